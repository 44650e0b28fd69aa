"""The Metal Shading Language's row of the SIMT spelling table
(:class:`..simt.dialect.Dialect`).

Metal's four address spaces are written on every pointer (``device`` for
tensors, ``threadgroup`` for shared buffers, ``thread`` for a thread's own
values, ``constant`` for the argument struct); its barriers name the memory
they order; its simdgroup functions take no lane mask. The types are Metal's
(``long`` is 64 bits; there is no ``double``): an f64 value has no
spelling here, and asking for one is refused (:func:`literal`, and the
emitter's checks in :mod:`.rules`).
"""

from __future__ import annotations

import math
from typing import Any

import ml_dtypes
import numpy as np

from ...errors import NotAvailableError
from ...semantics import dtypes as D
from ..simt.dialect import Dialect

#: register types of each dtype (16-bit floats are Metal's half and bfloat,
#: computed in float; f64 has none)
REG = {"bool": "bool", "i8": "char", "i16": "short", "i32": "int", "i64": "long",
       "u8": "uchar", "u16": "ushort", "u32": "uint", "u64": "ulong", "f16": "half",
       "bf16": "bfloat", "f32": "float"}

#: the barrier's memory: what threadgroup_barrier / simdgroup_barrier order
#: (threadgroup memory and device memory, as CUDA's block barrier does)
MEM_FLAGS = "mem_flags::mem_threadgroup | mem_flags::mem_device"

#: the simdgroup width the collectives assume (Apple GPUs: 32 lanes)
LANES = 32


def no_f64(what: str) -> NotAvailableError:
    """The refusal of an f64 value ``what`` (Apple GPUs have no double)."""
    return NotAvailableError(f"{what} needs f64, which Metal does not have (Apple GPUs "
                             "have no double)", hint="use f32, or the llvm or cuda target")


def _float_literal(v: float, dt: D.DType) -> str:
    """An f32 literal in the shortest decimal that reads back as the same
    float (C++14 has no hexadecimal float literals), a non-finite one by its
    bits; 16-bit floats by their bits (the prelude's ``tn_half`` / ``tn_bfloat``)."""
    if dt.name == "f64":
        raise no_f64("the constant " + repr(v))
    if dt.name == "f32":
        x = np.float32(v)
        if math.isfinite(float(x)):
            s = str(x)
            return s + "f" if any(c in s for c in ".e") else s + ".0f"
        return f"tn_bitsf({int(np.array(x).view(np.uint32)):#x}u)"
    npdt = np.float16 if dt.name == "f16" else ml_dtypes.bfloat16
    bits = np.array(v, dtype=npdt).view(np.uint16).item()
    return f"tn_{REG[dt.name]}({bits:#x})"


def literal(value: Any, dt: D.DType) -> str:
    """A Metal expression of the register type of ``dt`` holding ``value``."""
    if dt.is_bool:
        return "true" if value else "false"
    if dt.is_int:
        v = int(value)
        if dt.is_signed:
            if dt.bits == 64 and v == -(1 << 63):
                return "((long)0x8000000000000000ul)"
            return f"(({REG[dt.name]}){v}l)"
        return f"(({REG[dt.name]}){v}ul)"
    return _float_literal(float(value), dt)


BARRIER = {"block": f"threadgroup_barrier({MEM_FLAGS});",
           "warp": f"simdgroup_barrier({MEM_FLAGS});"}

METAL = Dialect(
    name="metal",
    warp_size=LANES,
    types=REG,
    byte="uchar",
    index_types={32: ("int", "", "uint"), 64: ("long", "l", "ulong")},
    sym_param="long",
    status_param="device atomic_int*",
    spaces={"global": "device ", "shared": "threadgroup ", "local": "thread ",
            "constant": "constant "},
    restrict="",
    kernel_head="kernel void {name}(",
    launch_bounds="",
    launch_bounds_min="",
    shared_array="",  # tn_smem is a parameter ([[threadgroup(0)]]), see rules.py
    shared_realign=None,  # no 1024-byte swizzled tiles (a Hopper layout)
    include='#include "tn_metal.h"',
    thread_id="tn_tpos.x",
    block_id="tn_tgpos.x",
    grid_blocks="",  # not among the builtins; a grid cap is refused (rules.py)
    barriers=BARRIER,
    shuffle="tn_simd_{mode}({value}, {lane})",
    pack="tn_pack<{t}, {n}>",
    vload="tn_vload",
    vstore="tn_vstore",
    unroll="#pragma unroll",
    unroll_n="#pragma unroll {n}",
    math={"round": "rint"},
    f32_suffix="",
    fma="fma",
    literal=literal,
)
