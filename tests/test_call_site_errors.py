"""A call's mistakes are reported at the user's line that made the call, in
the words of the caller's framework; arrays that cannot be viewed in place
(DLPack edge cases, torch's lazy negation, the meta device) are refused with
a located error on every entry point; the emulated cuda target reads inputs
that numpy will not let anyone write, as the interpreter and llvm do."""

from __future__ import annotations

import functools
import inspect
import os

import numpy as np
import pytest

import tilenest as tn
from tilenest import f32
from tilenest.errors import TilenestError, TypeCheckError

FILE = os.path.relpath(__file__)


@tn.kernel
def double(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"]):
    (n,) = x.shape
    for p in tn.parallel(tn.shape(n)):
        y(tn.coord(p.index()), tn.shape(1)).store(x[tn.coord(p.index()), tn.shape(1)] * 2.0)


@pytest.fixture(scope="module")
def llvm():
    return double.compile("llvm")


def _entries(llvm):
    # partials, not lambdas: a lambda here would itself be the user's calling line
    return {"call": double, "interpret": functools.partial(tn.interpret, double),
            "reference": functools.partial(tn.reference, double), "llvm": llvm}


def _call_line() -> int:
    """The line marked ``# CALL`` in the calling test function."""
    f = inspect.currentframe().f_back
    src, first = inspect.getsourcelines(f.f_code)
    return next(first + i for i, line in enumerate(src) if "# CALL" in line)


def _at_call(e: TilenestError, line: int) -> bool:
    return bool(e.sites) and e.sites[0].file == FILE and e.sites[0].line == line


X = np.arange(8, dtype=np.float32)


@pytest.mark.parametrize("entry", ["call", "interpret", "reference", "llvm"])
@pytest.mark.parametrize("args,needle", [
    ((X.astype(np.float64), np.zeros(8, np.float32)), "has dtype float64"),
    ((X.reshape(2, 4), np.zeros(8, np.float32)), "has rank 2"),
    ((X, np.zeros(5, np.float32)), "extent N is 8 elsewhere"),
    ((X,), "argument"),
    ((X, np.zeros(16, np.float32)[::2]), None),  # llvm: a layout it cannot read
])
def test_argument_errors_name_the_call_line(llvm, entry, args, needle):
    run = _entries(llvm)[entry]
    try:
        run(*args)  # CALL
    except TilenestError as e:
        assert needle is None or needle in e.message, e.render()
        assert _at_call(e, _call_line()), e.render()
    else:
        assert needle is None and entry != "llvm"  # the strided output is llvm's refusal


def test_keyword_and_constant_errors_name_the_call_line():
    with pytest.raises(TilenestError, match="has no argument 'z'") as e:
        double(X, np.zeros(8, np.float32), z=1)  # CALL
    assert _at_call(e.value, _call_line()), e.value.render()
    with pytest.raises(TypeCheckError) as e:
        double(X.astype(np.float64), np.zeros(8, np.float32))
    assert e.value.hint == "convert with x.astype(np.float32)"


def test_a_call_from_a_thread_pool_names_the_kernel():
    """No user frame to name (the pool calls the kernel directly): the error
    names the kernel's location instead of a line of the standard library."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        fut = pool.submit(double, X.astype(np.float64), np.zeros(8, np.float32))
        with pytest.raises(TypeCheckError) as e:
            fut.result()
    site = e.value.sites[0]
    assert site == double.program.loc and site.file == FILE and site.line == 24  # the def


# -- DLPack and buffer edge cases ---------------------------------------------------------


class BadDevice:
    """A DLPack producer whose device query answers nonsense."""

    def __dlpack__(self, **kw):
        raise AssertionError("never exported")

    def __dlpack_device__(self):
        return ("cpu",)


class FailingExport:
    """A host DLPack producer whose export raises something unusual."""

    def __dlpack__(self, **kw):
        raise OverflowError("the producer gave up")

    def __dlpack_device__(self):
        return (1, 0)


@pytest.mark.parametrize("entry", ["call", "interpret", "reference", "llvm"])
@pytest.mark.parametrize("make,needle", [
    (BadDevice, "does not say which device it lives on"),
    (FailingExport, "cannot be viewed as a host array (the producer gave up)"),
])
def test_dlpack_edge_cases_are_located_errors(llvm, entry, make, needle):
    run = _entries(llvm)[entry]
    with pytest.raises(TilenestError) as e:
        run(make(), np.zeros(8, np.float32))  # CALL
    assert needle in e.value.message and "argument 'x'" in e.value.message
    assert _at_call(e.value, _call_line()), e.value.render()


@pytest.mark.parametrize("entry", ["call", "interpret", "reference", "llvm"])
def test_a_buffer_numpy_cannot_read_is_a_located_error(llvm, entry):
    import ctypes

    odd = (ctypes.c_char_p * 8)()  # a buffer of format '<z', which numpy has no dtype for
    with pytest.raises(TilenestError, match="argument 'x': the buffer of its "
                       "[a-z_.]*c_char_p_Array_8 cannot be viewed as an array") as e:
        _entries(llvm)[entry](odd, np.zeros(8, np.float32))  # CALL
    assert _at_call(e.value, _call_line()), e.value.render()


# -- torch ---------------------------------------------------------------------------------


@pytest.mark.parametrize("entry", ["call", "interpret", "reference", "llvm"])
def test_torch_meta_neg_and_dtype(llvm, entry):
    torch = pytest.importorskip("torch")
    run = _entries(llvm)[entry]
    with pytest.raises(TilenestError, match="argument 'x' is a torch.Tensor on the meta "
                       "device") as e:
        run(torch.zeros(8, device="meta"), np.zeros(8, np.float32))  # CALL
    assert _at_call(e.value, _call_line()) and "device='cpu'" in e.value.hint
    neg = torch.arange(8, dtype=torch.float32)._neg_view()
    assert neg.is_neg()
    y = np.zeros(8, np.float32)
    with pytest.raises(TilenestError, match="argument 'x' is a negated view") as e:
        run(neg, y)  # was: read as +x, giving 2 * x instead of -2 * x
    assert "x.resolve_neg()" in e.value.hint and not y.any()
    run(neg.resolve_neg(), y)
    if entry != "reference":
        assert y.tolist() == (-2 * X).tolist()
    with pytest.raises(TypeCheckError, match="torch.Tensor of dtype torch.float64") as e:
        run(torch.zeros(8, dtype=torch.float64), y)
    assert e.value.hint == "convert it: x.to(torch.float32)"


def test_admits_reasons_name_the_output():
    ref = tn.reference(double, X, np.zeros(8, np.float32))
    verdicts = [ref.admits(np.zeros(4, np.float32)), ref.admits(np.zeros(8, np.float64))]
    for v in verdicts:
        assert not v and v.reason.startswith("y"), v.reason


# -- the emulated cuda target --------------------------------------------------------------


@pytest.fixture(scope="module")
def emulated():
    return double.compile("cuda", device="emulated")


def test_emulated_cuda_reads_read_only_inputs(emulated, llvm):
    ro = X.copy()
    ro.flags.writeable = False
    want = (2 * X).tolist()
    for x in (ro, np.broadcast_to(X, (8,))[::1]):
        for run in (emulated, llvm, double):
            y = np.zeros(8, np.float32)
            run(x, y)
            assert y.tolist() == want
    assert not ro.flags.writeable and ro.tolist() == X.tolist()


def test_emulated_cuda_reads_jax_inputs(emulated):
    jnp = pytest.importorskip("jax.numpy")
    y = np.zeros(8, np.float32)
    emulated(jnp.asarray(X), y)
    assert y.tolist() == (2 * X).tolist()


def test_emulated_cuda_names_a_read_only_output(emulated):
    ro = np.zeros(8, np.float32)
    ro.flags.writeable = False
    with pytest.raises(TilenestError, match="argument 'y' is written by kernel double but the "
                       "array is read-only") as e:
        emulated(X, ro)  # CALL
    assert _at_call(e.value, _call_line()) and "argument 0" not in e.value.message
