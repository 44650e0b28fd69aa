"""The SIMT host emulator: generated-style CUDA sources compiled as host C++
against the shim, run under every interleaving policy, with the faults it must
report (wrong masks, divergent barriers, stage-reuse races) and a TSan build."""

from __future__ import annotations

import platform
import shutil
import subprocess

import numpy as np
import pytest

from tilenest.backends.simt import emulator as em
from tilenest.errors import TilenestError

# A block-wide sum: warp butterflies, then one partial per warp in shared
# memory, then warp 0 reduces the partials. The barrier orders the partials'
# writes before warp 0 reads them.
REDUCE = r"""
extern "C" __global__ void __launch_bounds__(256) block_sum(const float* __restrict__ x,
                                                          float* __restrict__ out,
                                                          long long n, int* tn_status) {
  extern __shared__ __align__(16) unsigned char tn_smem[];
  float* part = reinterpret_cast<float*>(tn_smem + 0);
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  float v = i < n ? x[i] : 0.0f;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if ((threadIdx.x & 31u) == 0) part[threadIdx.x >> 5] = v;  // @write
  __syncthreads();  // @barrier
  if (threadIdx.x < 32) {
    float w = threadIdx.x < (blockDim.x >> 5) ? part[threadIdx.x] : 0.0f;  // @read
    for (int o = 16; o > 0; o >>= 1) w = __fadd_rn(w, __shfl_xor_sync(0xffffffffu, w, o));
    if (threadIdx.x == 0) out[blockIdx.x] = w;
  }
}
"""
REDUCE_TYPES = {"block_sum": ["const float*", "float*", "long long", "int*"]}
DROPPED = REDUCE.replace("__syncthreads();  // @barrier", "/* barrier dropped */")

WRONG_MASK = r"""
extern "C" __global__ void warp_sum(const float* x, float* out) {
  float v = x[threadIdx.x];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0x0000ffffu, v, o);  // @shfl
  if (threadIdx.x == 0) out[0] = v;
}
"""

DIVERGENT = r"""
extern "C" __global__ void divergent(float* out) {
  extern __shared__ __align__(16) unsigned char tn_smem[];
  float* s = reinterpret_cast<float*>(tn_smem);
  s[threadIdx.x] = (float)threadIdx.x;
  if (threadIdx.x < 16) __syncthreads();  // @barrier
  out[threadIdx.x] = s[31 - threadIdx.x];
}
"""

# Two stages in flight: stage k lives in buf[k % 2]; after consuming stage k a
# thread refills buf[k % 2] with stage k + 2. The trailing barrier keeps the
# refill from overwriting a stage other threads still read; the first refill
# that matters happens when there are at least 3 stages.
STAGES = r"""
extern "C" __global__ void staged(const float* x, float* out, int stages) {
  extern __shared__ __align__(16) unsigned char tn_smem[];
  const int n = blockDim.x, t = threadIdx.x;
  float* buf = reinterpret_cast<float*>(tn_smem);      // buf[2][n]
  buf[t] = x[t];
  if (stages > 1) buf[n + t] = x[n + t];
  float acc = 0.0f;
  for (int k = 0; k < stages; ++k) {
    __syncthreads();
    float* cur = buf + (k % 2) * n;
    acc += cur[(t + 1) % n] * (float)(k + 1);
    __syncthreads();  // @trailing
    if (k + 2 < stages) cur[t] = x[(k + 2) * n + t];
  }
  out[t] = acc;
}
"""
STAGES_DROPPED = STAGES.replace("__syncthreads();  // @trailing", "/* trailing barrier dropped */")

IOTA_A = r"""
extern "C" __global__ void iota_a(int* out) {
  out[blockIdx.x * blockDim.x + threadIdx.x] = 1000 * (int)blockIdx.x + (int)threadIdx.x;
}
"""
IOTA_B = r"""
extern "C" __global__ void iota_b(int* out, int scale) {
  extern __shared__ __align__(16) unsigned char tn_smem[];
  int* s = reinterpret_cast<int*>(tn_smem);
  s[threadIdx.x] = scale * (int)threadIdx.x;
  __syncthreads();
  out[blockIdx.x * blockDim.x + threadIdx.x] = s[blockDim.x - 1 - threadIdx.x] + (int)gridDim.x;
}
"""

