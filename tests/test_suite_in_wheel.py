"""The conformance suite ships in the wheel: a wheel built from this checkout
holds every case file (the package's ``conformance_suite/cases`` links to
``spec/conformance/cases``; the build copies the files), and tilenest
imported from that wheel alone finds its suite, as ``--tilenest-impl`` needs."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CASES = ROOT / "spec" / "conformance" / "cases"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wheel built (no dependencies, no isolation) from a copy of the files a
    build reads, so that the build leaves nothing in the checkout."""
    if importlib.util.find_spec("setuptools") is None:
        pytest.skip("setuptools is not installed: no wheel can be built here")
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "tilenest", src / "tilenest", symlinks=True,
                    ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    shutil.copytree(CASES, src / "spec" / "conformance" / "cases")
    out = tmp_path_factory.mktemp("dist")
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                        "--no-build-isolation", "-w", str(out), str(src)],
                       capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    (whl,) = out.glob("tilenest-*.whl")
    return whl


def test_the_wheel_carries_every_case_file(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    packaged = {n.removeprefix("tilenest/conformance_suite/cases/") for n in names
                if n.startswith("tilenest/conformance_suite/cases/")}
    source = {p.relative_to(CASES).as_posix() for p in CASES.rglob("*") if p.is_file()}
    assert packaged == source and len(source) > 400


def test_tilenest_from_the_wheel_finds_its_suite(wheel, tmp_path):
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    env = dict(os.environ, PYTHONPATH=str(site))
    code = ("from tilenest import conformance as C; s = C.default_suite(); "
            "print(s); print(len(C.load_suite(s)))")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stderr
    where, count = r.stdout.split()
    assert Path(where) == site / "tilenest" / "conformance_suite"
    recipes = [p for p in CASES.rglob("*.json") if not p.name.endswith(".tileir.json")]
    assert int(count) == len(recipes)


def test_the_wheel_carries_every_header_the_backends_read(wheel):
    """Every prelude, shim and stdlib stand-in under ``tilenest/backends`` (the
    files NVRTC, the emulator, clang and a Metal runtime include) is in the
    wheel: a generated source includes them by name at compile time."""
    names = set(zipfile.ZipFile(wheel).namelist())
    backends = ROOT / "tilenest" / "backends"
    headers = {f"tilenest/{p.relative_to(ROOT / 'tilenest').as_posix()}"
               for p in backends.rglob("*") if p.is_file()
               and (p.suffix in (".h", ".cuh") or p.name == "metal_stdlib")}
    assert len(headers) >= 8 and headers <= names, sorted(headers - names)
