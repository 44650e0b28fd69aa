"""The float-only math header ``prelude/tn_mathf.h`` built as a host library.

``tn_mathf.h`` is the GPU scalar math that needs no f64 (the narrow-dtype
transcendentals and the exact float <-> integer conversions, for targets such
as Apple GPUs without double). It is plain C++14, so it also compiles as host
code: :func:`build` compiles it with ``g++ -std=c++14 -O2 -ffp-contract=off
-fno-fast-math`` (IEEE float arithmetic, no contraction, fused multiply-add
through ``std::fmaf``) into a shared library, and :class:`MathF` calls its
functions over numpy arrays. The tests judge every function against the
interpreter's reference with it; ``benchmarks/mathf_host.py`` times it. Host
timings are CPU emulation of GPU code, not GPU speed.

While the header is included, ``double`` is poisoned (a macro naming an
undeclared type) and float -> double promotions are errors, so a double that
slips into the header fails the build. The library also holds, outside that
region, the double-based formulation the CUDA prelude uses today (each
function evaluated in double and rounded once), for speed comparisons only.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
from pathlib import Path

import numpy as np

HEADER = Path(__file__).parent / "prelude" / "tn_mathf.h"
UNARY = ("exp", "exp2", "expm1", "log", "log2", "log1p", "tanh", "erf", "sigmoid", "sin",
         "cos", "rsqrt")
BINARY = ("pow", "atan2")
#: integer dtypes of the float -> integer conversions: (C type, numpy dtype)
INTS: dict[str, tuple[str, type[np.integer]]] = {"i8": ("signed char", np.int8), "i16": ("short", np.int16), "i32": ("int", np.int32),
    "i64": ("long long", np.int64), "u8": ("unsigned char", np.uint8),
    "u16": ("unsigned short", np.uint16), "u32": ("unsigned", np.uint32),
    "u64": ("unsigned long long", np.uint64)}
_CXX = os.environ.get("TILENEST_CXX", "g++")
FLAGS = ("-x", "c++", "-std=c++14", "-O2", "-ffp-contract=off", "-fno-fast-math", "-fPIC",
         "-shared", "-Wall", "-Wextra", "-pedantic", "-Werror", "-Wdouble-promotion", "-Wfloat-conversion")

#: the double-based formulation of each function (today's CUDA prelude)
_DOUBLE = {"exp": "exp(d)", "exp2": "exp2(d)", "expm1": "expm1(d)", "log": "log(d)",
           "log2": "log2(d)", "log1p": "log1p(d)", "tanh": "tanh(d)", "erf": "erf(d)",
           "sigmoid": "1.0 / (1.0 + exp(-d))", "sin": "sin(d)", "cos": "cos(d)",
           "rsqrt": "1.0 / sqrt(d)"}


def source(div_off: bool = False) -> str:
    """The C++ translation unit: the header (double poisoned) and array loops.
    With ``div_off``, the header's divisions (``TN_DIV``) return a quotient one
    ulp away from the correctly rounded one (up or down by the operands' low
    bits), as a division that is not correctly rounded may."""
    lines = ["#include <cmath>", "#include <cstring>",
             "#define TN_FN static inline",
             "#define TN_FMA(a, b, c) std::fmaf((a), (b), (c))",
             ("static inline unsigned tn_host_as_uint(float x) "
              "{ unsigned u; std::memcpy(&u, &x, 4); return u; }"),
             ("static inline float tn_host_as_float(unsigned u) "
              "{ float x; std::memcpy(&x, &u, 4); return x; }"),
             "#define TN_AS_UINT(x) tn_host_as_uint(x)",
             "#define TN_AS_FLOAT(u) tn_host_as_float(u)",
             *(_DIV_OFF if div_off else ()),
             "#define double tnf_double_is_not_allowed_here",
             f'#include "{HEADER}"',
             "#undef double",
             'extern "C" {']
    for f in UNARY:
        lines.append(f"void map_{f}(const float* x, float* y, long n) "
                     f"{{ for (long i = 0; i < n; ++i) y[i] = tnf_{f}(x[i]); }}")
        lines.append(f"void dmap_{f}(const float* x, float* y, long n) "
                     f"{{ for (long i = 0; i < n; ++i) {{ double d = x[i]; "
                     f"y[i] = (float)({_DOUBLE[f]}); }} }}")
    for f in BINARY:
        lines.append(f"void map_{f}(const float* x, const float* z, float* y, long n) "
                     f"{{ for (long i = 0; i < n; ++i) y[i] = tnf_{f}(x[i], z[i]); }}")
        lines.append(f"void dmap_{f}(const float* x, const float* z, float* y, long n) "
                     f"{{ for (long i = 0; i < n; ++i) y[i] = (float){f}((double)x[i], "
                     f"(double)z[i]); }}")
    for name, (ct, np_t) in INTS.items():
        info = np.iinfo(np_t)
        lo, hi = (f"({ct}){info.min}" if info.min >= -(2 ** 31) else f"({ct})(-{info.max}ll - 1)",
                  f"({ct}){info.max}ull")
        lines.append(f"void f2{name}(const float* x, {ct}* y, long n) "
                     f"{{ for (long i = 0; i < n; ++i) y[i] = tnf_f2i<{ct}>(x[i], {lo}, {hi}); }}")
    lines.append("void i64_to_f32(const long long* x, float* y, long n, int odd) "
                 "{ for (long i = 0; i < n; ++i) y[i] = tnf_i64_to_f32(x[i], odd != 0); }")
    lines.append("void u64_to_f32(const unsigned long long* x, float* y, long n, int odd) "
                 "{ for (long i = 0; i < n; ++i) y[i] = tnf_u64_to_f32(x[i], odd != 0); }")
    lines.append("}")
    return "\n".join(lines) + "\n"


_DIV_OFF = ("static inline float tn_host_div_off(float a, float b) {",
            "  float q = a / b; unsigned u = tn_host_as_uint(q);",
            "  if ((u & 0x7fffffffu) == 0u || (u & 0x7f800000u) == 0x7f800000u) return q;",
            "  return tn_host_as_float((tn_host_as_uint(a) ^ tn_host_as_uint(b)) & 1u ? u + 1u : u - 1u);",
            "}",
            "#define TN_DIV(a, b) tn_host_div_off((a), (b))")


def build(folder: Path, extra: tuple[str, ...] = (), div_off: bool = False) -> Path:
    """Compile :func:`source` into ``folder`` (named by a hash of the source,
    the header and the flags, so a changed header is rebuilt); returns the path.
    ``extra`` flags are added (the benchmark's ``-march=native``, so that
    ``std::fmaf`` is one instruction rather than a library call)."""
    src = source(div_off)
    flags = (*FLAGS, *extra)
    key = hashlib.sha256((src + HEADER.read_text() + " ".join(flags)).encode()).hexdigest()[:16]
    lib = Path(folder) / f"tn_mathf_{key}.so"
    if not lib.exists():
        cpp = Path(folder) / f"tn_mathf_{key}.cpp"
        cpp.write_text(src)
        tmp = lib.with_suffix(f".{os.getpid()}.tmp")
        subprocess.run([_CXX, *flags, str(cpp), "-o", str(tmp), "-lm"], check=True,
                       capture_output=True, text=True)
        os.replace(tmp, lib)
    return lib


class MathF:
    """The functions of a library made by :func:`build`, over numpy arrays."""

    def __init__(self, lib: Path):
        self.lib = ctypes.CDLL(str(lib))

    def _call(self, name: str, *arrays: np.ndarray, extra: tuple = ()) -> None:
        fn = getattr(self.lib, name)
        fn(*(ctypes.c_void_p(a.ctypes.data) for a in arrays), ctypes.c_long(arrays[0].size),
           *extra)

    def unary(self, f: str, x: np.ndarray, double: bool = False) -> np.ndarray:
        """``tnf_f`` (or, with ``double``, the double-based formulation) on f32 ``x``."""
        x = np.ascontiguousarray(x, np.float32)
        y = np.empty_like(x)
        self._call(("dmap_" if double else "map_") + f, x, y)
        return y

    def binary(self, f: str, a: np.ndarray, b: np.ndarray, double: bool = False) -> np.ndarray:
        a = np.ascontiguousarray(a, np.float32)
        b = np.ascontiguousarray(np.broadcast_to(b, a.shape), np.float32)
        y = np.empty_like(a)
        self._call(("dmap_" if double else "map_") + f, a, b, y)
        return y

    def float_to_int(self, x: np.ndarray, dst: str) -> np.ndarray:
        """``tnf_f2i`` of f32 ``x`` to the integer dtype ``dst`` (``"i32"``...)."""
        x = np.ascontiguousarray(x, np.float32)
        y = np.empty(x.shape, INTS[dst][1])
        self._call("f2" + dst, x, y)
        return y

    def int64_to_f32(self, v: np.ndarray, odd: bool = False) -> np.ndarray:
        """A signed or unsigned 64-bit array as f32 (nearest even, or to odd)."""
        name = "u64_to_f32" if v.dtype == np.uint64 else "i64_to_f32"
        v = np.ascontiguousarray(v, np.uint64 if v.dtype == np.uint64 else np.int64)
        y = np.empty(v.shape, np.float32)
        self._call(name, v, y, extra=(ctypes.c_int(1 if odd else 0),))
        return y