POISON_READ = r"""
extern "C" __global__ void read_unwritten(float* out) {
  extern __shared__ __align__(16) unsigned char tn_smem[];
  out[threadIdx.x] = reinterpret_cast<float*>(tn_smem)[threadIdx.x];
}
"""

DEEP = r"""
__device__ __noinline__ float deep(int d, volatile float* p) {
  volatile float local[512];
  for (int i = 0; i < 512; ++i) local[i] = p[0] + i;
  return d == 0 ? local[7] : deep(d - 1, p) + local[d % 512];
}
extern "C" __global__ void overflow(float* out) { out[threadIdx.x] = deep(1000, out); }
"""

SHUFFLES = r"""
extern "C" __global__ void shuffles(const int* x, int* out) {
  const unsigned l = threadIdx.x;
  int v = x[l];
  out[0 * 32 + l] = __shfl_sync(0xffffffffu, v, 3, 16);
  out[1 * 32 + l] = __shfl_up_sync(0xffffffffu, v, 2, 16);
  out[2 * 32 + l] = __shfl_down_sync(0xffffffffu, v, 2, 16);
  out[3 * 32 + l] = __shfl_xor_sync(0xffffffffu, v, 5);
  out[4 * 32 + l] = (int)__ballot_sync(0xffffffffu, v & 1);
  out[5 * 32 + l] = __all_sync(0xffffffffu, v > 0) + 2 * __any_sync(0xffffffffu, v > 90);
  out[6 * 32 + l] = (int)__double_as_longlong(__shfl_down_sync(0xffffffffu, (double)v, 1));
}
"""

# Lane 0 waits at the barrier while the other lanes wait for it in a shuffle.
DEADLOCK = r"""
extern "C" __global__ void stuck(float* out) {
  float v = out[threadIdx.x];
  if (threadIdx.x == 0) __syncthreads();
  else v = __shfl_sync(0xffffffffu, v, 0);  // @shfl
  out[threadIdx.x] = v;
}
"""

INTER_BLOCK = r"""
extern "C" __global__ void bump(int* counter, int use_atomic) {
  if (threadIdx.x == 0) {
    if (use_atomic) atomicAdd(counter, 1);
    else counter[0] += 1;  // @bump
  }
}
"""


def line_of(source: str, marker: str) -> int:
    """1-based line of the source that carries ``marker``."""
    hits = [i + 1 for i, ln in enumerate(source.splitlines()) if marker in ln]
    assert len(hits) == 1, marker
    return hits[0]


@pytest.fixture(scope="module")
def reduce_mod():
    return em.build(REDUCE, REDUCE_TYPES)


@pytest.fixture(scope="module")
def dropped_mod():
    return em.build(DROPPED, REDUCE_TYPES)


@pytest.fixture(scope="module")
def reduce_input():
    rng = np.random.default_rng(7)
    x = rng.standard_normal(3 * 256).astype(np.float32)
    return x, x.reshape(3, 256).astype(np.float64).sum(axis=1)


def run_reduce(mod, x, policy, seed=0, poison="nan"):
    out = np.zeros(3, np.float32)
    status = np.zeros(1, np.int32)
    mod.launch("block_sum", (3,), (256,), [x, out, x.size, status], shared_bytes=8 * 4,
               policy=policy, seed=seed, poison=poison)
    return out


def test_kernel_signatures_are_read_from_the_source():
    assert em.parse_kernels(REDUCE) == {
        "block_sum": ["const float * __restrict__", "float * __restrict__", "long long", "int *"]}
    assert em.parse_kernels(IOTA_B) == {"iota_b": ["int *", "int"]}


@pytest.mark.parametrize("policy", em.POLICIES)
def test_block_reduction_is_right_under_every_policy(reduce_mod, reduce_input, policy):
    x, ref = reduce_input
    for seed in (0, 1):
        out = run_reduce(reduce_mod, x, policy, seed)
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-4)


