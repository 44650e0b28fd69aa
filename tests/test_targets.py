"""The target registry (``tilenest/targets.py``): one row per target, and every
layer reading the row rather than a target's name.

The central check registers a third SIMT target -- a small device with 512
threads and 16 KiB of shared memory per block, no code generation -- and
shows that the schedule defaults, the storage plan, the legality gate's
binding catalogue, the resource limits and the command line all follow its
row: adding a target is adding a row (and, for code generation, a folder).
"""

from __future__ import annotations

import argparse
import importlib.util
import pathlib
from dataclasses import replace
from types import MappingProxyType

import pytest

import tilenest as tn
from tilenest import targets as T
from tilenest.errors import NotAvailableError, UsageError
from tilenest.lowering import Schedule, default_schedule, lower_verified, storage_plan
from tilenest.lowering.legality import schedule_obligations
from tilenest.lowering.schedule import for_target, unused_fields
from tilenest.proofs import gpu
from tilenest.proofs.obligation import PROVED, REFUTED, discharge

ROOT = pathlib.Path(__file__).resolve().parents[1]

#: a SIMT device unlike CUDA in every limit the layers read
SMALL = T.Target(
    "smallgpu", "a small SIMT device (tests only)",
    T.Profile(simt=True, lanes=T.SIMT_LANES, max_threads=512, shared_bytes=16 * 1024,
              static_shared_bytes=16 * 1024, f64=False, index_bits=32, max_grid=65535),
    T.Catalogue("smallgpu", ("block", "warp", "thread"),
                frozenset({("block", "warp"), ("warp", "thread")}),
                {("block", "warp"): 16, ("warp", "thread"): 32, ("block", "thread"): 512},
                {}, ("block", "warp", "thread")),
    defaults=MappingProxyType({"block_threads": 128}),
    unused=("threads", "chunk"))


@pytest.fixture
def small():
    """``SMALL`` registered for one test."""
    row = T.register(SMALL)
    yield row
    del T.TARGETS[row.name]


def example(file: str, name: str | None = None) -> tn.Kernel:
    """Kernel ``name`` (default: the file's name) of ``examples/FILE.py``."""
    spec = importlib.util.spec_from_file_location(f"ex_{file}", ROOT / "examples" / f"{file}.py")
    assert spec is not None and spec.loader is not None
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return getattr(m, name or file)


# ---------------------------------------------------------------------------
# the registry


def test_every_row_has_a_profile_a_catalogue_and_llvm_cuda_metal_compile():
    assert T.compiling() == ("llvm", "cuda", "metal")
    assert T.row("cuda").runs and T.row("metal").runs
    assert T.row("metal").host_run == {"device": "emulated"}
    assert T.profile("cuda").shared_bytes == 227 * 1024
    assert T.profile("metal").shared_bytes == 32 * 1024 and not T.profile("metal").f64
    assert not T.profile("llvm").simt and T.profile("cuda").simt
    # the proofs' catalogues are the rows' data
    from tilenest.proofs import bindings as BD

    assert BD.CUDA is T.row("cuda").catalogue and BD.METAL is T.row("metal").catalogue
    assert BD.target("llvm") is BD.target("cpu") is T.row("llvm").catalogue


def test_register_refuses_a_duplicate_and_a_lane_width_the_simt_form_lacks():
    with pytest.raises(UsageError, match="registered already"):
        T.register(T.CUDA)
    wide = replace(SMALL, name="widegpu", profile=replace(SMALL.profile, lanes=64))
    with pytest.raises(UsageError, match="32 lanes"):
        T.register(wide)
    assert "widegpu" not in T.TARGETS


def test_a_target_without_code_generation_is_refused_where_code_is_asked_for(small):
    k = example("softmax", "row_softmax")
    with pytest.raises(NotAvailableError, match="no code generation for target 'smallgpu' yet"):
        k.compile(target="smallgpu")
    with pytest.raises(NotAvailableError, match="no tuner"):
        tn.tune(k, target="llvm")


# ---------------------------------------------------------------------------
# a third SIMT row


def test_default_schedule_reads_the_row(small):
    p = example("softmax", "row_softmax").program
    s = default_schedule(p, "smallgpu")
    assert (s.target, s.block_threads, s.stages, s.threads) == ("smallgpu", 128, 1, None)
    c = default_schedule(p, "cuda")
    # the ring's depth and warp roles are the lowering's choice on cuda
    assert (c.block_threads, c.stages, c.warp_roles) == (256, None, None)
    assert unused_fields("smallgpu") == ("threads", "chunk")
    with pytest.raises(UsageError, match="not used by the smallgpu target"):
        default_schedule(p, "smallgpu", threads=4)


def test_a_backend_takes_its_defaults_from_the_row_once(monkeypatch):
    """``cuda``'s compile schedule and ``default_schedule`` both read the
    row's ``block_threads``: changing the row changes both."""
    from tilenest.backends import cuda

    p = example("softmax", "row_softmax").program
    monkeypatch.setitem(T.TARGETS, "cuda", replace(T.CUDA, defaults=MappingProxyType(
        {"block_threads": 128, "stages": 2})))
    assert default_schedule(p, "cuda").block_threads == 128
    assert cuda._schedule(p, None).block_threads == 128
    # a schedule made for another target gets the row's threads, keeps the rest
    given = cuda._schedule(p, Schedule(stages=3))
    assert (given.target, given.block_threads, given.stages) == ("cuda", 128, 3)
    assert for_target(p, Schedule(block_threads=64), "cuda").block_threads == 64


