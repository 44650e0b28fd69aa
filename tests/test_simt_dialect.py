"""The emulator takes a dialect and a target profile's limits.

A dialect defined here, in the test -- a thin header over the runtime core
``tn_runtime.h`` with its own spelling of kernels, barriers and collectives
-- is built and run by the emulator with NVRTC made unusable: emulating a
language other than CUDA compiles nothing for a GPU. The launch limits
(lanes per warp, threads per block, shared memory) reach the runtime from
the emulator: the same build gives different collectives under 8 and 16
lanes, and a launch beyond the profile is refused.
"""

from __future__ import annotations


import numpy as np
import pytest

from tilenest.backends.simt import emulator as em
from tilenest.backends.simt.emu_dialects import CUDA, Dialect, Limits, dialect
from tilenest.errors import UsageError

#: the toy language's thin header: its names for the runtime's barrier,
#: thread index and collectives (sum and ballot over every lane of the warp)
TOY_HEADER = r"""
#define TN_EMU_BARRIER_NAME "toy_barrier()"
#define TN_EMU_TRAP_NAME "toy_trap()"
#define TN_EMU_OP_NAMES "toy_sync", "toy_shuffle", "toy_shuffle_up", "toy_shuffle_down", \
    "toy_shuffle_xor", "toy_ballot", "toy_any", "toy_all", "toy_sum", "toy_min", "toy_max", \
    "toy_and", "toy_or", "toy_xor"
#include "tn_runtime.h"
#define toy_kernel
#define toy_tid ((int)tn_emu::cur_thread_idx().x)
#define toy_barrier() tn_emu::syncthreads_impl(__LINE__, 0)
#define toy_sum(v) ((int)(uint32_t)tn_emu::collective(tn_emu::OP_RED_ADD, __LINE__, \
    tn_emu::full_mask(), tn_emu::S.lanes, 1, (uint32_t)(v)))
#define toy_ballot(p) ((unsigned)tn_emu::collective(tn_emu::OP_BALLOT, __LINE__, \
    tn_emu::full_mask(), tn_emu::S.lanes, 0, (p) != 0))
"""

#: kernels live in a namespace: the launcher reaches them through the
#: dialect's entry format
TOY_SOURCE = r"""
namespace toy {
toy_kernel void lanes(int* out, const int* in) {
  int t = toy_tid;
  int v = in[t];
  int s = toy_sum(v);
  unsigned b = toy_ballot(v % 2);
  toy_barrier();
  out[2 * t] = s;
  out[2 * t + 1] = (int)b;
}
toy_kernel void early_exit(int* out) {
  if (toy_tid == 0) return;
  toy_barrier();
  out[toy_tid] = 1;
}
}
"""

TOY_LIMITS = Limits(lanes=8, max_threads=32, max_block=(32, 1, 1), shared_bytes=4096)


@pytest.fixture
def toy(tmp_path) -> Dialect:
    header = tmp_path / "tn_toy_shim.h"
    header.write_text(TOY_HEADER)
    return Dialect(name="toy", title="Toy", language="Toy C++", header=header, std="c++14",
                   defines=("TN_EMULATE=1",), kernel_marker="toy_kernel", limits=TOY_LIMITS,
                   entry="toy::{name}", hints={1: "toy: every thread meets the barrier"})


def _expected(values: np.ndarray, lanes: int) -> np.ndarray:
    out = np.zeros(2 * len(values), np.int32)
    for t in range(len(values)):
        g = values[t - t % lanes: t - t % lanes + lanes]
        out[2 * t] = g.sum()
        out[2 * t + 1] = sum(1 << k for k, v in enumerate(g) if v % 2)
    return out


def test_a_non_cuda_dialect_builds_and_runs_without_nvrtc(toy, no_nvrtc):
    assert em.parse_kernels(TOY_SOURCE, toy) == {"lanes": ["int *", "const int *"],
                                                 "early_exit": ["int *"]}
    mod = em.build(TOY_SOURCE, dialect=toy)
    assert mod.dialect is toy and mod.limits == TOY_LIMITS
    values = np.arange(1, 17, dtype=np.int32) * np.array([1, 2, 3, 5] * 4, np.int32)
    for policy in em.POLICIES:
        out = np.zeros(32, np.int32)
        mod.launch("lanes", 1, 16, [out, values], policy=policy, seed=3)
        np.testing.assert_array_equal(out, _expected(values, 8))


