"""The Metal emitter: MSL that Metal's compiler would accept, for every kernel
we ship, and the refusals of what Metal cannot run exactly.

* every example (``examples/*.py``) and every workload (``tilenest.workloads``,
  small size, f32, f16 and bf16, default metal schedule) emits MSL that
  ``clang-19 -fsyntax-only`` accepts against the Metal shim (``check_msl``, on
  the one-string source :func:`standalone` pastes together);
* a dropped address-space qualifier in that text is caught by the check;
* golden MSL for two small kernels (``tests/golden/metal``; rewrite them with
  ``TILENEST_UPDATE_GOLDEN=1``);
* f64 is refused with the op and the user's line; a collective a Metal
  simdgroup cannot do exactly (a partial lane group) is refused;
* ``tilenest lower --target metal --emit msl`` prints the source, and a
  compiled kernel's call says why it cannot run here.
"""

from __future__ import annotations

import glob
import inspect
import os
import re
import subprocess
import sys

import pytest

import tilenest as tn
from tilenest import f16, f32, f64, i64
from tilenest.backends import metal
from tilenest.backends.metal.check import check_msl, clang_available
from tilenest.backends.metal.emit import standalone
from tilenest.cli import load_programs
from tilenest.errors import NotAvailableError, TargetCheckError
from tilenest.lowering import default_schedule
from tilenest.semantics import dtypes as D
from tilenest.workloads import WORKLOADS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOLDEN = os.path.join(ROOT, "tests", "golden", "metal")
UPDATE = os.environ.get("TILENEST_UPDATE_GOLDEN") == "1"

needs_clang = pytest.mark.skipif(not clang_available(), reason="clang-19 is not installed")


def _examples() -> list:
    out = []
    for f in sorted(glob.glob(os.path.join(ROOT, "examples", "*.py"))):
        for name, p in load_programs(f, None, {}):
            out.append(pytest.param(p, id=f"{os.path.basename(f)}:{name}"))
    return out


def _workloads() -> list:
    out = []
    for n, w in WORKLOADS.items():
        for dt in (D.f32, D.f16, D.bf16):
            if dt in w.dtypes:
                out.append(pytest.param(n, dt, id=f"{n}-{dt.name}"))
    return out


def _msl(p: tn.TileProgram) -> str:
    return metal.emit(p, "msl")


@needs_clang
@pytest.mark.parametrize("program", _examples())
def test_every_example_type_checks(program: tn.TileProgram) -> None:
    """Each example's MSL (default metal schedule) is accepted by the check."""
    src = _msl(program)
    assert src.startswith('#include "tn_metal.h"\n')
    check_msl(standalone(src), name=f"{program.name}.metal")


@needs_clang
@pytest.mark.parametrize("name,dtype", _workloads())
def test_every_workload_type_checks(name: str, dtype: D.DType) -> None:
    """Each workload kernel at its small size, in f32, f16 and bf16, emits
    MSL the check accepts, with one ``kernel void`` per phase."""
    w = WORKLOADS[name]
    p = w.kernel(dtype, None, w.size("small")).program
    src = _msl(p)
    check_msl(standalone(src), name=f"{name}_{dtype.name}.metal")
    k, s = metal.stage_source(p, default_schedule(p, "metal"))
    assert src.count("kernel void ") == len(k.phases) == len(s.kernels)


def _softmax() -> tn.TileProgram:
    return dict(load_programs(os.path.join(ROOT, "examples", "softmax.py"), None, {}))[
        "row_softmax"]


def _axpy() -> tn.TileProgram:
    return dict(load_programs(os.path.join(ROOT, "examples", "ragged.py"), None, {}))["axpy"]


