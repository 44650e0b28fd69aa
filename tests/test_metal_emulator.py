"""The emulator runs Metal Shading Language kernels (the ``metal`` dialect).

Hand-written kernels in the convention of generated MSL -- tensor buffers,
then the constant struct of :func:`tilenest.backends.metal.arguments.layout`,
the status word, the threadgroup memory and the five built-in parameters --
are compiled as host C++ against ``tn_metal_shim.h`` with NVRTC made
unusable, and run under every interleaving policy and poison. Each check of
the emulator has a mutation it catches: a dropped ``threadgroup_barrier``
(a wrong answer under some policy, and a race under ThreadSanitizer), a
wrong ``simd_shuffle_xor`` partner, a divergent barrier, a lane that leaves
its simdgroup in a ``simd_sum``, a launch beyond the metal profile.
"""

from __future__ import annotations

import re
import types

import numpy as np
import pytest

from tilenest.backends.metal import arguments
from tilenest.backends.simt import emulator as em
from tilenest.backends.simt.emu_dialects import METAL, dialect
from tilenest.semantics import dtypes as D
from tilenest.targets import profile

THREADS = 64  # two simdgroups


def _layout() -> arguments.ArgumentLayout:
    """The argument layout of a row sum ``out[r] = sum(x[r, :])`` over ``n`` columns."""
    g = types.SimpleNamespace
    kernel = g(name="rowsum", syms=["n"], params=[],
               globals=[g(name="x", dtype=D.f32, space="global", arg=0),
                        g(name="out", dtype=D.f32, space="global", arg=1)])
    return arguments.layout(kernel, {"out"}, arguments=2)


LAYOUT = _layout()
STRUCT, PARAMS = LAYOUT.msl_struct()
BUILTINS = """threadgroup uchar* tn_smem [[threadgroup(0)]],
    uint3 tn_tgpos [[threadgroup_position_in_grid]],
    uint3 tn_tpos [[thread_position_in_threadgroup]],
    uint3 tn_tgsize [[threads_per_threadgroup]],
    uint tn_lane [[thread_index_in_simdgroup]],
    uint tn_simd [[simdgroup_index_in_threadgroup]]"""

#: one threadgroup per row: strided partial sums, simd_sum per simdgroup, the
#: simdgroups' sums through threadgroup memory, thread 0 adds them; a row
#: longer than 4096 columns stores status code 3
ROWSUM = """using namespace metal;
{struct}
kernel void rowsum({params},
    {builtins}) {{
  threadgroup float* part = (threadgroup float*)tn_smem;
  const long n = tn_args.s_n;
  if (n > 4096) {{
    int expected = 0;
    atomic_compare_exchange_weak_explicit(tn_status, &expected, 3, memory_order_relaxed,
                                          memory_order_relaxed);
    return;
  }}
  float acc = 0.0f;
  for (long j = tn_tpos.x; j < n; j += tn_tgsize.x) acc += b_x[tn_tgpos.x * n + j];
  float s = simd_sum(acc);
  if (tn_lane == 0) part[tn_simd] = s;
  {barrier}
  if (tn_tpos.x == 0) {{
    float t = 0.0f;
    for (uint w = 0; w < (tn_tgsize.x + 31) / 32; ++w) t += part[w];
    b_out[tn_tgpos.x] = t;
  }}
}}
"""
BARRIER = "threadgroup_barrier(mem_flags::mem_threadgroup);"


def rowsum_source(barrier: str = BARRIER) -> str:
    return ROWSUM.format(struct=STRUCT, params=PARAMS, builtins=BUILTINS, barrier=barrier)


def _rows(rows: int = 3, n: int = 100) -> np.ndarray:
    # small integers: every order of summation gives the same float
    return (np.arange(rows * n, dtype=np.float32).reshape(rows, n) * 7 % 13) - 6