def test_dropped_barrier_is_detected_by_some_policy(dropped_mod, reduce_input):
    x, ref = reduce_input
    wrong = []
    for policy in em.POLICIES:
        for poison in em.POISONS:
            out = run_reduce(dropped_mod, x, policy, seed=1, poison=poison)
            if not np.allclose(out, ref, rtol=1e-5, atol=1e-4):
                wrong.append((policy, poison))
    assert wrong, "no policy exposes the missing __syncthreads()"
    assert ("in_order", "nan") in wrong  # warp 0 reads the other warps' partials unwritten


def test_wrong_shuffle_mask_is_an_emulator_error():
    mod = em.build(WRONG_MASK)
    x = np.ones(32, np.float32)
    out = np.zeros(1, np.float32)
    with pytest.raises(em.EmulatorError) as ei:
        mod.launch("warp_sum", (1,), (32,), [x, out], policy="in_order")
    e = ei.value
    assert isinstance(e, TilenestError)
    assert e.what == "warp collective mask mismatch"
    assert e.line == line_of(WRONG_MASK, "@shfl")
    assert e.thread[0] >= 16 and "0x0000ffff" in str(e) and "warp_sum" in str(e)
    assert e.hint


@pytest.mark.parametrize("policy", em.POLICIES)
def test_divergent_barrier_is_reported_not_hung(policy):
    mod = em.build(DIVERGENT)
    out = np.zeros(32, np.float32)
    with pytest.raises(em.EmulatorError) as ei:
        mod.launch("divergent", (1,), (32,), [out], shared_bytes=128, policy=policy, seed=5)
    assert ei.value.what == "divergent barrier"
    assert ei.value.line == line_of(DIVERGENT, "@barrier")


def run_stages(mod, stages, policy, seed=0):
    n = 64
    x = np.arange(stages * n, dtype=np.float32) % 17 + 1
    out = np.zeros(n, np.float32)
    mod.launch("staged", (1,), (n,), [x, out, stages], shared_bytes=2 * n * 4, policy=policy,
               seed=seed)
    ref = sum((k + 1) * np.roll(x[k * n:(k + 1) * n], -1) for k in range(stages))
    return out, ref


def test_stage_reuse_race_is_caught_and_needs_three_stages():
    good = em.build(STAGES)
    bad = em.build(STAGES_DROPPED)
    for policy in em.POLICIES:
        out, ref = run_stages(good, 4, policy, seed=2)
        np.testing.assert_array_equal(out, ref)
        out, ref = run_stages(bad, 2, policy, seed=2)  # no refill: the dropped barrier is moot
        np.testing.assert_array_equal(out, ref)
    caught = [p for p in em.POLICIES if not np.array_equal(*run_stages(bad, 3, p, seed=2))]
    assert caught, "no policy exposes the refill that overwrites a stage still being read"


