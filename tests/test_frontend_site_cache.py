"""A kernel's ``def`` site (``frontend/kernel.py`` ``kernel_site``) is parsed once
per source file version, not at every call, and an edited file is read again."""

from __future__ import annotations

import importlib.util
import os

import numpy as np

from tilenest.frontend import kernel as K

_SOURCE = '''
import tilenest as tn
from tilenest import f32

{pad}
@tn.kernel
def double(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"]):
    (n,) = x.shape
    for p in tn.parallel(tn.shape(n)):
        y(tn.coord(p.index()), tn.shape(1)).store(x[tn.coord(p.index()), tn.shape(1)] * 2.0)
'''


def _load(path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _counting(monkeypatch):
    calls = []
    real = K.parse_function

    def parse(fn):
        calls.append(fn)
        return real(fn)

    monkeypatch.setattr(K, "parse_function", parse)
    return calls


def test_calls_parse_the_source_once(tmp_path, monkeypatch):
    f = tmp_path / "kern_once.py"
    f.write_text(_SOURCE.format(pad=""))
    k = _load(f).double
    calls = _counting(monkeypatch)
    x = np.arange(4, dtype=np.float32)
    k(x, np.zeros(4, np.float32))  # captures the program and finds the site
    assert calls
    calls.clear()
    for _ in range(3):
        y = np.zeros(4, np.float32)
        k(x, y)
        assert y.tolist() == (2 * x).tolist()
    first = K.kernel_site(k.fn)
    assert not calls
    assert first == K._parse_site(k.fn)
    assert first.line == 7  # the def statement


def test_an_edited_file_is_read_again(tmp_path, monkeypatch):
    f = tmp_path / "kern_edit.py"
    f.write_text(_SOURCE.format(pad=""))
    k = _load(f).double
    calls = _counting(monkeypatch)
    K.kernel_site(k.fn)
    K.kernel_site(k.fn)
    assert len(calls) == 1
    st = os.stat(f)
    f.write_text(_SOURCE.format(pad="# an added line\n"))
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    K.kernel_site(k.fn)
    assert len(calls) == 2
    k2 = _load(f).double  # the function defined by the edited file
    assert K.kernel_site(k2.fn).line == 8
    assert len(calls) == 3


def test_another_working_directory_is_looked_up_again(tmp_path, monkeypatch):
    f = tmp_path / "kern_cwd.py"
    f.write_text(_SOURCE.format(pad=""))
    k = _load(f).double
    calls = _counting(monkeypatch)
    K.kernel_site(k.fn)
    monkeypatch.chdir(tmp_path)
    site = K.kernel_site(k.fn)
    assert len(calls) == 2
    assert site == K._parse_site(k.fn)
