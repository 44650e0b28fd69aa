"""Random programs of the differential fuzzer, validated on the CUDA target.

The generator of ``tilenest/validation/fuzz.py`` (the same seeded stream as
its LLVM campaign) draws each program; :func:`check_spec` with
``target="cuda"`` compiles it to the SIMT form with 32 threads per program,
emits CUDA C++, builds the cubin with NVRTC and runs the generated source on
the host emulator, whose successive calls rotate the interleaving policy and
the shared-memory poison; every case must be admitted by the interpreter's
oracle. The default run checks :data:`DEFAULT` programs; ``-m slow`` runs
:data:`SLOW` more (``TILENEST_CUDA_FUZZ`` changes that count).
"""

from __future__ import annotations

import os

import pytest

from tilenest.errors import TilenestError
from tilenest.validation.fuzz import Spec, check_spec, random_spec

#: the seed of the cuda slice's stream (programs ``SEED * 1_000_003 + i``)
SEED = 4242
DEFAULT = 30
SLOW = int(os.environ.get("TILENEST_CUDA_FUZZ", "300"))
#: cases per program: three calls use three policies and three poisons
CASES = 3


def _explain(r) -> str:  # type: ignore[no-untyped-def]
    return (f"{r.status}: {r.message}\n--- spec ---\n{r.spec}\n--- TileIR ---\n{r.tileir}\n"
            f"--- DSL ---\n{r.source}")


def _check(i: int):  # type: ignore[no-untyped-def]
    r = check_spec(random_spec(SEED * 1_000_003 + i), cases=CASES, seed=i, target="cuda")
    assert r.status in ("ok", "unsupported", "skipped"), _explain(r)
    return r


_RESULTS: dict[int, str] = {}


@pytest.mark.parametrize("i", range(DEFAULT))
def test_random_program_validates_on_cuda(i):
    _RESULTS[i] = _check(i).status


def test_most_default_programs_were_compared():
    """The slice is worth its time only if the programs really ran: at most
    a third of them may be refused or skipped."""
    for i in range(DEFAULT):
        if i not in _RESULTS:
            _RESULTS[i] = _check(i).status
    ok = sum(s == "ok" for s in _RESULTS.values())
    assert ok >= 2 * DEFAULT // 3, _RESULTS


@pytest.mark.slow
@pytest.mark.parametrize("i", range(DEFAULT, DEFAULT + SLOW))
def test_random_program_validates_on_cuda_slow(i):
    _check(i)


def test_a_reduction_program_runs_on_the_emulator():
    """A fixed program with a cross-thread tree reduction: compared, not refused."""
    s = Spec("f32", 2, (4, 16), False, False,
             [("red", 1, "add", "unordered_tree", "sub"), ("un", "exp")])
    r = check_spec(s, cases=CASES, target="cuda")
    assert r.status == "ok", _explain(r)


def test_unknown_target_is_an_error():
    with pytest.raises(TilenestError, match="no target"):
        check_spec(Spec(), target="nope")


def test_an_integer_minimum_keeps_its_identity_under_32_bit_indices():
    """Slow-slice program 86 (``argmax`` of a tile under the 32-bit index
    arithmetic of its schedule): the minimum's identity ``2^63 - 1`` went
    into a local declared as a 32-bit index (-1 after the truncation: every
    argmax off by one), and the select between an ``i64`` buffer element and
    a narrowed index local did not compile. Both are 64-bit now and the
    program validates."""
    from tilenest.backends import cuda
    from tilenest.validation.fuzz import build, schedule_for

    spec = random_spec(SEED * 1_000_003 + 86)
    k = build(spec)
    sched = schedule_for(spec, k.program, "cuda")
    assert sched.index_bits == 32
    src = cuda.emit(k.program, "cuda", sched)
    held = {ln.split("=")[0].strip() for ln in src.splitlines()
            if "9223372036854775807" in ln and "=" in ln}
    assert held and all(f"long long {v};" in src and f"int {v};" not in src for v in held)
    r = check_spec(spec, cases=CASES, seed=86, target="cuda")
    assert r.status == "ok", _explain(r)
