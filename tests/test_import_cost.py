"""``import tilenest`` stays cheap: the heavy dependencies (ml_dtypes for
bf16, the solvers, llvmlite, the TileIR grammar's parser generator) load on
first use, not at import."""

import subprocess
import sys

HEAVY = ("ml_dtypes", "z3", "islpy", "llvmlite", "lark")


def _loaded_after(code: str) -> list[str]:
    probe = f"{code}\nimport sys\nprint(' '.join(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True)
    return out.stdout.split()


def test_import_tilenest_loads_no_heavy_module():
    assert _loaded_after("import tilenest") == []


def test_defining_a_kernel_loads_no_heavy_module():
    code = ("import tilenest as tn\n"
            "@tn.kernel\n"
            "def add(x: tn.Tensor[tn.f32, 1], y: tn.Tensor[tn.f32, 1]):\n"
            "    (n,) = x.shape\n"
            "    for p in tn.parallel(tn.shape(tn.cdiv(n, 4))):\n"
            "        o = tn.coord(p.index() * 4)\n"
            "        y(o, tn.shape(4)).store(x[o, tn.shape(4)] + 1.0)\n")
    assert "ml_dtypes" not in _loaded_after(code)


def test_bf16_still_has_its_numpy_type():
    code = ("import tilenest as tn\nimport numpy as np\n"
            "from tilenest.semantics.dtypes import from_numpy\n"
            "assert tn.bf16.np.name == 'bfloat16'\n"
            "assert from_numpy(tn.bf16.np) is tn.bf16\n"
            "assert from_numpy(np.float32) is tn.f32\n")
    assert "ml_dtypes" in _loaded_after(code)