def test_the_lanes_of_a_warp_come_from_the_launch_limits(toy, no_nvrtc):
    wide = Limits(lanes=16, max_threads=32, max_block=(32, 1, 1), shared_bytes=4096)
    mod = em.build(TOY_SOURCE, dialect=toy, limits=wide)
    values = np.arange(16, dtype=np.int32)
    out = np.zeros(32, np.int32)
    mod.launch("lanes", 1, 16, [out, values])
    np.testing.assert_array_equal(out, _expected(values, 16))
    assert not np.array_equal(_expected(values, 16), _expected(values, 8))


def test_errors_are_spelled_in_the_dialect(toy, no_nvrtc):
    mod = em.build(TOY_SOURCE, dialect=toy)
    with pytest.raises(em.EmulatorError, match=r"toy_barrier\(\)") as info:
        mod.launch("early_exit", 1, 8, [np.zeros(8, np.int32)])
    assert info.value.hint == "toy: every thread meets the barrier"
    assert info.value.sites and info.value.sites[0].file == "<toy:early_exit>"


def test_a_launch_beyond_the_profile_is_refused(toy, no_nvrtc):
    mod = em.build(TOY_SOURCE, dialect=toy)
    with pytest.raises(em.EmulatorError, match="at most 32 threads"):
        mod.launch("lanes", 1, 64, [np.zeros(128, np.int32), np.zeros(64, np.int32)])
    with pytest.raises(em.LaunchError, match=r"outside 0\.\.4096"):
        mod.launch("lanes", 1, 8, [np.zeros(16, np.int32), np.zeros(8, np.int32)],
                   shared_bytes=8192)


def test_limits_the_runtime_cannot_emulate_are_refused():
    with pytest.raises(UsageError, match="power of two"):
        Limits(lanes=12, max_threads=32, max_block=(32, 1, 1), shared_bytes=0)
    with pytest.raises(UsageError, match="lanes=64"):
        Limits(lanes=64, max_threads=32, max_block=(32, 1, 1), shared_bytes=0)
    with pytest.raises(UsageError, match="shared_bytes"):
        Limits(lanes=32, max_threads=32, max_block=(32, 1, 1), shared_bytes=1 << 20)


def test_dialects_are_found_by_name():
    assert dialect("cuda") is CUDA and dialect(CUDA) is CUDA
    with pytest.raises(UsageError, match="dialects: cuda"):
        dialect("fortran")


def test_a_changed_runtime_core_is_a_new_build(toy, tmp_path, monkeypatch, no_nvrtc):
    """The build key and the precompiled header's key cover the runtime
    core's text, not only the dialect header's: a precompiled shim that
    outlived a change of ``tn_runtime.h`` would be read in place of it."""
    monkeypatch.setenv("TILENEST_EMU_CACHE", str(tmp_path / "cache"))
    first = em.build(TOY_SOURCE, dialect=toy).path
    assert em.build(TOY_SOURCE, dialect=toy).path == first  # cached
    changed = tmp_path / "tn_runtime.h"
    changed.write_text(em.RUNTIME_PATH.read_text() + "\n/* changed */\n")
    monkeypatch.setattr(em, "RUNTIME_PATH", changed)
    assert em.build(TOY_SOURCE, dialect=toy).path != first
    assert len(list((tmp_path / "cache").glob("shim-*.h"))) == 2


def test_a_build_error_names_the_dialect(toy, no_nvrtc):
    with pytest.raises(em.EmulatorBuildError, match="against the Toy shim") as info:
        em.build("toy_kernel void broken(int* a) { a[0] = toy_undefined; }\n", dialect=toy)
    assert "not valid Toy C++" in (info.value.hint or "")
