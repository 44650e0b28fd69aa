"""The emulator's dialects: what it needs to know of one SIMT language.

The emulator (:mod:`tilenest.backends.simt.emulator`) compiles a generated
source as host C++ against the runtime core ``shim/tn_runtime.h`` and one
thin header per language. A :class:`Dialect` names that header, the
compiler options the language needs (its C++ standard, its macros), how a
kernel definition is recognised in the source, which function the launcher
of a kernel calls, and the hints of its error messages (in its spelling). A
launch runs under a target profile's :class:`Limits`, which the runtime
receives with every launch; a dialect carries the profile the emulator uses
when the caller names none.

Two dialects are registered: :data:`CUDA` and :data:`METAL` (the Metal
Shading Language, whose kernels take their built-in values -- thread and
threadgroup positions, the threadgroup memory -- as attributed parameters
that the launcher fills per thread). A new language is a new
:class:`Dialect` row and a thin header, with no change to the runtime.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tilenest.errors import UsageError
from tilenest.targets import profile

__all__ = ["CUDA", "DIALECTS", "METAL", "RUNTIME_PATH", "SHIM_DIR", "Dialect", "Limits", "dialect"]

#: the folder of the runtime core and the dialects' thin headers
SHIM_DIR = Path(__file__).with_name("shim")
#: the dialect-free runtime core every thin header includes
RUNTIME_PATH = SHIM_DIR / "tn_runtime.h"
#: the portable scalar prelude's folder, on every dialect's include path
_PRELUDE_DIR = Path(__file__).with_name("prelude")
#: the shared-memory storage the runtime has (TN_EMU_SMEM_STORAGE): no profile exceeds it
SMEM_STORAGE = 228 * 1024
#: a C++ attribute, ``[[...]]``
_ATTRIBUTE = re.compile(r"\[\[[^\[\]]*\]\]")
#: the widest warp the runtime emulates (a collective's mask is 32 bits)
MAX_LANES = 32


@dataclass(frozen=True)
class Limits:
    """A target profile's limits that a launch must respect: ``lanes``
    threads per warp (CUDA) or simdgroup (Metal), at most ``max_threads``
    threads per block with each extent within ``max_block``, at most
    ``shared_bytes`` bytes of dynamic shared (threadgroup) memory."""

    lanes: int
    max_threads: int
    max_block: tuple[int, int, int]
    shared_bytes: int

    def __post_init__(self) -> None:
        ok = (isinstance(self.lanes, int) and 1 <= self.lanes <= MAX_LANES
              and self.lanes & (self.lanes - 1) == 0)
        if not ok:
            raise UsageError(f"emulator limits: lanes={self.lanes!r} is not a power of two in "
                             f"1..{MAX_LANES}",
                             hint="a collective's lane mask is 32 bits wide")
        if self.max_threads < 1 or len(self.max_block) != 3 or min(self.max_block) < 1:
            raise UsageError(f"emulator limits: max_threads={self.max_threads} and "
                             f"max_block={self.max_block} must be positive",
                             hint="max_block is the (x, y, z) bound of a block's extents")
        if not 0 <= self.shared_bytes <= SMEM_STORAGE:
            raise UsageError(f"emulator limits: shared_bytes={self.shared_bytes} is outside "
                             f"0..{SMEM_STORAGE}",
                             hint="the emulator's shared-memory storage is "
                                  f"{SMEM_STORAGE // 1024} KiB")


@dataclass(frozen=True)
class Dialect:
    """One language the emulator runs.

    ``name``: the dialect's key (and the file name of its sites,
    ``<name:kernel>``); ``title`` and ``language``: how messages name the
    dialect and its source language; ``header``: the thin header ``-include``d before the source (it includes
    ``tn_runtime.h``, found on the include path); ``std``: the C++ standard
    of ``-std=``; ``defines``: ``NAME=VALUE`` macros of every build;
    ``kernel_marker``: the word that starts a kernel definition
    (``__global__``); ``entry``: the function a kernel's launcher calls, a
    format of the kernel's ``name``; ``include_dirs``: folders searched for
    the source's includes after the caller's; ``limits``: the profile a
    launch uses when the caller names none; ``hints``: the hint of each
    runtime error code, in the language's words.

    Parameters, for languages that pass more than arguments:
    ``builtins`` maps a parameter attribute (``[[NAME]]``, as written
    between the brackets without spaces) to the C++ expression the launcher
    passes for it in the running thread (``{type}`` names the parameter's
    type); such a parameter is no launch argument. ``address_spaces`` are the
    words of a parameter type that name memory, not type (left out when the
    emulator reads the type), ``read_only`` those of them whose memory the
    kernel cannot write, and ``type_names`` maps the language's type names
    to the C names the emulator checks arrays and scalars by.
    ``strip_attributes``: the source's ``[[...]]`` attributes are blanked
    before it is compiled (same length, so lines and columns stay): Metal's
    attribute arguments use words the shim defines as macros
    (``[[threadgroup(0)]]``), and the launcher has read them already.
    ``refused`` maps a pattern of source text the emulator cannot run
    faithfully to the hint of the error it raises for it. ``structs``: the
    struct types a kernel may take by value, with their sizes; the caller
    passes such a parameter as an array of exactly that many bytes (CUDA's
    ``__grid_constant__`` tensor maps, ``tn_tmap``)."""

    name: str
    title: str
    language: str
    header: Path
    std: str
    defines: tuple[str, ...]
    kernel_marker: str
    limits: Limits
    entry: str = "{name}"
    include_dirs: tuple[Path, ...] = (_PRELUDE_DIR,)
    hints: Mapping[int, str] = field(default_factory=dict)
    builtins: Mapping[str, str] = field(default_factory=dict)
    address_spaces: tuple[str, ...] = ()
    read_only: tuple[str, ...] = ()
    type_names: Mapping[str, str] = field(default_factory=dict)
    strip_attributes: bool = False
    refused: Mapping[str, str] = field(default_factory=dict)
    structs: Mapping[str, int] = field(default_factory=dict)

    def flags(self) -> tuple[str, ...]:
        """The compiler options of the language: source kind, standard, macros."""
        return ("-x", "c++", f"-std={self.std}", *(f"-D{d}" for d in self.defines))

    def prepare(self, source: str) -> str:
        """The text the host compiler sees of a ``source`` of this dialect."""
        if not self.strip_attributes:
            return source
        return _ATTRIBUTE.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), source)

    def refusals(self, source: str) -> list[tuple[int, str, str]]:
        """``(line, text, hint)`` of each construct of ``source`` this dialect refuses."""
        out = []
        for pattern, hint in self.refused.items():
            for m in re.finditer(pattern, source):
                out.append((source.count("\n", 0, m.start()) + 1, m.group(0), hint))
        return sorted(out)

    def kernel_pattern(self) -> re.Pattern[str]:
        """A kernel definition's start: the marker, then up to the name and ``(``."""
        return re.compile(r"(?<![\w])" + re.escape(self.kernel_marker) +
                          r"\b(?P<head>[^;{}()]*?)\b(?P<name>[A-Za-z_]\w*)\s*\(")


