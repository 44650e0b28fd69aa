"""ThreadSanitizer over the generated CUDA source of every example kernel.

Each example kernel is compiled for ``cuda`` with 32 threads per program and
its generated source is run once under ThreadSanitizer
(``emulator.run_tsan``: every GPU thread a TSan fiber, barriers and warp
collectives annotated as synchronization), one launch per phase, on inputs
made here; TSan must report no data race and the emulator no error, and the
outputs, which come back from the TSan process, must be admitted by the
interpreter's oracle (computed in this process, not under TSan).

The sizes are chosen so that every thread loop whose trip count grows with a
size runs at least three rounds per thread (:func:`thread_rounds`): a race
between one round of a thread and a later round of another needs rounds to
exist. Thread loops over a fixed tile of at most 32 elements have one round
at any size.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import re
from pathlib import Path

import numpy as np
import pytest

import tilenest as tn
from tilenest.backends import cuda
from tilenest.backends.cuda.runtime import CudaKernel
from tilenest.backends.simt import emulator as em
from tilenest.lowering import default_schedule
from tilenest.lowering import loopir as L
from tilenest.semantics import expr as E

ROOT = Path(__file__).resolve().parent.parent
THREADS = 32

needs_tsan = pytest.mark.skipif(not em.tsan_available(),
                                reason="the host compiler has no ThreadSanitizer runtime "
                                       "(libtsan: g++ -print-file-name=libtsan.so)")


def _f32(rng, *shape):  # type: ignore[no-untyped-def]
    return rng.standard_normal(shape).astype(np.float32)


#: example -> inputs for the TSan run of its kernels: small, yet every
#: size-dependent thread loop at least three rounds of 32 threads, each thread
#: taking up to four consecutive f32 elements per round (the vector lanes)
INPUTS = {
    "causal_attention": lambda rng: (_f32(rng, 5, 400), _f32(rng, 5, 400), _f32(rng, 5, 390),
                                     np.zeros((5, 390), np.float32), np.float32(0.05)),
    "folds": lambda rng: (np.array([1, 2, 3], np.float32), np.zeros(2, np.float32)),
    "gemm": lambda rng: (_f32(rng, 40, 70), _f32(rng, 70, 36), np.zeros((40, 36), np.float32)),
    "memory_stage": lambda rng: (_f32(rng, 13, 21), np.zeros((21, 13), np.float32)),
    "ragged": lambda rng: (np.float32(2.5), _f32(rng, 300), _f32(rng, 300),
                           np.zeros(300, np.float32)),
    "rmsnorm": lambda rng: (_f32(rng, 2, 400), _f32(rng, 400), np.zeros((2, 400), np.float32),
                            np.float32(1e-5)),
    "softmax": lambda rng: (_f32(rng, 2, 400), np.zeros((2, 400), np.float32)),
    "two_level": lambda rng: (_f32(rng, 3, 400), np.zeros((3, 400), np.float32)),
}
EXAMPLES = sorted(p.stem for p in (ROOT / "examples").glob("*.py"))


def _kernels(name: str) -> list:
    spec = importlib.util.spec_from_file_location(f"ex_tsan_{name}",
                                                  ROOT / "examples" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return [v for v in vars(mod).values() if isinstance(v, tn.Kernel)]


def thread_rounds(kernel: L.Kernel, syms: dict[str, int]) -> list[tuple[str, int]]:
    """Rounds per thread of every thread loop whose trip count depends only
    on the symbols and grows with them (three rounds or more when every
    symbol is large; a remainder such as ``E mod 8`` never does):
    ``(expression, value at syms)``."""
    env = {E.Sym(s): v for s, v in syms.items()}
    bigs = [{E.Sym(s): big for s in syms} for big in (10_000, 10_007)]
    out = []
    for ph in kernel.phases:
        for s in L.walk(ph.body):
            if not (isinstance(s, L.For) and s.kind == "thread"):
                continue
            for r in s.body:
                if not isinstance(r, L.For) or isinstance(r.hi, E.Const):
                    continue
                try:
                    grows = max(int(E.evaluate(r.hi, b)) for b in bigs) >= 3
                    if grows:
                        out.append((str(r.hi), int(E.evaluate(r.hi, env))))
                except Exception:  # noqa: BLE001 - a bound over outer loop variables
                    continue
    return out


def tsan_call(ck, arrays: tuple) -> tuple[list, dict]:  # type: ignore[no-untyped-def]
    """Run every phase of ``ck`` on ``arrays`` under ThreadSanitizer, in
    order, as the runtime launches them; arrays are updated in place.
    Returns the reports (one per launch) and the call's symbol values. The
    launch arguments and sizes are the runtime's own
    (``CudaKernel.launch_args``, ``CudaKernel.launches``), so this stays the
    ABI the emulator is called with."""
    keep, syms = ck.bind(arrays, None)
    assert ck.aliases(keep) == ck.schedule.aliases
    symvals = [int(syms[s]) for s in ck.kernel.syms]
    status = np.zeros(1, dtype=np.int32)
    args = [int(a) if isinstance(a, np.int64) else a
            for a in ck.launch_args(keep, symvals, status, lambda a: a)]
    kernels = {i.name: list(i.params) for i in ck.source.kernels}
    reports = []
    for info, n, smem in ck.launches(syms):
        reports.append(em.run_tsan(ck.source.text, info.name, (n,), (info.threads,), args,
                                   kernels=kernels, include_dirs=(cuda.prelude_dir(),),
                                   shared_bytes=smem, policy="random", seed=7, timeout=240.0))
        assert status[0] == 0, f"{info.name}: status {status[0]}"
    return reports, syms


def test_every_example_has_tsan_inputs():
    assert set(INPUTS) == set(EXAMPLES)


@needs_tsan
@pytest.mark.parametrize("name", EXAMPLES)
def test_example_source_is_race_free_under_tsan(name):
    for kern in _kernels(name):
        prog = kern.program
        ck = cuda.compile_program(prog, default_schedule(prog, "cuda", block_threads=THREADS),
                                  device="emulated")
        arrays = INPUTS[name](np.random.default_rng(11))
        want = tn.reference(kern, *(a.copy() if isinstance(a, np.ndarray) else a
                                    for a in arrays))
        want = want if isinstance(want, tuple) else (want,)
        reports, syms = tsan_call(ck, arrays)
        rounds = thread_rounds(ck.kernel, syms)
        short = [(e, v) for e, v in rounds if v < 3]
        assert not short, f"{prog.name}: thread loops with fewer than 3 rounds: {short}"
        assert reports
        for rep in reports:
            assert rep.error is None, f"{prog.name}: {rep.error}"
            assert not rep.races, f"{prog.name}: " + "\n".join(
                f"{r.space} race at lines {r.lines}" for r in rep.races) + "\n" + \
                rep.races[0].text[:3000]
            assert rep.returncode == 0, rep.log[-3000:]
        got = {v.name: a for v, a in zip(prog.args, arrays, strict=True)}
        for adm in want:
            v = adm.admits(got[adm.name])
            assert v, f"{prog.name} under TSan: {adm.name}: {v}"


@needs_tsan
def test_tsan_reports_a_dropped_barrier_of_the_generated_source():
    """The run can fail: with the barrier between the store of the row
    maximum (by thread 0) and the loop that reads it (every thread) dropped,
    TSan reports the race in shared memory with both lines."""
    (kern,) = _kernels("softmax")
    prog = kern.program
    ck = cuda.compile_program(prog, default_schedule(prog, "cuda", block_threads=THREADS),
                              device="emulated")
    text = ck.source.text
    sites = [m.start() for m in re.finditer(r"__syncthreads\(\);", text)]
    at = sites[1]  # after `m` is stored, before the exponentials read it
    cut = text[:at] + "/* dropped */" + text[at + len("__syncthreads();"):]
    bad = CudaKernel(prog, ck.kernel, ck.schedule, dataclasses.replace(ck.source, text=cut),
                     ck.built, "emulated", [], 0.0)
    reports, _ = tsan_call(bad, INPUTS["softmax"](np.random.default_rng(3)))
    races = [r for rep in reports for r in rep.races]
    assert races and all(r.space == "shared" and len(r.lines) == 2 for r in races)