def _run(mod, x: np.ndarray, **kw) -> tuple[np.ndarray, np.ndarray]:
    out = np.zeros(x.shape[0], np.float32)
    status = np.zeros(1, np.int32)
    args = [x, out, LAYOUT.pack({}, {"n": x.shape[1]}), status]
    mod.launch("rowsum", x.shape[0], THREADS, args, shared_bytes=8, **kw)
    return out, status


def _line(source: str, text: str) -> int:
    return next(i for i, ln in enumerate(source.splitlines(), 1) if text in ln)


def test_the_metal_dialect_takes_the_metal_profile():
    p = profile("metal")
    assert dialect("metal") is METAL
    assert (METAL.limits.lanes, METAL.limits.max_threads, METAL.limits.shared_bytes) == \
        (p.lanes, p.max_threads, p.shared_bytes) == (32, 1024, 32 * 1024)


def test_parameters_split_into_arguments_and_builtins():
    kernels = em.parse_kernels(rowsum_source(), "metal")
    assert kernels["rowsum"] == [
        "const device float *", "device float *", "constant tn_args_rowsum&",
        "device atomic_int *", "threadgroup uchar * [[threadgroup(0)]]",
        "uint3 [[threadgroup_position_in_grid]]", "uint3 [[thread_position_in_threadgroup]]",
        "uint3 [[threads_per_threadgroup]]", "uint [[thread_index_in_simdgroup]]",
        "uint [[simdgroup_index_in_threadgroup]]"]
    # a word ending in the marker is no kernel
    assert em.parse_kernels("void my_kernel(int* a) { }\n", "metal") == {}


def test_row_sum_under_every_policy_and_poison(no_nvrtc):
    mod = em.build(rowsum_source(), dialect="metal")
    assert mod.dialect is METAL and mod.limits == METAL.limits
    x = _rows()
    for policy in em.POLICIES:
        for k, poison in enumerate(em.POISONS):
            out, status = _run(mod, x, policy=policy, poison=poison, seed=k + 1,
                               block_order="shuffle")
            np.testing.assert_array_equal(out, x.sum(axis=1), err_msg=f"{policy} {poison}")
            assert status[0] == 0


def test_a_dropped_barrier_gives_a_wrong_answer_under_some_policy(no_nvrtc):
    mod = em.build(rowsum_source(barrier=""), dialect="metal")
    x = _rows()
    wrong = set()
    for policy in em.POLICIES:
        for poison in em.POISONS:
            out, _ = _run(mod, x, policy=policy, poison=poison)
            if not np.array_equal(out, x.sum(axis=1)):
                wrong.add((policy, poison))
    # thread 0 reads the second simdgroup's slot before it is written
    assert ("in_order", "nan") in wrong and ("in_order", "big") in wrong


def test_the_status_word_reaches_the_caller(no_nvrtc):
    mod = em.build(rowsum_source(), dialect="metal")
    _, status = _run(mod, np.ones((2, 5000), np.float32))
    assert status[0] == 3


def test_a_divergent_barrier_names_kernel_thread_and_line(no_nvrtc):
    src = rowsum_source(barrier="if (tn_tpos.x == 5) return;\n  " + BARRIER)
    mod = em.build(src, dialect="metal")
    with pytest.raises(em.EmulatorError, match=r"threadgroup_barrier\(\)") as info:
        _run(mod, _rows())
    e = info.value
    assert e.code == 1 and e.kernel == "rowsum"
    assert e.line == _line(src, BARRIER)
    assert e.sites and e.sites[0].file == "<metal:rowsum>"
    assert "threadgroup_barrier()" in (e.hint or "")
    assert 5 in (e.thread[0], int(re.search(r"thread (\d+)", str(e)).group(1)))


SHUFFLE = """using namespace metal;
kernel void butterfly(device int* b_out [[buffer(0)]], const device int* b_in [[buffer(1)]],
    uint3 tn_tpos [[thread_position_in_threadgroup]],
    uint tn_lane [[thread_index_in_simdgroup]]) {{
  int v = b_in[tn_tpos.x];
  for (uint m = 16; m >= 1; m /= 2) v += simd_shuffle_xor(v, {partner});
  int w = simd_broadcast(v, 3u);
  b_out[tn_tpos.x] = v * 1000 + (w == v);
}}
"""


