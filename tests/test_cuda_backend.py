"""The CUDA backend without a GPU: every example compiles to an sm_90a cubin
with NVRTC, and its generated source validates against the interpreter on the
host emulator under every thread interleaving and poison; mutations of the
generated source (a dropped barrier, a wrong distribution, a wrong shuffle
mask) are caught."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tilenest as tn
from tilenest.backends import cuda
from tilenest.backends.cuda.runtime import CudaKernel
from tilenest.backends.simt.emulator import POLICIES, EmulatorError
from tilenest.lowering import default_schedule

from suite_shares import cuda_share

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted(p.stem for p in (ROOT / "examples").glob("*.py"))


def _kernels(name: str) -> list:
    spec = importlib.util.spec_from_file_location(f"ex_{name}", ROOT / "examples" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return [v for v in vars(mod).values() if isinstance(v, tn.Kernel)]


def _small(program, threads: int = 32, **kw):
    """A schedule with few threads per program, so that the validation sizes
    give every distributed loop at least three iterations per thread."""
    return default_schedule(program, "cuda", block_threads=threads, **kw)


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_compiles_for_sm90a_and_validates_emulated(name):
    for kern in _kernels(name):
        ck = cuda.compile_program(kern.program, _small(kern.program), device="emulated")
        assert ck.cubin[:4] == b"\x7fELF" and ck.cubin[18] == 190  # EM_CUDA
        assert all(r.registers for r in ck.resources.values())
        # 8 cases: every policy twice, every poison at least twice (rotation)
        rep = tn.validate(kern, "cuda", compiled=ck, cases=8, seed=3)
        assert rep.ok, rep.summary()
        assert rep.count("ok") >= 4


def test_default_block_size_validates():
    (kern,) = _kernels("softmax")
    ck = cuda.compile_program(kern.program, device="emulated")
    assert ck.schedule.block_threads == 256
    x = np.random.default_rng(0).standard_normal((3, 700)).astype(np.float32)
    y = np.full_like(x, np.nan)
    for policy in POLICIES:
        y[...] = np.nan
        ck(x, y, policy=policy, seed=1)
        assert tn.reference(kern, x, np.zeros_like(x)).admits(y)


def _mutant(ck: CudaKernel, text: str) -> CudaKernel:
    src = dataclasses.replace(ck.source, text=text)
    return CudaKernel(ck.program, ck.kernel, ck.schedule, src, ck.built, "emulated", [], 0.0)


def _softmax():
    (kern,) = _kernels("softmax")
    # one element per thread and step: the mutations below edit that map's text
    ck = cuda.compile_program(kern.program, _small(kern.program, vector_lanes=1),
                              device="emulated")
    x = np.random.default_rng(1).standard_normal((5, 200)).astype(np.float32)
    return kern, ck, x


def _caught(kern, ck, x) -> bool:
    """Whether some interleaving and poison makes ``ck`` reject or mismatch."""
    for i in range(12):
        y = np.zeros_like(x)
        try:
            ck(x, y, policy=POLICIES[i % 4], seed=i, poison=("nan", "big", "bytes")[i % 3])
        except EmulatorError:
            return True
        if not tn.reference(kern, x, np.zeros_like(x)).admits(y):
            return True
    return False


def test_unmutated_softmax_passes_every_interleaving():
    kern, ck, x = _softmax()
    assert not _caught(kern, ck, x)


def test_dropped_barrier_is_caught():
    kern, ck, x = _softmax()
    text = ck.source.text
    sites = [m.start() for m in re.finditer(r"__syncthreads\(\);", text)]
    assert sites
    caught = 0
    for at in sites:
        mutated = text[:at] + "/* dropped */" + text[at + len("__syncthreads();"):]
        caught += _caught(kern, _mutant(ck, mutated), x)
    # the barrier between the warps' partial sums and their combination is
    # needed by every reduction: at least those removals must be caught
    assert caught >= 2, f"only {caught} of {len(sites)} dropped barriers caught"


def test_barrier_between_grid_stride_programs_is_needed():
    """``grid_blocks``: a block runs program after program, a barrier after
    each ordering its last reads of shared memory before the next program's
    first writes. Causal attention's first writes to shared memory (the next
    query block's tiles) are read by other threads in its last step: every
    interleaving passes with the barrier, and dropping it is caught."""
    kern = _kernels("causal_attention")[0]
    ck = cuda.compile_program(kern.program, _small(kern.program, grid_blocks=2),
                              device="emulated")
    text = ck.source.text
    assert "gridDim.x" in text
    rep = tn.validate(kern, "cuda", compiled=ck, cases=8, seed=3)
    assert rep.ok, rep.summary()
    tail = text.rindex("__syncthreads();")
    mutant = _mutant(ck, text[:tail] + "/* dropped */" + text[tail + len("__syncthreads();"):])
    try:
        caught = not tn.validate(kern, "cuda", compiled=mutant, cases=8, seed=3).ok
    except EmulatorError:
        caught = True
    assert caught


def test_wrong_distribution_is_caught():
    kern, ck, x = _softmax()
    text = ck.source.text
    # the thread -> element map of every distributed loop: l = 32 r + t; a
    # stride of 16 leaves elements unwritten and others written twice
    mutated = re.sub(r"\(32(ll)? \* \(\((long long|int)\)v_r", r"(16\1 * ((\2)v_r", text)
    assert mutated != text
    assert _caught(kern, _mutant(ck, mutated), x)


def test_wrong_shuffle_mask_is_caught():
    kern, ck, x = _softmax()
    text = ck.source.text
    mutated = text.replace("tn_shfl_xor(0xffffffffu", "tn_shfl_xor(0xffffu", 1)
    assert mutated != text
    with pytest.raises(EmulatorError, match="mask"):
        _mutant(ck, mutated)(x, np.zeros_like(x), policy="in_order")


def test_stages_and_cli_lower():
    (kern,) = _kernels("softmax")
    for stage in cuda.STAGES:
        assert cuda.emit(kern.program, stage).strip()
    r = subprocess.run([sys.executable, "-m", "tilenest.cli", "lower",
                        str(ROOT / "examples" / "softmax.py"), "--target", "cuda",
                        "--emit", "sass-resources"], capture_output=True, text=True)
    assert r.returncode == 0 and "registers" in r.stdout, r.stderr
    r = subprocess.run([sys.executable, "-m", "tilenest.cli", "lower",
                        str(ROOT / "examples" / "softmax.py"), "--target", "cuda",
                        "--emit", "asm"], capture_output=True, text=True)
    assert r.returncode != 0 and "unknown stage" in r.stderr and "Traceback" not in r.stderr


def test_kernel_compile_and_validate_target_cuda():
    (kern,) = _kernels("ragged")
    ck = kern.compile(target="cuda", device="emulated")
    assert isinstance(ck, CudaKernel) and ck.device == "emulated"
    rep = tn.validate(kern, "cuda", cases=4)
    assert rep.ok and rep.target == "cuda", rep.summary()


def _conformance_on_the_emulated_device(capsys, select: list[str]) -> None:
    """The conformance cases ``select`` (every case when empty) through the
    cuda target on the host emulator: every one compared, every one passing."""
    from tilenest.conformance import load_suite, main

    status = main(backend="cuda", select=select)
    out = capsys.readouterr().out
    assert status == 0, out[-3000:]
    n = len(select) if select else len(load_suite())
    m = re.search(r"(\d+)/(\d+) passed", out)
    assert m and int(m.group(1)) == int(m.group(2)) == n, out[-3000:]  # every case compared


def test_conformance_share_on_the_emulated_device(capsys):
    """Two thirds of the conformance suite, from every rule group, on the
    emulated CUDA device (``suite_shares.cuda_share``: Metal runs the rest)."""
    _conformance_on_the_emulated_device(capsys, cuda_share())


@pytest.mark.slow
def test_conformance_suite_on_the_emulated_device(capsys):
    """Every conformance case through the cuda target on the host emulator."""
    _conformance_on_the_emulated_device(capsys, [])


@pytest.mark.parametrize("lanes", [2, 4, 8])
def test_vector_lanes_validate_on_both_paths(lanes):
    """Each thread takes ``lanes`` consecutive elements; full aligned groups
    use one wide access (the source says so), ragged or misaligned ones the
    scalar loop: rows of 64 and 66 columns take each path."""
    (kern,) = _kernels("softmax")
    s = default_schedule(kern.program, "cuda", block_threads=32, vector_lanes=lanes)
    ck = cuda.compile_program(kern.program, s, device="emulated")
    assert "vector accesses" in ck.source.text
    assert all(o.status == "proved" for o in ck.obligations if o.kind == "taskmap.coverage")
    rng = np.random.default_rng(lanes)
    cases = [[rng.standard_normal((r, c)).astype(np.float32), np.zeros((r, c), np.float32)]
             for r, c in ((3, 64), (3, 66), (2, 1000))]
    rep = tn.validate(kern, "cuda", compiled=ck, inputs=cases)
    assert rep.ok and rep.count("ok") == 3, rep.summary()


@pytest.mark.parametrize("name,dt,lanes", [
    ("softmax", "f32", 4),          # f32 rows beside a bool mask: 16 bytes of f32
    ("softmax", "bf16", 8),
    ("masked_softmax", "f32", 4),
    ("cross_entropy", "bf16", 8),   # the i64 labels are a side vector, not bulk
    ("argmax", "f32", 4),
    ("sort", "f16", 2),             # i64 index rows of the input's shape: 16 bytes of i64
    ("topk", "f16", 8),             # the i64 (R, K) indices are not of the input's shape
    ("gemm", "bf16", 8),            # bf16 operands, f32 result
    ("fp8_dequantize", "-", 4),     # e4m3fn codes in, f32 of their shape out
    ("fp8_quantize", "-", 4),
])
def test_default_lanes_make_one_wide_access_of_the_widest_bulk_input(name, dt, lanes):
    """The cuda default takes 16 bytes of the widest element type among the
    highest-rank tensors the program only reads and those it writes of
    their shape, per thread and step, so no bulk access needs two 128-bit
    accesses per step (32 bytes per thread cost softmax f32 5 points of the
    copy bandwidth on the H200, LayerNorm f32 19, and 32-byte f32 stores
    kept dequantization at 68%)."""
    from tilenest.bench.kernels import kernels
    from tilenest.lowering.schedule import default_lanes
    from tilenest.workloads import WORKLOADS

    if dt == "-":
        k = kernels()[name]
    else:
        wl = WORKLOADS[name]
        k = wl.kernel(getattr(tn, dt), dict(wl.schedules[0]), wl.size("small"))
    assert default_lanes(k.program) == lanes
    assert default_schedule(k.program, "cuda").vector_lanes == lanes


def test_conformance_backend_runs_every_interleaving_and_flags_differences(monkeypatch):
    """The conformance driver runs an emulated case under each interleaving and
    reports a difference between them (a race in generated code) as such."""
    import tilenest.backends as B
    from tilenest import conformance as C

    case = next(c for c in C.load_suite(C.default_suite(), ()) if c.verdict == "admitted")
    seen = []

    class Flaky:
        interleavings = ({"policy": "in_order"}, {"policy": "reversed"})

        def __call__(self, *args, params=None, policy=None, **kw):
            seen.append(policy)
            for a in args:
                if isinstance(a, np.ndarray) and a.size and policy == "reversed":
                    a.reshape(-1)[0] += 1  # another result under another interleaving

    class Row:
        def compile(self, *a, **k):
            return Flaky()

    monkeypatch.setattr(B, "target", lambda name: Row())
    out = C.Backend("cuda").run(case)
    assert seen == ["in_order", "reversed"]
    assert out.error == "internal" and "interleavings" in out.message


def test_row_invariant_shared_reads_are_hoisted_and_divisions_keep_their_reciprocal():
    """Softmax's exponential pass reads the row's max from shared memory and
    its division pass the row's sum: each is read once before its loop (CUDA
    cannot: any store of the loop may alias it), the division still takes
    the shared-divisor form, the exponential's full groups run with no
    per-group test, and the kernel still validates on the emulated device."""
    from tilenest.workloads import WORKLOADS

    wl = WORKLOADS["softmax"]
    k = wl.kernel(tn.bf16, {"rp": 1})
    ck = cuda.compile_program(k.program, default_schedule(k.program, "cuda", block_threads=32,
                                                          row_registers=0),
                              device="emulated")
    src = ck.source.text
    hoisted = re.findall(r"const float (tn_inv_\w+) = \(unsigned\)\(.*?\) < \(unsigned\)\(1\) "
                         r"\? (b_\w+)\[", src)
    assert len(hoisted) == 2, src
    (m, mb), (s, sb) = hoisted
    # the max and the sum share one shared cell (their lifetimes are disjoint:
    # lowering/lifetimes.py); each is stored once and read once (the hoisted read)
    assert mb == sb and src.count(f"{mb}[") == 4
    assert f"tn_fdiv_prep({s})" in src
    exp_pass = src[src.index(m):]
    assert "full groups: 8 lanes" in exp_pass.split("tn_exp_f32_ok")[0]
    assert "#pragma unroll 1\n" in exp_pass.split("tn_exp_f32_ok")[0]
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((3, 777)) * 4).astype(tn.bf16.np)
    mask = np.ones((3, 777), bool)
    cases = [[x, mask, np.zeros_like(x)]]
    rep = tn.validate(k, "cuda", compiled=ck, inputs=cases)
    assert rep.ok and rep.count("ok") == 1, rep.summary()


_SYNC = re.compile(r"__syncthreads|__syncwarp|tn_shfl|tn_cp_async|tn_wgmma|tn_lane_reduce")


def _block_after(lines: list, i: int) -> list:
    """The lines of the ``{ ... }`` block opened on line ``i``."""
    depth, out = 0, []
    for ln in lines[i:]:
        depth += ln.count("{") - ln.count("}")
        out.append(ln)
        if depth <= 0:
            break
    return out


def test_every_hoisted_shared_read_is_of_a_value_its_loop_cannot_change():
    """Over every workload schedule's CUDA source: each shared read held in
    a register across a loop is of a buffer that loop never stores to, in a
    block with no barrier, collective or asynchronous copy, and is used
    there; and the hoist happens at all (the row kernels' scalars)."""
    from tilenest.backends.cuda import stage_source
    from tilenest.workloads import WORKLOADS

    seen = 0
    for name, wl in WORKLOADS.items():
        for sched in wl.schedules:
            try:
                k = wl.kernel(wl.dtypes[0], dict(sched))
            except tn.errors.TilenestError:  # a kernel needing its size (sort's width)
                k = wl.kernel(wl.dtypes[0], dict(sched), wl.size(next(iter(wl.sizes))))
            _, src = stage_source(k.program, default_schedule(k.program, "cuda"))
            lines = src.text.splitlines()
            for i, ln in enumerate(lines):
                if "read once" not in ln:
                    continue
                block = _block_after(lines, i)
                decls = re.findall(r"const \w+ (tn_inv_\w+) = .*? \? (b_\w+)\[", "\n".join(block))
                assert decls, (name, ln)
                body = "\n".join(block[1 + len(decls):])
                assert not _SYNC.search(body), (name, sched, body[:2000])
                for reg, buf in decls:
                    seen += 1
                    assert reg in body, (name, reg)
                    assert not re.search(rf"\b{buf}\[[^\]]*\]\s*=[^=]", body), (name, buf)
                    assert not re.search(rf"tn_vstore\w*<[^>]*>\(&{buf}\[", body), (name, buf)
    assert seen >= 20


def test_row_kernels_default_to_rows_in_registers_and_l2_policies():
    """The cuda target's stream defaults: a program with no mma keeps its rows
    in registers and sets L2 policies (the fastest row kernels on an H200,
    spec/lowering.md); one with an mma keeps neither; an override wins;
    metal has no such defaults."""
    from tilenest.workloads import WORKLOADS

    soft = WORKLOADS["softmax"].kernel(tn.f32, {"rp": 1}).program
    gemm = WORKLOADS["gemm"].kernel(tn.bf16, dict(WORKLOADS["gemm"].schedules[0])).program
    s = default_schedule(soft, "cuda")
    assert (s.row_registers, s.cache_hints) == (32, True)
    g = default_schedule(gemm, "cuda")
    assert (g.row_registers, g.cache_hints) == (0, False)
    assert default_schedule(soft, "cuda", row_registers=0).row_registers == 0
    m = default_schedule(soft, "metal")
    assert (m.row_registers, m.cache_hints) == (0, False)
    ck = cuda.compile_program(soft, s, device="emulated")
    assert "_reg[" in ck.source.text and "tn_vstore_stream" in ck.source.text
