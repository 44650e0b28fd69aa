"""The argument contract of a Metal kernel: which ``[[buffer(n)]]`` holds what.

Every phase function of a lowered kernel (``lowering/loopir.py``) takes the
same parameters, in this order (the Metal emitter spells them with
:meth:`ArgumentLayout.msl_struct`, the runtime fills them with
:meth:`ArgumentLayout.pack`; this module is the one place the order is
decided):

1. ``[[buffer(0)]]`` .. ``[[buffer(n-1)]]``: one pointer per tensor, the
   caller's tensor arguments in argument order, then the scratch buffers the
   runtime allocates for a call (``calls.scratch_arrays``), the order of the
   kernel's global buffers (``Buffer.arg``) with the scalars left out. A
   tensor the kernel writes (every scratch buffer) is ``device T*``; one it
   only reads is ``const device T*``. Bool elements are bytes (``uchar``), as
   on every target.
2. ``[[buffer(n)]]``: one ``constant`` struct holding every runtime scalar
   argument (in argument order, each in its own Metal type), then every
   symbol value (extents, and strides of strided views, in the kernel's
   symbol order) as a 64-bit ``long``. Members sit at C's natural offsets:
   each at the next multiple of its alignment, the struct's size a multiple
   of its largest alignment (:data:`MSL_SCALARS` lists sizes and
   alignments; Metal's ``long`` is 8 bytes, and Metal has no ``double``). A
   kernel with neither scalars nor symbols still gets the struct, with one
   ``uint`` member, so the buffer is never empty.
3. ``[[buffer(n+1)]]``: the status word, ``device atomic_int*``: 0 on entry;
   the first failing check stores its nonzero code there with a compare and
   exchange (as ``tn_fail`` does on ``cuda``), and the runtime raises
   ``calls.status_error`` for it after the launch.

The scalar buffers of the loop IR (``Buffer.space == "scalar"``: a runtime
scalar passed to CUDA as a one-element array) are struct members here, not
buffers. :func:`launch_geometry` gives a phase's dispatch size and refuses
what a threadgroup cannot hold.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...errors import NotAvailableError, TilenestError
from ...semantics.dtypes import DType
from ...targets import profile

#: Metal's scalar types a struct member can have: (size, alignment) in bytes
MSL_SCALARS: dict[str, tuple[int, int]] = {
    "bool": (1, 1), "char": (1, 1), "uchar": (1, 1), "short": (2, 2), "ushort": (2, 2),
    "int": (4, 4), "uint": (4, 4), "long": (8, 8), "ulong": (8, 8),
    "half": (2, 2), "bfloat": (2, 2), "float": (4, 4),
}

#: the Metal type of each tilenest dtype (f64 has none: Apple GPUs have no double)
MSL_TYPE: dict[str, str] = {
    "bool": "bool", "i8": "char", "i16": "short", "i32": "int", "i64": "long",
    "u8": "uchar", "u16": "ushort", "u32": "uint", "u64": "ulong",
    "f16": "half", "bf16": "bfloat", "f32": "float",
}

#: the numpy type whose bytes are a Metal scalar's bytes (bfloat: its bits)
_NP_OF: dict[str, str] = {
    "bool": "?", "char": "i1", "uchar": "u1", "short": "<i2", "ushort": "<u2", "int": "<i4",
    "uint": "<u4", "long": "<i8", "ulong": "<u8", "half": "<f2", "bfloat": "<u2",
    "float": "<f4",
}

#: most threads in one threadgroup, most threadgroup memory one threadgroup can
#: have (bytes), most threadgroups in one dimension of a grid: the metal row's
#: profile (``tilenest/targets.py``)
MAX_THREADS = profile("metal").max_threads
MAX_THREADGROUP_MEMORY = profile("metal").shared_bytes
MAX_THREADGROUPS = profile("metal").max_grid

#: the name of the status word parameter, and of the struct parameter
STATUS = "tn_status"
ARGS = "tn_args"


def msl_type(dt: DType, what: str) -> str:
    """The Metal type of values of ``dt``; f64 is refused (``what`` names the value)."""
    t = MSL_TYPE.get(dt.name)
    if t is None:
        raise NotAvailableError(f"{what} has dtype {dt.name}, which Metal cannot hold "
                                "(Apple GPUs have no double)",
                                hint="use f32, or run on the llvm or cuda target")
    return t


@dataclass(frozen=True)
class Member:
    """One member of the constant struct: its Metal type and name, its byte
    offset, and what it holds (``kind`` ``scalar``: the argument ``source``;
    ``symbol``: the symbol ``source``; ``pad``: nothing)."""

    name: str
    type: str
    offset: int
    kind: str
    source: str


@dataclass(frozen=True)
class Tensor:
    """One tensor parameter: ``[[buffer(index)]]``, the Metal element type,
    the parameter's name in the source, whether the kernel writes it, and
    the loop IR buffer it is (``arg``: its kernel argument position)."""

    index: int
    elem: str
    name: str
    written: bool
    buffer: str
    arg: int

    def declaration(self) -> str:
        q = "device" if self.written else "const device"
        return f"{q} {self.elem}* {self.name} [[buffer({self.index})]]"


@dataclass(frozen=True)
class ArgumentLayout:
    """The parameters of every phase function of one Metal kernel (see the
    module docstring): ``tensors`` at ``[[buffer(0..n-1)]]``, the struct
    ``struct_name`` of ``members`` (``size`` bytes) at ``[[buffer(n)]]``, the
    status word at ``[[buffer(n+1)]]``."""

    struct_name: str
    tensors: tuple[Tensor, ...]
    members: tuple[Member, ...]
    size: int
    align: int
    #: the dtype of each scalar argument, by name
    scalar_dtypes: tuple[tuple[str, DType], ...] = ()

    @property
    def struct_index(self) -> int:
        """The ``[[buffer(n)]]`` of the constant struct."""
        return len(self.tensors)

    @property
    def status_index(self) -> int:
        """The ``[[buffer(n)]]`` of the status word."""
        return len(self.tensors) + 1

    def member(self, kind: str, source: str) -> Member:
        """The member holding scalar argument (``kind="scalar"``) or symbol
        (``kind="symbol"``) ``source``."""
        for m in self.members:
            if m.kind == kind and m.source == source:
                return m
        raise KeyError(f"no {kind} {source!r} in {self.struct_name}")

    def msl_struct(self) -> tuple[str, str]:
        """The MSL text of the struct declaration, and the parameter list of
        a phase function (comma separated, without parentheses), for the
        emitter to paste."""
        lines = [f"struct {self.struct_name} {{"]
        lines += [f"    {m.type} {m.name};  // offset {m.offset}" for m in self.members]
        lines.append("};")
        params = [t.declaration() for t in self.tensors]
        params.append(f"constant {self.struct_name}& {ARGS} [[buffer({self.struct_index})]]")
        params.append(f"device atomic_int* {STATUS} [[buffer({self.status_index})]]")
        return "\n".join(lines) + "\n", ", ".join(params)

    def dtype(self) -> np.dtype:
        """A numpy structured dtype with the struct's exact layout (explicit
        offsets and item size)."""
        return np.dtype({"names": [m.name for m in self.members],
                         "formats": [_NP_OF[m.type] for m in self.members],
                         "offsets": [m.offset for m in self.members],
                         "itemsize": self.size})

    def pack(self, scalars: Mapping[str, Any], symbols: Mapping[str, int]) -> bytes:
        """The bytes of the constant buffer for one call: each scalar argument
        (by parameter name) converted to its dtype as the interpreter does,
        each symbol (by name) as a 64-bit integer; padding is zero. A missing
        value or an out-of-range one is an error."""
        from ...semantics.numerics import constant

        rec = np.zeros((), dtype=self.dtype())
        for m in self.members:
            if m.kind == "pad":
                continue
            if m.kind == "scalar":
                if m.source not in scalars:
                    raise TilenestError(f"no value for the scalar argument '{m.source}'")
                dt = dict(self.scalar_dtypes)[m.source]
                try:
                    v = np.array(constant(scalars[m.source], dt), dtype=dt.np)
                except (ValueError, TypeError) as e:
                    raise TilenestError(f"argument '{m.source}': {e}") from None
                if m.type == "bfloat":
                    v = v.view(np.uint16)
                rec[m.name] = v
            else:
                if m.source not in symbols:
                    raise TilenestError(f"no value for the symbol '{m.source}'")
                s = int(symbols[m.source])
                if not -2**63 <= s < 2**63:
                    raise TilenestError(f"symbol '{m.source}' = {s} does not fit 64 bits")
                rec[m.name] = s
        return rec.tobytes()


def bind(lay: ArgumentLayout, facts: Any, keep: list) -> tuple[list[np.ndarray], dict[str, Any]]:
    """One call's values for the layout, on every device alike: an array per
    tensor, in layout order, over the caller's memory (bool elements as
    bytes, bf16 elements as their 16-bit patterns, a strided view as the
    memory from its first element on, a read-only input as a writeable alias
    of the same memory), and each runtime scalar argument's value by name
    (bound, in ``keep``, as a one-element array at its argument position)."""
    from ...semantics import arrays as A

    tensors: list[np.ndarray] = []
    for t in lay.tensors:
        a = keep[t.arg]
        a = a.reshape(-1) if a.ndim == 0 else a
        if not a.flags.c_contiguous:
            a = A.span(a)
        if a.dtype == np.bool_:
            a = a.view(np.uint8)
        elif t.elem == "bfloat":
            a = a.view(np.uint16)
        tensors.append(A.input_alias(a))
    where = {b.name: b.arg for b in facts.globals if b.space == "scalar"}
    scalars = {name: keep[where[name]].reshape(-1)[0].item() for name, _ in lay.scalar_dtypes}
    return tensors, scalars


def _ident(prefix: str, name: str, taken: set[str]) -> str:
    """A fresh C identifier for ``name`` (``prefix`` keeps it clear of Metal's keywords)."""
    base = prefix + re.sub(r"[^0-9A-Za-z_]", "_", name)
    out, k = base, 1
    while out in taken:
        out, k = f"{base}_{k}", k + 1
    taken.add(out)
    return out


def _align(x: int, a: int) -> int:
    return (x + a - 1) // a * a


def layout(kernel: Any, written: Collection[str], arguments: int | None = None) -> ArgumentLayout:
    """The argument layout of ``kernel`` (a loop IR ``Kernel``, or the
    ``CallFacts`` of one: its ``name``, ``globals`` and ``syms``).
    ``written`` names the tensor parameters the kernel stores to
    (``signature.stored_tensors``); ``arguments`` is the number of the
    caller's arguments (the global buffers past it are scratch, always
    written; left out, the count of a loop IR kernel's non-scratch params)."""
    if arguments is None:
        arguments = sum(1 for p in kernel.params if p.kind != "scratch")
    taken: set[str] = set()
    tensors: list[Tensor] = []
    scalars: list[tuple[str, str, DType]] = []  # (member name, source, dtype)
    for b in sorted(kernel.globals, key=lambda b: b.arg):
        if b.space == "scalar":
            msl_type(b.dtype, f"scalar argument '{b.name}'")
            scalars.append((_ident("a_", b.name, taken), b.name, b.dtype))
            continue
        elem = "uchar" if b.dtype.is_bool else msl_type(b.dtype, f"tensor '{b.name}'")
        tensors.append(Tensor(len(tensors), elem, _ident("b_", b.name, taken),
                              b.arg >= arguments or b.name in written, b.name, b.arg))
    members: list[Member] = []
    offset, align = 0, 1

    def add(name: str, ty: str, kind: str, source: str) -> None:
        nonlocal offset, align
        size, a = MSL_SCALARS[ty]
        offset = _align(offset, a)
        members.append(Member(name, ty, offset, kind, source))
        offset += size
        align = max(align, a)

    for name, src, dt in scalars:
        add(name, MSL_TYPE[dt.name], "scalar", src)
    for s in kernel.syms:
        add(_ident("s_", s, taken), "long", "symbol", s)
    if not members:
        add(_ident("tn_", "unused", taken), "uint", "pad", "")
    struct = _ident("", f"tn_args_{kernel.name}", taken)
    return ArgumentLayout(struct, tuple(tensors), tuple(members), _align(offset, align), align,
                          tuple((src, dt) for _, src, dt in scalars))


def launch_geometry(phase: str, programs: int, threads: int, threadgroup_bytes: int,
                    site: Any = None) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """``(threadgroups per grid, threads per threadgroup)`` of one dispatch
    of ``phase``: one threadgroup of ``threads`` threads per program (1-D).
    More than :data:`MAX_THREADS` threads, more than
    :data:`MAX_THREADGROUP_MEMORY` bytes of threadgroup memory or more than
    :data:`MAX_THREADGROUPS` programs is an error naming the sizes, never a
    truncated dispatch."""
    if threads < 1 or threads > MAX_THREADS:
        raise TilenestError(f"{phase}: {threads} threads per program; a Metal threadgroup "
                            f"holds 1 to {MAX_THREADS}", site,
                            "use fewer threads per program (the schedule's block threads)")
    if threadgroup_bytes > MAX_THREADGROUP_MEMORY:
        raise TilenestError(f"{phase}: the program's shared buffers need {threadgroup_bytes} "
                            f"bytes for these sizes, above the {MAX_THREADGROUP_MEMORY} a Metal "
                            "threadgroup can have", site,
                            "use smaller tiles per program (the shared-capacity obligation "
                            "states the sizes that fit)")
    if programs > MAX_THREADGROUPS:
        raise TilenestError(f"{phase}: {programs} programs exceed Metal's grid limit "
                            f"{MAX_THREADGROUPS}", site, "split the top-level parallel domain")
    return (max(0, programs), 1, 1), (threads, 1, 1)


@dataclass(frozen=True)
class Dispatch:
    """One phase function's dispatch, on every device alike: ``grid``
    threadgroups of ``group`` threads (:func:`launch_geometry`) with
    ``threadgroup_bytes`` of threadgroup memory."""

    name: str
    grid: tuple[int, int, int]
    group: tuple[int, int, int]
    threadgroup_bytes: int


def dispatches(kernel: Any, syms: Mapping[str, int]) -> list[Dispatch]:
    """The dispatches of one call of ``kernel`` (a ``MetalKernel``) with these
    symbol values, in phase order (phases with no programs left out; a
    phase without shared buffers gets no threadgroup memory), each checked
    against the metal profile at the kernel's site."""
    out = []
    for info, n, smem in kernel.launches(syms):
        smem = smem if info.threadgroup else 0
        grid, group = launch_geometry(info.name, n, info.threads, smem, kernel.program.site)
        out.append(Dispatch(info.name, grid, group, smem))
    return out
