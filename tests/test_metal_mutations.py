"""Mutations of *generated* MSL are caught.

The four classes the Metal checks exist for, each applied to the text the
emitter wrote for a real kernel (the row softmax of ``examples/softmax.py``)
and each caught here without a Mac:

* a dropped ``threadgroup_barrier``: the emulator, under its interleavings and
  poisons, produces a result the interpreter rejects (or a launch error);
* a wrong ``simd_shuffle_xor`` partner: the reduction combines the wrong lanes
  and the interpreter rejects the result;
* an address-space mix-up: clang-19 refuses the text against the shim;
* an f64 operation: the backend refuses the program at its source line.
"""

from __future__ import annotations

import copy
import dataclasses
import re

import numpy as np
import pytest

import tilenest as tn
from tilenest.backends import metal
from tilenest.backends.metal.check import check_msl, clang_available
from tilenest.backends.simt.emulator import POLICIES, EmulatorError
from tilenest.errors import TilenestError

from softmax import row_softmax

BARRIER = "threadgroup_barrier(mem_flags::mem_threadgroup | mem_flags::mem_device);"


@pytest.fixture(scope="module")
def softmax():
    s = metal._schedule(row_softmax.program, None).with_(vector_lanes=1)
    ck = metal.compile_program(row_softmax.program, s, device="emulated")
    x = np.random.default_rng(1).standard_normal((5, 200)).astype(np.float32)
    return ck, x


def mutant(ck, text: str):
    """``ck`` running ``text`` instead of its own MSL (built afresh)."""
    m = copy.copy(ck)
    m.source = dataclasses.replace(ck.source, text=text)
    m._emu = None
    return m


def caught(ck, x) -> bool:
    """Whether some interleaving and poison makes ``ck`` fail or be rejected."""
    for i in range(12):
        y = np.zeros_like(x)
        try:
            ck(x, y, policy=POLICIES[i % 4], seed=i, poison=("nan", "big", "bytes")[i % 3])
        except EmulatorError:
            return True
        if not tn.reference(row_softmax, x, np.zeros_like(x)).admits(y):
            return True
    return False


def test_the_unmutated_kernel_passes(softmax):
    ck, x = softmax
    assert not caught(ck, x)


def test_a_dropped_threadgroup_barrier_is_caught(softmax):
    ck, x = softmax
    text = ck.source.text
    sites = [m.start() for m in re.finditer(re.escape(BARRIER), text)]
    assert len(sites) >= 2
    hits = sum(caught(mutant(ck, text[:at] + "/* dropped */" + text[at + len(BARRIER):]), x)
               for at in sites)
    assert hits >= 2, f"only {hits} of {len(sites)} dropped barriers caught"


def test_a_wrong_shuffle_partner_is_caught(softmax):
    ck, x = softmax
    text = ck.source.text
    # the sum's first butterfly step (the maximum's would be harmless: softmax
    # is the same for any shift)
    wrong = re.sub(r"tn_simd_xor\((\w*acc_s\w*), 16\)", r"tn_simd_xor(\1, 0)", text, count=1)
    assert wrong != text
    assert caught(mutant(ck, wrong), x)


@pytest.mark.skipif(not clang_available(), reason="clang-19 is not installed")
def test_an_address_space_mix_up_is_refused_by_clang(softmax):
    ck, _ = softmax
    check_msl(metal.standalone(ck.source.text))
    # a threadgroup buffer's pointer made from a device-memory pointer
    mixed = ck.source.text.replace("= (threadgroup float*)(", "= (device float*)(", 1)
    assert mixed != ck.source.text
    with pytest.raises(TilenestError, match=r"threadgroup float \*const.*device float \*"):
        check_msl(metal.standalone(mixed))


def test_an_f64_operation_is_refused_at_its_line():
    @tn.kernel
    def widened(x: tn.Tensor[tn.f32, "N"], y: tn.Tensor[tn.f32, "N"]):  # noqa: F821
        for _p in tn.parallel(tn.shape(1)):
            t = x[tn.coord(0), tn.shape(x.shape[0])]
            y(tn.coord(0), tn.shape(x.shape[0])).store(tn.cast(tn.cast(t, tn.f64) * 2.0, tn.f32))

    with pytest.raises(TilenestError, match="f64") as e:
        widened.compile(target="metal")
    assert "test_metal_mutations.py" in str(e.value)