def test_two_libraries_do_not_share_the_shims_globals():
    a = em.build(IOTA_A)
    b = em.build(IOTA_B)
    assert a.path != b.path
    assert a.state_address() != b.state_address()
    assert a.smem_address() != b.smem_address()
    for _ in range(2):
        oa = np.zeros(2 * 32, np.int32)
        ob = np.zeros(3 * 64, np.int32)
        a.launch("iota_a", (2,), (32,), [oa])
        b.launch("iota_b", (3,), (64,), [ob, 5], shared_bytes=256, policy="random", seed=9)
        np.testing.assert_array_equal(oa, [1000 * (i // 32) + i % 32 for i in range(64)])
        np.testing.assert_array_equal(ob, [5 * (63 - i % 64) + 3 for i in range(192)])
    nm = shutil.which("nm")
    if nm:
        for mod in (a, b):
            table = subprocess.run([nm, "-D", "--defined-only", str(mod.path)], check=True,
                                   capture_output=True, text=True).stdout
            exported = {ln.split()[-1] for ln in table.splitlines() if ln.strip()}
            assert exported and all(s.startswith("tn_emu_") for s in exported), exported


@pytest.mark.parametrize(("poison", "check"), [
    ("nan", np.isnan), ("big", lambda v: v == np.finfo(np.float32).max),
    ("bytes", lambda v: v.view(np.uint32) == 0xA5A5A5A5)])
def test_shared_memory_is_poisoned_before_each_block(poison, check):
    mod = em.build(POISON_READ)
    out = np.zeros(32, np.float32)
    mod.launch("read_unwritten", (2,), (32,), [out], shared_bytes=128, poison=poison)
    assert check(out).all()


def test_fiber_stack_overflow_is_reported():
    mod = em.build(DEEP)
    out = np.zeros(2, np.float32)
    with pytest.raises(em.EmulatorError) as ei:
        mod.launch("overflow", (1,), (2,), [out], stack_size=32 * 1024)
    assert ei.value.what == "fiber stack overflow"


def test_bad_arguments_are_launch_errors(reduce_mod, reduce_input):
    x, _ = reduce_input
    out = np.zeros(3, np.float64)  # wrong dtype for float*
    with pytest.raises(em.LaunchError):
        reduce_mod.launch("block_sum", (3,), (256,), [x, out, x.size, np.zeros(1, np.int32)])
    with pytest.raises(em.LaunchError):
        reduce_mod.launch("block_sum", (3,), (256,), [x, np.zeros(3, np.float32), x.size,
                                                      np.zeros(1, np.int32)], policy="sideways")
    with pytest.raises(em.EmulatorBuildError):
        em.build("extern \"C\" __global__ void k(float* p) { p[0] = undefined_name; }")


def test_shuffle_variants_follow_cuda_semantics():
    mod = em.build(SHUFFLES)
    x = np.array([7, 12, 3, 8, 5, 10, 1, 20, 4, 9, 2, 99, 6, 11, 13, 15,
                  17, 19, 21, 23, 25, 27, 29, 31, 33, 35, 37, 39, 41, 43, 45, 47], np.int32)
    out = np.zeros(7 * 32, np.int32)
    mod.launch("shuffles", (1,), (32,), [x, out], policy="random", seed=4)
    lanes = np.arange(32)
    seg, i = lanes & ~15, lanes & 15
    np.testing.assert_array_equal(out[0:32], x[seg + 3])
    np.testing.assert_array_equal(out[32:64], np.where(i < 2, x, x[np.maximum(lanes - 2, 0)]))
    np.testing.assert_array_equal(out[64:96], np.where(i + 2 >= 16, x, x[np.minimum(lanes + 2, 31)]))
    np.testing.assert_array_equal(out[96:128], x[lanes ^ 5])
    ballot = np.uint32(sum(1 << k for k in range(32) if x[k] & 1)).astype(np.int32)
    np.testing.assert_array_equal(out[128:160], ballot)
    np.testing.assert_array_equal(out[160:192], 1 + 2)
    as_double = np.where(lanes < 31, x[np.minimum(lanes + 1, 31)], x).astype(np.float64)
    np.testing.assert_array_equal(out[192:224], as_double.view(np.int64).astype(np.int32))


def test_barrier_against_shuffle_is_a_deadlock_error():
    mod = em.build(DEADLOCK)
    with pytest.raises(em.EmulatorError) as ei:
        mod.launch("stuck", (1,), (32,), [np.zeros(32, np.float32)], policy="reversed")
    assert ei.value.what == "deadlock"


needs_tsan = pytest.mark.skipif(not em.tsan_available(),
                                reason="the host compiler has no libtsan (g++ -print-file-name)")


@needs_tsan
def test_tsan_reports_the_dropped_barrier_with_its_lines(reduce_input):
    x = reduce_input[0][:256].copy()
    out = np.zeros(1, np.float32)
    rep = em.run_tsan(DROPPED, "block_sum", (1,), (256,), [x, out, 256, np.zeros(1, np.int32)],
                      kernels=REDUCE_TYPES, shared_bytes=32)
    assert rep.error is None
    assert rep.races, rep.log[-2000:]
    lines = {ln for r in rep.races for ln in r.lines}
    assert {line_of(DROPPED, "@write"), line_of(DROPPED, "@read")} <= lines
    assert all(r.space == "shared" for r in rep.races)
    assert "block (0,0,0) thread" in rep.races[0].current.thread


@needs_tsan
def test_tsan_is_clean_on_the_correct_reduction(reduce_input):
    x, ref = reduce_input
    out = np.zeros(3, np.float32)
    rep = em.run_tsan(REDUCE, "block_sum", (3,), (256,), [x, out, x.size, np.zeros(1, np.int32)],
                      kernels=REDUCE_TYPES, shared_bytes=32, policy="random", seed=3)
    assert rep.clean, rep.log[-3000:]
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-4)  # results come back in place


@needs_tsan
def test_tsan_sees_blocks_race_on_global_memory_but_not_atomics():
    counter = np.zeros(1, np.int32)
    rep = em.run_tsan(INTER_BLOCK, "bump", (2,), (32,), [counter, 0])
    assert [r.lines for r in rep.races] == [(line_of(INTER_BLOCK, "@bump"),) * 2]
    assert rep.races[0].space == "global"
    assert {rep.races[0].current.thread, rep.races[0].previous.thread} == {
        "block (0,0,0) thread (0,0,0)", "block (1,0,0) thread (0,0,0)"}
    rep = em.run_tsan(INTER_BLOCK, "bump", (2,), (32,), [counter, 1])
    assert rep.clean, rep.log[-2000:]
    assert counter[0] == 4


def test_include_dirs_are_searched_and_a_changed_header_rebuilds(tmp_path):
    src = '#include "tn_prelude.cuh"\n' \
          'extern "C" __global__ void k(int* out) { out[threadIdx.x] = TN_VALUE; }\n'
    out = np.zeros(4, np.int32)
    (tmp_path / "tn_prelude.cuh").write_text("#define TN_VALUE 11\n")
    em.build(src, include_dirs=[tmp_path]).launch("k", 1, 4, [out])
    assert (out == 11).all()
    (tmp_path / "tn_prelude.cuh").write_text("#define TN_VALUE 12\n")
    em.build(src, include_dirs=[tmp_path]).launch("k", 1, 4, [out])
    assert (out == 12).all()


# CUDA's fast-math intrinsics, which the shim maps to the accurate functions
FAST_MATH = r"""
extern "C" __global__ void fast_math(const float* __restrict__ x, float* __restrict__ out) {
  const float v = x[threadIdx.x];
  float* o = out + 9 * threadIdx.x;
  o[0] = __expf(v); o[1] = __exp10f(v); o[2] = __logf(v); o[3] = __log2f(v);
  o[4] = __log10f(v); o[5] = __sinf(v); o[6] = __cosf(v); o[7] = __tanf(v);
  o[8] = __powf(v, 1.5f);
}
"""


def test_fast_math_intrinsics_load_and_give_the_accurate_functions():
    """A module calling ``__expf`` and its kin loads (glibc declares those names
    but exports none of them) and each gives the accurate function."""
    mod = em.build(FAST_MATH)
    x = np.array([0.5, 1.0, 2.25, 7.0], np.float32)
    out = np.full(9 * x.size, np.nan, np.float32)
    mod.launch("fast_math", (1, 1, 1), (x.size, 1, 1), [x, out])
    d = x.astype(np.float64)
    want = np.stack([np.exp(d), 10.0**d, np.log(d), np.log2(d), np.log10(d), np.sin(d),
                     np.cos(d), np.tan(d), d**1.5], axis=1).ravel()
    np.testing.assert_allclose(out, want, rtol=1e-6)


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"),
                    reason="the register-only fiber switch is x86-64's")
def test_fibers_switch_without_swapcontext():
    """On x86-64 the fibers switch stacks with tn_switch (registers only):
    swapcontext makes a system call for the signal mask at every switch,
    which took about a third of an emulated launch. The built library does
    not import it (nor setcontext, which the fault path used)."""
    mod = em.build("__global__ void k(float* y) { y[threadIdx.x] = 1.0f; }")
    out = subprocess.run(["nm", "-D", "--undefined-only", str(mod.path)], capture_output=True,
                         text=True, check=True).stdout
    assert "makecontext" not in out and "swapcontext" not in out and "setcontext" not in out
    y = np.zeros(64, np.float32)
    mod.launch("k", 1, 64, [y], policy="random", seed=1)
    assert (y == 1).all()
