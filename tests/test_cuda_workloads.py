"""Every workload of the library, compiled for CUDA and run on the host emulator.

Each workload, at its small sizes (``small`` and the shape variants that are
small: every size except ``medium`` and ``large``), in every storage dtype it
lists, is compiled with ``target="cuda"`` (``device="emulated"``) under a
schedule of 32 threads per program, so the thread loops of the SIMT form are
as short as the emulator allows and the few-thread corner cases (a lane with
no element, a partial last round) occur. The generated source runs under two
different interleaving policies and two different shared-memory poisons per
case (the pair rotates with the case so that the suite covers every policy
and poison), and each run's outputs must be

* admitted by the interpreter's oracle (``tn.reference``), and
* within the workload's FP64 formula bound (bitwise where it is exact),

as in ``test_llvm_workloads.py``. Every further tile schedule of every
workload is judged the same way at the small size in f32.

The default run (about three minutes on two cores) takes the ``small`` size
in every dtype, the other small shape variants in f32 and the second
schedule of every workload; ``-m slow`` adds those variants in f16 and bf16,
the remaining schedules, and the medium sizes (thread loops of many rounds,
full vector groups).
"""

from __future__ import annotations

import numpy as np
import pytest

from tilenest import f32
from tilenest.backends import cuda
from tilenest.backends.simt.emulator import POISONS, POLICIES
from tilenest.lowering import default_schedule
from workload_checks import assert_validates
from tilenest.workloads import WORKLOADS
from tilenest.workloads.base import Result

#: sizes judged by default; ``medium`` runs under -m slow; ``large`` never here
_BIG = ("medium", "large")
THREADS = 32


def _params(sizes) -> list:  # type: ignore[no-untyped-def]
    out = []
    for n, w in WORKLOADS.items():
        for s in w.sizes:
            if s not in sizes(w):
                continue
            for dt in w.dtypes:
                out.append((n, s, dt))
    return out


SMALL = _params(lambda w: [s for s in w.sizes if s not in _BIG])
MEDIUM = _params(lambda w: [s for s in w.sizes if s == "medium"])
#: the default run: ``small`` in every dtype, the other small variants in f32
DEFAULT = [c for c in SMALL if c[1] == "small" or c[2] == f32]


def _copy(a):  # type: ignore[no-untyped-def]
    return a.copy() if isinstance(a, np.ndarray) else a


def runs_for(i: int) -> list[tuple[str, str, int]]:
    """The two ``(policy, poison, seed)`` runs of case ``i``: different
    policies and different poisons, rotating with ``i`` so that consecutive
    cases together use every policy and every poison."""
    return [(POLICIES[i % 4], POISONS[i % 3], 2 * i + 1),
            (POLICIES[(i + 2) % 4], POISONS[(i + 1) % 3], 2 * i + 2)]


def compile_emulated(wl, size, dtype, schedule=None, gpu=None):  # type: ignore[no-untyped-def]
    """The kernel of ``wl`` for ``size``/``dtype`` and its emulated CUDA build
    (``gpu``: further ``Schedule`` overrides)."""
    sched = dict(wl.schedules[0] if schedule is None else schedule)
    k = wl.kernel(dtype, sched, wl.size(size))
    s = default_schedule(k.program, "cuda", **{"block_threads": THREADS, **(gpu or {})})
    return sched, k, cuda.compile_program(k.program, s, device="emulated")


def emulated_runs(wl, size, dtype, i: int, schedule=None, gpu=None) -> list[tuple[str, Result]]:  # type: ignore[no-untyped-def]
    """Run the emulated build of ``wl`` on its seeded arguments once per run
    of :func:`runs_for`; each labelled with its policy and poison."""
    sched, k, ck = compile_emulated(wl, size, dtype, schedule, gpu)
    sz = wl.size(size)
    args = wl.args(sz, dtype)
    out = []
    for policy, poison, seed in runs_for(i):
        work = {n: _copy(a) for n, a in args.items()}
        ck(*work.values(), policy=policy, poison=poison, seed=seed)
        out.append((f"{policy}/{poison}",
                    Result(wl, sz, dtype, sched, k, args, {n: work[n] for n in wl.outputs})))
    return out




