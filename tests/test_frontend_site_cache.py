"""A kernel's source is read and parsed once (``frontend/stager.py``
``parse_function``): capture, its variants, the ``def`` site and every call
share one parse, also when many threads call a kernel at once."""

from __future__ import annotations

import ast
import importlib.util
import sys
import threading

import numpy as np

from tilenest.frontend import kernel as K
from tilenest.frontend import stager as S

_SOURCE = '''
import tilenest as tn
from tilenest import f32

{pad}
@tn.kernel
def double(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"], *, c=2.0):
    (n,) = x.shape
    for p in tn.parallel(tn.shape(n)):
        y(tn.coord(p.index()), tn.shape(1)).store(x[tn.coord(p.index()), tn.shape(1)] * c)
'''


def _load(path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _counting_parses(monkeypatch, filename: str) -> list[str]:
    """Every ``ast.parse`` of the source of a function defined in ``filename``
    (a parse happens on the dedented source; its first line names the def)."""
    calls: list[str] = []
    real = ast.parse

    def parse(source, *a, **kw):
        if isinstance(source, str) and "def double(" in source:
            calls.append(filename)
        return real(source, *a, **kw)

    monkeypatch.setattr(S.ast, "parse", parse)
    return calls


def test_capture_variants_site_and_calls_share_one_parse(tmp_path, monkeypatch):
    f = tmp_path / "kern_once.py"
    f.write_text(_SOURCE.format(pad=""))
    k = _load(f).double
    calls = _counting_parses(monkeypatch, str(f))
    x = np.arange(4, dtype=np.float32)
    for c in (2.0, 3.0):  # two variants: two captures of one function
        for _ in range(3):
            y = np.zeros(4, np.float32)
            k(x, y, c=c)
            assert y.tolist() == (c * x).tolist()
    site = K.kernel_site(k.fn)
    assert site.line == 7  # the def statement
    assert len(calls) == 1


def test_one_kernel_called_from_eight_threads(tmp_path, monkeypatch):
    """Eight threads call a kernel nobody has captured yet, all at once: one
    capture, one parse, eight right answers (concurrent ``ast.parse`` once
    raised ``SystemError: AST constructor recursion depth mismatch``)."""
    f = tmp_path / "kern_threads.py"
    f.write_text(_SOURCE.format(pad=""))
    k = _load(f).double
    calls = _counting_parses(monkeypatch, str(f))
    captures: list[object] = []
    real_capture = K.capture

    def capture(*a, **kw):
        captures.append(a)
        return real_capture(*a, **kw)

    monkeypatch.setattr(K, "capture", capture)
    start = threading.Barrier(8)
    results: dict[int, object] = {}

    def work(i: int) -> None:
        x = np.arange(16, dtype=np.float32) + i
        y = np.zeros(16, np.float32)
        start.wait()
        try:
            for _ in range(4):
                k(x, y)
            results[i] = y.tolist() == (2 * x).tolist()
        except BaseException as e:  # noqa: BLE001 - reported by the assertion below
            results[i] = e

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {i: True for i in range(8)}
    assert len(captures) == 1 and len(calls) == 1


def test_another_working_directory_names_the_file_from_there(tmp_path, monkeypatch):
    """Source file names are relative to the working directory: after a
    ``chdir`` the site is looked up again and names the file from there."""
    f = tmp_path / "kern_cwd.py"
    f.write_text(_SOURCE.format(pad=""))
    k = _load(f).double
    before = K.kernel_site(k.fn)
    monkeypatch.chdir(tmp_path)
    after = K.kernel_site(k.fn)
    assert after.file == "kern_cwd.py" and after.line == before.line == 7


def test_threads_capturing_different_kernels_build_their_own_programs(tmp_path):
    """Capture state is per thread: eight threads capturing eight variants at
    once get the programs a lone capture gives."""
    f = tmp_path / "kern_many.py"
    f.write_text(_SOURCE.format(pad=""))
    k = _load(f).double
    want = {c: str(k.specialize(c=float(c)).program) for c in range(8)}
    fresh = [k.specialize(c=float(c)) for c in range(8)]
    start = threading.Barrier(8)
    got: dict[int, object] = {}

    def work(c: int) -> None:
        start.wait()
        try:
            got[c] = str(fresh[c].program)
        except BaseException as e:  # noqa: BLE001 - reported by the assertion below
            got[c] = e

    threads = [threading.Thread(target=work, args=(c,)) for c in range(8)]
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads often, so that the captures interleave
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(before)
    assert got == want