@tn.kernel
def _four_uses(x: tn.Tensor[tn.f32, "R C"], y: tn.Tensor[tn.f32, "R C"]):
    rows, cols = x.shape
    for p in tn.parallel(tn.shape(rows)):
        o = tn.coord(p.index(), 0)
        e = x[o, tn.shape(1, cols)] * 3.0
        y(o, tn.shape(1, cols)).store(e + e + e + e)


def test_storage_plan_follows_the_profile_not_the_name(small):
    for p in (example("causal_attention").program, _four_uses.program):
        gpu_plan = storage_plan(p, default_schedule(p, "cuda"))
        assert storage_plan(p, default_schedule(p, "smallgpu")) == gpu_plan
    # a cheap value used four times: kept on the CPU, recomputed on a GPU
    cpu = storage_plan(p, default_schedule(p, "llvm"))
    assert cpu != gpu_plan and "materialize" in cpu.values()


def test_legality_binds_blocks_in_the_rows_catalogue(small):
    p = example("softmax", "row_softmax").program
    obs = schedule_obligations(p, default_schedule(p, "smallgpu"))
    scope = [o for o in obs if o.kind == "binding.scope"]
    assert scope and all("smallgpu provides scope 'block'" in o.title for o in scope)
    cpu = schedule_obligations(p, default_schedule(p, "llvm"))
    assert all("cpu provides scope 'core'" in o.title for o in cpu if o.kind == "binding.scope")


def test_the_shared_limit_of_the_row_refuses_a_schedule_that_fits_cuda(small):
    """32 KiB of operand tiles per stage: within CUDA's 227 KiB, beyond the
    small device's 16 KiB, for every size (a kernel that never launches)."""
    p = example("gemm").specialize(bm=64, bn=64, bk=64).program
    k = lower_verified(p, default_schedule(p, "smallgpu", stages=2))
    cuda = gpu.resource_obligations(k, T.profile("cuda"))
    small_obs = gpu.resource_obligations(k, T.profile("smallgpu"))
    discharge(cuda + small_obs, timeout=5.0)
    cap = {o.kind: o for o in cuda if o.kind == gpu.SHARED}
    mine = {o.kind: o for o in small_obs if o.kind == gpu.SHARED}
    assert cap[gpu.SHARED].status == PROVED
    assert mine[gpu.SHARED].status == REFUTED
    assert mine[gpu.SHARED] in gpu.never_launchable(small_obs)
    assert f"<= {16 * 1024}" in mine[gpu.SHARED].title


def test_the_thread_limit_of_the_row_refuses_a_block_that_fits_cuda(small):
    p = example("softmax", "row_softmax").program
    k = lower_verified(p, default_schedule(p, "smallgpu", block_threads=1024))
    cuda = [o for o in gpu.resource_obligations(k, T.profile("cuda")) if "threads" in o.title]
    mine = [o for o in gpu.resource_obligations(k, T.profile("smallgpu"))
            if "threads" in o.title]
    discharge(cuda + mine, timeout=5.0)
    assert cuda and all(o.status == PROVED for o in cuda)
    assert mine and all(o.status == REFUTED for o in mine)
    assert all("1..512" in o.title for o in mine)


def test_the_command_line_lists_only_rows_that_compile(small):
    from tilenest import cli

    with pytest.raises(argparse.ArgumentTypeError, match="smallgpu.*no code generation yet"):
        cli._target_arg("smallgpu")
    assert cli._target_arg("metal") == "metal"  # MSL is emitted
    # its catalogue is checkable
    args = cli.build_parser().parse_args(["check", "x.py", "--target", "smallgpu"])
    assert args.target == "smallgpu"
    with pytest.raises(UsageError, match="'smallgpu': it has no code generation yet"):
        cli.build_parser().parse_args(["lower", "x.py", "--target", "smallgpu"])


def test_a_row_with_a_backend_module_becomes_a_compile_target(monkeypatch):
    from tilenest import cli
    from tilenest.validation import fuzz

    row = replace(SMALL, name="smallgpu2", module="tilenest.backends.cuda")
    T.register(row)
    try:
        assert cli._target_arg("smallgpu2") == "smallgpu2"
        help_text = cli.build_parser()._subparsers._group_actions[0].choices["lower"] \
            .format_help()
        assert "llvm, cuda, metal, smallgpu2" in help_text
        assert "smallgpu2" in fuzz.fuzz_targets()
        assert fuzz.parse_targets("llvm,smallgpu2:5") == (("llvm", 1), ("smallgpu2", 5))
        from tilenest import bench

        assert "smallgpu2" not in bench.targets()  # it names no benchmark script
    finally:
        del T.TARGETS["smallgpu2"]
    with pytest.raises(tn.errors.TilenestError, match="no fuzz target 'smallgpu'"):
        fuzz.parse_targets("llvm,smallgpu")


def test_the_fuzzer_runs_a_simt_row_with_one_warp_per_program(small):
    from tilenest.validation.fuzz import Spec, build, schedule_for

    p = build(Spec()).program
    s = schedule_for(Spec(sched="v256"), p, "smallgpu")
    assert (s.target, s.block_threads, s.vector_bits) == ("smallgpu", T.SIMT_LANES, None)
    c = schedule_for(Spec(sched="v256"), p, "llvm")
    assert c.vector_bits == 256 and c.block_threads is None

