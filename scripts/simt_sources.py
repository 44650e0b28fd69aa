"""Fingerprint every generated CUDA C++ source, to show a refactor leaves them unchanged.

    python scripts/simt_sources.py --out FILE.json [--jobs N] [--only PATTERN]
                                   [--compare OLD.json] [--against NEW.json] [--dump DIR]

The sources enumerated (each a *key*, see :func:`tasks`):

* ``workload/NAME/DTYPE/SCHEDULE`` -- every workload of
  :mod:`tilenest.workloads`, in each of its dtypes and each of its
  schedules. A size only changes the program through the compile-time
  constants it implies (``size_consts``, or a schedule value computed from the
  size); where two sizes imply different constants the key ends in
  ``@SIZE`` for each size, otherwise the size is left out.
* ``example/FILE/KERNEL`` -- every kernel of ``examples/*.py``, found as
  ``tilenest lower FILE --target cuda --emit cuda`` finds them.
* ``bench/gemm/bf16/TILE+OVERRIDES`` -- the GEMM tiles and GPU schedules of
  ``benchmarks/cuda.py`` (``GEMM_SCHEDULES``).

Each of these in the program's default cuda schedule, then (a ``+FIELD=VALUE``
suffix) under each override set of ``tilenest.backends.cuda.tune.SEARCH`` (the
search ``tn.tune`` and the row benchmarks run) and, for a program holding an
``mma``, under each explicit ``mma_unit``.

The manifest maps each key to the SHA-256 of the emitted source
(``tilenest.backends.target("cuda").emit(program, "cuda", schedule)``), or
to ``refused: CLASS`` when the emitter refuses the kernel with a tilenest
error, or ``crashed: CLASS`` when it fails with any other exception: a
refusal that appears or goes away is a difference too.

``--compare OLD.json`` prints each key whose hash differs, that is missing
or that is new against ``OLD`` (with ``--only``, only ``OLD``'s keys the
pattern selects are compared) and exits 1 on any difference; ``--against
NEW.json`` compares two stored manifests instead of emitting. ``--dump DIR``
writes every emitted source to ``DIR/KEY.cu`` for a diff. Run it from a
checkout: the checkout's ``tilenest`` is imported, not an installed one.
"""

from __future__ import annotations

import argparse
import fnmatch
import functools
import hashlib
import importlib.util
import itertools
import json
import re
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path[:1]:
    sys.path.insert(0, str(ROOT))

#: mma units tried beyond the default (``auto``) for a program holding an mma
MMA_UNITS = ("tensor", "wgmma", "simt")
_UNSAFE = re.compile(r"[^A-Za-z0-9_.,=+@/-]")


@dataclass(frozen=True)
class Task:
    """One program to build and emit under several schedules.

    ``source`` says how a worker rebuilds the program: ``("workload", name,
    dtype, schedule index, size name or None)``, ``("example", file, kernel)``
    or ``("bench-gemm", index)``. ``key`` is the key of its default schedule;
    each variant's key is ``key + "+" + label``."""

    key: str
    source: tuple
    mma: bool | None  # None: unknown until the program is built


def _label(d: dict[str, Any]) -> str:
    """``a=1,b=x`` for a schedule or override dict, in its own order."""
    return ",".join(f"{k}={v}" for k, v in d.items())


def variants(mma: bool) -> list[dict[str, Any]]:
    """The schedule overrides emitted for one program: the default (``{}``),
    each of the tuner's search entries, and each explicit mma unit when the
    program holds an mma; duplicates dropped, in that order."""
    from tilenest.backends.cuda.tune import SEARCH

    out: list[dict[str, Any]] = [{}]
    for o in [*SEARCH, *([{"mma_unit": u} for u in MMA_UNITS] if mma else [])]:
        if dict(o) not in out:
            out.append(dict(o))
    return out


def variant_key(key: str, over: dict[str, Any]) -> str:
    return key + ("+" + _label(over) if over else "")


@functools.cache
def _bench() -> Any:
    """``benchmarks/cuda.py`` as a module (its imports are lazy: no GPU needed)."""
    name = "_tilenest_bench_cuda"
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / "cuda.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # its dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def _resolved(wl: Any, sched: dict[str, Any], size: str) -> str:
    """The compile-time constants ``wl.kernel(_, sched, size)`` binds, as text."""
    sz = wl.size(size)
    consts = {**wl.fixed, **sched}
    if wl.size_consts is not None:
        consts.update(wl.size_consts(sz))
    return repr(sorted((n, v(sz) if callable(v) else v) for n, v in consts.items()))


