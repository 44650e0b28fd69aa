"""Warpgroup tensor cores with the first operand in registers: the
register-A form of ``wgmma.mma_async`` (``tn_wgmma_<dt>_n<n>_ra[_kb]``), its
emulation and ``group_mma``'s emission of it.

A hand-written kernel runs one step sequence of the wrapper on a 64 x ``n``
tile: each thread holds its cells of ``a`` in the lane-fragment order
(``loopir.frag_cell``), ``b`` lies in shared memory as the matrix
descriptor's 128-byte-swizzle rules place it (computed here from those rules,
not from the code generator's layout). The products are exact (small
multiples of 1/4), so the emulator's result must equal numpy's. For
``group_mma`` a wgmma GEMM's lowering is rewritten to read ``a`` from a lane
fragment filled from the shared tile just before the mma (the lowering does
not produce such a kernel yet); the result is checked against the oracle.
"""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import pytest

import tilenest as tn
from tilenest.backends import cuda
from tilenest.backends.cuda import ARCH, prelude_dirs
from tilenest.backends.cuda.nvrtc import compile_cuda
from tilenest.backends.cuda.rules import wgmma_name, wgmma_wrapper
from tilenest.backends.simt import emulator as EMU
from tilenest.errors import NotAvailableError, TilenestError
from tilenest.lowering import default_schedule
from tilenest.lowering import loopir as L
from tilenest.semantics import expr as E

K = 64  # the hand kernel's depth: four 16-deep steps in one 128-byte panel row
DTYPES = {"bf16": tn.bf16, "f16": tn.f16}


# ------------------------------------------------------------------ the hand kernel
def _swizzle(addr: np.ndarray) -> np.ndarray:
    """The 128-byte swizzle of shared byte addresses: bits 4-6 ^= bits 7-9."""
    return addr ^ (((addr >> 7) & 7) << 4)