#: the last step exchanges with lane ^ 2 again instead of lane ^ 1: the
#: partners no longer span the simdgroup, half of its values are never added
WRONG = "m == 1 ? 2u : m"


def test_a_wrong_shuffle_partner_is_detected(no_nvrtc):
    values = (np.arange(THREADS, dtype=np.int32) * 5) % 17
    want = np.repeat([values[:32].sum(), values[32:].sum()], 32) * 1000 + 1
    outs = {}
    for partner in ("m", WRONG):
        mod = em.build(SHUFFLE.format(partner=partner), dialect="metal")
        for policy in em.POLICIES:
            out = np.zeros(THREADS, np.int32)
            mod.launch("butterfly", 1, THREADS, [out, values], policy=policy, seed=2)
            outs.setdefault(partner, []).append(out)
    for out in outs["m"]:
        np.testing.assert_array_equal(out, want)
    assert all(not np.array_equal(out, want) for out in outs[WRONG])


def test_a_lane_that_leaves_a_simd_sum_is_an_error(no_nvrtc):
    src = """using namespace metal;
kernel void partial(device float* b_out [[buffer(0)]],
    uint tn_lane [[thread_index_in_simdgroup]]) {
  if (tn_lane == 7) return;
  b_out[tn_lane] = simd_sum(1.0f);
}
"""
    mod = em.build(src, dialect="metal")
    for policy in ("in_order", "reversed"):
        with pytest.raises(em.EmulatorError, match="simd_sum") as info:
            mod.launch("partial", 1, 32, [np.zeros(32, np.float32)], policy=policy)
        assert info.value.code == 9 and info.value.line == _line(src, "simd_sum")


def test_simd_reductions_and_as_type(no_nvrtc):
    src = """using namespace metal;
kernel void reds(device float* b_out [[buffer(0)]], const device float* b_in [[buffer(1)]],
    uint3 tn_tpos [[thread_position_in_threadgroup]]) {
  float v = b_in[tn_tpos.x];
  uint i = tn_tpos.x;
  b_out[4 * i] = simd_max(v);
  b_out[4 * i + 1] = simd_min(v);
  b_out[4 * i + 2] = as_type<float>((uint)simd_sum(i));
  b_out[4 * i + 3] = metal::fma(v, 2.0f, metal::exp(0.0f));
}
"""
    mod = em.build(src, dialect="metal")
    v = np.linspace(-3, 5, 32).astype(np.float32)
    out = np.zeros(128, np.float32)
    mod.launch("reds", 1, 32, [out, v], policy="random", seed=5)
    got = out.reshape(32, 4)
    np.testing.assert_array_equal(got[:, 0], v.max())
    np.testing.assert_array_equal(got[:, 1], v.min())
    np.testing.assert_array_equal(got[:, 2].view(np.uint32), sum(range(32)))
    np.testing.assert_array_equal(got[:, 3], v * 2 + 1)


def test_launches_beyond_the_metal_profile_are_refused(no_nvrtc):
    mod = em.build(rowsum_source(), dialect="metal")
    x = _rows(1, 8)
    args = [x, np.zeros(1, np.float32), LAYOUT.pack({}, {"n": 8}), np.zeros(1, np.int32)]
    with pytest.raises(em.EmulatorError, match="at most 1024 threads"):
        mod.launch("rowsum", 1, 1025, args)
    mod.launch("rowsum", 1, 1024, args, shared_bytes=32 * 1024)
    with pytest.raises(em.LaunchError, match=r"outside 0\.\.32768"):
        mod.launch("rowsum", 1, 64, args, shared_bytes=32 * 1024 + 1)
    with pytest.raises(em.LaunchError, match="takes 4 arguments, got 3"):
        mod.launch("rowsum", 1, 64, args[:3])


