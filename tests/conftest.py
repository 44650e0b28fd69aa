import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for p in (ROOT / "tests", ROOT / "examples"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

# The suite judges freshly compiled code and freshly decided proofs: the
# persistent cache (tilenest.diskcache) is off unless a test enables it with a
# folder of its own (tests/test_diskcache.py). Emulator builds, which only
# save host C++ compile time and are checked by their headers' contents, keep
# their usual folder (as in a normal run).
import os  # noqa: E402

if "TILENEST_EMU_CACHE" not in os.environ:
    from tilenest.backends.simt.emulator import cache_dir  # noqa: E402

    os.environ["TILENEST_EMU_CACHE"] = str(cache_dir())
os.environ["TILENEST_CACHE_DIR"] = "off"


import types  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def fresh_proof_answers():
    """Each test decides its own proofs: the process's remembered engine
    answers (``obligation._RECENT``) start empty, so a test that replaces an
    engine sees it called."""
    from tilenest.proofs import obligation

    obligation._RECENT.clear()


def _of_tilenest(obj) -> bool:  # type: ignore[no-untyped-def]
    name = getattr(obj, "__name__", "") if isinstance(obj, types.ModuleType) else \
        getattr(obj, "__module__", None) or type(obj).__module__
    return name == "tilenest" or name.startswith("tilenest.")


@pytest.fixture(autouse=True)
def no_kernels_compiled_under_a_patch(request):
    """A test that patches tilenest itself (``monkeypatch.setattr`` on one of
    its modules, classes or objects: a lowering threshold, an emitter method)
    leaves none of the kernels compiled under the patch in the process's
    caches: the in-memory kernel caches key on the program and schedule, not
    on the code that lowered them, so a later test asking for the same
    kernel would get the patched one. Cleared before the patch is undone;
    the memory is not given back (a garbage collection of a long-running
    worker's heap, about a second a test)."""
    if "monkeypatch" not in request.fixturenames:
        yield
        return
    mp = request.getfixturevalue("monkeypatch")  # set up first, so undone after this
    yield
    if any(_of_tilenest(target) for target, _, _ in mp._setattr):
        import tilenest as tn

        tn.clear_cache(release=False)


@pytest.fixture
def no_nvrtc(monkeypatch):
    """NVRTC unusable: its module raises on any use, whether imported before or after."""
    from tilenest.backends.cuda import nvrtc

    def boom(*a, **k):
        raise AssertionError("NVRTC was used")

    for name in ("compile_cuda", "compile_program", "nvrtc_library", "find_nvrtc",
                 "nvrtc_available", "toolchain_identity"):
        monkeypatch.setattr(nvrtc, name, boom)

    class Exploding(types.ModuleType):
        def __getattr__(self, name):
            raise AssertionError(f"NVRTC was used ({name})")

    monkeypatch.setitem(sys.modules, "tilenest.backends.cuda.nvrtc", Exploding("nvrtc"))


@pytest.fixture
def mutate_source(monkeypatch):
    """``mutate_source(old, new)``: every CUDA/Metal source the SIMT emitter
    produces from now on in the test has ``old`` replaced by ``new`` (a
    mutation of the emitted code); a source without ``old`` fails the test,
    so a mutation that no longer applies is noticed."""
    from dataclasses import replace as _replace

    from tilenest.backends.simt.emitter import Emitter

    def apply(old: str, new: str) -> None:
        real = Emitter.source

        def mutated(self):  # type: ignore[no-untyped-def]
            src = real(self)
            text = src.text.replace(old, new)
            assert text != src.text, f"the emitted source has no {old!r}"
            return _replace(src, text=text)

        monkeypatch.setattr(Emitter, "source", mutated)

    return apply
