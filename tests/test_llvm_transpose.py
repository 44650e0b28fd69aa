"""Transposed ``mma`` operands on the CPU: a plain copy of the tile as stored,
then a transposing copy between two local tiles that the code generator runs
as blocks transposed in registers (``backends/llvm/transpose.py``) instead of
a gather per vector of the packed tile."""

from __future__ import annotations

import numpy as np
import pytest

import tilenest as tn
from tilenest import f32, f64
from tilenest.backends import target
from tilenest.backends.llvm.transpose import transpose_shape
from tilenest.bench.kernels import bmm_nt_kernel
from tilenest.lowering import default_schedule, lower_verified
from tilenest.lowering import loopir as L


def _copies(k, bits):  # type: ignore[no-untyped-def]
    low = lower_verified(k.program, default_schedule(k.program, "llvm", threads=1))
    return [s for ph in low.phases for s in L.walk(ph.body)
            if transpose_shape(s, bits) is not None]


def test_the_transposed_operand_is_copied_as_register_blocks():
    k = bmm_nt_kernel(f32).specialize(bm=32, bn=32, bk=32)
    (copy,) = _copies(k, 512)
    assert copy.hi == copy.body[0].hi  # 32 x 32, a multiple of 16 lanes
    sched = default_schedule(k.program, "llvm", threads=1)
    ir = target("llvm").emit(k.program, "ir", sched)
    w = (sched.vector_bits or 128) // 32
    # log2(W) rounds of W two-input shuffles per block (16 lanes: 64)
    assert ir.count("shufflevector") >= w * (w.bit_length() - 1)
    assert "llvm.masked.gather" not in ir


def test_tiles_that_are_not_whole_blocks_keep_the_element_copy():
    k = bmm_nt_kernel(f32).specialize(bm=32, bn=24, bk=20)
    assert not _copies(k, 512)


@pytest.mark.parametrize("dt,tiles", [
    (f32, {"bm": 32, "bn": 32, "bk": 32}),
    (f32, {"bm": 16, "bn": 48, "bk": 16}),
    (f64, {"bm": 32, "bn": 16, "bk": 32}),
    (f32, {"bm": 32, "bn": 24, "bk": 20}),
], ids=["f32-32", "f32-48x16", "f64", "f32-not-blocks"])
def test_transposed_operand_results(dt, tiles):
    """Ragged sizes in every dim (the bounds are the first copy's), against
    the oracle."""
    k = bmm_nt_kernel(dt).specialize(**tiles)
    rng = np.random.default_rng(7)
    A = rng.standard_normal((3, 70, 45)).astype(dt.np)
    Bt = rng.standard_normal((3, 33, 45)).astype(dt.np)
    oracle = tn.reference(k, A, Bt, np.zeros((3, 70, 33), dt.np))
    C = np.zeros((3, 70, 33), dt.np)
    k.compile(target="llvm", threads=1)(A, Bt, C)
    v = oracle.admits(C)
    assert v.ok, str(v)
    assert np.allclose(C, A @ Bt.transpose(0, 2, 1), rtol=1e-4, atol=1e-4)
