"""``Schedule.cache_hints``: L2 policies on the CUDA target's wide global
accesses, chosen from the program's order of reads (``emit.cache_hints``).
They change no value (the hinted kernels validate on the emulated device,
``tests/test_cuda_workloads.py``, and on the GPU, ``tests/test_cuda_device.py``);
here, the policy of each access site follows the rule."""

from __future__ import annotations

import re

import pytest

import tilenest as tn
from tilenest.backends import cuda
from tilenest.errors import UsageError
from tilenest.lowering import default_schedule
from tilenest.workloads import WORKLOADS


def _sites(text: str) -> list[tuple[str, str]]:
    """(prelude function, buffer) of every wide access of a source, in order."""
    return re.findall(r"(tn_v(?:load|store)\w*)<[^>]*>\(&(b_\w+)\[", text)


def _compile(name: str, dt, hints: bool):
    """The workload with or without hints, its rows re-read from memory (not
    kept in registers, which a program without mma does by default)."""
    k = WORKLOADS[name].kernel(dt, {"rp": 1})
    s = default_schedule(k.program, "cuda", cache_hints=hints, row_registers=0)
    return k, cuda.compile_program(k.program, s, device="emulated")


def test_policies_follow_the_order_of_reads():
    """RMSNorm reads x twice (sum of squares, then the scaling) and w once:
    the first read of x keeps its lines, the second is their last use, w has
    no policy, the output streams. LayerNorm's middle read of x (the
    variance) keeps its lines too. Without the field nothing is hinted."""
    _, ck = _compile("rmsnorm", tn.bf16, True)
    assert _sites(ck.source.text) == [("tn_vload_keep", "b_x"), ("tn_vload_last", "b_x"),
                                      ("tn_vload", "b_w"), ("tn_vstore_stream", "b_y")]
    _, ck = _compile("layernorm", tn.f32, True)
    xs = [f for f, b in _sites(ck.source.text) if b == "b_x"]
    assert xs == ["tn_vload_keep", "tn_vload_keep", "tn_vload_last"]
    _, ck = _compile("rmsnorm", tn.bf16, False)
    assert {f for f, _ in _sites(ck.source.text)} == {"tn_vload", "tn_vstore"}


def test_shared_memory_accesses_are_never_hinted():
    """Softmax keeps its exponentials in shared memory: those accesses stay plain."""
    _, ck = _compile("softmax", tn.f32, True)
    shared = [f for f, b in _sites(ck.source.text) if b.startswith("b__")]
    assert shared and set(shared) <= {"tn_vload", "tn_vstore"}


def test_a_value_that_is_not_a_bool_is_refused():
    k = WORKLOADS["rmsnorm"].kernel(tn.f32, {"rp": 1})
    with pytest.raises(UsageError, match="cache_hints"):
        cuda.compile_program(k.program, default_schedule(k.program, "cuda", cache_hints=1),
                             device="emulated")
    with pytest.raises(UsageError, match="cache_hints"):
        default_schedule(k.program, "llvm", cache_hints=True)
