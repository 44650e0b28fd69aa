"""Timing a user's own kernel against a baseline: :func:`do_bench`.

``tilenest bench`` times the kernels that ship with the package; this is the
same method (:mod:`tilenest.bench.timing`: a warm-up, samples of at least
``min_sample_ms`` each, alternating rounds with the baseline, calibration
until the samples are stable) for any zero-argument callable, typically a
compiled kernel bound to its arrays::

    import numpy as np
    import tilenest as tn
    from tilenest.bench import do_bench

    ck = my_kernel.compile()
    x = np.random.rand(4096, 4096).astype(np.float32)
    y = np.empty_like(x)
    r = do_bench(lambda: ck(x, y), baseline=lambda: np.exp(x, out=y))
    print(r)            # kernel 1.234 ms ±3%, baseline 2.345 ms ±2%: ratio 1.90x
    r.ratio             # baseline time / kernel time (> 1: the kernel is faster)

Nothing here checks results: compare the outputs (``tn.validate``, or the
admitted outputs of ``tn.reference``) before trusting a ratio.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..errors import TilenestError
from .timing import NOISE_LIMIT, Method, Timing, measure, plus_minus


@dataclass(frozen=True)
class BenchResult:
    """The timing of the function, of its baseline (if one was given) and the
    ratio ``baseline.median / time.median``; ``noisy`` is True when a timing's
    noise stayed above the calibration limit (the ratio is then uncertain)."""

    time: Timing
    baseline: Timing | None = None

    @property
    def ratio(self) -> float | None:
        if self.baseline is None or self.time.median <= 0:
            return None
        return self.baseline.median / self.time.median

    @property
    def noisy(self) -> bool:
        return any(t.noise > NOISE_LIMIT for t in (self.time, self.baseline) if t is not None)

    def __str__(self) -> str:
        pm = plus_minus()

        def ms(t: Timing) -> str:
            return f"{t.median * 1e3:.3f} ms {pm}{t.spread:.0%}"

        text = f"kernel {ms(self.time)}"
        if self.baseline is not None:
            text += f", baseline {ms(self.baseline)}: ratio {self.ratio:.2f}x"
        if self.noisy:
            text += " (noisy samples: the ratio is uncertain)"
        return text


def do_bench(fn: Callable[[], object], baseline: Callable[[], object] | None = None, *,
             samples: int = 5, min_sample_ms: float = 50.0, min_calls: int = 1,
             max_noise: float = NOISE_LIMIT, max_extra: int | None = None) -> BenchResult:
    """Time ``fn`` (and ``baseline``, in alternating rounds) as ``tilenest
    bench`` times its kernels: each sample a block of calls lasting at least
    ``min_sample_ms`` milliseconds and ``min_calls`` calls, each block after an
    untimed warm-up call; ``samples`` rounds, then up to ``max_extra`` more (as
    many again by default) while a function's noise is above ``max_noise``.
    Returns the seconds per call of each (median, spread, noise) and their
    ratio."""
    if samples < 1 or min_calls < 1:
        raise TilenestError(f"do_bench: samples={samples}, min_calls={min_calls}: each is "
                            "at least 1", hint="e.g. do_bench(fn, samples=5)")
    if not 0 < min_sample_ms < float("inf"):
        raise TilenestError(f"do_bench: min_sample_ms={min_sample_ms} is not a positive time",
                            hint="e.g. do_bench(fn, min_sample_ms=50)")
    method = Method(samples=samples, min_sample_s=min_sample_ms / 1e3, min_calls=min_calls,
                    max_noise=max_noise, max_extra=max_extra)
    fns = [fn] if baseline is None else [fn, baseline]
    timings = measure(fns, method)
    return BenchResult(timings[0], timings[1] if baseline is not None else None)