def test_parameters_follow_the_fixed_convention() -> None:
    """The contract's parameters, then tn_smem (a phase with shared buffers
    only), then the five builtins in their fixed order; symbols and scalars
    come from the struct."""
    builtins = ("uint3 tn_tgpos [[threadgroup_position_in_grid]], "
                "uint3 tn_tpos [[thread_position_in_threadgroup]], "
                "uint3 tn_tgsize [[threads_per_threadgroup]], "
                "uint tn_lane [[thread_index_in_simdgroup]], "
                "uint tn_simd [[simdgroup_index_in_threadgroup]])")
    sm = _msl(_softmax())
    head = re.search(r"kernel void \w+\(\n(.*)\{", sm).group(1).strip()
    assert head.startswith("const device float* b_x [[buffer(0)]], device float* b_y "
                           "[[buffer(1)]], constant tn_args_row_softmax& tn_args [[buffer(2)]], "
                           "device atomic_int* tn_status [[buffer(3)]], "
                           "threadgroup uchar* tn_smem [[threadgroup(0)]], ")
    assert head.rstrip().endswith(builtins)
    assert "= tn_args.s_C;" in sm
    ax = _msl(_axpy())
    assert "tn_smem" not in ax  # no shared buffers: no threadgroup memory parameter
    assert re.search(r"const float \w+\[1\] = \{tn_args\.a_a\};", ax)


def test_barriers_and_collectives_are_metal_words() -> None:
    """Block barriers order threadgroup and device memory; lane reductions
    are simd_shuffle_xor butterflies (through the prelude's tn_simd_xor)."""
    sm = _msl(_softmax())
    assert "threadgroup_barrier(mem_flags::mem_threadgroup | mem_flags::mem_device);" in sm
    assert "__syncthreads" not in sm
    assert re.search(r"tn_simd_xor\(\w+, 16\)", sm)


def _renumbered(text: str) -> str:
    """``text`` with the lowering's temporaries (``..._t<n>``, numbered by a
    counter of the whole process) renumbered in order of appearance, so a
    golden file does not depend on what ran before."""
    seen: dict[str, str] = {}

    def one(m: re.Match) -> str:
        return "_t" + seen.setdefault(m.group(1), str(len(seen)))

    return re.sub(r"_t(\d+)\b", one, text)


def _check_golden(name: str, text: str) -> None:
    text = _renumbered(text)
    path = os.path.join(GOLDEN, name)
    if UPDATE or not os.path.exists(path):
        if not UPDATE:
            pytest.fail(f"no golden file {path}: run with TILENEST_UPDATE_GOLDEN=1")
        with open(path, "w") as f:
            f.write(text)
    with open(path) as f:
        want = f.read()
    assert text == want, f"{name} differs from the golden MSL (TILENEST_UPDATE_GOLDEN=1 rewrites it)"


def test_golden_axpy() -> None:
    """The MSL of examples/ragged.py's axpy (no shared memory, a scalar argument)."""
    _check_golden("axpy.metal", _msl(_axpy()))


def test_golden_scale_rows() -> None:
    """The MSL of examples/two_level.py's scale_rows."""
    p = dict(load_programs(os.path.join(ROOT, "examples", "two_level.py"), None, {}))[
        "scale_rows"]
    _check_golden("scale_rows.metal", _msl(p))


def _sort() -> tn.TileProgram:
    w = WORKLOADS["sort"]
    return w.kernel(D.f32, None, w.size("small")).program


@needs_clang
@pytest.mark.parametrize("kernel,old,new", [
    # a shared buffer's pointer declared without its threadgroup space
    (_softmax, "threadgroup float* const b__m_3 = (threadgroup float*)",
     "float* const b__m_3 = (threadgroup float*)"),
    # the status word without its device space (integer division passes it on)
    (_sort, "device atomic_int* tn_status", "atomic_int* tn_status"),
], ids=["threadgroup-pointer", "device-status"])
def test_check_catches_a_dropped_address_space(kernel, old: str, new: str) -> None:  # type: ignore[no-untyped-def]
    """The emitted text passes the check; the same text with one
    address-space word dropped does not."""
    src = _msl(kernel())
    check_msl(standalone(src))
    assert old in src
    with pytest.raises(TargetCheckError):
        check_msl(standalone(src.replace(old, new, 1)))


@tn.kernel
def f64_tensor(x: tn.Tensor[f64, "N"], y: tn.Tensor[f64, "N"], *, block=64):
    (n,) = x.shape
    for p in tn.parallel(tn.shape(tn.cdiv(n, block))):
        o = tn.coord(p.index() * block)
        y(o, tn.shape(block)).store(x[o, tn.shape(block)] * 2.0)


