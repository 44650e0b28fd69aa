"""The Metal type check (tilenest/backends/metal/check.py): hand-written MSL
kernels in the style tilenest generates type-check against the metal_stdlib
shim, and each mistake Metal's compiler would refuse is refused here with
the line it is on."""

from __future__ import annotations

import pytest

from tilenest.backends.metal import check
from tilenest.errors import NotAvailableError, TargetCheckError

needs_clang = pytest.mark.skipif(not check.clang_available(),
                                 reason="clang-19 is not installed (make test installs it)")

ROW_SUM = """\
#include <metal_stdlib>
using namespace metal;

// one threadgroup per row; each simdgroup sums its lanes, then simdgroup 0
// sums the partial sums left in threadgroup memory
kernel void row_sum(device const float* x [[buffer(0)]],
                    device float* out [[buffer(1)]],
                    constant uint& cols [[buffer(2)]],
                    uint row [[threadgroup_position_in_grid]],
                    uint t [[thread_position_in_threadgroup]],
                    uint width [[threads_per_threadgroup]],
                    uint lane [[thread_index_in_simdgroup]],
                    uint sg [[simdgroup_index_in_threadgroup]]) {
  threadgroup float partial[32];
  float acc = 0.0f;
  for (uint c = t; c < cols; c += width) {
    acc += x[row * cols + c];
  }
  acc = simd_sum(acc);
  if (lane == 0) {
    partial[sg] = acc;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (sg == 0) {
    float p = lane < (width + 31) / 32 ? partial[lane] : 0.0f;
    p = simd_sum(p);
    float4 check = float4(p, float2(simd_max(p), simd_min(p)), simd_shuffle_xor(p, 1));
    if (lane == 0 && !isnan(check.x)) {
      out[row] = metal::fma(check.x, 1.0f, 0.0f);
    }
  }
  threadgroup_barrier(mem_flags::mem_threadgroup | mem_flags::mem_device);
}
"""

MMA_8X8 = """\
#include <metal_stdlib>
using namespace metal;

// C (8x8, f32) += A (8x8, f16) x B (8x8, f16) on one simdgroup, the tiles
// staged through threadgroup memory
kernel void mma8(device const half* a [[buffer(0)]],
                 device const half* b [[buffer(1)]],
                 device float* c [[buffer(2)]],
                 ushort t [[thread_index_in_simdgroup]]) {
  threadgroup half ta[64];
  threadgroup half tb[64];
  for (ushort i = t; i < 64; i += 32) {
    ta[i] = a[i];
    tb[i] = b[i];
  }
  simdgroup_barrier(mem_flags::mem_threadgroup);
  simdgroup_half8x8 ma;
  simdgroup_half8x8 mb;
  simdgroup_float8x8 mc;
  simdgroup_load(ma, ta, 8);
  simdgroup_load(mb, tb, 8);
  simdgroup_load(mc, c, 8);
  simdgroup_multiply_accumulate(mc, ma, mb, mc);
  simdgroup_store(mc, c, 8);
}
"""


@needs_clang
@pytest.mark.parametrize("src", [ROW_SUM, MMA_8X8], ids=["row_sum", "simdgroup_mma"])
def test_kernels_type_check(src):
    check.check_msl(src)


def _refusal(src: str, old: str, new: str) -> tuple[TargetCheckError, int]:
    """The error of ``src`` with ``old`` replaced by ``new`` (once), and the
    line of the edit."""
    assert src.count(old) == 1
    bad = src.replace(old, new)
    line = bad[:bad.index(new)].count("\n") + 1
    with pytest.raises(TargetCheckError) as e:
        check.check_msl(bad, "edited.metal")
    return e.value, line


def _assert_names_line(err: TargetCheckError, line: int, *words: str) -> None:
    assert err.sites and err.sites[0].file == "edited.metal" and err.sites[0].line == line
    first = err.notes[0]
    assert first.startswith(f"line {line}:"), err.render()
    for w in words:
        assert w in first, err.render()


@needs_clang
def test_threadgroup_pointer_where_device_is_expected():
    src = ROW_SUM.replace("kernel void row_sum", "void keep(device float* p) { p[0] = 0.0f; }\n"
                          "kernel void row_sum")
    err, line = _refusal(src, "    partial[sg] = acc;\n", "    keep(partial);\n")
    _assert_names_line(err, line, "keep", "threadgroup", "device")


@needs_clang
def test_double_is_refused():
    err, line = _refusal(ROW_SUM, "  float acc = 0.0f;\n", "  double acc = 0.0;\n")
    _assert_names_line(err, line, "poisoned", "double")


@needs_clang
def test_if_constexpr_is_refused():
    err, line = _refusal(ROW_SUM, "  if (lane == 0) {\n", "  if constexpr (true) {\n")
    _assert_names_line(err, line, "constexpr if", "C++17")


@needs_clang
def test_misspelled_simd_function_is_refused():
    # Metal's product is simd_product
    err, line = _refusal(ROW_SUM, "  acc = simd_sum(acc);\n", "  acc = simd_prod(acc);\n")
    _assert_names_line(err, line, "simd_prod")


@needs_clang
def test_vector_constructor_with_too_few_components_is_refused():
    err, line = _refusal(MMA_8X8, "  simdgroup_half8x8 ma;\n",
                         "  float4 v = float4(1.0f, 2.0f);\n  simdgroup_half8x8 ma;\n")
    _assert_names_line(err, line, "as many components")


def test_local_threadgroup_arrays_keep_their_lines():
    assert check.prepare("kernel void k() {\n  threadgroup float a[4];\n}\n") == \
        "kernel void k() {\n  static threadgroup float a[4];\n}\n"
    # parameters and file-scope lines are left alone
    assert check.prepare("kernel void k(\n    threadgroup float* p,\n") == \
        "kernel void k(\n    threadgroup float* p,\n"


def test_missing_clang_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(check, "CLANG", "clang-19-not-installed")
    assert not check.clang_available()
    with pytest.raises(NotAvailableError, match="clang-19-not-installed"):
        check.check_msl(ROW_SUM)
