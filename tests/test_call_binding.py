"""How a call binds its arguments, the same for every entry point: the
interpreter, the oracle and compiled kernels."""

from __future__ import annotations

import numpy as np
import pytest

import tilenest as tn
from tilenest import f32
from tilenest.errors import TilenestError


@tn.kernel
def scale(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"], *, k=2.0):
    (n,) = x.shape
    for p in tn.parallel(tn.shape(tn.cdiv(n, 4))):
        o = tn.coord(p.index() * 4)
        y(o, tn.shape(4)).store(x[o, tn.shape(4), tn.bounds.zero] * k)


def _args():
    x = np.arange(10, dtype=np.float32)
    return x, np.zeros_like(x)


@pytest.mark.parametrize("entry", ["call", "interpret", "reference", "compiled"])
def test_read_only_output_is_a_located_error(entry):
    x, y = _args()
    y.flags.writeable = False
    run = {"call": lambda: scale(x, y), "interpret": lambda: tn.interpret(scale, x, y),
           "compiled": lambda: scale.compile()(x, y),
           # the oracle never writes the caller's arrays: a read-only output is fine
           "reference": lambda: tn.reference(scale, x, y)}[entry]
    if entry == "reference":
        assert run().admits(x * 2)
        return
    with pytest.raises(TilenestError, match="argument 'y' is written .* read-only") as e:
        run()
    assert "test_call_binding.py" in str(e.value)


def test_read_only_input_is_fine():
    x, y = _args()
    x.flags.writeable = False
    scale(x, y)
    assert np.array_equal(y, x * 2)


def test_interpret_and_reference_take_keywords_and_constants():
    x, y = _args()
    tn.interpret(scale, y=y, x=x, k=3.0)
    assert np.array_equal(y, x * 3)
    assert tn.reference(scale, x, y=np.zeros_like(x), k=3.0, schedule="reversed").admits(y)
    assert not tn.reference(scale, x, np.zeros_like(x)).admits(y)  # k defaults to 2
    with pytest.raises(TilenestError, match="has no argument 'z'"):
        tn.interpret(scale, x, y, z=1)
    with pytest.raises(TilenestError, match="missing argument"):
        tn.reference(scale, x)


def test_interpret_takes_batch_for_a_kernel_too():
    import numpy as np

    import tilenest as tn
    from tilenest import f32

    @tn.kernel
    def add_one(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"]):  # noqa: F821
        (n,) = x.shape
        y = y.with_dims(*x.dims())
        for p in tn.parallel(tn.shape(tn.cdiv(n, 4))):
            y(tn.coord(p.index() * 4), tn.shape(4)).store(
                x[tn.coord(p.index() * 4), tn.shape(4), tn.bounds.zero] + 1.0)

    x = np.arange(6, dtype=np.float32)
    for batch in (True, False):
        y = np.zeros(6, np.float32)
        tn.interpret(add_one, x, y, batch=batch)
        assert y.tolist() == (x + 1).tolist()
