"""Shared buffers of disjoint lifetimes share storage (``lowering/lifetimes.py``).

The kernel: causal attention split into the key blocks that need no mask and
those that do (``flash_attention`` with ``split=True``), two key loops of one
double-buffered key/value ring each, a plain block barrier between them."""

from __future__ import annotations

from dataclasses import replace

import pytest

import tilenest as tn
import tilenest.lowering.lifetimes as lifetimes
from tilenest.lowering import default_schedule, lower_verified
from tilenest.lowering import loopir as L
from tilenest.lowering.inplace import merged, touched
from tilenest.proofs.barriers import check_barriers
from tilenest.proofs.obligation import REFUTED
from tilenest.workloads.attention import flash_kernel

#: the rule itself (the tests replace it by the identity to lower without it)
SHARE = lifetimes.share_disjoint
#: the benchmark's tiles (wgmma, bulk copies) and the emulated tests' smaller ones
TILES = ({"bq": 64, "bk": 64, "dh": 128, "dv": 128}, {"bq": 32, "bk": 16, "dh": 32, "dv": 32})


def _lowered(split, tiles=TILES[0], merge=True, monkeypatch=None):  # type: ignore[no-untyped-def]
    kern = flash_kernel(tn.bf16).specialize(causal=True, split=split, **tiles)
    if not merge:
        monkeypatch.setattr(lifetimes, "share_disjoint", lambda k: k)
    return lower_verified(kern.program, default_schedule(kern.program, "cuda",
                                                         block_threads=128))


def _shared(k):  # type: ignore[no-untyped-def]
    return {b.name for b in k.locals if b.space == "shared"}


@pytest.mark.parametrize("tiles", TILES, ids=["64x64-d128", "32x16-d32"])
def test_two_key_loops_keep_one_ring(tiles, monkeypatch):
    """The split kernel needs the shared memory of the unsplit one (one ring
    for both loops), so as many blocks fit a multiprocessor; without the
    merge it needs a second key and value ring."""
    one = L.shared_bytes(_lowered(False, tiles))
    shared_one = _lowered(True, tiles)
    assert L.shared_bytes(shared_one) == one
    separate = _lowered(True, tiles, merge=False, monkeypatch=monkeypatch)
    ring = 2 * tiles["bk"] * (tiles["dh"] + tiles["dv"]) * 2  # two versions, bf16
    assert L.shared_bytes(separate).value - one.value >= ring
    assert len(_shared(separate) - _shared(shared_one)) >= 2
    assert all(o.status != REFUTED for o in check_barriers(shared_one))


def test_no_merge_without_a_barrier_that_completes_the_first_loop(monkeypatch):
    """The rule needs a barrier completing every earlier access (asynchronous
    copies and overlapped mmas included) between the two lifetimes: with the
    top-level barriers made to keep one copy group or one mma group in
    flight, nothing is merged."""
    separate = _lowered(True, merge=False, monkeypatch=monkeypatch)
    assert SHARE(separate).locals != separate.locals
    for field in ("keep", "mma_keep"):
        ph = separate.phases[0]
        body = tuple(replace(s, **{field: 1}) if L.is_block_barrier(s) else s for s in ph.body)
        lagging = replace(separate, phases=(replace(ph, body=body),) + separate.phases[1:])
        assert SHARE(lagging).locals == lagging.locals


def test_a_merge_of_overlapping_lifetimes_is_refuted(monkeypatch):
    """The barrier proof discharges the merged kernel rather than trusting
    the rule: merging the first loop's key ring into its value ring (both
    live at once) is refuted as a race."""
    separate = _lowered(True, merge=False, monkeypatch=monkeypatch)
    body = separate.phases[0].body
    loop = next(s for s in body if isinstance(s, L.For)
                and any(isinstance(t, L.WarpMma) for t in L.walk(s.body)))
    live = [b for b in separate.locals if b.space == "shared" and b.layout is not None
            and b.name in touched(loop)]
    pairs = [(x, y) for x in live for y in live if x.name < y.name and x.size == y.size]
    assert pairs
    wrong = merged(separate, pairs[0][1], pairs[0][0])
    assert any(o.status == REFUTED for o in check_barriers(wrong))