@tn.kernel
def f64_value(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"], *, block=64):
    (n,) = x.shape
    for p in tn.parallel(tn.shape(tn.cdiv(n, block))):
        o = tn.coord(p.index() * block)
        wide = x[o, tn.shape(block)].astype(f64)  # the f64 line
        y(o, tn.shape(block)).store((wide * 2.0).astype(f32))


def _line_of(fn: object, marker: str) -> int:
    lines, first = inspect.getsourcelines(fn.fn if hasattr(fn, "fn") else fn)  # type: ignore[attr-defined]
    return first + next(i for i, t in enumerate(lines) if marker in t)


def test_f64_value_refused_with_its_line() -> None:
    """An f32 kernel that converts to f64 is refused, naming the op and the
    line of the conversion, before anything is emitted."""
    with pytest.raises(NotAvailableError) as e:
        metal.emit(f64_value.program, "msl")
    msg = str(e.value)
    assert "f64" in msg and "op '" in msg and "Metal" in msg
    src = inspect.getsource(sys.modules[__name__])
    line = next(i + 1 for i, t in enumerate(src.splitlines()) if "# the f64 line" in t)
    assert any(s.line == line and s.file and s.file.endswith("test_metal_emit.py")
               for s in e.value.sites), (e.value.sites, line)


def test_f64_tensor_refused() -> None:
    """A kernel with an f64 tensor argument is refused for metal (compile
    and emit), naming the argument."""
    for call in (lambda: metal.emit(f64_tensor.program, "msl"),
                 lambda: metal.compile_program(f64_tensor.program)):
        with pytest.raises(NotAvailableError, match="argument 'x'.*f64"):
            call()


def test_narrow_transcendentals_use_float_math() -> None:
    """An f16 kernel's transcendentals call the float-only tnf_ functions
    (nothing evaluates in double: the check refuses the word)."""
    w = WORKLOADS["gelu"]
    src = _msl(w.kernel(D.f16, None, w.size("small")).program)
    assert "tnf_tanh(" in src and "double" not in src


@tn.kernel
def conversions(x: tn.Tensor[f16, "N"], y: tn.Tensor[f16, "N"], z: tn.Tensor[f16, "N"],
                w: tn.Tensor[i64, "N"], *, block=64):
    (n,) = x.shape
    y = y.with_dims(x.dim(0))
    z = z.with_dims(x.dim(0))
    w = w.with_dims(x.dim(0))
    for p in tn.parallel(tn.shape(tn.cdiv(n, block))):
        o = tn.coord(p.index() * block)
        a = x[o, tn.shape(block)]
        k = a.astype(i64)
        w(o, tn.shape(block)).store(k)
        y(o, tn.shape(block)).store(tn.pow(a, a) + tn.atan2(a, a) + k.astype(f16))
        z(o, tn.shape(block)).store(-tn.abs(a) + tn.sqrt(a) + tn.round(a))


@needs_clang
def test_f16_math_and_conversions_stay_in_float() -> None:
    """pow, atan2, f16 -> i64 and i64 -> f16 call the float-only functions
    (the i64 -> f16 one through the round-to-odd float, then one rounding);
    f16 negation and abs flip bits; sqrt and round are Metal's overloaded
    float functions (not C's sqrtf / rintf); the MSL type-checks."""
    src = _msl(conversions.program)
    check_msl(standalone(src))
    assert "tnf_pow(tn_widen(" in src and "tnf_atan2(tn_widen(" in src
    assert "tnf_f2i<long>(tn_widen(" in src
    assert re.search(r"tn_narrow_f16\(tnf_i64_to_f32\(\(long\)\(.*\), true\)\)", src)
    assert "tn_half(tn_hbits(" in src and "0x8000u" in src and "0x7fffu" in src
    assert "sqrt(tn_widen(" in src and "rint(tn_widen(" in src and "sqrtf" not in src


@pytest.mark.parametrize("change", [{"mask": 0xFFFF}, {"width": 64}],
                         ids=["partial-mask", "wide-group"])
def test_inexact_collective_refused(change: dict) -> None:
    """Softmax's lane reductions with half the lanes masked off (or a group
    wider than a simdgroup) have no exact Metal spelling (its collectives
    take no mask): emit_msl refuses the kernel instead of writing one."""
    from dataclasses import replace

    from tilenest.backends.metal.emit import emit_msl
    from tilenest.lowering import loopir as L

    p = _softmax()
    k, _ = metal.stage_source(p, default_schedule(p, "metal"))
    emit_msl(k)  # as lowered: full simdgroups

    def fs(t):  # type: ignore[no-untyped-def]
        return (replace(t, **change),) if isinstance(t, L.LaneReduce) else None

    k2 = replace(k, phases=tuple(replace(ph, body=L.map_stmts(ph.body, lambda x: None, fs))
                                 for ph in k.phases))
    with pytest.raises(NotAvailableError, match="no exact metal lowering"):
        emit_msl(k2)


def test_cli_lower_emits_msl() -> None:
    """``tilenest lower examples/softmax.py --target metal --emit msl``."""
    r = subprocess.run([sys.executable, "-m", "tilenest.cli", "lower",
                        os.path.join(ROOT, "examples", "softmax.py"), "--target", "metal",
                        "--emit", "msl"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith('#include "tn_metal.h"') and "kernel void row_softmax" in r.stdout


def test_compiled_kernel_runs_emulated_and_the_gpu_call_is_refused_here() -> None:
    """compile_program proves and emits; the kernel runs on the emulated
    device, and a gpu kernel's call raises NotAvailableError off macOS."""
    import numpy as np

    k = metal.compile_program(_axpy(), device="emulated")
    assert k.obligations and "kernel void axpy" in k.text and "#include" not in k.text.split(
        "\n")[0]
    x = np.arange(8, dtype=np.float32)
    out = x * 0
    k(np.float32(2), x, x, out)
    assert out.tolist() == (3 * x).tolist()
    if sys.platform != "darwin":
        g = metal.compile_program(_axpy(), device="gpu")
        with pytest.raises(NotAvailableError, match="macOS"):
            g(np.float32(2), x, x, x * 0)


def test_standalone_inlines_the_prelude_chain() -> None:
    """standalone() leaves no quoted include; <metal_stdlib> stays."""
    text = standalone(_msl(_axpy()))
    assert not re.search(r'^\s*#\s*include\s+"', text, re.M)
    assert "#include <metal_stdlib>" in text and "tnf_exp(" in text and "TN_SCALAR_H" in text


def test_nvidia_tensor_core_mma_refused_with_the_simt_hint() -> None:
    """A tile in NVIDIA's fragment layout (a warp mma that is not opaque)
    has no Metal spelling: refused, pointing at the other units. With
    mma_unit='tensor' the metal lowering itself makes simdgroup tiles
    (tests/test_metal_simdgroup.py)."""
    from dataclasses import replace

    from tilenest.backends.metal.emit import emit_msl
    from tilenest.lowering import lower_verified
    from tilenest.lowering import loopir as L
    from tilenest.semantics.signature import stored_tensors

    w = WORKLOADS["gemm"]
    p = w.kernel(D.f16, None, w.size("small")).program
    k = lower_verified(p, default_schedule(p, "metal", mma_unit="tensor"))
    assert any(isinstance(s, L.WarpMma) and s.opaque for ph in k.phases for s in L.walk(ph.body))
    nv = replace(k, phases=tuple(replace(ph, body=L.map_stmts(
        ph.body, lambda x: None, lambda s: (replace(s, opaque=False),)
        if isinstance(s, L.WarpMma) else None)) for ph in k.phases))
    with pytest.raises(NotAvailableError, match="fragment layout has no metal lowering") as e:
        emit_msl(nv, stored_tensors(p), 64)
    assert "mma_unit='simt'" in str(e.value)


def test_capped_grid_refused_and_threadgroup_flags() -> None:
    """A capped grid needs the grid size, which is not among the builtins:
    refused. Each kernel's info says whether it binds threadgroup memory."""
    p = _softmax()
    with pytest.raises(NotAvailableError, match="grid_blocks"):
        metal.emit(p, "msl", default_schedule(p, "metal", grid_blocks=4))
    _, sm = metal.stage_source(p, default_schedule(p, "metal"))
    _, ax = metal.stage_source(_axpy(), default_schedule(_axpy(), "metal"))
    assert all(i.threadgroup for i in sm.kernels) and not any(i.threadgroup for i in ax.kernels)
