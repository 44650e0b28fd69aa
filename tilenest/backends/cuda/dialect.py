"""CUDA C++'s row of the SIMT spelling table (:class:`..simt.dialect.Dialect`)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ...semantics import dtypes as D
from ..simt.dialect import Dialect

#: register types of each dtype
REG = {"bool": "bool", "i8": "signed char", "i16": "short", "i32": "int", "i64": "long long",
       "u8": "unsigned char", "u16": "unsigned short", "u32": "unsigned int",
       "u64": "unsigned long long", "f8e4m3fn": "tn_f8e4m3fn", "f8e5m2": "tn_f8e5m2",
       "f16": "tn_f16", "bf16": "tn_bf16", "f32": "float", "f64": "double"}


def _float_literal(v: float, dt: D.DType) -> str:
    """Finite f32/f64 values as exact hexadecimal literals, the others by
    their bits (the prelude's ``tn_bitsf``/``tn_bitsd``/``tn_mk_*``)."""
    if dt.name == "f64":
        if math.isfinite(v):
            return f"{float(v).hex()}"
        bits = np.array(v, dtype=np.float64).view(np.uint64).item()
        return f"tn_bitsd({bits:#x}ull)"
    if dt.name == "f32":
        if math.isfinite(v):
            return f"{float(v).hex()}f"
        bits = np.array(v, dtype=np.float32).view(np.uint32).item()
        return f"tn_bitsf({bits:#x}u)"
    npdt = np.float16 if dt.name == "f16" else dt.np  # bf16, FP8: ml_dtypes
    bits = np.array(v, dtype=npdt).view(f"u{dt.itemsize}").item()
    return f"tn_mk_{dt.name}({bits:#x})"


def const(value: Any, dt: D.DType) -> str:
    """A C++ expression of the register type of ``dt`` holding ``value``."""
    if dt.is_bool:
        return "true" if value else "false"
    if dt.is_int:
        v = int(value)
        if dt.is_signed:
            if dt.bits == 64 and v == -(1 << 63):
                return "((long long)0x8000000000000000ull)"
            return f"(({REG[dt.name]}){v}ll)"
        return f"(({REG[dt.name]}){v}ull)"
    return _float_literal(float(value), dt)


CUDA = Dialect(
    name="cuda",
    warp_size=32,
    types=REG,
    byte="unsigned char",
    index_types={32: ("int", "", "unsigned"), 64: ("long long", "ll", "unsigned long long")},
    sym_param="long long",
    status_param="int*",
    spaces={"global": "", "shared": "", "local": "", "constant": "const "},
    restrict=" __restrict__",
    kernel_head='extern "C" __global__ void {bounds} {name}(',
    launch_bounds="__launch_bounds__({threads})",
    launch_bounds_min="__launch_bounds__({threads}, {min_blocks})",
    shared_array="extern __shared__ __align__(16) unsigned char tn_smem[];",
    shared_realign=("unsigned char* const tn_sbase = tn_smem + ((0u - tn_smem_addr(tn_smem)) "
                    "& 1023u);"),
    include='#include "tn_prelude.cuh"',
    thread_id="threadIdx.x",
    block_id="blockIdx.x",
    grid_blocks="gridDim.x",
    barriers={"block": "__syncthreads();", "warp": "__syncwarp();"},
    shuffle="tn_shfl_{mode}({mask:#x}u, {value}, {lane}, {width})",
    pack="tn_pack<{t}, {n}>",
    vload="tn_vload",
    vstore="tn_vstore",
    unroll="#pragma unroll",
    unroll_n="#pragma unroll {n}",
    outline="static __device__ __noinline__",
    math={"round": "rint"},
    f32_suffix="f",
    fma="fma",
    literal=const,
    # e^x on f32 by the special function unit (tn_prelude.cuh): 2^a alone
    # within 96 ulp, corrected by one fma within 4, by their error analyses;
    # 2^x by the unit itself, within 2 ulp of the rounded value (PTX ISA);
    # each measured over every f32 input on the device (tests/test_approx_exp.py);
    # tanh by a polynomial below 1 and the unit's ex2 and rcp above, within 2.18
    # ulp wherever the unit keeps the PTX ISA's promises (benchmarks/tanh_approx.py)
    approx={("exp", "f32"): (("tn_exp_f32_coarse", 96.0), ("tn_exp_f32_approx", 4.0)),
            ("exp2", "f32"): (("tn_ex2_approx", 2.5),),
            ("tanh", "f32"): (("tn_tanh_approx", 3.0),)},
)
