"""The CUDA build step: NVRTC compiles CUDA C++ to an sm_90a cubin without a GPU.

Nothing here needs a GPU or a driver; the tests are skipped only when no NVRTC
library is installed at all.
"""

from __future__ import annotations

import os
import re
import struct
from pathlib import Path

import pytest

from tilenest.backends.cuda import nvrtc
from tilenest.backends.cuda.nvrtc import (
    CONTRACT_OPTIONS,
    CudaCompileError,
    compile_cuda,
    compile_program,
    find_nvrtc,
    nvrtc_available,
    nvrtc_library,
    nvrtc_version,
)
from tilenest.backends.cuda.resources import (
    EM_CUDA,
    CubinFormatError,
    KernelResources,
    cubin_arch,
    elf_resources,
    parse_ptxas_log,
    read_cubin,
    tool_info,
)
from tilenest.errors import NotAvailableError, TilenestError, UsageError

needs_nvrtc = pytest.mark.skipif(not nvrtc_available(), reason="no NVRTC library installed")

TINY = 'extern "C" __global__ void tiny(float* out) { out[threadIdx.x] = 1.0f; }\n'

SHARED = """
extern "C" __global__ void uses_shared(float* a) {
  __shared__ float s[1024];
  s[threadIdx.x] = a[threadIdx.x];
  __syncthreads();
  a[threadIdx.x] = s[1023 - threadIdx.x];
}
"""

LOCAL_ARRAY = """
extern "C" __global__ void local_array(float* out, const int* idx) {
  float loc[256];
  for (int i = 0; i < 256; ++i) loc[i] = out[i * 7 + threadIdx.x];
  float acc = 0.0f;
  for (int i = 0; i < 256; ++i) acc += loc[idx[i]];
  out[threadIdx.x] = acc;
}
"""

# 64 values live across a loop with a run-time trip count: more than 32 registers.
SPILLS = """
extern "C" __global__ void spills(float* out, const float* in, int n) {
  float v[64];
  #pragma unroll
  for (int j = 0; j < 64; ++j) v[j] = in[j * 128 + threadIdx.x];
  for (int t = 0; t < n; ++t) {
    float x = in[t];
    #pragma unroll
    for (int j = 0; j < 64; ++j) v[j] = v[j] * x + v[(j + 1) & 63];
  }
  #pragma unroll
  for (int j = 0; j < 64; ++j) out[j * 128 + threadIdx.x] = v[j];
}
"""

MMA_BF16 = """
#include <cuda_bf16.h>
extern "C" __global__ void mma_bf16(const __nv_bfloat16* A, const __nv_bfloat16* B, float* C) {
  int lane = threadIdx.x & 31;
  const unsigned* a = reinterpret_cast<const unsigned*>(A) + lane * 4;
  const unsigned* b = reinterpret_cast<const unsigned*>(B) + lane * 2;
  float c0 = 0.f, c1 = 0.f, c2 = 0.f, c3 = 0.f;
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
               "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(c0), "+f"(c1), "+f"(c2), "+f"(c3)
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  __nv_bfloat16 h = __float2bfloat16(c0);
  C[lane * 4 + 0] = __bfloat162float(h);
  C[lane * 4 + 1] = c1;
  C[lane * 4 + 2] = c2;
  C[lane * 4 + 3] = c3;
}
"""

MUL_ADD = """
extern "C" __global__ void mul_add(float* o, const float* a, const float* b, const float* c) {
  int i = threadIdx.x;
  o[i] = a[i] * b[i] + c[i];
}
"""


@needs_nvrtc
def test_version_and_library_are_reported():
    lib = nvrtc_library()
    assert nvrtc_version() == lib.version
    assert lib.version[0] >= 12
    assert Path(lib.path).is_file()
    assert lib.origin in ("wheel", "toolkit")
    assert f"{lib.version[0]}.{lib.version[1]}" in lib.describe()


@needs_nvrtc
def test_tiny_kernel_is_an_sm90a_cubin():
    c = compile_cuda(TINY, "tiny.cu")
    data = c.cubin
    assert data[:4] == b"\x7fELF" and data[4] == 2  # ELF64
    machine, = struct.unpack_from("<H", data, 18)
    assert machine == EM_CUDA == 190
    flags, = struct.unpack_from("<I", data, 48)
    sm = (flags >> 8) & 0xFF if data[8] >= 8 else flags & 0xFF
    assert sm == 90
    assert cubin_arch(data) == "sm_90a"
    assert "-arch sm_90a" in tool_info(data).options
    assert "tiny" in c.resources
    # The 'a' marker is decoded, not assumed: plain sm_90 reads back without it.
    plain = compile_cuda(TINY, "tiny.cu", arch="sm_90")
    assert cubin_arch(plain.cubin) == "sm_90"