def _judge(name: str, size: str, dt, i: int, schedule=None, gpu=None) -> None:  # type: ignore[no-untyped-def]
    adm = None
    for label, r in emulated_runs(WORKLOADS[name], size, dt, i, schedule, gpu):
        adm = assert_validates(r, label, adm)


@pytest.mark.parametrize("i,name,size,dt", [
    pytest.param(i, n, s, dt, id=f"{n}-{s}-{dt.name}",
                 marks=() if (n, s, dt) in DEFAULT else pytest.mark.slow)
    for i, (n, s, dt) in enumerate(SMALL)])
def test_workload_validates_emulated(i, name, size, dt):
    _judge(name, size, dt, i)


SCHEDULES = [pytest.param(n, j, id=f"{n}-s{j}", marks=() if j == 1 else pytest.mark.slow)
             for n, w in WORKLOADS.items() for j in range(1, len(w.schedules))]


@pytest.mark.parametrize("name,j", SCHEDULES)
def test_every_schedule_validates_emulated(name, j):
    """Schedule 0 is covered above; each other schedule at the small size, f32
    (schedule 1 of every workload by default, the others under -m slow)."""
    wl = WORKLOADS[name]
    _judge(name, "small", f32, j, wl.schedules[j])


#: row workloads whose rows are read more than once (staging changes their code)
STAGED = ("softmax", "rmsnorm", "layernorm")


@pytest.mark.parametrize("i,name,size,dt,vector", [
    pytest.param(i, n, s, dt, v, id=f"{n}-{s}-{dt.name}-v{v}",
                 marks=() if (s, dt, v) == ("medium", f32, 4) else pytest.mark.slow)
    for i, (n, s, dt) in enumerate(c for c in SMALL + MEDIUM if c[0] in STAGED)
    for v in (1, 4)])
def test_staged_loads_validate_emulated(i, name, size, dt, vector):
    """``Schedule(stage_loads=True)``: rows read once into shared memory, then
    every use reads the shared copy. At the medium size the thread loops have
    full vector groups (the strip-mined, unrolled loop), a partial group and
    groups past the end; with one lane per step the scalar loops run."""
    _judge(name, size, dt, i, gpu={"stage_loads": True, "vector_lanes": vector})


@pytest.mark.slow
@pytest.mark.parametrize("i,name,size,dt", [
    pytest.param(i, n, s, dt, id=f"{n}-{s}-{dt.name}") for i, (n, s, dt) in enumerate(MEDIUM)])
def test_workload_validates_emulated_medium(i, name, size, dt):
    _judge(name, size, dt, i)


def test_runs_cover_every_policy_and_poison():
    """The rotation gives each case two policies and two poisons, and the
    suite every policy and every poison in both runs."""
    for i in range(len(SMALL)):
        (p0, q0, _), (p1, q1, _) = runs_for(i)
        assert p0 != p1 and q0 != q1
    assert {r[0] for i in range(4) for r in runs_for(i)} == set(POLICIES)
    assert {r[1] for i in range(3) for r in runs_for(i)} == set(POISONS)


def test_emulated_run_really_uses_the_generated_source():
    """A wrong emulated output is caught: corrupt one element of an emulated
    softmax result and both judges must reject it."""
    (label, r), _ = emulated_runs(WORKLOADS["softmax"], "small", f32, 0)
    assert_validates(r, label)
    out = next(iter(r.outputs))
    r.outputs[out].flat[4] += np.float32(0.125) * (1 + abs(r.outputs[out].flat[4]))
    with pytest.raises(AssertionError):
        assert_validates(r, label)
