"""``make demo`` (``python -m tilenest.demo``) is the README's first command: it
must run every example, every kernel of each, with no failure."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_demo_runs_every_kernel_of_every_example():
    r = subprocess.run([sys.executable, "-m", "tilenest.demo"], capture_output=True, text=True,
                       cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    files = sorted(ROOT.glob("examples/*.py"))
    assert f"{len(files)} example files, 0 failure(s)" in r.stdout
    # a module with several kernels runs each of them against numpy
    for name in ("causal_attention", "causal_attention_blocked"):
        assert f"-- run {name}:" in r.stdout