@needs_nvrtc
def test_bf16_header_and_inline_mma_compile():
    c = compile_cuda(MMA_BF16, "mma.cu", want_ptx=True)
    assert cubin_arch(c.cubin) == "sm_90a"
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in c.ptx
    assert c.resources["mma_bf16"].registers > 0


@needs_nvrtc
def test_static_shared_memory_and_registers_are_reported():
    c = compile_cuda(SHARED, "shared.cu")
    r = c.resources["uses_shared"]
    assert r.shared_bytes == 4096
    assert r.registers > 0
    assert r.barriers == 1
    assert r.constant_bytes and r.constant_bytes > 0
    assert not r.spilled and c.warnings() == []
    # The cubin's own attributes agree with the ptxas report.
    e = elf_resources(c.cubin)["uses_shared"]
    assert e.registers == r.registers
    assert e.stack_frame_bytes == r.stack_frame_bytes == 0
    assert e.shared_bytes == 4096


@needs_nvrtc
def test_runtime_indexed_local_array_has_a_stack_frame():
    c = compile_cuda(LOCAL_ARRAY, "local.cu")
    r = c.resources["local_array"]
    assert r.stack_frame_bytes >= 1024
    assert elf_resources(c.cubin)["local_array"].stack_frame_bytes == r.stack_frame_bytes


@needs_nvrtc
def test_register_cap_forces_a_spill_that_is_warned():
    free = compile_cuda(SPILLS, "spills.cu").resources["spills"]
    capped = compile_cuda(SPILLS, "spills.cu", options=("--maxrregcount=32",))
    r = capped.resources["spills"]
    assert not free.spilled and free.registers > 32
    assert r.registers <= 32
    assert r.spilled and r.spill_store_bytes > 0 and r.spill_load_bytes > 0
    (warning,) = capped.warnings()
    assert "spills" in warning and str(r.spill_store_bytes) in warning


@needs_nvrtc
def test_fmad_false_keeps_multiply_and_add_apart():
    c = compile_cuda(MUL_ADD, "fmad.cu", arch="compute_90a", want_ptx=True)
    assert c.cubin == b"" and c.resources == {}
    assert "--fmad=false" in c.options
    assert re.search(r"\bmul\.rn\.f32\b", c.ptx) and re.search(r"\badd\.rn\.f32\b", c.ptx)
    assert "fma." not in c.ptx
    # Without the contract NVRTC contracts the same source into an FMA.
    loose = compile_program(MUL_ADD, "fmad.cu", ("--gpu-architecture=compute_90a",
                                                 "--fmad=true"))
    assert loose.status == 0 and "fma.rn.f32" in loose.ptx
    # The contract also reaches ptxas (the cubin records the options it ran with).
    assert "-fmad false" in tool_info(compile_cuda(MUL_ADD, "fmad.cu").cubin).options


@needs_nvrtc
def test_sm90a_compile_can_return_ptx_too():
    c = compile_cuda(MUL_ADD, "fmad.cu", want_ptx=True)
    assert c.cubin and ".target sm_90a" in c.ptx
    assert compile_cuda(MUL_ADD, "fmad.cu").ptx is None


@needs_nvrtc
def test_syntax_error_names_the_source_line():
    src = 'extern "C" __global__ void broken(float* o) {\n  int i = threadIdx.x\n  o[i] = 1.0f;\n}\n'
    with pytest.raises(CudaCompileError) as info:
        compile_cuda(src, "gen.cu")
    err = info.value
    assert isinstance(err, TilenestError)
    assert [str(s) for s in err.sites] == ["gen.cu:3:3"]
    assert 'expected a ";"' in err.message
    rendered = err.render()
    assert "o[i] = 1.0f;" in rendered and err.hint
    assert "gen.cu(3)" in err.log and err.source == src


@needs_nvrtc
def test_rejected_inline_ptx_quotes_the_ptx_line():
    src = 'extern "C" __global__ void bad(float* o) { asm volatile("bogus.op.f32 %0;" :: "f"(o[0])); }'
    with pytest.raises(CudaCompileError) as info:
        compile_cuda(src, "bad.cu")
    assert "ptxas" in info.value.message
    assert any("bogus.op.f32" in n for n in info.value.notes)


