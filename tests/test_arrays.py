"""Arrays from any framework (``tilenest/semantics/arrays.py``): DLPack arrays (torch,
jax, numpy's own export, a minimal producer) and buffer-protocol objects run
through the interpreter, the llvm target and the CUDA emulator, read in
place and with outputs written in place; device mismatches, layouts a
compiled target does not read, immutable outputs and non-arrays are errors
naming the argument. The GPU tests (marker ``device``) use cupy arrays and
torch CUDA tensors in place."""

from __future__ import annotations

import array

import numpy as np
import pytest

import tilenest as tn
from tilenest.semantics import arrays as A
from tilenest import bf16, f32
from tilenest.errors import TilenestError, TypeCheckError


@tn.kernel
def scale(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"], *, k=2.0):
    (n,) = x.shape
    for p in tn.parallel(tn.shape(tn.cdiv(n, 4))):
        o = tn.coord(p.index() * 4)
        y(o, tn.shape(4)).store(x[o, tn.shape(4), tn.bounds.zero] * k + 1.0)


@tn.kernel
def bump(x: tn.Tensor[bf16, "N"]):
    (n,) = x.shape
    for p in tn.parallel(tn.shape(tn.cdiv(n, 4))):
        o = tn.coord(p.index() * 4)
        x(o, tn.shape(4)).store(x[o, tn.shape(4), tn.bounds.zero] * 2.0)


N = 10
X = np.arange(N, dtype=np.float32) - 3.5
WANT = X * 2 + 1  # exact in f32: the numpy run of every entry point gives this


@pytest.fixture(scope="module")
def llvm():
    return scale.compile(target="llvm")


@pytest.fixture(scope="module")
def emulated():
    return scale.compile(target="cuda", device="emulated")


def _numpy_run() -> np.ndarray:
    y = np.zeros(N, dtype=np.float32)
    scale(X.copy(), y)
    return y


class Exporter:
    """The least an array may offer: ``__dlpack__`` and ``__dlpack_device__``
    (here over a numpy array, on the device it claims)."""

    def __init__(self, a: np.ndarray, device: tuple[int, int] = (1, 0)):
        self.a = a
        self.device = device

    def __dlpack__(self, **kw):
        return self.a.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self.device


# -- without torch or jax --------------------------------------------------------------
def test_numpy_run_is_the_expected_one():
    assert np.array_equal(_numpy_run(), WANT)


@pytest.mark.parametrize("entry", ["interpreter", "llvm"])
def test_a_dlpack_producer_is_read_and_written_in_place(entry, llvm):
    x, y = Exporter(X.copy()), Exporter(np.zeros(N, dtype=np.float32))
    run = scale if entry == "interpreter" else llvm
    out = run(x, y)
    assert out is y  # the caller's own object comes back
    assert np.array_equal(y.a, WANT)


@pytest.mark.parametrize("entry", ["interpreter", "llvm"])
def test_buffer_protocol_objects_are_read_and_written_in_place(entry, llvm):
    x = array.array("f", X.tolist())
    y = bytearray(4 * N)  # bytes: viewed as uint8, so given as a typed memoryview
    run = scale if entry == "interpreter" else llvm
    run(x, memoryview(y).cast("f"))
    assert np.array_equal(np.frombuffer(y, dtype=np.float32), WANT)


def test_host_view_shares_memory_with_the_caller():
    a = np.zeros(N, dtype=np.float32)
    v = A.host_view(Exporter(a), "x", written=True)
    assert v.ctypes.data == a.ctypes.data and v.flags.writeable
    assert A.host_view(a, "x", written=True) is a  # numpy arrays pass through unchanged
    b = bytearray(8)
    assert A.host_view(b, "x", written=True).ctypes.data == np.frombuffer(b, np.uint8).ctypes.data


def test_a_read_only_buffer_for_an_output_is_the_numpy_error():
    y = memoryview(np.zeros(N, dtype=np.float32)).toreadonly()
    with pytest.raises(TilenestError, match="argument 'y' is written .* read-only"):
        scale(X.copy(), y)
    scale(memoryview(X.copy()).toreadonly(), np.zeros(N, dtype=np.float32))  # input: fine


@pytest.mark.parametrize("entry", ["interpreter", "llvm", "emulated"])
def test_a_device_array_on_a_host_entry_point_is_an_error(entry, llvm, emulated):
    run = {"interpreter": scale, "llvm": llvm, "emulated": emulated}[entry]
    y = Exporter(np.zeros(N, dtype=np.float32), device=(2, 1))  # claims cuda:1
    with pytest.raises(TilenestError, match="argument 'y' is a .* on cuda:1, but this entry "
                       "point runs on the host") as e:
        run(X.copy(), y)
    assert "device='gpu'" in e.value.hint
    assert not y.a.any()


@pytest.mark.parametrize("bad,kind", [([0.0] * N, "list"), (np.float32(1), "numpy.float32"),
                                      ("text", "str")])
def test_an_object_that_is_not_an_array_is_an_error(bad, kind, llvm):
    for run in (scale, llvm):
        with pytest.raises(TilenestError, match=f"argument 'x' must be an array, got {kind}\n"
                           ) as e:
            run(bad, np.zeros(N, dtype=np.float32))
        assert "DLPack" in e.value.hint


def test_numpy_messages_are_unchanged(llvm):
    with pytest.raises(TypeCheckError, match="argument 'x' has dtype float64, the kernel "
                       "needs f32"):
        scale(X.astype(np.float64), np.zeros(N, dtype=np.float32))
    with pytest.raises(TilenestError, match="argument 'y' is not a C-contiguous aligned "
                       "array") as e:
        llvm(X.copy(), np.zeros(2 * N, dtype=np.float32)[::2])
    assert e.value.hint == "pass np.ascontiguousarray(x) (and copy results back if needed)"


def test_a_wrong_dtype_through_dlpack_names_the_array_kind():
    with pytest.raises(TypeCheckError, match="argument 'x' is a test_arrays.Exporter of dtype "
                       "float64, the kernel needs f32") as e:
        scale(Exporter(X.astype(np.float64)), np.zeros(N, dtype=np.float32))
    assert e.value.hint == "convert it: np.asarray(x, dtype=np.float32)"


# -- torch ---------------------------------------------------------------------------------
def test_torch_cpu_tensors_through_interpreter_llvm_and_emulator(llvm, emulated):
    torch = pytest.importorskip("torch")
    x = torch.from_numpy(X.copy())
    for run in (scale, lambda a, b: tn.interpret(scale, a, b), llvm, emulated):
        y = torch.zeros(N)
        ptr = y.data_ptr()
        out = run(x, y)
        assert out is y and y.data_ptr() == ptr
        assert np.array_equal(y.numpy(), WANT)


def test_torch_host_view_writes_the_tensor():
    torch = pytest.importorskip("torch")
    t = torch.zeros(3, 4)
    v = A.host_view(t, "y", written=True)
    assert v.ctypes.data == t.data_ptr()
    v[1, 2] = 7.0
    assert t[1, 2].item() == 7.0


def test_reference_on_torch_admits_the_numpy_run_and_leaves_the_tensors_alone():
    torch = pytest.importorskip("torch")
    x, y = torch.from_numpy(X.copy()), torch.zeros(N)
    adm = tn.reference(scale, x, y)
    assert adm.admits(WANT)
    assert not y.any()


def test_strided_torch_tensors(llvm):
    torch = pytest.importorskip("torch")
    y = torch.zeros(2 * N)
    scale(torch.from_numpy(X.copy()), y[::2])  # the interpreter reads any strides
    assert np.array_equal(y[::2].numpy(), WANT) and not y[1::2].any()
    with pytest.raises(TilenestError, match="argument 'y' is not a C-contiguous aligned "
                       "array") as e:
        llvm(torch.from_numpy(X.copy()), torch.zeros(2 * N)[::2])
    assert "x.contiguous()" in e.value.hint


def test_torch_errors_name_the_argument(llvm):
    torch = pytest.importorskip("torch")
    x = torch.from_numpy(X.copy())
    for run in (scale, llvm):
        with pytest.raises(TypeCheckError, match="argument 'x' is a torch.Tensor of dtype "
                           "torch.float64, the kernel needs f32") as e:
            run(x.double(), torch.zeros(N))
        assert e.value.hint == "convert it: x.to(torch.float32)"  # torch's spelling
        with pytest.raises(TilenestError, match="argument 'y': its torch.Tensor cannot be "
                           "viewed as a host array") as e:
            run(x, torch.zeros(N, requires_grad=True))
        assert "detach" in e.value.hint


def test_torch_bfloat16_is_viewed_through_its_bits():
    torch = pytest.importorskip("torch")
    x = torch.arange(6, dtype=torch.bfloat16) - 2
    want = (x * 2).clone()
    bump(x)
    assert torch.equal(x, want)


@tn.kernel
def axpy(a: tn.Scalar[f32], x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"]):
    (n,) = x.shape
    for p in tn.parallel(tn.shape(tn.cdiv(n, 4))):
        o = tn.coord(p.index() * 4)
        y(o, tn.shape(4)).store(x[o, tn.shape(4), tn.bounds.zero] * a)


def test_a_0d_torch_tensor_is_a_scalar_argument():
    torch = pytest.importorskip("torch")
    x, y = torch.from_numpy(X.copy()), torch.zeros(N)
    axpy(torch.tensor(3.0), x, y)
    assert np.array_equal(y.numpy(), X * 3)
    y.zero_()
    axpy.compile()(torch.tensor(3.0), x, y)
    assert np.array_equal(y.numpy(), X * 3)


# -- jax -----------------------------------------------------------------------------------
def test_jax_arrays_are_inputs(llvm):
    jnp = pytest.importorskip("jax.numpy")
    x = jnp.asarray(X)
    # (not the emulator: it refuses read-only arrays for every pointer parameter)
    for run in (scale, llvm):
        y = np.zeros(N, dtype=np.float32)
        run(x, y)
        assert np.array_equal(y, WANT)
    assert tn.reference(scale, x, np.zeros(N, dtype=np.float32)).admits(WANT)


def test_a_jax_array_for_an_output_is_an_error(llvm, emulated):
    jnp = pytest.importorskip("jax.numpy")
    y = jnp.zeros(N, dtype=jnp.float32)
    for run in (scale, llvm, emulated):
        with pytest.raises(TilenestError, match="argument 'y' is written by the kernel, but "
                           "it is a jax.Array and jax arrays are immutable") as e:
            run(X.copy(), y)
        assert "jnp.asarray(out)" in e.value.hint
    assert not np.asarray(y).any()


# -- on a GPU --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gpu():
    from tilenest.backends import cuda

    if not cuda.gpu_available():
        pytest.fail("no usable CUDA GPU (CuPy and a driver are needed)")
    return scale.compile(target="cuda", device="gpu")


@pytest.mark.device
def test_cupy_arrays_are_used_in_place_on_the_gpu(gpu):
    import cupy as cp

    x, y = cp.asarray(X), cp.zeros(N, dtype=cp.float32)
    ptr = y.data.ptr
    assert gpu(x, y) is y
    assert y.data.ptr == ptr
    assert np.array_equal(cp.asnumpy(y), WANT)
    b = gpu.bound(x, y)  # the bound launches take them the same way
    y.fill(0)
    b.launch()
    b.check()
    assert np.array_equal(cp.asnumpy(y), WANT)


@pytest.mark.device
def test_torch_cuda_tensors_are_used_in_place_on_the_gpu(gpu):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("this torch has no CUDA")
    x = torch.from_numpy(X.copy()).cuda()
    y = torch.zeros(N, device="cuda")
    ptr = y.data_ptr()
    assert gpu(x, y) is y
    torch.cuda.synchronize()
    assert y.data_ptr() == ptr
    assert np.array_equal(y.cpu().numpy(), WANT)
    hy = torch.zeros(N)  # a host tensor: copied to the device and back, as numpy
    gpu(x, hy)
    assert np.array_equal(hy.numpy(), WANT)
    with pytest.raises(TilenestError, match="argument 'y' is a torch.Tensor on cuda:0, but "
                       "this entry point runs on the host"):
        scale(x.cpu(), y)
    with pytest.raises(TilenestError, match="argument 'y' is not a C-contiguous"):
        gpu(x, torch.zeros(2 * N, device="cuda")[::2])


@pytest.mark.device
def test_cupy_on_the_interpreter_is_an_error():
    import cupy as cp

    with pytest.raises(TilenestError, match="argument 'x' is a cupy.ndarray on cuda:0") as e:
        scale(cp.asarray(X), np.zeros(N, dtype=np.float32))
    assert "cupy.asnumpy" in e.value.hint


# -- strided views on compiled targets (Schedule.strided) -----------------------------
def _gemm_strided_case(dt, M=37, K=40, N=33, pad=9, off=3):
    """A GEMM whose ``A`` is a column slice of a wider array (rows ``K + pad``
    apart, starting ``off`` elements in) and its oracle."""
    from tilenest.workloads import WORKLOADS

    rng = np.random.default_rng(M * 100 + K)
    big = rng.standard_normal((M, K + pad)).astype(dt.np)
    a = big[:, off:off + K]
    b = rng.standard_normal((K, N)).astype(dt.np)
    return a, b, (M, N)


_STRIDED = [(t, dt, 32, off) for t in ("llvm", "cuda")
            for dt, off in ((f32, 3), (bf16, 8), (bf16, 3))]


@pytest.mark.parametrize("target,dt,tile,off", [
    pytest.param(*c, marks=[pytest.mark.slow] if c[0] == "cuda" and c[1] == f32 else [],
                 id=f"{c[1]}-{'aligned' if c[3] % 8 == 0 else 'unaligned'}-{c[0]}")
    for c in _STRIDED])
def test_a_sliced_input_is_read_in_place_through_its_strides(target, dt, tile, off):
    """A read-only argument whose rows are packed but not adjacent runs the
    variant with its outer strides as runtime arguments (``A.stride0``):
    nothing is copied, and the result is the oracle's; on the emulated GPU
    the tensor-core GEMM takes it too, with rows at an 8-element stride
    (16-byte copies) or not (the aligned copy's guard falls back); the f32
    emulated run is under -m slow (llvm covers f32)."""
    from tilenest.lowering import default_schedule, lower_verified, print_kernel
    from tilenest.workloads import WORKLOADS

    k = WORKLOADS["gemm"].kernel(dt, {"bm": tile, "bn": tile, "bk": 16, "loop": "pipeline"})
    a, b, (M, N) = _gemm_strided_case(dt, off=off, pad=8 if off == 8 else 9)
    assert not a.flags.c_contiguous and A.row_strides(a) == (a.strides[0] // a.itemsize, 1)
    oracle = tn.reference(k, np.ascontiguousarray(a), b, np.zeros((M, N), dt.np))
    ck = k.compile(target=target)
    c = np.zeros((M, N), dt.np)
    ck(a, b, c)
    assert oracle.admits(c).ok
    ir = print_kernel(lower_verified(k.program, default_schedule(k.program, target,
                                                                strided=("A",))))
    assert "A.stride0" in ir


def test_strided_views_a_compiled_kernel_cannot_read_are_errors(llvm):
    """Views whose innermost dimension is not packed (a transpose), and a
    strided view given for a written argument, are errors naming it."""
    from tilenest.workloads import WORKLOADS

    k = WORKLOADS["gemm"].kernel(f32, {"bm": 32, "bn": 32, "bk": 16, "loop": "pipeline"})
    ck = k.compile(target="llvm")
    a, b, (M, N) = _gemm_strided_case(f32)
    with pytest.raises(TilenestError, match="argument 'A' is not a C-contiguous aligned array; "
                       "compiled kernels read arrays in place, through views whose innermost"):
        ck(np.asfortranarray(a), b, np.zeros((M, N), np.float32))
    wide = np.zeros((M, N + 4), np.float32)
    with pytest.raises(TilenestError, match="argument 'C' .* a written argument must be "
                       "C-contiguous") as e:
        ck(np.ascontiguousarray(a), b, wide[:, :N])
    assert "ascontiguousarray" in e.value.hint


def test_a_narrowed_torch_tensor_runs_on_llvm():
    torch = pytest.importorskip("torch")
    from tilenest.workloads import WORKLOADS

    k = WORKLOADS["gemm"].kernel(f32, {"bm": 32, "bn": 32, "bk": 16, "loop": "pipeline"})
    a, b, (M, N) = _gemm_strided_case(f32)
    ta = torch.from_numpy(np.ascontiguousarray(a.base if a.base is not None else a))
    ta = ta.narrow(1, 3, a.shape[1])
    assert not ta.is_contiguous()
    c = torch.zeros((M, N))
    k.compile(target="llvm")(ta, torch.from_numpy(b), c)
    oracle = tn.reference(k, np.ascontiguousarray(a), b, np.zeros((M, N), np.float32))
    assert oracle.admits(c.numpy()).ok


@pytest.mark.device
@pytest.mark.parametrize("dt,off", [(bf16, 8), (bf16, 3)], ids=["aligned", "unaligned"])
def test_a_sliced_host_input_runs_on_the_gpu(dt, off):
    """The strided variant on a real GPU: a column slice of a wider host array
    is copied by its memory span and read through ``A.stride0``; the result
    is the oracle's."""
    from tilenest.backends import cuda
    from tilenest.workloads import WORKLOADS

    if not cuda.gpu_available():
        pytest.fail("no usable CUDA GPU (CuPy and a driver are needed)")
    k = WORKLOADS["gemm"].kernel(dt, {"bm": 64, "bn": 64, "bk": 32, "loop": "pipeline"})
    a, b, (M, N) = _gemm_strided_case(dt, M=130, K=96, N=70, off=off, pad=8 if off == 8 else 9)
    assert not a.flags.c_contiguous
    oracle = tn.reference(k, np.ascontiguousarray(a), b, np.zeros((M, N), dt.np))
    c = np.zeros((M, N), dt.np)
    k.compile(target="cuda", device="gpu")(a, b, c)
    assert oracle.admits(c).ok
