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

The default run (every kind of kernel, each narrow dtype on most of them):

* every workload but WORKLOADS_SLOW (gemm_relu: gemm_gelu runs the same
  tiles with a heavier epilogue) at the ``small`` size in f32, and in one
  narrow dtype (f16
  and bf16 alternating over the workloads; gemm in both) except NARROW_SLOW:
  gemm_relu, gemm_gelu and bmm (gemm's narrow-operand contraction covers
  theirs), residual_layernorm (layernorm's and rmsnorm's), sort, sort_desc
  and topk (NVRTC takes some 10-20 s per narrow build of each sorting
  network; sort's runs in bf16 with its row in registers, below);
* the other small shape variants in f32 (none of topk's, whose variants are
  each a kernel of their own to build and run: its ``small`` size stays);
* the second schedule of every workload but SCHEDULE_SLOW (gemm_gelu's is
  gemm's tiling, sort_desc's sort's);
* the staged loads of the row workloads at the medium size, f32, 4 lanes;
* rows kept in registers (``row_registers``) for softmax (f32), masked
  softmax and sort (bf16), one dtype each.

``-m slow`` adds gemm_relu, the other narrow dtypes,
the topk variants ``k1``, ``near_n`` and ``wide``, the remaining schedules and staged
variants, and the medium sizes (thread loops of many rounds, full vector
groups).
"""

from __future__ import annotations

import numpy as np
import pytest

from tilenest import f32
from tilenest.backends.simt.emulator import POISONS, POLICIES
from workload_checks import assert_validates, emulated_runs, judge_emulated, runs_for
from tilenest.workloads import WORKLOADS

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
#: workloads run under -m slow only (see the module docstring)
WORKLOADS_SLOW: tuple[str, ...] = ("gemm_relu",)
#: workloads whose narrow-dtype builds all run under -m slow only (another
#: workload's narrow build covers the same code; see the module docstring)
NARROW_SLOW = ("gemm_relu", "gemm_gelu", "bmm", "residual_layernorm", "sort", "sort_desc",
               "topk")
#: workloads run in both narrow dtypes by default
NARROW_BOTH = ("gemm",)
#: small variants under -m slow only (each a kernel of its own to build and prove)
VARIANTS_SLOW = (("topk", "k1"), ("topk", "near_n"), ("topk", "wide"))


def _narrow_default(name: str) -> set:  # type: ignore[type-arg]
    """The narrow dtypes of ``name`` in the default run: f16 and bf16
    alternate over the workloads, both for NARROW_BOTH, none for NARROW_SLOW."""
    if name in NARROW_SLOW:
        return set()
    j = list(WORKLOADS).index(name)
    return {w for w in WORKLOADS[name].dtypes if w != f32 and
            (name in NARROW_BOTH or (w.name == "bf16") == (j % 2 == 1))}


#: the default run: ``small`` in f32 and in its narrow dtypes, the other
#: small variants in f32 (but VARIANTS_SLOW), none of WORKLOADS_SLOW
DEFAULT = [c for c in SMALL if c[0] not in WORKLOADS_SLOW and (
           (c[1] == "small" and (c[2] == f32 or c[2] in _narrow_default(c[0])))
           or (c[1] != "small" and c[2] == f32 and (c[0], c[1]) not in VARIANTS_SLOW))]


def _judge(name: str, size: str, dt, i: int, schedule=None, gpu=None) -> None:  # type: ignore[no-untyped-def]
    judge_emulated("cuda", name, size, dt, i, schedule, {"block_threads": THREADS, **(gpu or {})})


@pytest.mark.parametrize("i,name,size,dt", [
    pytest.param(i, n, s, dt, id=f"{n}-{s}-{dt.name}",
                 marks=() if (n, s, dt) in DEFAULT else pytest.mark.slow)
    for i, (n, s, dt) in enumerate(SMALL)])
def test_workload_validates_emulated(i, name, size, dt):
    _judge(name, size, dt, i)


#: workloads whose schedule 1 runs under -m slow only: gemm_relu's and
#: gemm_gelu's are gemm's tiling with an epilogue, sort_desc's sort's in the
#: other order (gemm's and sort's run by default)
SCHEDULE_SLOW = ("gemm_relu", "gemm_gelu", "sort_desc")
SCHEDULES = [pytest.param(n, j, id=f"{n}-s{j}",
                          marks=() if j == 1 and n not in SCHEDULE_SLOW else pytest.mark.slow)
             for n, w in WORKLOADS.items() for j in range(1, len(w.schedules))]


@pytest.mark.parametrize("name,j", SCHEDULES)
def test_every_schedule_validates_emulated(name, j):
    """Schedule 0 is covered above; each other schedule at the small size, f32
    (schedule 1 of every workload but SCHEDULE_SLOW by default, the others
    under -m slow)."""
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


#: workloads with a thread-private row buffer (``Schedule.row_registers``)
PRIVATE_ROWS = ("softmax", "masked_softmax", "sort", "topk")


@pytest.mark.parametrize("i,name,size,dt,elems", [
    pytest.param(i, n, s, dt, e, id=f"{n}-{s}-{dt.name}-r{e}",
                 marks=() if (n, s, e, dt.name) in (("softmax", "medium", 8, "f32"),
                                                    ("masked_softmax", "small", 64, "bf16"),
                                                    ("sort", "small", 8, "bf16"))
                 else pytest.mark.slow)
    for i, (n, s, dt) in enumerate(c for c in SMALL + MEDIUM if c[0] in PRIVATE_ROWS)
    for e in (8, 64)])
def test_row_registers_validate_emulated(i, name, size, dt, elems):
    """``Schedule(row_registers=N)``: the thread-private row kept in
    registers for its first steps and in shared memory for the rest. At the
    medium size with 8 elements per thread both parts hold elements of every
    row; with 64 the small rows lie wholly in registers."""
    _judge(name, size, dt, i, gpu={"row_registers": elems})


@pytest.mark.parametrize("i,name,dt,elems", [
    pytest.param(i, n, dt, e, id=f"{n}-{dt.name}-r{e}",
                 marks=() if (n, dt.name, e) in (("rmsnorm", "bf16", 8), ("layernorm", "f32", 64),
                                                 ("layernorm", "bf16", 64))
                 else pytest.mark.slow)
    for i, (n, s, dt) in enumerate(c for c in MEDIUM if c[0] in ("rmsnorm", "layernorm"))
    for e in (8, 64)])
def test_input_rows_cached_in_registers_validate_emulated(i, name, dt, elems):
    """``Schedule(row_registers=N)`` on normalizations: no shared row, but
    the input read in two or three passes is cached in registers by the
    first (f32 values of a bf16 input). With 8 elements per thread the later
    steps of the medium rows still read global memory; with 64 the rows
    lie wholly in registers. (One row per program: with several, the
    reads carry a row guard and the input is not cached.)"""
    sched = next(s for s in WORKLOADS[name].schedules if s.get("rp") == 1)
    _judge(name, "medium", dt, i, sched, gpu={"row_registers": elems})


def test_row_registers_with_one_lane_validate_emulated():
    """One element per thread and step (no lane loop): four steps in
    registers, the rest of the medium rows in shared memory."""
    _judge("softmax", "medium", f32, 3, gpu={"row_registers": 4, "vector_lanes": 1})


@pytest.mark.parametrize("name,j,blocks", [
    pytest.param(n, j, g, id=f"{n}-s{j}-g{g}",
                 marks=() if (n, g) in (("softmax", 5), ("gemm", 2)) else pytest.mark.slow)
    for n in ("softmax", "rmsnorm", "layernorm", "gemm") for j in (0, 1) for g in (1, 2, 5)])
def test_grid_stride_blocks_validate_emulated(name, j, blocks):
    """``Schedule(grid_blocks=G)``: G blocks, each running every G-th program
    with a barrier between two, staged loads on (shared memory reused from
    one program to the next): fewer blocks than programs, one block, and a
    count that does not divide the programs."""
    wl = WORKLOADS[name]
    gpu = {"grid_blocks": blocks, **({"stage_loads": True} if name != "gemm" else {})}
    _judge(name, "small", f32, j, wl.schedules[j], gpu=gpu)


@pytest.mark.parametrize("i,name,dt", [
    pytest.param(i, n, dt, id=f"{n}-{dt.name}",
                 marks=() if (n, dt.name) in (("rmsnorm", "bf16"), ("layernorm", "f32"))
                 else pytest.mark.slow)
    for i, (n, s, dt) in enumerate(c for c in MEDIUM if c[0] in STAGED)])
def test_cache_hints_validate_emulated(i, name, dt):
    """``Schedule(cache_hints=True)``: the hinted loads and stores (emulated as
    plain ones, the policies being the GPU's L2's business) in the full
    vector groups of the medium size."""
    _judge(name, "medium", dt, i, gpu={"cache_hints": True})


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


def test_default_run_covers_every_workload_dtype_policy_and_poison():
    """The default selection keeps every workload but WORKLOADS_SLOW at the
    small size in f32 and every other one but NARROW_SLOW in a narrow dtype,
    each narrow dtype on a GEMM, elementwise maps, row reductions, attention
    and a scan, and every policy and poison in both runs of a case."""
    default = {c: i for i, c in enumerate(SMALL) if c in DEFAULT}
    names = set(WORKLOADS) - set(WORKLOADS_SLOW)
    assert {n for n, s, dt in default if s == "small" and dt == f32} == names
    narrow = {n for n, s, dt in default if s == "small" and dt != f32}
    assert narrow == names - set(NARROW_SLOW)
    kinds = (("gemm",), ("add", "gelu", "residual_gelu", "swiglu", "rope"),
             ("row_sum", "row_max", "softmax", "masked_softmax", "rmsnorm", "layernorm",
              "cross_entropy"), ("attention_gqa", "attention_mha"), ("scan_fold", "scan_tree"))
    for dt in {dt for w in WORKLOADS.values() for dt in w.dtypes} - {f32}:
        ran = {n for n, s, d in default if d == dt}
        assert all(ran & set(kind) for kind in kinds), (dt, ran)
    for run in (0, 1):
        assert {runs_for(i)[run][0] for i in default.values()} == set(POLICIES)
        assert {runs_for(i)[run][1] for i in default.values()} == set(POISONS)


def test_emulated_run_really_uses_the_generated_source():
    """A wrong emulated output is caught: corrupt one element of an emulated
    softmax result and both judges must reject it."""
    (label, r), _ = emulated_runs("cuda", WORKLOADS["softmax"], "small", f32, 0,
                                  gpu={"block_threads": THREADS})
    assert_validates(r, label)
    out = next(iter(r.outputs))
    r.outputs[out].flat[4] += np.float32(0.125) * (1 + abs(r.outputs[out].flat[4]))
    with pytest.raises(AssertionError):
        assert_validates(r, label)