CUDA = Dialect(
    name="cuda",
    title="CUDA",
    language="CUDA C++",
    header=SHIM_DIR / "tn_cuda_shim.h",
    std="c++17",
    defines=("TN_EMULATE=1",),
    kernel_marker="__global__",
    structs={"tn_tmap": 128},
    # the cuda row's profile (an H200: 32-lane warps, 1024 threads, the 228 KiB
    # shared window of a multiprocessor); CUDA itself caps a block's z at 64
    limits=Limits(lanes=profile("cuda").lanes, max_threads=profile("cuda").max_threads,
                  max_block=(profile("cuda").max_threads, profile("cuda").max_threads, 64),
                  shared_bytes=profile("cuda").sm_shared_bytes),
    hints={
        1: "every thread of the block must reach the same __syncthreads(); hoist the barrier "
           "out of the thread-dependent branch or early return",
        2: "a warp collective's mask must name exactly the lanes that call it, each lane "
           "included; with all 32 lanes participating use 0xffffffff",
        3: "a barrier or collective waits for a thread that waits elsewhere; make all threads "
           "meet the same synchronization in the same order",
        4: "raise stack_size= in the launch, or move large per-thread arrays to shared memory",
        5: "an index runs outside its buffer, an argument pointer is wrong, or a vector access "
           "is not aligned to its size (CUDA faults on a misaligned address)",
        6: "the kernel executed __trap()",
        7: "check grid, block, shared_bytes and stack_size against CUDA's limits",
        8: "an integer division by zero (or INT_MIN / -1) in the kernel",
        9: "every lane named in a collective's mask must call it; narrow the mask to the lanes "
           "that reach the call",
        10: "a bulk copy's completion barrier (mbarrier) must expect its bytes before they "
            "land, see one arrival per phase, and be waited for before the next group "
            "reuses it; the issuing thread waits for its copies before it exits. A wgmma's "
            "accumulator and A registers stay unwritten until the wgmma wait_group that "
            "completes it",
    },
)

