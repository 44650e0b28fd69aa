"""The public namespace reaches what the README shows (``tn.interpreter.random``)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import tilenest as tn
from tilenest import f32


@tn.kernel
def _halves(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"]):
    (n,) = x.shape
    for p in tn.parallel(tn.shape(2)):
        h = x[tn.coord(p.index() * (n // 2)), tn.shape(n // 2)]
        y(tn.coord(p.index() * (n // 2)), tn.shape(n // 2)).store(h * 2.0)


def test_random_schedule_is_reachable_from_the_package():
    x = np.arange(8, dtype=np.float32)
    y = np.zeros(8, np.float32)
    tn.interpret(_halves, x, y, schedule=tn.interpreter.random(3))
    assert (y == 2 * x).all()


def test_subpackages_are_imported_on_first_use_only():
    code = ("import sys, tilenest as tn; assert 'tilenest.interpreter' not in sys.modules; "
            "tn.interpreter; assert 'tilenest.interpreter' in sys.modules; tn.lowering.loopir")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_unknown_attribute_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        tn.nothing_here  # noqa: B018