@needs_nvrtc
def test_options_carry_target_contract_and_pinned_includes():
    c = compile_cuda(TINY, "tiny.cu")
    assert c.options[0] == "--gpu-architecture=sm_90a"
    for o in CONTRACT_OPTIONS + ("--prec-div=true", "--prec-sqrt=true", "--ftz=false",
                                 "-std=c++17", nvrtc.PTXAS_VERBOSE):
        assert o in c.options
    incs = [o.split("=", 1)[1] for o in c.options if o.startswith("--include-path=")]
    lib = nvrtc_library()
    assert incs == list(lib.include_dirs) and incs
    assert any((Path(d) / "cuda_bf16.h").is_file() for d in incs)
    assert any((Path(d) / "crt" / "mma.h").is_file() for d in incs)
    if lib.origin == "wheel":
        import nvidia
        roots = [Path(p).resolve() for p in nvidia.__path__]
        assert all(any(Path(d).resolve().is_relative_to(r) for r in roots) for d in incs)
    # A caller's folder comes first, so it can shadow nothing but its own headers.
    mine = compile_cuda(TINY, "tiny.cu", include_dirs=("/nonexistent/inc",))
    first = next(o for o in mine.options if o.startswith("--include-path="))
    assert first == "--include-path=/nonexistent/inc"


@needs_nvrtc
@pytest.mark.parametrize("opt", ["--fmad=true", "-use_fast_math", "--ftz=true",
                                 "--prec-div=false", "-arch=sm_80", "-std=c++20",
                                 "--ptxas-options=--fmad=true"])
def test_options_that_break_the_contract_are_refused(opt):
    with pytest.raises(UsageError):
        compile_cuda(TINY, options=(opt,))


@needs_nvrtc
def test_unknown_option_is_a_compile_error_naming_it():
    with pytest.raises(CudaCompileError) as info:
        compile_cuda(TINY, options=("--no-such-option",))
    assert "--no-such-option" in info.value.message


@needs_nvrtc
def test_cache_returns_the_same_result_and_is_bounded():
    nvrtc.clear_cache()
    a = compile_cuda(TINY, "tiny.cu")
    assert compile_cuda(TINY, "tiny.cu") is a
    assert compile_cuda(TINY, "other.cu") is not a
    assert nvrtc.cache_size() == 2
    with pytest.raises(TypeError):
        a.resources["x"] = KernelResources("x")  # type: ignore[index]
    nvrtc.clear_cache()
    assert nvrtc.cache_size() == 0


@needs_nvrtc
def test_wheel_is_preferred_over_a_toolkit_and_a_toolkit_is_the_fallback(tmp_path):
    lib = nvrtc_library()
    libdir = Path(lib.path).parent
    home = tmp_path / "cuda"
    (home / "lib64").mkdir(parents=True)
    for f in libdir.glob("libnvrtc*.so*"):
        os.symlink(f, home / "lib64" / f.name)
    os.symlink(Path(lib.include_dirs[0]), home / "include")
    fallback = find_nvrtc(wheel_roots=[], toolkit_homes=[home])
    assert fallback.origin == "toolkit" and fallback.path.startswith(str(home))
    assert fallback.include_dirs == (str(home / "include"),)
    assert fallback.version == lib.version
    if lib.origin == "wheel":
        chosen = find_nvrtc(toolkit_homes=[home])
        assert chosen.origin == "wheel" and chosen.path == lib.path


def test_missing_nvrtc_is_not_available_with_an_install_hint(tmp_path):
    with pytest.raises(NotAvailableError) as info:
        find_nvrtc(wheel_roots=[tmp_path], toolkit_homes=[tmp_path / "none"])
    assert "nvidia-cuda-nvrtc==13.0.88" in info.value.hint


def test_ptxas_report_parsing():
    log = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_Z2tkILi3EEvPf' for 'sm_80'
ptxas info    : Function properties for _Z2tkILi3EEvPf
ptxas         .     16 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 24 registers, used 1 barriers, 400 bytes smem, 360 bytes cmem[0]
ptxas info    : Compile time = 2.0 ms
ptxas info    : Function properties for _Z6helperf
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
"""
    t = parse_ptxas_log(log)
    k = t["_Z2tkILi3EEvPf"]
    assert (k.registers, k.barriers, k.shared_bytes, k.constant_bytes) == (24, 1, 400, 360)
    assert (k.stack_frame_bytes, k.spill_store_bytes, k.spill_load_bytes) == (16, 8, 12)
    assert k.entry and k.spilled
    assert not t["_Z6helperf"].entry and not t["_Z6helperf"].spilled


def test_non_cubin_bytes_are_refused():
    with pytest.raises(CubinFormatError):
        read_cubin(b"not an elf at all" * 8)
    elf_x86 = bytearray(64)
    elf_x86[:6] = b"\x7fELF\x02\x01"
    struct.pack_into("<H", elf_x86, 18, 62)
    with pytest.raises(CubinFormatError):
        read_cubin(bytes(elf_x86))