def _b_image(b: np.ndarray, kb: bool) -> np.ndarray:
    """The shared-memory image (16-bit units from a 1024-byte aligned base) of
    the ``k x n`` operand ``b`` as the descriptor of ``_source`` reads it:
    MN-major -- 64-column panels ``k x 128`` bytes apart (the leading offset),
    8-row groups 1024 bytes apart (the stride offset), 2 bytes per column; or
    K-major (stored ``n x k``) -- 8-column groups 1024 bytes apart, 128 bytes
    per column, 2 bytes per step of the contraction; then the swizzle."""
    kd, n = b.shape
    k, j = np.meshgrid(np.arange(kd), np.arange(n), indexing="ij")
    if kb:
        byte = (k // 64) * n * 128 + (j % 8) * 128 + (j // 8) * 1024 + 2 * (k % 64)
    else:
        byte = (j // 64) * kd * 128 + (k % 8) * 128 + (k // 8) * 1024 + 2 * (j % 64)
    img = np.zeros(kd * n, np.uint16)
    img[_swizzle(byte) // 2] = b.view(np.uint16)
    return img


def _source(dt: str, n: int, kb: bool, mutate: bool = False) -> str:
    """One warpgroup computes ``out (64 x n, f32) += a (64 x K) * b``: ``a``
    row-major bits, ``bimg`` the shared image of ``b`` (:func:`_b_image`).
    Each thread takes its cells of ``a`` in the lane-fragment order and packs
    them as ``group_mma`` does (register ``r`` of step ``kk``: cells ``8 kk +
    2 r`` and ``8 kk + 2 r + 1``), all before the fence. With ``mutate`` the
    argument ``what`` 1 flips the sign bit of an A register, 2 adds 1 to an
    accumulator register, between the issue and the wait."""
    fn = wgmma_name(dt, n, kb, ra=True)
    lead = 16 if kb else K * 128
    wrapper = "\n".join(wgmma_wrapper(dt, n, kb, ra=True))
    writes = ("  if (what == 1) ra[1][2] ^= 0x80000000u;\n"
              "  if (what == 2) d[1] += 1.0f;\n") if mutate else ""
    return f"""#include "tn_prelude.cuh"
{wrapper}
extern "C" __global__ void __launch_bounds__(128) ra_mma(const unsigned short* a,
    const unsigned short* bimg, float* out, int what) {{
  extern __shared__ __align__(16) unsigned char tn_smem[];
  unsigned short* const sb = (unsigned short*)(tn_smem + ((0u - tn_smem_addr(tn_smem)) & 1023u));
  const int t = threadIdx.x, w = t / 32, l = t % 32;
  for (int i = t; i < {K * n}; i += 128) sb[i] = bimg[i];
  tn_fence_proxy_async();
  __syncthreads();
  tn_{dt} cells[{K // 2}];
  unsigned ra[{K // 16}][4];
  float d[{n // 2}];
#pragma unroll
  for (int q = 0; q < {K // 8}; ++q)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int e = 0; e < 2; ++e)
        cells[4 * q + 2 * h + e] = tn_mk_{dt}(a[(16 * w + l / 4 + 8 * h) * {K} + 8 * q + 2 * (l % 4) + e]);
#pragma unroll
  for (int i = 0; i < {K // 4}; ++i)
    ra[i / 4][i % 4] = (unsigned)tn_get16(cells[2 * i]) | ((unsigned)tn_get16(cells[2 * i + 1]) << 16);
#pragma unroll
  for (int q = 0; q < {n // 8}; ++q)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int e = 0; e < 2; ++e)
        d[4 * q + 2 * h + e] = out[(16 * w + l / 4 + 8 * h) * {n} + 8 * q + 2 * (l % 4) + e];
  const tn_u64 db = tn_wgmma_desc(tn_smem_addr(sb), {lead}u, 1024u);
  tn_wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < {K // 16}; ++kk)
    {fn}(d, ra[kk], tn_wgmma_desc_at(db, {"32u" if kb else "2048u"} * kk), 1);
  tn_wgmma_commit();
{writes}  tn_wgmma_wait<0>();
#pragma unroll
  for (int q = 0; q < {n // 8}; ++q)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int e = 0; e < 2; ++e)
        out[(16 * w + l / 4 + 8 * h) * {n} + 8 * q + 2 * (l % 4) + e] = d[4 * q + 2 * h + e];
}}
"""


def _operands(dt: str, n: int, kb: bool, seed: int):  # type: ignore[no-untyped-def]
    """Seeded ``a`` (64 x K), ``b`` (K x n) and ``c`` (64 x n) of multiples
    of 1/4 in [-2, 2] (exact in both 16-bit types, every sum exact in f32),
    with ``a``'s bits, ``b``'s shared image and the exact ``c + a b``."""
    rng = np.random.default_rng(seed)
    npt = DTYPES[dt].np
    a = (rng.integers(-8, 9, (64, K)) / 4).astype(npt)
    b = (rng.integers(-8, 9, (K, n)) / 4).astype(npt)
    c = (rng.integers(-8, 9, (64, n)) / 4).astype(np.float32)
    want = c + a.astype(np.float64) @ b.astype(np.float64)
    return a.view(np.uint16).copy(), _b_image(b, kb), c, want


_MODULES: dict = {}


def _module(dt: str, n: int, kb: bool, mutate: bool) -> EMU.EmuModule:
    key = (dt, n, kb, mutate)
    if key not in _MODULES:
        kinds = {"ra_mma": ["const unsigned short*", "const unsigned short*", "float*", "int"]}
        _MODULES[key] = EMU.build(_source(dt, n, kb, mutate), kinds, include_dirs=prelude_dirs())
    return _MODULES[key]


def _emulate(dt: str, n: int, kb: bool, what: int = 0, policy: str = "in_order",
             seed: int = 1):  # type: ignore[no-untyped-def]
    a, img, c, want = _operands(dt, n, kb, seed)
    _module(dt, n, kb, what != 0).launch("ra_mma", (1, 1, 1), (128, 1, 1), [a, img, c, what],
                                        shared_bytes=2 * K * n + 1024, policy=policy,
                                        seed=seed)
    return c, want


SHAPES = [(dt, n, kb) for dt in ("bf16", "f16") for n in (64, 128) for kb in (False, True)]
IDS = [f"{dt}-n{n}-{'kmajor' if kb else 'mnmajor'}" for dt, n, kb in SHAPES]


@pytest.mark.parametrize("dt,n,kb", SHAPES, ids=IDS)
def test_register_a_wgmma_computes_the_product_emulated(dt, n, kb):
    """``c += a b`` with ``a`` from the threads' registers (the PTX register
    fragment: per warp ``mma.m16n8k16``'s ``a``, warp ``w`` holding rows
    ``16 w ..``) and ``b`` through its descriptor, MN-major or K-major."""
    for policy in ("in_order", "random"):
        got, want = _emulate(dt, n, kb, policy=policy)
        assert np.array_equal(got, want), policy


def test_the_kernel_with_its_writes_not_taken_is_admitted():
    """The control of the next test: the writes' code present, not run."""
    got, want = _emulate("bf16", 64, False, what=-1)
    assert np.array_equal(got, want)


@pytest.mark.parametrize("what,name", [(1, "A registers"), (2, "accumulator registers")])
def test_writing_the_operand_registers_before_the_wait_is_an_error(what, name):
    """The device may read a wgmma's A registers and accumulator at any time
    until the wait that completes it: a thread that writes them in between
    is reported (here after the commit, before ``wgmma.wait_group``)."""
    with pytest.raises(EMU.EmulatorError, match=f"wrote its {name} after issuing it") as info:
        _emulate("bf16", 64, False, what=what)
    assert info.value.code == 10  # the asynchronous protocol's code


#: ptxas's notes that it fenced or waited where the source did not (a
#: register of a wgmma written after the fence, or read before the wait)
INJECTED = ("C7517", "C7519", "C7520")


def test_the_register_a_wrapper_compiles_for_sm90a():
    """The device text: the register-A operand list (four A registers, the
    ``b`` descriptor, ``scale-d`` and three immediates -- no ``imm-trans-a``),
    assembled by ptxas for sm_90a, which adds no fence or wait of its own."""
    for dt, n, kb in [("bf16", 64, False), ("f16", 128, True)]:
        text = "\n".join(wgmma_wrapper(dt, n, kb, ra=True))
        r = n // 2
        assert f"TN_FN void {wgmma_name(dt, n, kb, True)}(float* d, const unsigned* a, " \
               "tn_u64 db, int sd)" in text
        assert f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{dt}.{dt} " in text
        assert (f"{{%{r}, %{r + 1}, %{r + 2}, %{r + 3}}}, %{r + 4}, p, 1, 1, "
                f"{0 if kb else 1};") in text
        assert f"setp.ne.b32 p, %{r + 5}, 0;" in text
        built = compile_cuda(_source(dt, n, kb), "ra_mma.cu", arch=ARCH,
                             include_dirs=prelude_dirs(), want_ptx=True, cache=False)
        assert built.cubin and built.ptx is not None
        assert not any(code in built.log for code in INJECTED), built.log
        assert len(re.findall(rf"wgmma\.mma_async\.sync\.aligned\.m64n{n}k16\.f32\.{dt}\.{dt}"
                              r"\s*\{[^}]*\},\s*\{%r\d+, %r\d+, %r\d+, %r\d+\},\s*%rd\d+,"
                              rf"\s*p, 1, 1, {0 if kb else 1};", built.ptx)) == K // 16


def test_fp8_operands_have_no_register_a_wrapper():
    with pytest.raises(NotAvailableError, match="FP8"):
        wgmma_wrapper("e4m3_e4m3", 64, True, ra=True)


@pytest.mark.device
@pytest.mark.parametrize("dt,n,kb", SHAPES, ids=IDS)
def test_register_a_wgmma_on_the_gpu(dt, n, kb, tmp_path):
    """On a CUDA GPU: the hand kernel's product equals numpy's (the PTX
    operand list and the register fragment as the hardware has them)."""
    if not cuda.gpu_available():
        pytest.fail("no usable CUDA GPU (CuPy and a driver are needed)")
    import cupy as cp

    built = compile_cuda(_source(dt, n, kb), "ra_mma.cu", arch=ARCH,
                         include_dirs=prelude_dirs(), cache=False)
    path = tmp_path / "ra_mma.cubin"
    path.write_bytes(built.cubin)
    fn = cp.RawModule(path=str(path)).get_function("ra_mma")
    a, img, c, want = _operands(dt, n, kb, seed=3)
    out = cp.asarray(c)
    fn((1,), (128,), (cp.asarray(a), cp.asarray(img), out, np.int32(0)),
       shared_mem=2 * K * n + 1024)
    assert np.array_equal(cp.asnumpy(out), want)


# ------------------------------------------------------------------ group_mma's emission
def _in_registers(k: L.Kernel) -> L.Kernel:
    """``k`` with each warpgroup mma's ``a`` read from a lane fragment (a new
    ``local`` buffer of ``k/2`` cells per thread) that the mma's threads fill
    from its shared tile just before it: cell ``4 q + 2 h + e`` holds the
    element ``loopir.lane_cell`` gives the lane."""
    frags: list[L.Buffer] = []

    def fs(st):  # type: ignore[no-untyped-def]
        if not (isinstance(st, L.WarpMma) and st.group == 4):
            return None
        frag = L.Buffer(f"%afrag{len(frags)}", st.a.buf.dtype, "local", E.Const(st.k // 2))
        frags.append(frag)
        vs = [L.LVar(f"{st.tag}.f{x}", L.INDEX) for x in "qhe"]
        q, h, e = (E.Var(v.name) for v in vs)
        i, j = L.lane_cell(st.lane, E.Const(0), q, h, e, group=4)
        body: tuple = (L.Store(frag, L.IExpr(L.frag_cell(E.Const(0), q, h, e, st.k)),
                               L.Load(st.a.buf, L.IExpr(st.a.at(i, j)))),)
        for v, ext in reversed(list(zip(vs, (st.k // 8, 2, 2)))):
            body = (L.For(v, E.Const(0), E.Const(ext), body),)
        a = L.Frag(frag, E.Const(0), 0, 0, lane_cols=st.k, lane_period=64)
        return (*body, replace(st, a=a))

    phases = tuple(replace(ph, body=L.map_stmts(ph.body, lambda x: None, fs)) for ph in k.phases)
    return replace(k, phases=phases, locals=k.locals + tuple(frags))


@pytest.fixture
def register_a(monkeypatch):
    """The CUDA backend compiles the lowered kernel rewritten by
    :func:`_in_registers` (compile with ``cache=False``: the result is kept
    neither in memory nor on disk, where it would stand for the program)."""
    real = cuda.lower_verified
    monkeypatch.setattr(cuda, "lower_verified", lambda *a, **kw: _in_registers(real(*a, **kw)))
    monkeypatch.setattr(cuda, "_store", lambda *a, **kw: None)


def _gemm(bm, bn, bk, dt=tn.bf16):  # type: ignore[no-untyped-def]
    from tilenest.workloads import WORKLOADS

    return WORKLOADS["gemm"].kernel(dt, {"bm": bm, "bn": bn, "bk": bk, "loop": "pipeline"})


def _sched(kern, **kw):  # type: ignore[no-untyped-def]
    return default_schedule(kern.program, "cuda", mma_unit="wgmma", **kw)


def _validate(kern, ck, M, K_, N, dt, policy="random"):  # type: ignore[no-untyped-def]
    """The emulated GEMM ``ck`` against the oracle on seeded inputs."""
    rng = np.random.default_rng(7)
    A = rng.standard_normal((M, K_)).astype(dt.np)
    B = rng.standard_normal((K_, N)).astype(dt.np)
    oracle = tn.reference(kern, A, B, np.zeros((M, N), dt.np))
    C = np.zeros((M, N), dt.np)
    ck(A, B, C, policy=policy, poison="nan", seed=5)
    v = oracle.admits(C)
    assert v.ok, str(v)


@pytest.mark.parametrize("dt,tile,threads", [(tn.bf16, (64, 128, 64), 128),
                                             (tn.f16, (128, 64, 64), 256)],
                         ids=["bf16-64x128", "f16-128x64"])
def test_group_mma_reads_a_lane_fragment_from_registers(register_a, dt, tile, threads):
    """``group_mma`` of a 16-bit ``a`` lane fragment: no ``a`` descriptor;
    the steps' registers packed from the thread's cells (step ``kk``: from
    ``offset + 8 kk``) into an array of the phase, then the fence, then one
    wrapper call per step; compiled by NVRTC for sm_90a (the wrapper's device
    text included) with no fence or wait of ptxas's own, and run emulated
    against the oracle (ragged sizes)."""
    kern = _gemm(*tile, dt=dt)
    ck = cuda.compile_program(kern.program, _sched(kern, stages=2, block_threads=threads),
                              device="emulated", cache=False)
    text = ck.source.text
    (w,) = [s for ph in ck.kernel.phases for s in L.walk(ph.body) if isinstance(s, L.WarpMma)]
    assert w.a.lane_cols == 64 and w.group == 4
    fn = wgmma_name(dt.name, w.n, False, True)
    steps = re.findall(rf"{fn}\(&\w+\[[^\]]*\], (mma_\w+)_ra\[(\d+)\], "
                       r"tn_wgmma_desc_at\(\1_b, (\d+)u\), 1\);", text)
    assert [(int(j), int(bo)) for _, j, bo in steps] == [(j, 2048 * j) for j in range(4)]
    u = steps[0][0]
    assert f"#define {fn}(d, a, db, sd) do {{ if (!(sd)) " in text
    assert "tn_emu::wgmma_ra_at(__LINE__, " in text
    assert "_a = tn_wgmma_desc(" not in text
    # the phase's array of the steps' registers, all packed before the fence
    assert f"unsigned {u}_ra[4][4];" in text
    pack = (f"{u}_ra[{u}_i / 4][{u}_i % 4] = (unsigned)tn_get16(b__afrag0[{u}_oa + 2 * {u}_i]) "
            f"| ((unsigned)tn_get16(b__afrag0[{u}_oa + 2 * {u}_i + 1]) << 16);")
    head = text[:text.index(f"{fn}(&")].rstrip().splitlines()
    assert [ln.strip() for ln in head[-2:]] == [pack, "tn_wgmma_fence();"]
    assert ck.built.cubin and not any(code in ck.built.log for code in INJECTED), ck.built.log
    _validate(kern, ck, tile[0] + 9, 3 * tile[2] + 5, tile[1] + 13, dt)


def test_group_mma_register_a_with_a_k_major_b(register_a):
    """``x @ W^T`` (``b`` stored ``n x k``): the ``_ra_kb`` wrapper, ``b``'s
    steps 32 bytes apart in its panel row."""
    from tilenest.bench.kernels import fp8_gemm_kernel

    kern = fp8_gemm_kernel(tn.bf16, tn.bf16, tn.bf16).specialize(bm=128, bn=128, bk=64)
    ck = cuda.compile_program(kern.program, _sched(kern, stages=2), device="emulated",
                              cache=False)
    text = ck.source.text
    assert "tn_wgmma_bf16_n128_ra_kb(" in text and "p, 1, 1, 0;" in text
    rng = np.random.default_rng(2)
    M, K_, N = 137, 200, 150
    A = rng.standard_normal((M, K_)).astype(tn.bf16.np)
    W = rng.standard_normal((N, K_)).astype(tn.bf16.np)
    one = np.float32(1.0)
    oracle = tn.reference(kern, A, W, np.zeros((M, N), tn.bf16.np), one, one)
    C = np.zeros((M, N), tn.bf16.np)
    ck(A, W, C, one, one, policy="random", poison="nan", seed=2)
    v = oracle.admits(C)
    assert v.ok, str(v)


@pytest.mark.device
def test_group_mma_register_a_on_the_gpu(register_a):
    """On a CUDA GPU: the rewritten bf16 GEMM over the validator's shape classes."""
    if not cuda.gpu_available():
        pytest.fail("no usable CUDA GPU (CuPy and a driver are needed)")
    kern = _gemm(128, 128, 64)
    ck = cuda.compile_program(kern.program, _sched(kern, stages=2), device="gpu", cache=False)
    assert "_ra(" in ck.source.text
    rep = tn.validate(kern, "cuda", compiled=ck, cases=8, seed=4)
    assert rep.ok and rep.count("ok") == 8, rep.summary()


def test_repacking_the_registers_of_a_running_register_a_wgmma_is_caught(register_a):
    """An overlapped mma (three stages) completes at the next iteration's
    barrier, after that iteration has packed its A registers anew: the
    emulator reports the write."""
    kern = _gemm(128, 128, 64)
    ck = cuda.compile_program(kern.program, _sched(kern, stages=3), device="emulated",
                              cache=False)
    assert "tn_wgmma_wait<1>();" in ck.source.text
    with pytest.raises(TilenestError, match="wrote its A registers"):
        _validate(kern, ck, 128, 256, 128, tn.bf16, policy="in_order")


def test_fp8_a_in_registers_is_refused(register_a):
    from tilenest.bench.kernels import fp8_gemm_kernel

    kern = fp8_gemm_kernel(tn.f32, tn.f8e4m3fn, tn.f8e4m3fn).specialize(bm=128, bn=128, bk=128)
    with pytest.raises(NotAvailableError, match="FP8") as info:
        cuda.compile_program(kern.program, _sched(kern, stages=2), device="emulated",
                             cache=False)
    assert info.value.hint