def tasks() -> list[Task]:
    """Every program to emit, in a fixed order (see the module docstring)."""
    from tilenest.workloads import WORKLOADS

    out: list[Task] = []
    for name, wl in WORKLOADS.items():
        for dt in wl.dtypes:
            for i, sched in enumerate(wl.schedules):
                base = f"workload/{name}/{dt.name}/{_label(sched) or 'default'}"
                groups: dict[str, list[str]] = {}
                for size in wl.sizes:
                    groups.setdefault(_resolved(wl, sched, size), []).append(size)
                if len(groups) == 1:
                    out.append(Task(base, ("workload", name, dt.name, i, next(iter(wl.sizes))),
                                    None))
                else:
                    out += [Task(f"{base}@{size}", ("workload", name, dt.name, i, size), None)
                            for size in wl.sizes]
    for f in sorted((ROOT / "examples").glob("*.py")):
        for kname in _example_names(f.name):
            out.append(Task(f"example/{f.name}/{kname}", ("example", f.name, kname), None))
    for j, (tile, gpu) in enumerate(_bench().GEMM_SCHEDULES):
        out.append(Task(f"bench/gemm/bf16/{_label(tile)}" + (f"+{_label(gpu)}" if gpu else ""),
                        ("bench-gemm", j), False))
    return out


@functools.cache
def _example(fname: str) -> tuple[tuple[str, Any], ...]:
    from tilenest.cli import load_programs

    fresh_counters()  # the programs' own ids, as a fresh process builds them
    return tuple(load_programs(str(ROOT / "examples" / fname)))


def _example_names(fname: str) -> list[str]:
    return [n for n, _ in _example(fname)]


def _program(source: tuple) -> tuple[Any, dict[str, Any]]:
    """The program of a task's ``source`` and its base schedule overrides."""
    kind = source[0]
    if kind == "workload":
        from tilenest.semantics import dtypes as D
        from tilenest.workloads import WORKLOADS

        _, name, dtn, i, size = source
        wl = WORKLOADS[name]
        return wl.kernel(getattr(D, dtn), wl.schedules[i], size).program, {}
    if kind == "example":
        return dict(_example(source[1]))[source[2]], {}
    if kind == "bench-gemm":
        from tilenest.semantics import dtypes as D
        from tilenest.workloads import WORKLOADS

        tile, gpu = _bench().GEMM_SCHEDULES[source[1]]
        return WORKLOADS["gemm"].kernel(D.bf16, tile).program, dict(gpu)
    raise ValueError(f"unknown task kind {kind!r}")


def fresh_counters() -> None:
    """Restart at 0 every module-level ``itertools.count`` of the loaded
    ``tilenest`` modules. The lowering names its variables from such
    counters, so without this a source's text would depend on what the
    process emitted before it (and so on how tasks fall to workers); with
    it, each key's text is the one a fresh process would emit."""
    for name, mod in list(sys.modules.items()):
        if mod is not None and (name == "tilenest" or name.startswith("tilenest.")):
            for attr, value in list(vars(mod).items()):
                if isinstance(value, itertools.count):
                    setattr(mod, attr, itertools.count())


def _has_mma(program: Any) -> bool:
    return re.search(r"= mma\b", str(program)) is not None


def _outcome(fn: Any) -> tuple[str, str | None]:
    """(manifest value, source text or None) of calling ``fn``."""
    from tilenest.errors import TilenestError

    try:
        text = fn()
    except TilenestError as e:
        return f"refused: {type(e).__name__}", None
    except Exception as e:  # noqa: BLE001 - recorded, so a new crash is a difference
        return f"crashed: {type(e).__name__}", None
    return hashlib.sha256(text.encode()).hexdigest(), text


def run_task(task: Task, pattern: str | None) -> list[tuple[str, str, str | None]]:
    """(key, manifest value, text) of each of ``task``'s variants that
    ``pattern`` selects."""
    from tilenest.backends import target
    from tilenest.lowering import default_schedule

    fresh_counters()
    try:
        program, base = _program(task.source)
    except Exception:  # noqa: BLE001 - the build's own refusal is the key's value
        fresh_counters()
        value = _outcome(lambda: _program(task.source))[0]
        return [(task.key, value, None)] if selected(task.key, pattern) else []
    tgt = target("cuda")
    out = []
    for over in variants(_has_mma(program) if task.mma is None else task.mma):
        key = variant_key(task.key, over)
        if not selected(key, pattern):
            continue
        fresh_counters()
        value, text = _outcome(lambda over=over: tgt.emit(
            program, "cuda", default_schedule(program, "cuda", **{**base, **over})))
        out.append((key, value, text))
    return out


