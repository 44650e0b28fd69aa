"""Emulated launches run their array arguments against guard pages
(``tilenest.backends.simt.guard_pages``): a read or write past an array's end
is an error naming the argument, as ``compute-sanitizer --tool memcheck``
reports it on a GPU, while aliasing, alignment and the results of a correct
kernel are those of the caller's arrays."""

from __future__ import annotations

import numpy as np
import pytest

from tilenest.backends.simt import emulator as em
from tilenest.backends.simt import guard_pages as GP
from tilenest.errors import TilenestError

#: y[i] = x[i + off] + 1 for i < n, one thread per element
SHIFTED = r"""
extern "C" __global__ void shifted(const float* __restrict__ x, float* y, int n, int off) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i + off] + 1.0f;
}
"""
#: y[i] = x[i] + 1, the two pointers free to alias
ALIASED = r"""
extern "C" __global__ void aliased(const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] + 1.0f;
}
"""
#: out[0] = the address of p modulo 256
ADDRESS = r"""
extern "C" __global__ void address(const float* p, long long* out) {
  out[0] = (long long)((unsigned long long)p % 256ull);
}
"""


@pytest.fixture(scope="module")
def mod():  # type: ignore[no-untyped-def]
    return em.build(SHIFTED + ALIASED + ADDRESS)


def test_a_correct_kernel_gives_the_same_results(mod):
    x = np.arange(64, dtype=np.float32)
    y = np.zeros(60, np.float32)
    mod.launch("shifted", 1, 64, [x, y, 60, 4])
    assert np.array_equal(y, x[4:] + 1)


@pytest.mark.parametrize("n", [64, 61])
def test_a_read_past_the_end_names_the_argument(mod, n):
    """A read one 16-byte group past the array (n = 64: the very next
    element) faults with the argument and the distance named; x is left
    as it was."""
    x = np.arange(n, dtype=np.float32)
    y = np.zeros(n, np.float32)
    off = 1 if n % 4 == 0 else 4
    with pytest.raises(TilenestError) as e:
        mod.launch("shifted", 1, 64, [x, y, n, off])
    text = e.value.render()
    assert "invalid memory access" in text and "past the end of argument 0" in text, text
    assert f"{n * 4} bytes, shape ({n},)" in text, text
    assert np.array_equal(x, np.arange(n, dtype=np.float32))
    # unguarded, the same launch reads whatever follows x and reports nothing
    mod.launch("shifted", 1, 64, [x, y, n, off], guard=False)


def test_a_write_past_the_end_names_the_argument_and_keeps_what_was_written(mod):
    x = np.arange(80, dtype=np.float32)
    y = np.full(64, -1.0, np.float32)
    with pytest.raises(TilenestError) as e:
        mod.launch("shifted", 1, 80, [x, y, 80, 0])  # n larger than y
    assert "past the end of argument 1" in e.value.render()
    # the elements written before the fault came back to the caller's array
    assert np.array_equal(y, x[:64] + 1)


def test_one_array_passed_twice_is_one_array(mod):
    x = np.arange(32, dtype=np.float32)
    mod.launch("aliased", 1, 32, [x, x, 32])
    assert np.array_equal(x, np.arange(32, dtype=np.float32) + 1)


def test_overlapping_views_keep_their_overlap(mod):
    """y is x shifted by 8 elements within one buffer: the guarded launch
    reads and writes the same overlapping memory the caller's arrays are."""
    want = np.arange(48, dtype=np.float32)
    base = want.copy()
    # one thread per element, block-ordered: in-place shifts read before write
    mod.launch("aliased", 1, 32, [want[8:40], want[0:32], 32], guard=False)
    mod.launch("aliased", 1, 32, [base[8:40], base[0:32], 32])
    assert np.array_equal(base, want)


@pytest.mark.parametrize("offset", [0, 1, 2, 3])
def test_an_array_keeps_its_alignment(mod, offset):
    buf = np.zeros(64, np.float32)
    view = buf[offset:offset + 16]
    out = np.zeros(1, np.int64)
    mod.launch("address", 1, 1, [view, out])
    assert int(out[0]) % GP.ALIGN == view.ctypes.data % GP.ALIGN


def test_a_placement_copies_back_only_the_writable_arrays():
    """Inside the block the arrays live at their placed addresses; after
    it, what was written there comes back to the arrays the caller marks
    writable, and not to the others."""
    a = np.arange(10, dtype=np.float64)
    b = np.arange(3, dtype=np.int32)
    with GP.placed([a, None, b], [True, False, False]) as at:
        assert at.addresses[1] is None
        pa = np.ctypeslib.as_array((np.ctypeslib.ctypes.c_double * 10).from_address(
            at.addresses[0]))
        assert np.array_equal(pa, a)
        pa[:] = -1.0
        pb = np.ctypeslib.as_array((np.ctypeslib.ctypes.c_int32 * 3).from_address(
            at.addresses[2]))
        pb[:] = 7
        assert {at.owner(r.guard) for r in at.regions} == {0, 2}
    assert np.array_equal(a, np.full(10, -1.0))
    assert np.array_equal(b, np.arange(3, dtype=np.int32))
