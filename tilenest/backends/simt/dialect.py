"""The spelling of one SIMT source language, as a table the emitter core reads.

The emitter core (:mod:`.emitter`) decides *what* a loop-IR kernel becomes
(which loops unroll, which accesses widen, which values live in registers);
a :class:`Dialect` says only *how it is written*: function qualifiers,
address-space words, thread and block builtins, barrier and lane-collective
calls, vector types, math function names and literals. A second language is
a second table plus its vendor-only rules (a subclass of the core's
``Emitter`` adding rules), not a copy of the emitter.

Scalar semantics live in the shared prelude (``tn_*`` functions): a dialect
names the prelude header it includes, and the core calls the prelude's
functions by their portable names.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ...semantics import dtypes as D


@dataclass(frozen=True)
class Dialect:
    """The spelling of one SIMT language (see the module docstring).

    Every text fragment the core emits that is not a prelude call or C-family
    punctuation comes from here. Format strings name their holes (``{t}``,
    ``{n}`` ...); each field's comment says which."""

    #: the target's name, in messages ("... has no cuda lowering")
    name: str
    #: lanes of one lane-collective group (warp / simdgroup)
    warp_size: int
    #: register type of each dtype name
    types: Mapping[str, str]
    #: element type of a buffer of bool (one byte)
    byte: str
    #: index arithmetic: bits -> (signed type, literal suffix, unsigned type)
    index_types: Mapping[int, tuple[str, str, str]]
    #: type of a kernel symbol in the argument list (always 64-bit)
    sym_param: str
    #: type of the status word argument, pointer included
    status_param: str
    #: words before a pointer or array of each address space
    #: ("global", "shared", "local", "constant")
    spaces: Mapping[str, str]
    #: the no-alias qualifier of a pointer parameter (with its leading blank)
    restrict: str
    #: the kernel function's head: {bounds} the launch-bound attribute
    #: (:attr:`launch_bounds`), {name} the function
    kernel_head: str
    #: launch-bound attribute: {threads} per block, {min_blocks} resident
    #: blocks (:attr:`launch_bounds_min` when a minimum is asked)
    launch_bounds: str
    launch_bounds_min: str
    #: declaration of the dynamic shared bytes (named ``tn_smem``)
    shared_array: str
    #: the statement rounding the shared base up to 1024 bytes for swizzled
    #: tiles (defines ``tn_sbase``); None: no swizzled layouts
    shared_realign: str | None
    #: the line including the prelude
    include: str
    #: thread index in the block, block index, blocks in the grid
    thread_id: str
    block_id: str
    grid_blocks: str
    #: barrier statement of each scope ("block", "warp")
    barriers: Mapping[str, str]
    #: a lane shuffle of mode {mode} ("idx", "xor", "down", "up"): {mask}
    #: the lanes taking part (an int), {value}, {lane}, {width}
    shuffle: str
    #: a ``V``-lane pack of element type {t} ({n} lanes), its aligned
    #: load and store functions
    pack: str
    vload: str
    vstore: str
    #: the loop pragma that asks for full unrolling; {n}: unroll n times
    unroll: str
    unroll_n: str
    #: math: float function of loop IR op -> base name (the op itself when
    #: absent); suffix of the f32 variant; fused multiply-add base name
    math: Mapping[str, str]
    f32_suffix: str
    fma: str
    #: a literal of a dtype holding a Python value
    literal: Callable[[Any, D.DType], str]
    #: the qualifiers of a helper function compiled once and called, never
    #: inlined (:meth:`Emitter.outlined`); None: every helper is inlined
    outline: str | None = None
    #: cheaper realizations of functions under a declared accuracy bound
    #: (``loopir.Un.ulp``): (op, dtype name) -> ((prelude function, the ulp
    #: bound it meets), ...), cheapest first; the first whose bound the
    #: declared one admits is taken
    approx: Mapping[tuple[str, str], tuple[tuple[str, float], ...]] = field(
        default_factory=dict)

    def reg(self, dt: D.DType) -> str:
        """The register type of ``dt``."""
        return self.types[dt.name]

    def mem(self, dt: D.DType) -> str:
        """The element type of a buffer of ``dt`` (bool occupies a byte)."""
        return self.byte if dt.is_bool else self.types[dt.name]

    def math_fn(self, op: str, f64: bool) -> str:
        """The float function computing ``op`` in double (``f64``) or float."""
        return self.math.get(op, op) + ("" if f64 else self.f32_suffix)