def test_a_threadgroup_variable_is_refused_not_made_private(no_nvrtc):
    src = """kernel void tile(device float* b_out [[buffer(0)]],
    uint t [[thread_position_in_threadgroup]]) {
  threadgroup float cache[64];
  cache[t] = 1.0f;
  b_out[t] = cache[63 - t];
}
"""
    with pytest.raises(em.EmulatorBuildError, match="threadgroup float cache") as info:
        em.build(src, dialect="metal")
    assert info.value.sites[0].line == 3 and "[[threadgroup(0)]]" in (info.value.hint or "")


def test_a_later_prelude_is_found_on_the_include_path(tmp_path, no_nvrtc):
    """A source that includes the emitter's prelude finds it through
    ``include_dirs``, after the shim (which it may build on)."""
    (tmp_path / "tn_metal.h").write_text(
        "static inline void tn_store_twice(device float* p, float v) { p[0] = 2.0f * v; }\n")
    src = """#include "tn_metal.h"
kernel void twice(device float* b_out [[buffer(0)]], uint t [[thread_position_in_threadgroup]]) {
  tn_store_twice(b_out + t, (float)t);
}
"""
    mod = em.build(src, dialect="metal", include_dirs=[tmp_path])
    out = np.zeros(8, np.float32)
    mod.launch("twice", 1, 8, [out])
    np.testing.assert_array_equal(out, 2 * np.arange(8, dtype=np.float32))


@pytest.mark.skipif(not em.tsan_available(), reason="no ThreadSanitizer runtime")
def test_tsan_reports_the_dropped_barrier_race(no_nvrtc):
    x = _rows(1, 64)

    def tsan(src: str):
        args = [x, np.zeros(1, np.float32), LAYOUT.pack({}, {"n": 64}), np.zeros(1, np.int32)]
        return em.run_tsan(src, "rowsum", 1, THREADS, args, dialect="metal", shared_bytes=8)

    good = rowsum_source()
    assert tsan(good).clean
    bad = rowsum_source(barrier="")
    report = tsan(bad)
    assert report.races and report.error is None
    write, read = _line(bad, "part[tn_simd] = s"), _line(bad, "t += part[w]")
    assert any(r.space == "shared" and set(r.lines) == {write, read} for r in report.races)


def test_the_portable_prelude_runs_under_the_metal_shim(no_nvrtc):
    """``tn_scalar.h`` (the scalar semantics both dialects share) compiles
    against the Metal shim as C++14 with Metal's spellings of its hooks."""
    src = r"""#define TN_FN static inline
#define TN_THREAD thread
#define TN_STATUS device atomic_int*
typedef long tn_i64;
typedef ulong tn_u64;
TN_FN unsigned tn_fbits(float x) { return as_type<uint>(x); }
TN_FN float tn_bitsf(unsigned x) { return as_type<float>(x); }
TN_FN void tn_fail(TN_STATUS st, int code) {
  int z = 0;
  atomic_compare_exchange_weak_explicit(st, &z, code, memory_order_relaxed, memory_order_relaxed);
}
#include "tn_scalar.h"
using namespace metal;
kernel void narrow(device float* b_out [[buffer(0)]], device atomic_int* tn_status [[buffer(1)]],
    uint t [[thread_position_in_threadgroup]]) {
  b_out[t] = tn_widen(tn_to_bf16((float)t / 3.0f));
  if (t == 3) tn_fail(tn_status, 5);
  if (t == 4) tn_fail(tn_status, 6);
}
"""
    mod = em.build(src, dialect="metal")
    out, status = np.zeros(16, np.float32), np.zeros(1, np.int32)
    mod.launch("narrow", 1, 16, [out, status])
    bits = (np.arange(16, dtype=np.float32) / np.float32(3)).view(np.uint32)
    bf16 = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16).astype(np.uint32)
    np.testing.assert_array_equal(out, bf16.view(np.float32))
    assert status[0] == 5  # the first failure is kept