def selected(key: str, pattern: str | None) -> bool:
    """Whether ``--only PATTERN`` selects ``key``: a glob (``*?[``) matched
    against the whole key, else a substring of it."""
    if pattern is None:
        return True
    if any(c in pattern for c in "*?["):
        return fnmatch.fnmatchcase(key, pattern)
    return pattern in key


def _may_select(task: Task, pattern: str | None) -> bool:
    """Whether any variant of ``task`` could be selected (before building it)."""
    return any(selected(variant_key(task.key, o), pattern)
               for o in variants(task.mma is not False))


def _worker(args: tuple[Task, str | None, bool]) -> list[tuple[str, str, str | None]]:
    task, pattern, keep = args
    return [(k, v, t if keep else None) for k, v, t in run_task(task, pattern)]


def manifest(pattern: str | None = None, jobs: int = 1, dump: Path | None = None,
             progress: bool = True) -> dict[str, str]:
    """The manifest of every selected key (sorted by key), emitted on
    ``jobs`` processes; each source written under ``dump`` when given."""
    todo = [t for t in tasks() if _may_select(t, pattern)]
    work = [(t, pattern, dump is not None) for t in todo]
    results: Iterator[list[tuple[str, str, str | None]]]
    if jobs > 1:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else None
        pool = ProcessPoolExecutor(max_workers=jobs, mp_context=ctx)
        results = pool.map(_worker, work, chunksize=2)
    else:
        pool = None
        results = map(_worker, work)
    out: dict[str, str] = {}
    t0 = time.perf_counter()
    try:
        for n, rows in enumerate(results, 1):
            for key, value, text in rows:
                if key in out:
                    raise RuntimeError(f"two sources share the key {key}")
                out[key] = value
                if dump is not None and text is not None:
                    path = dump / (_UNSAFE.sub("_", key) + ".cu")
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_text(text)
            if progress and (n % 25 == 0 or n == len(work)):
                print(f"  {n}/{len(work)} programs, {len(out)} sources, "
                      f"{time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    finally:
        if pool is not None:
            pool.shutdown()
    return dict(sorted(out.items()))


def compare(old: dict[str, str], new: dict[str, str], pattern: str | None = None) -> list[str]:
    """One line per difference between two manifests: ``changed``,
    ``missing`` (in ``old`` only) or ``new`` (in ``new`` only); with
    ``pattern``, ``old``'s keys it does not select are left out."""
    old = {k: v for k, v in old.items() if selected(k, pattern)}
    lines = []
    for k in sorted(old.keys() | new.keys()):
        if k not in new:
            lines.append(f"missing  {k}  (was {old[k]})")
        elif k not in old:
            lines.append(f"new      {k}  ({new[k]})")
        elif old[k] != new[k]:
            lines.append(f"changed  {k}  ({old[k]} -> {new[k]})")
    return lines


def _load(path: str) -> dict[str, str]:
    data = json.loads(Path(path).read_text())
    if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
        raise SystemExit(f"{path}: not a manifest (a JSON object of key -> hash)")
    return data


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="write the manifest here (JSON)")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    ap.add_argument("--only", help="keys to emit: a glob, or a substring of the key")
    ap.add_argument("--compare", metavar="OLD", help="manifest to compare with; exit 1 on a "
                    "difference")
    ap.add_argument("--against", metavar="NEW", help="with --compare: compare this stored "
                    "manifest instead of emitting")
    ap.add_argument("--dump", metavar="DIR", help="write each source to DIR/KEY.cu")
    ap.add_argument("--quiet", action="store_true", help="no progress lines")
    a = ap.parse_args(argv)
    if a.jobs < 1:
        ap.error("--jobs must be at least 1")
    if a.against and not a.compare:
        ap.error("--against needs --compare")
    if a.against:
        new = _load(a.against)
    else:
        if not (a.out or a.compare or a.dump):
            ap.error("give --out, --compare or --dump")
        t0 = time.perf_counter()
        new = manifest(a.only, a.jobs, Path(a.dump) if a.dump else None, not a.quiet)
        dt = time.perf_counter() - t0
        refused = sum(v.startswith("refused") for v in new.values())
        crashed = sum(v.startswith("crashed") for v in new.values())
        print(f"{len(new)} sources ({refused} refused, {crashed} crashed) in {dt:.1f} s "
              f"on {a.jobs} process{'es' if a.jobs > 1 else ''}", file=sys.stderr)
        if a.out:
            Path(a.out).write_text(json.dumps(new, indent=1, sort_keys=True) + "\n")
    if a.compare:
        diff = compare(_load(a.compare), new, a.only)
        for line in diff:
            print(line)
        print(f"{len(diff)} difference{'s' if len(diff) != 1 else ''}", file=sys.stderr)
        return 1 if diff else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