#: the Metal profile of the metal row (32-lane simdgroups, 1024 threads, 32 KiB)
_METAL_PROFILE = profile("metal")

METAL = Dialect(
    name="metal",
    title="Metal",
    language="Metal Shading Language (C++14)",
    header=SHIM_DIR / "tn_metal_shim.h",
    std="c++14",
    defines=("TN_EMULATE=1",),
    kernel_marker="kernel",
    limits=Limits(lanes=_METAL_PROFILE.lanes, max_threads=_METAL_PROFILE.max_threads,
                  max_block=(_METAL_PROFILE.max_threads,) * 3,
                  shared_bytes=_METAL_PROFILE.shared_bytes),
    builtins={
        "threadgroup_position_in_grid": "tn_emu::msl_value<{type}>(tn_emu::msl_threadgroup_position())",
        "thread_position_in_threadgroup": "tn_emu::msl_value<{type}>(tn_emu::msl_thread_position())",
        "threads_per_threadgroup": "tn_emu::msl_value<{type}>(tn_emu::msl_threads_per_threadgroup())",
        "threadgroups_per_grid": "tn_emu::msl_value<{type}>(tn_emu::msl_threadgroups_per_grid())",
        "thread_position_in_grid": "tn_emu::msl_value<{type}>(tn_emu::msl_thread_position_in_grid())",
        "thread_index_in_threadgroup": "tn_emu::msl_value<{type}>(tn_emu::msl_thread_index())",
        "thread_index_in_simdgroup": "tn_emu::msl_value<{type}>(tn_emu::msl_lane())",
        "simdgroup_index_in_threadgroup": "tn_emu::msl_value<{type}>(tn_emu::msl_simdgroup())",
        "threads_per_simdgroup": "tn_emu::msl_value<{type}>(tn_emu::msl_simd_size())",
        # the one threadgroup memory argument: the block's poisoned storage
        "threadgroup(0)": "({type})(void *)tn_smem",
    },
    address_spaces=("device", "constant", "threadgroup", "thread"),
    read_only=("constant",),
    strip_attributes=True,
    # a threadgroup variable declared in a kernel would be each thread's own
    # on the host (the address-space word is empty there): never silently
    refused={r"\bthreadgroup\s+(?:const\s+)?[A-Za-z_][\w:]*\s+[A-Za-z_]\w*\s*[\[;=]":
             "the emulator shares threadgroup memory through the kernel's "
             "[[threadgroup(0)]] parameter only; declare no threadgroup variables"},
    type_names={"uint": "unsigned int", "uchar": "unsigned char", "ushort": "unsigned short",
                "char": "signed char", "long": "long long", "ulong": "unsigned long long",
                "atomic_int": "int", "atomic_uint": "unsigned int", "half": "half",
                "bfloat": "bfloat"},
    hints={
        1: "every thread of the threadgroup must reach the same threadgroup_barrier(); hoist "
           "the barrier out of the thread-dependent branch or early return",
        2: "every lane of the simdgroup must call the same simdgroup function with values of "
           "one type (Metal's simd_* functions take no lane mask)",
        3: "a barrier or simdgroup function waits for a thread that waits elsewhere; make all "
           "threads meet the same synchronization in the same order",
        4: "raise stack_size= in the launch, or move large per-thread arrays to threadgroup "
           "memory",
        5: "an index runs outside its buffer or an argument buffer is wrong",
        6: "the kernel trapped",
        7: "check the threadgroups, threads per threadgroup and threadgroup memory against "
           "the metal profile's limits",
        8: "an integer division by zero (or INT_MIN / -1) in the kernel",
        9: "every lane of the simdgroup must call a simd_* function: a lane that returned "
           "early may not leave the others waiting in it",
    },
)

#: every dialect by name
DIALECTS: dict[str, Dialect] = {CUDA.name: CUDA, METAL.name: METAL}


def dialect(d: Dialect | str) -> Dialect:
    """``d`` itself, or the registered dialect of that name."""
    if isinstance(d, Dialect):
        return d
    if d not in DIALECTS:
        raise UsageError(f"the emulator has no dialect '{d}'",
                         hint="dialects: " + ", ".join(DIALECTS))
    return DIALECTS[d]