#: one simdgroup: C = A[:, 8:16] @ B^T + C (B half, loaded transposed), and
#: P = A[:, 8:16] @ B^T without an accumulator, through simdgroup matrices
MATRICES = """using namespace metal;
kernel void mm(device float* b_out [[buffer(0)]], const device float* b_a [[buffer(1)]],
    const device half* b_b [[buffer(2)]], const device float* b_c [[buffer(3)]],
    uint tn_lane [[thread_index_in_simdgroup]]) {
  simdgroup_float8x8 a;
  simdgroup_half8x8 b;
  simdgroup_float8x8 c;
  simdgroup_load(a, b_a + {offset}, 16, ulong2(8, 0));
  simdgroup_load(b, b_b, 8, ulong2(0, 0), true);
  simdgroup_load(c, b_c);
  simdgroup_multiply_accumulate(c, a, b, c);
  simdgroup_store(c, b_out, 8);
  simdgroup_float8x8 p;
  simdgroup_multiply(p, a, b);
  simdgroup_store(p, b_out + 64, 8);
}
"""


def _matrix_operands():  # type: ignore[no-untyped-def]
    # small integers: every order of summation gives the same float
    rng = np.random.default_rng(0)
    return (rng.integers(-4, 5, (8, 16)).astype(np.float32),
            rng.integers(-4, 5, (8, 8)).astype(np.float16),
            rng.integers(-4, 5, (8, 8)).astype(np.float32))


def test_simdgroup_matrices_load_multiply_and_store(no_nvrtc):
    """Origins, row strides, a transposed load, a half operand into a float
    accumulator, with and without accumulation, under every policy: the
    same product as numpy's; the source also type-checks as MSL."""
    src = MATRICES.replace("{offset}", "0")
    mod = em.build(src, dialect="metal")
    a, b, c = _matrix_operands()
    want = a[:, 8:] @ b.T.astype(np.float32)
    for policy in em.POLICIES:
        out = np.zeros(128, np.float32)
        mod.launch("mm", 1, 32, [out, a, b, c], policy=policy, seed=3)
        np.testing.assert_array_equal(out[:64].reshape(8, 8), want + c)
        np.testing.assert_array_equal(out[64:].reshape(8, 8), want)
    from tilenest.backends.metal import check
    if check.clang_available():
        check.check_msl("#include <metal_stdlib>\n" + src)


def test_a_lane_loading_other_memory_is_an_error(no_nvrtc):
    """Every lane must name the same matrix: a lane-dependent address is
    refused at the load's line."""
    src = MATRICES.replace("{offset}", "(tn_lane == 5 ? 1 : 0)")
    mod = em.build(src, dialect="metal")
    a, b, c = _matrix_operands()
    with pytest.raises(em.EmulatorError, match="simdgroup_load.*lane 5") as info:
        mod.launch("mm", 1, 32, [np.zeros(128, np.float32), a, b, c])
    assert info.value.line == _line(src, "simdgroup_load(a")


def test_a_lane_that_leaves_a_matrix_product_is_an_error(no_nvrtc):
    src = MATRICES.replace("  simdgroup_multiply_accumulate",
                           "  if (tn_lane == 3) return;\n  simdgroup_multiply_accumulate")
    src = src.replace("{offset}", "0")
    mod = em.build(src, dialect="metal")
    a, b, c = _matrix_operands()
    with pytest.raises(em.EmulatorError, match="simdgroup_multiply_accumulate"):
        mod.launch("mm", 1, 32, [np.zeros(128, np.float32), a, b, c])


@pytest.mark.parametrize("poison,bits", [("nan", 0x7FC00000), ("big", 0x7F7FFFFF),
                                         ("bytes", 0xA5A5A5A5)])
def test_a_fresh_simdgroup_matrix_holds_the_poison(no_nvrtc, poison, bits):
    src = """using namespace metal;
kernel void fresh(device float* b_out [[buffer(0)]]) {
  simdgroup_float8x8 m;
  simdgroup_store(m, b_out);
}
"""
    out = np.zeros(64, np.float32)
    em.build(src, dialect="metal").launch("fresh", 1, 32, [out], poison=poison)
    assert set(out.view(np.uint32).tolist()) == {bits}
