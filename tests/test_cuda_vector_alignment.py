"""The emulator faults on a misaligned vector access, as a GPU does.

A CUDA ``ld``/``st`` of 4, 8 or 16 bytes (and the two 16-byte halves of a
32-byte group) needs an address aligned to its size; the device raises
"misaligned address" otherwise. x86 loads most misaligned addresses without
complaint, so the emulator checks the prelude's vector accesses itself: a
generated source whose per-group alignment guard is wrong must fail on the
emulator, not pass there and fault on the GPU.
"""

from __future__ import annotations

import dataclasses

import re

import numpy as np
import pytest

import tilenest as tn
from tilenest.backends import cuda
from tilenest.backends.cuda.runtime import CudaKernel
from tilenest.backends.simt import emulator as em
from tilenest.lowering import default_schedule

_COPY = r'''
#include "tn_prelude.cuh"
extern "C" __global__ void copy{V}(const {T}* x, {T}* y, long long off, int* st) {{
  tn_pack<{T}, {V}> q = tn_vload<{T}, {V}>(x + off + {V} * threadIdx.x);
  tn_vstore<{T}, {V}>(y + off + {V} * threadIdx.x, q);
}}
'''

#: (element C type, numpy dtype, lanes): groups of 4, 8, 16 and 32 bytes
GROUPS = [("float", np.float32, 1), ("float", np.float32, 2), ("float", np.float32, 4),
          ("float", np.float32, 8), ("unsigned short", np.uint16, 4),
          ("unsigned char", np.uint8, 8)]


@pytest.mark.parametrize("ctype,dt,v", GROUPS,
                         ids=[f"{c.split()[-1]}x{v}" for c, _, v in GROUPS])
def test_vector_access_alignment_is_checked(ctype, dt, v):
    mod = em.build(_COPY.format(T=ctype, V=v), include_dirs=(cuda.prelude_dir(),))
    nbytes = np.dtype(dt).itemsize * v
    need = min(16, nbytes) if nbytes in (4, 8, 16, 32) else 0
    x = np.arange(64 * v, dtype=dt)
    for off in range(0, 16 // np.dtype(dt).itemsize + 1):
        y = np.zeros_like(x)
        misaligned = need and (off * np.dtype(dt).itemsize) % need
        args = [x, y, off, np.zeros(1, np.int32)]
        if misaligned:
            with pytest.raises(em.EmulatorError, match="misaligned address") as e:
                mod.launch(f"copy{v}", (1,), (32,), args)
            assert e.value.what == "invalid memory access"
        else:
            mod.launch(f"copy{v}", (1,), (32,), args)
            assert (y[off:off + 32 * v] == x[off:off + 32 * v]).all()


@tn.kernel
def _scale(x: tn.Tensor[tn.f32, "R C"], y: tn.Tensor[tn.f32, "R C"]):
    rows, cols = x.shape
    for p in tn.parallel(tn.shape(rows)):
        t = x[tn.coord(p.index(), 0), tn.shape(1, cols)]
        y(tn.coord(p.index(), 0), tn.shape(1, cols)).store(t * 3.0)


def _without_alignment_test(text: str) -> str:
    """The source with every alignment test of a group guard made ``true``:
    each ``tn_aligned(p, B)`` and each divisibility of a symbol the guard
    asks for instead of testing the address (``tn_multiple(S_C, 4)``) --
    and nothing else: the guard's bounds test must stay, or the tail groups
    would read and write past the host arrays."""
    out, n = re.subn(r"tn_aligned\((.*?), (4|8|16)\)", r"(true || tn_aligned(\1, \2))", text)
    out, m = re.subn(r"tn_multiple\((S_\w+), (\d+)\)", r"(true || tn_multiple(\1, \2))", out)
    assert n and m
    return out


def test_a_dropped_alignment_guard_fails_on_the_emulator():
    """Rows of 13 floats start at every 4-byte offset: the generated guard
    sends the misaligned groups to the scalar loop. With the guard's
    alignment test removed the emulator must fault, not pass."""
    prog = _scale.program
    ck = cuda.compile_program(prog, default_schedule(prog, "cuda", block_threads=32,
                                                     vector_lanes=4), device="emulated")
    text = ck.source.text
    assert "tn_aligned(" in text and "tn_vload" in text
    x = np.random.default_rng(0).standard_normal((6, 13)).astype(np.float32)
    for policy in em.POLICIES:
        y = np.zeros_like(x)
        ck(x, y, policy=policy)
        assert tn.reference(_scale, x, np.zeros_like(x)).admits(y)
    bad = CudaKernel(prog, ck.kernel, ck.schedule,
                     dataclasses.replace(ck.source, text=_without_alignment_test(text)),
                     ck.built, "emulated", [], 0.0)
    with pytest.raises(em.EmulatorError, match="misaligned address"):
        bad(x, np.zeros_like(x), policy="in_order")
