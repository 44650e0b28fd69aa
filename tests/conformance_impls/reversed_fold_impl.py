"""A deliberately wrong implementation: it runs every ``fold_left`` reduction
in reversed source order (as ``fold_right``), which changes strict folds whose
order is observable (digit accumulation, cancelling float sums)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import reference_impl  # noqa: E402


def rewrite(text: str) -> str:
    return text.replace("policy = fold_left", "policy = fold_right")


reference_impl.rewrite = rewrite

if __name__ == "__main__":
    sys.exit(reference_impl.main(sys.argv))
