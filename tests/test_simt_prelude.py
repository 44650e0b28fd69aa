"""The portable scalar prelude (``backends/simt/prelude/tn_scalar.h``).

* It is C++14: the host compiler parses it under ``-std=c++14
  -pedantic-errors`` (and under C++17, as the emulator builds), every template
  instantiated, with a minimal dialect header of the kind MSL's will be -- and
  the same check refuses C++17 (``if constexpr``, a hexadecimal float
  literal), so it would catch one creeping in.
* CUDA's prelude declares its f64 overloads before including it: the float
  templates instantiated for double compute in double (a float conversion
  would lose 1e300 and 1e-300).
* Every CUDA build sees it: the NVRTC include path and the header list that
  keys its disk cache, and the names the tuner keeps.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tilenest.backends import cuda
from tilenest.backends.simt import emulator as em
from tilenest.backends.simt import prelude_dir

CXX = shutil.which("g++")
needs_cxx = pytest.mark.skipif(CXX is None, reason="no host C++ compiler")

#: what a dialect defines before including tn_scalar.h, in host C++ without
#: any CUDA: the portable header needs nothing more
HOST_DIALECT = r"""
#include <math.h>
#include <string.h>
typedef long long tn_i64;
typedef unsigned long long tn_u64;
#define TN_FN static inline
#define TN_THREAD
#define TN_STATUS int*
TN_FN unsigned tn_fbits(float x) { unsigned u; memcpy(&u, &x, 4); return u; }
TN_FN float tn_bitsf(unsigned b) { float f; memcpy(&f, &b, 4); return f; }
TN_FN void tn_fail(int* st, int code) { if (*st == 0) *st = code; }
#include "tn_scalar.h"
"""

#: one use of every template and overload set, so that their bodies are checked
USES = r"""
int uses(int* st, float x, tn_i64 i) {
  bool ok = true;
  tn_fdivisor d = tn_fdiv_prep(x);
  float f = tn_fextreme(x, x, true) + tn_ffloordiv(x, x) + tn_fmod(x, x) + tn_frem(x, x) +
            tn_exp_f32(x) + tn_exp_f32_ok(x, ok) + tn_fdiv_by(x, d) + tn_fdiv_by_ok(x, d, ok) +
            tn_roundeven(x) + tn_widen(tn_to_bf16(x)) + tn_widen_f16_soft(tn_to_f16(x)) +
            tn_select(ok, x, x) + tn_copysign(x, x);
  int n = tn_iadd(1, 2) + tn_isub(1, 2) + tn_imul(1, 2) + tn_ineg(1) + tn_iabs(-1) +
          tn_idiv(1, 2, st) + tn_irem(1, 2, st) + tn_ifloordiv(1, 2, st) + tn_imod(1, 2, st) +
          tn_ishl(1, 2, st) + tn_ishr(1, 2, st) + tn_imax(1, 2) + tn_imin(1, 2) +
          tn_xfloordiv(1, 2) + tn_xmod(1, 2) + tn_clamp(1, 0, 2) + tn_xmin(1, 2) + tn_xmax(1, 2) +
          tn_get16(tn_mk_f16(1)) + tn_getb(tn_mk_bool(1)) + tn_geti(tn_mk_i8(1));
  tn_i64 w = tn_imul(i, i) + tn_ishl(i, i, st) + tn_xfloordiv(i, i) + tn_clamp(i, i, i) +
             tn_align16(i) + (tn_i64)tn_imul((tn_i8)1, (tn_i8)2) + (tn_i64)tn_iadd((short)1, (short)2);
  return (int)f + n + (int)w + tn_isinf(x) + tn_isfinite(x) + tn_signbit(x);
}
"""


def _check(tmp_path: Path, std: str, extra: str = "") -> subprocess.CompletedProcess:
    src = tmp_path / "use.cc"
    src.write_text(HOST_DIALECT + USES + extra)
    return subprocess.run([CXX, f"-std={std}", "-pedantic-errors", "-Wall", "-Werror",
                           "-fsyntax-only", "-I", prelude_dir(), str(src)],
                          capture_output=True, text=True, check=False)


@needs_cxx
@pytest.mark.parametrize("std", ["c++14", "c++17"])
def test_the_portable_prelude_is_cpp14(tmp_path, std):
    r = _check(tmp_path, std)
    assert r.returncode == 0, r.stderr


@needs_cxx
@pytest.mark.parametrize("construct", [
    "template <typename T> int later(T) { if constexpr (sizeof(T) == 4) return 1; return 0; }",
    "float later() { return 0x1.8p23f; }",
])
def test_the_cpp14_check_refuses_cpp17(tmp_path, construct):
    r = _check(tmp_path, "c++14", construct)
    assert r.returncode != 0


def test_the_portable_prelude_uses_no_double_and_no_device_words():
    text = (Path(prelude_dir()) / "tn_scalar.h").read_text()
    code = "\n".join(line.split("//")[0] for line in text.splitlines())
    for word in ("double", "memcpy", "asm", "__device__", "if constexpr", "long long",
                 "atomicCAS", "0x1."):
        assert word not in code, word


F64_SOURCE = r"""
#include "tn_prelude.cuh"
__global__ void f64ops(double* out, const double* a, const double* b) {
  out[0] = tn_fmod(a[0], b[0]);
  out[1] = tn_ffloordiv(a[0], b[0]);
  out[2] = tn_fextreme(a[1], b[1], true);
  out[3] = tn_fextreme(a[1], b[1], false);
  out[4] = tn_fextreme(a[2], b[2], true);
}
"""


def test_cuda_float_templates_compute_doubles_in_double():
    """A NaN operand of f64 maximum comes back quieted with its payload: the
    double ``tn_quiet``, which a float template sees only when CUDA's prelude
    declares it before including the portable header (through float the
    payload is lost). The other double operations keep their values."""
    mod = em.build(F64_SOURCE, include_dirs=cuda.prelude_dirs())
    a = np.array([1e300, 1e-300, np.uint64(0x7FF0000000000123).view(np.float64)])
    b = np.array([7.0, 2e-300, 1.0])
    out = np.zeros(5)
    mod.launch("f64ops", 1, 1, [out, a, b])
    assert out[0] == np.fmod(1e300, 7.0) and out[1] == np.floor_divide(1e300, 7.0)
    assert out[2] == 2e-300 and out[3] == 1e-300
    assert hex(out[4:].view(np.uint64)[0]) == hex(0x7FF8000000000123)


def test_every_cuda_build_sees_the_portable_prelude():
    dirs = cuda.prelude_dirs()
    assert dirs == (cuda.prelude_dir(), prelude_dir())
    files = [Path(f).name for f in cuda.prelude_files()]
    assert "tn_prelude.cuh" in files and "tn_scalar.h" in files
    from tilenest.backends.cuda.tune import _prelude_names

    assert {"tn_exp_f32", "tn_fdiv_by", "tn_vstore_stream"} <= _prelude_names()


def test_nvrtc_compiles_the_cuda_prelude_on_the_include_path():
    from tilenest.backends.cuda import nvrtc

    if not nvrtc.nvrtc_available():
        pytest.skip("no NVRTC library installed")
    src = '#include "tn_prelude.cuh"\n__global__ void k(float* a) { a[0] = tn_exp_f32(a[0]); }\n'
    built = nvrtc.compile_cuda(src, "k.cu", arch=cuda.ARCH, include_dirs=cuda.prelude_dirs(),
                               want_ptx=True, cache=False)
    assert "k" in "".join(built.resources) and built.ptx
