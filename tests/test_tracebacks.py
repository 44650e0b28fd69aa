"""User errors leave tilenest's entry points with short tracebacks: the user's
frames and one frame of the boundary, not the dozens of tilenest frames in
between (``tilenest/tracebacks.py``); ``TILENEST_DEBUG=1`` keeps them all, and
bugs (exceptions that are not user errors) always keep them."""

from __future__ import annotations

import traceback
from pathlib import Path

import numpy as np
import pytest

import tilenest as tn
from tilenest import f32
from tilenest.errors import CaptureError, TilenestError, TypeCheckError

PACKAGE = Path(tn.__file__).resolve().parent


@tn.kernel
def double(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"]):
    (n,) = x.shape
    for p in tn.parallel(tn.shape(n)):
        y(tn.coord(p.index()), tn.shape(1)).store(x[tn.coord(p.index()), tn.shape(1)] * 2.0)


@tn.kernel
def broken(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"]):
    (n,) = x.shape
    for p in tn.serial(tn.shape(n), order="sideways"):
        y(tn.coord(p.index()), tn.shape(1)).store(x[tn.coord(p.index()), tn.shape(1)])


def _own_frames(e: BaseException) -> list[str]:
    return [f"{f.filename}:{f.lineno}" for f in traceback.extract_tb(e.__traceback__)
            if PACKAGE in Path(f.filename).resolve().parents]


def _my_helper(run, *args):
    return run(*args)


X64 = np.zeros(8)
Y = np.zeros(8, np.float32)


def _uses():
    return {
        "kernel call": lambda: _my_helper(double, X64, Y),
        "tn.interpret": lambda: _my_helper(tn.interpret, double, X64, Y),
        "tn.reference": lambda: _my_helper(tn.reference, double, X64, Y),
        "llvm call": lambda: _my_helper(double.compile("llvm"), X64, Y),
        "capture": lambda: broken.program,
        "capture at call": lambda: broken(np.zeros(8, np.float32), Y),
        "compile": lambda: broken.compile("llvm"),
        "tn.parse": lambda: tn.parse("kernel @k() {\n  %x = nope\n}"),
    }


@pytest.mark.parametrize("use", list(_uses()))
def test_user_errors_hide_tilenest_frames(use, monkeypatch):
    monkeypatch.delenv("TILENEST_DEBUG", raising=False)
    with pytest.raises(TilenestError) as e:
        _uses()[use]()
    own = _own_frames(e.value)
    assert len(own) == 1 and own[0].startswith(str(PACKAGE / "tracebacks.py")), own
    names = [f.name for f in traceback.extract_tb(e.value.__traceback__)]
    assert "test_user_errors_hide_tilenest_frames" in names  # the user's frames stay
    if use in ("kernel call", "tn.interpret", "tn.reference", "llvm call"):
        assert "_my_helper" in names
    # what Python prints: a few lines of frames, then the located message and hint
    printed = "".join(traceback.format_exception(e.value))
    assert printed.count('  File "') <= 4, printed
    assert printed.rstrip().endswith(str(e.value).splitlines()[-1])


def test_debug_keeps_every_frame(monkeypatch):
    monkeypatch.setenv("TILENEST_DEBUG", "1")
    with pytest.raises(TypeCheckError) as e:
        _my_helper(double, X64, Y)
    assert len(_own_frames(e.value)) > 3
    assert any("signature.py" in f for f in _own_frames(e.value))


def test_a_bug_keeps_every_frame(monkeypatch):
    """Not a user error (tilenest itself failed): the frames are the evidence."""
    from tilenest.semantics import signature

    def fails(*a, **kw):
        raise KeyError("a bug")

    monkeypatch.delenv("TILENEST_DEBUG", raising=False)
    monkeypatch.setattr(signature, "bind_call", fails)
    import tilenest.interpreter.core as core

    monkeypatch.setattr(core, "bind_call", fails)
    with pytest.raises(KeyError) as e:
        _my_helper(double, np.zeros(8, np.float32), Y)
    assert len(_own_frames(e.value)) > 3


def test_a_failed_capture_is_short_on_every_use(monkeypatch):
    monkeypatch.delenv("TILENEST_DEBUG", raising=False)
    for _ in range(3):
        with pytest.raises(CaptureError) as e:
            broken(np.zeros(8, np.float32), Y)
        assert len(_own_frames(e.value)) == 1
