"""Mutation fuzzing of the TileIR readers: text and JSON in, never a crash out.

The corpus is every conformance case program (``spec/conformance/cases``:
``*.tile`` text and ``*.tileir.json`` JSON, plus the JSON form of every text
case) and the printed text and JSON of every example kernel (``examples/*.py``).
Input ``i`` of a campaign with seed ``S`` is a function of ``(S, i)`` alone: a
corpus entry mutated one to four times by a generator seeded with
``"S:i"`` -- token deletion, duplication, swap and replacement, line
edits, number blowups, name corruption, dtype swaps and deep nesting for
text; key deletion, value type swaps, number blowups, name corruption, list
edits and deep nesting for JSON (and, now and then, a text mutation of the
JSON itself).

Each input is fed to its reader with verification (``parse_program`` or
``jsonio.loads``) and classified:

* ``accepted`` -- it reads; then its round trips must hold: print -> parse,
  ``to_json`` -> ``from_json`` and ``dumps`` -> ``loads`` give back an equal
  program (a failure is a finding of kind ``roundtrip``);
* ``rejected`` -- the reader raised a :class:`~tilenest.errors.TilenestError`
  that names a site (line:col in text, a JSON path in JSON);
* ``crash`` -- any other exception (kind ``crash``), or a TilenestError
  without any location (kind ``unlocated``);
* ``slow`` -- reading and the round trips took more than :data:`SLOW_S`
  seconds of processor time (kind ``slow``); an input is abandoned after
  :data:`HANG_S` seconds of wall-clock time (kind ``hang``).

A campaign is resumable: ``--resume STATE`` keeps the progress and every
finding (with its input and traceback) in a JSON state file, rewritten
atomically every few seconds; running the same command again continues where
it stopped. ``python -m tilenest.validation.fuzz_text --count N --seed S``.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import importlib.util
import json
import os
import random
import re
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import TilenestError
from ..semantics import dtypes as D
from ..semantics.jsonio import _write

#: an input slower than this (processor seconds, reading and round trips) is a finding
SLOW_S = 1.0
#: an input still running after this many seconds is abandoned (a ``hang``)
HANG_S = 20.0
#: the largest input text a finding records in full
MAX_RECORDED = 200_000

ROOT = Path(__file__).resolve().parents[2]

# ---------------------------------------------------------------------------
# corpus


@dataclass(frozen=True)
class Seed:
    """One corpus entry: ``kind`` is ``text`` or ``json``."""

    name: str
    kind: str
    text: str


def _example_kernels(folder: Path) -> Iterator[tuple[str, Any]]:
    from ..frontend.kernel import Kernel

    for path in sorted(folder.glob("*.py")):
        spec = importlib.util.spec_from_file_location(f"_tilenest_fuzz_example_{path.stem}", path)
        if spec is None or spec.loader is None:
            continue
        mod = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(mod)
        except Exception:  # noqa: BLE001 - an example that does not import is not a seed
            continue
        for name, k in sorted(vars(mod).items()):
            if isinstance(k, Kernel):
                try:
                    yield f"{path.stem}.{name}", k.program
                except TilenestError:
                    continue


def corpus(root: Path = ROOT) -> list[Seed]:
    """Every seed: conformance programs (text, JSON, and the JSON form of each
    text program) and the example kernels in both forms, in a fixed order."""
    from ..semantics import jsonio
    from ..semantics.parser import read_program_unverified
    from ..semantics.printer import print_program

    seeds: list[Seed] = []
    cases = root / "spec" / "conformance" / "cases"
    for path in sorted(cases.rglob("*.tile")):
        text = path.read_text(encoding="utf-8")
        rel = str(path.relative_to(cases))
        seeds.append(Seed(rel, "text", text))
        try:
            p = read_program_unverified(text, rel)
        except TilenestError:
            continue
        seeds.append(Seed(rel + ".json", "json", jsonio.dumps(p)))
    for path in sorted(cases.rglob("*.tileir.json")):
        seeds.append(Seed(str(path.relative_to(cases)), "json", path.read_text(encoding="utf-8")))
    for name, p in _example_kernels(root / "examples"):
        seeds.append(Seed(f"examples/{name}.tile", "text", print_program(p)))
        seeds.append(Seed(f"examples/{name}.json", "json", jsonio.dumps(p)))
    return seeds


# ---------------------------------------------------------------------------
# text mutations

_TOKEN = re.compile(r'%[A-Za-z0-9_.]+|\$[A-Za-z0-9_]+|#[A-Za-z0-9_]+|@[A-Za-z0-9_.]+'
                    r'|[A-Za-z_][A-Za-z0-9_.]*|\d+(?:\.\d*)?(?:[eE][+-]?\d+)?'
                    r'|"(?:[^"\\\n]|\\.)*"|->|<=|>=|==|!=|<<|>>|//|\s+|.', re.DOTALL)
_NUMBER = re.compile(r"\d+(?:\.\d*)?(?:[eE][+-]?\d+)?")

_BIG_NUMBERS = ("0", "1", "-1", "-4", "7", "2", "1000000", "4294967296", "9223372036854775807",
                "9223372036854775808", "-9223372036854775808", "18446744073709551615",
                "18446744073709551616", "10000000000000000000000000", "4611686018427387904",
                "1e400", "-0.0", "nan", "inf", "1.5", "0.1")
_NAME_DAMAGE = ("", " ", "a b", "x\ny", "$", "é", "\u00e9t\u00e9", "not", "and", "in", "kernel",
                "true", "0", "9x", ".", "__", "x" * 300, "\u2028", "\ud800")
_WORDS = ("yield", "parallel", "serial", "reduce", "pipeline", "stage", "if", "while", "map",
          "const", "add", "mul", "per", "tensor.load", "tensor.store", "memory.alloc",
          "memory.store", "memory.load", "level", "vars", "domain", "map", "valid", "bounds",
          "true", "false", "zero", "checked", "fill", "tile", "tensor", "memory", "state",
          "layout", "size", "resource", "loc", "syms", "dims", "assume", "kernel", "reducer",
          "merge", "lift", "not", "and", "or", "in", "min", "max", "nan", "inf")
_PUNCT = ("(", ")", "{", "}", "[", "]", "<", ">", ",", ":", "=", "->", "^", "|", "-", "+", "*",
          "//", "%", "\"", "@k", "#p0", "$0", "%0", "\n", "\x00", "\t", "\\")


def _dtypes() -> tuple[str, ...]:
    return tuple(D.BY_NAME)


def _tokens(text: str) -> list[str]:
    return _TOKEN.findall(text)


def _solid(toks: list[str]) -> list[int]:
    return [i for i, t in enumerate(toks) if not t.isspace()]


def _token_class(t: str) -> str:
    if t[:1] in "%$#@":
        return t[0]
    if _NUMBER.fullmatch(t):
        return "number" if "." in t or "e" in t.lower() else "int"
    if t in D.BY_NAME:
        return "dtype"
    if t[:1].isalpha() or t[:1] == "_":
        return "name"
    return t


def _small_variant(t: str, rng: random.Random) -> str:
    """A near miss of token ``t``: a neighbouring integer, another dtype, a fresh name."""
    if t.isdigit() and len(t) < 40:
        return str(max(0, int(t) + rng.choice((-2, -1, 1, 2, 7))))
    if t in D.BY_NAME:
        return rng.choice(_dtypes())
    if t[:1] in "%$#@":
        return t[0] + rng.choice(("0", "1", "p", "q", "x_0", "new", "r_s0"))
    return t


def mutate_text(text: str, rng: random.Random) -> str:
    """One mutation of TileIR (or JSON) text."""
    choice = rng.randrange(18)
    toks = _tokens(text)
    solid = _solid(toks)
    if not solid:
        return text + rng.choice(_PUNCT)
    i = rng.choice(solid)
    if choice >= 14:  # a token replaced by another of its class: the syntax mostly holds
        same = [k for k in solid if _token_class(toks[k]) == _token_class(toks[i])]
        toks[i] = toks[rng.choice(same)] if rng.random() < 0.8 else _small_variant(toks[i], rng)
    elif choice == 0:  # delete a token
        del toks[i]
    elif choice == 1:  # duplicate a token
        toks.insert(i, toks[i])
    elif choice == 2:  # swap two tokens
        j = rng.choice(solid)
        toks[i], toks[j] = toks[j], toks[i]
    elif choice == 3:  # replace a token by another of the text
        toks[i] = toks[rng.choice(solid)]
    elif choice == 4:  # insert a keyword or punctuation
        toks.insert(i, rng.choice(_WORDS + _PUNCT) + rng.choice(("", " ")))
    elif choice == 5:  # number blowup
        nums = [k for k in solid if _NUMBER.fullmatch(toks[k])]
        k = rng.choice(nums) if nums else i
        big = rng.choice(_BIG_NUMBERS + ("9" * rng.choice((19, 20, 21, 400, 4400, 5000)),))
        toks[k] = big
    elif choice == 6:  # name corruption
        names = [k for k in solid if toks[k][:1] in "%$#@" or toks[k][:1].isalpha()]
        k = rng.choice(names) if names else i
        t = toks[k]
        sigil = t[0] if t[0] in "%$#@" else ""
        toks[k] = sigil + rng.choice(_NAME_DAMAGE + (t[1:] + "x", t[len(sigil):].upper()))
    elif choice == 7:  # dtype swap (f32 <-> f64 and friends)
        dts = [k for k in solid if toks[k] in D.BY_NAME]
        k = rng.choice(dts) if dts else i
        toks[k] = rng.choice(_dtypes())
    elif choice == 8:  # delete, duplicate or swap whole lines
        lines = text.split("\n")
        a, b = rng.randrange(len(lines)), rng.randrange(len(lines))
        how = rng.randrange(3)
        if how == 0:
            del lines[a]
        elif how == 1:
            lines.insert(a, lines[b])
        else:
            lines[a], lines[b] = lines[b], lines[a]
        return "\n".join(lines)
    elif choice == 9:  # deep nesting of a value
        n = rng.choice((10, 100, 300, 1000, 3000))
        opener, closer = rng.choice((("(", ")"), ("[", "]"), ("{", "}"), ("-", ""),
                                      ("not ", ""), ("(1 + ", ")")))
        toks[i] = opener * n + toks[i] + closer * n
    elif choice == 10:  # a long run of one token
        toks.insert(i, (toks[i] + rng.choice((" ", ", ", " + "))) * rng.choice((50, 500, 2000)))
    elif choice == 11:  # an arbitrary byte or character
        toks.insert(i, chr(rng.choice((0, 7, 0x7f, 0xa0, 0xe9, 0x2028, 0xfeff, 0x1f600,
                                       rng.randrange(32, 127)))))
    elif choice == 12:  # truncate
        return text[:rng.randrange(len(text) + 1)]
    else:  # sign flip of a number
        nums = [k for k in solid if _NUMBER.fullmatch(toks[k])]
        k = rng.choice(nums) if nums else i
        toks[k] = "-" + toks[k]
    return "".join(toks)


# ---------------------------------------------------------------------------
# JSON mutations

_JUNK: tuple[Any, ...] = (None, True, False, 0, 1, -1, -4, 2 ** 63, 2 ** 64, -(2 ** 63) - 1,
                          10 ** 25, 1.5, float("nan"), "", "x", " ", "a b", "$", "é", "\n",
                          "\ud800", [], {}, {"const": 1}, {"float": "x"}, {"float": "1e5"},
                          {"float": " 1"}, {"float": "1_0"}, [None], {"kind": "tile"})


def _nodes(d: Any) -> list[tuple[Any, Any, Any]]:
    """``(parent, key, value)`` of every node of ``d`` (the root's parent is None),
    found without recursion and in time linear in the document."""
    out: list[tuple[Any, Any, Any]] = []
    stack: list[tuple[Any, Any, Any]] = [(None, None, d)]
    while stack:
        parent, key, v = stack.pop()
        out.append((parent, key, v))
        if isinstance(v, dict):
            stack.extend((v, k, x) for k, x in v.items())
        elif isinstance(v, list):
            stack.extend((v, i, x) for i, x in enumerate(v))
    return out


def _swap_type(v: Any, rng: random.Random) -> Any:
    """``v`` as a value of another JSON type."""
    options: list[Any] = [None, bool(rng.randrange(2)), rng.choice((0, 1, -1, 3)), 2.5,
                          type(v).__name__, [v], {"v": v}]
    if isinstance(v, list):
        options.append({str(i): x for i, x in enumerate(v)})
    if isinstance(v, dict):
        options.append(list(v.values()))
    return rng.choice(options)


def _damage_name(v: str, rng: random.Random) -> str:
    return rng.choice(_NAME_DAMAGE + (v + " ", " " + v, v + "$", v + "\n", "", v.upper(),
                                      v + "é", v[:-1]))


def _deep(v: Any, rng: random.Random) -> Any:
    n = rng.choice((10, 100, 400, 800, 3000))
    shape = rng.randrange(3)
    for _ in range(n):
        if shape == 0:
            v = {"add": [v, {"const": 1}]}
        elif shape == 1:
            v = [v]
        else:
            v = {"not": v}
    return v


def mutate_json(d: Any, rng: random.Random) -> Any:
    """One mutation of a JSON document (in place; the result is returned)."""
    nodes = _nodes(d)
    parent, key, node = rng.choice(nodes)
    choice = rng.randrange(10)

    def put(v: Any) -> Any:
        if parent is None:
            return v
        parent[key] = v
        return d

    def pick(test: Callable[[Any], bool]) -> tuple[Any, Any, Any] | None:
        found = [n for n in nodes if n[0] is not None and test(n[2])]
        return rng.choice(found) if found else None

    if choice == 0 and parent is not None:  # delete a key or an element
        del parent[key]
        return d
    if choice == 1:  # another type
        return put(_swap_type(node, rng))
    if choice == 2:  # junk
        return put(copy.deepcopy(rng.choice(_JUNK)))
    if choice == 3:  # number blowup at an integer
        n = pick(lambda v: isinstance(v, int) and not isinstance(v, bool))
        if n is not None:
            n[0][n[1]] = rng.choice((-1, -5, 0, 2 ** 62, 2 ** 63, 2 ** 64, -(2 ** 63), 10 ** 25,
                                     10 ** 400, 1 << 70, True, 3.0))
        return d
    if choice == 4:  # name corruption at a string
        n = pick(lambda v: isinstance(v, str))
        if n is not None:
            n[0][n[1]] = _damage_name(n[2], rng)
        return d
    if choice == 5 and isinstance(node, dict):  # an unknown key
        node[rng.choice(("extra", "op", "kind", "name", "loc", "const"))] = rng.choice(_JUNK)
        return d
    if choice == 6 and isinstance(node, list) and node:  # duplicate, drop or swap elements
        i, j = rng.randrange(len(node)), rng.randrange(len(node))
        how = rng.randrange(3)
        if how == 0:
            node.insert(i, copy.deepcopy(node[j]))
        elif how == 1:
            del node[i]
        else:
            node[i], node[j] = node[j], node[i]
        return d
    if choice == 7:  # deep nesting
        return put(_deep(node, rng))
    if choice == 8:  # a value moved from elsewhere in the document
        return put(copy.deepcopy(rng.choice(nodes)[2]))
    # dtype swap at a dtype string
    n = pick(lambda v: isinstance(v, str) and v in D.BY_NAME)
    if n is not None:
        n[0][n[1]] = rng.choice(_dtypes())
    return d


# ---------------------------------------------------------------------------
# one input


@dataclass
class Finding:
    """An input the readers mishandled."""

    index: int
    kind: str  # crash | unlocated | roundtrip | slow | hang
    reader: str  # text | json
    seed: str
    seconds: float
    error: str
    input: str
    traceback: str = ""


class _Hang(Exception):
    pass


def _on_alarm(signum: int, frame: Any) -> None:
    raise _Hang()


def make_input(seeds: list[Seed], seed: int, index: int) -> tuple[Seed, str]:
    """Input ``index`` of the campaign ``seed``: the entry it mutates and the text."""
    rng = random.Random(f"{seed}:{index}")
    s = seeds[rng.randrange(len(seeds))]
    text = s.text
    n = rng.choice((1, 1, 1, 2, 2, 3, 4))
    doc: Any = None
    if s.kind == "json":
        try:
            doc = json.loads(text)
        except ValueError:  # a seed that is deliberately not JSON: mutate its text
            doc = None
    if doc is not None:
        for _ in range(n):
            try:
                doc = mutate_json(doc, rng)
            except RecursionError:  # deep nesting made: no further mutations walk it
                break
        try:
            if rng.random() < 0.5:
                out: list[str] = []
                _write(doc, rng.choice((None, 1)), out)  # linear in depth, any Unicode
                text = "".join(out)
            else:
                text = json.dumps(doc, ensure_ascii=True)
        except (ValueError, RecursionError):  # a document json cannot write: write a seed
            text = s.text
        if rng.random() < 0.1:
            text = mutate_text(text, rng)
        return s, text
    for _ in range(n):
        text = mutate_text(text, rng)
    return s, text


def _located(e: TilenestError) -> bool:
    """Does the error say where (a site, or a JSON path in its message)?"""
    return bool(e.sites) or bool(re.match(r"^[^\s]+: ", e.message)) or \
        e.message.startswith("malformed JSON") or "nests too deeply" in e.message


def read(kind: str, text: str) -> Any:
    """The verified program of ``text`` (``kind`` is text or json)."""
    from ..semantics import jsonio
    from ..semantics.parser import parse_program

    if kind == "json":
        return jsonio.loads(text, "fuzz.json")
    return parse_program(text, "fuzz.tile")


def round_trip_problem(p: Any) -> str | None:
    """Why ``p`` does not survive print -> parse and the JSON round trips, or None."""
    from ..semantics import jsonio
    from ..semantics.parser import parse_program
    from ..semantics.printer import print_program

    text = print_program(p)
    if parse_program(text, "printed.tile") != p:
        return "print -> parse gives a different program"
    if jsonio.from_json(jsonio.to_json(p)) != p:
        return "to_json -> from_json gives a different program"
    if jsonio.loads(jsonio.dumps(p)) != p:
        return "dumps -> loads gives a different program"
    return None


def check_one(kind: str, text: str) -> tuple[str, str, str]:
    """``(outcome, error, traceback)``: outcome is accepted, rejected, crash,
    unlocated or roundtrip."""
    try:
        p = read(kind, text)
    except TilenestError as e:
        if not _located(e):
            return "unlocated", e.render(), ""
        return "rejected", "", ""
    except _Hang:
        raise
    except Exception as e:  # noqa: BLE001 - the finding this fuzzer is for
        return "crash", f"{type(e).__name__}: {e}"[:2000], traceback.format_exc()[-8000:]
    try:
        problem = round_trip_problem(p)
    except _Hang:
        raise
    except Exception as e:  # noqa: BLE001
        return "roundtrip", f"{type(e).__name__}: {e}"[:2000], traceback.format_exc()[-8000:]
    if problem:
        return "roundtrip", problem, ""
    return "accepted", "", ""


# ---------------------------------------------------------------------------
# campaign


@dataclass
class State:
    """Progress of a campaign (what ``--resume`` keeps)."""

    seed: int
    count: int
    next: int = 0
    seconds: float = 0.0
    counts: dict[str, int] = field(default_factory=lambda: {
        "inputs": 0, "text": 0, "json": 0, "accepted": 0, "rejected": 0, "crash": 0,
        "unlocated": 0, "roundtrip": 0, "slow": 0, "hang": 0})
    findings: list[Finding] = field(default_factory=list)
    max_seconds: float = 0.0
    slowest: int = -1

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["schema"] = "tilenest.fuzz_text/1"
        return d

    @staticmethod
    def from_json(d: dict[str, Any]) -> State:
        d = dict(d)
        d.pop("schema", None)
        d["findings"] = [Finding(**f) for f in d.get("findings", [])]
        return State(**d)

    @property
    def failures(self) -> int:
        c = self.counts
        return c["crash"] + c["unlocated"] + c["roundtrip"] + c["slow"] + c["hang"]


def _save(state: State, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(state.to_json(), indent=1, ensure_ascii=True))
    os.replace(tmp, path)


#: inputs per unit of work (the granularity of progress and of ``--jobs``)
CHUNK = 250

_SEEDS: list[Seed] | None = None


def _init_worker(seeds: list[Seed] | None) -> None:
    global _SEEDS
    _SEEDS = seeds if seeds is not None else corpus()


def _run_one(seeds: list[Seed], seed: int, i: int, use_alarm: bool) -> tuple[
        str, float, Finding | None, Finding | None, str]:
    s, text = make_input(seeds, seed, i)
    # processor time of this thread, so that a loaded machine does not make an
    # input look slow (the hang guard below is wall-clock)
    t0 = time.thread_time()
    try:
        if use_alarm:
            signal.setitimer(signal.ITIMER_REAL, HANG_S)
        outcome, error, tb = check_one(s.kind, text)
    except _Hang:
        outcome, error, tb = "hang", f"still running after {HANG_S:g} s", ""
    finally:
        if use_alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
    dt = time.thread_time() - t0
    finding = slow = None
    if outcome not in ("accepted", "rejected"):
        finding = Finding(i, outcome, s.kind, s.name, dt, error, text[:MAX_RECORDED], tb)
    if dt > SLOW_S and outcome != "hang":
        slow = Finding(i, "slow", s.kind, s.name, dt, f"took {dt:.2f} s", text[:MAX_RECORDED])
    return outcome, dt, finding, slow, s.kind


def _run_chunk(args: tuple[int, int, int]) -> dict[str, Any]:
    """Inputs ``start .. end-1`` of campaign ``seed``: counts, time and findings."""
    seed, start, end = args
    seeds = _SEEDS if _SEEDS is not None else corpus()
    import threading

    use_alarm = hasattr(signal, "setitimer") and \
        threading.current_thread() is threading.main_thread()
    old = signal.signal(signal.SIGALRM, _on_alarm) if use_alarm else None
    out: dict[str, Any] = {"start": start, "end": end, "counts": {}, "findings": [],
                           "seconds": 0.0, "max_seconds": 0.0, "slowest": -1}
    c = out["counts"]
    try:
        for i in range(start, end):
            outcome, dt, finding, slow, kind = _run_one(seeds, seed, i, use_alarm)
            for k in ("inputs", kind, outcome) + (("slow",) if slow else ()):
                c[k] = c.get(k, 0) + 1
            out["seconds"] += dt
            if dt > out["max_seconds"]:
                out["max_seconds"], out["slowest"] = dt, i
            out["findings"] += [f for f in (finding, slow) if f is not None]
    finally:
        if use_alarm:
            signal.signal(signal.SIGALRM, old)
    return out


def _merge(state: State, r: dict[str, Any]) -> None:
    for k, v in r["counts"].items():
        state.counts[k] = state.counts.get(k, 0) + v
    state.seconds += r["seconds"]
    if r["max_seconds"] > state.max_seconds:
        state.max_seconds, state.slowest = r["max_seconds"], r["slowest"]
    state.findings += r["findings"]
    state.next = r["end"]


def run_campaign(count: int, seed: int, state_path: Path | None = None,
                 seeds: list[Seed] | None = None, jobs: int = 1,
                 progress: Callable[[State], None] | None = None) -> State:
    """Run inputs ``0 .. count-1`` of campaign ``seed``, continuing the state
    saved at ``state_path`` (if any) and saving it there as it goes; with
    ``jobs > 1``, chunks of :data:`CHUNK` inputs run in that many processes
    (results are merged in input order, so the state is the same)."""
    state: State | None = None
    if state_path is not None and state_path.exists():
        state = State.from_json(json.loads(state_path.read_text()))
        if state.seed != seed:
            raise TilenestError(f"{state_path} holds campaign seed {state.seed}, not {seed}",
                                hint="pass the same --seed, or another --resume file")
        state.count = max(state.count, count)
    if state is None:
        state = State(seed, count)
    chunks = [(seed, a, min(a + CHUNK, state.count))
              for a in range(state.next, state.count, CHUNK)]
    last_save = time.monotonic()

    def done(r: dict[str, Any]) -> None:
        nonlocal last_save
        _merge(state, r)
        if time.monotonic() - last_save > 5:
            if state_path is not None:
                _save(state, state_path)
            last_save = time.monotonic()
            if progress is not None:
                progress(state)

    try:
        if jobs <= 1:
            _init_worker(seeds)
            for ch in chunks:
                done(_run_chunk(ch))
        else:
            import multiprocessing as mp

            with mp.get_context("fork").Pool(jobs, _init_worker, (seeds,)) as pool:
                for r in pool.imap(_run_chunk, chunks):
                    done(r)
    finally:
        if state_path is not None:
            _save(state, state_path)
    return state


def summary(state: State, wall: float | None = None) -> str:
    """The campaign's figures and findings, as printed at the end."""
    c = state.counts
    lines = [
        f"fuzz_text seed {state.seed}: {c['inputs']} inputs ({c['text']} text, {c['json']} JSON)"
        f" of {state.count}",
        f"  accepted {c['accepted']}, rejected with a located TilenestError {c['rejected']}",
        f"  crashes {c['crash']}, unlocated errors {c['unlocated']}, round-trip failures "
        f"{c['roundtrip']}, slow (> {SLOW_S:g} s) {c['slow']}, hangs {c['hang']}",
        f"  reading time {state.seconds:.1f} s"
        + (f" (this run {wall:.1f} s wall)" if wall is not None else "")
        + f", slowest input {state.slowest} at {state.max_seconds * 1000:.0f} ms",
    ]
    for f in state.findings[:20]:
        lines.append(f"  [{f.kind}] input {f.index} ({f.reader}, from {f.seed}, "
                     f"{f.seconds:.2f} s): {f.error.splitlines()[0] if f.error else ''}")
        if f.traceback:
            lines += ["      " + ln for ln in f.traceback.strip().splitlines()[-4:]]
    if len(state.findings) > 20:
        lines.append(f"  ... and {len(state.findings) - 20} more findings in the state file")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m tilenest.validation.fuzz_text",
        description="mutation fuzzing of the TileIR text and JSON readers "
                    "(exit 1 on any crash, unlocated error, round-trip failure or slow input)")
    ap.add_argument("--count", type=int, default=2000, help="inputs in the campaign")
    ap.add_argument("--seed", type=int, default=0, help="campaign seed")
    ap.add_argument("--resume", metavar="STATE", help="state file: continue it, and keep "
                                                      "progress and findings there")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    ap.add_argument("--quiet", action="store_true", help="no progress lines")
    a = ap.parse_args(argv)
    if a.count < 0:
        ap.error("--count must be >= 0")
    if a.jobs < 1:
        ap.error("--jobs must be >= 1")
    t0 = time.perf_counter()

    def progress(s: State) -> None:
        if not a.quiet:
            print(f"  ... {s.next}/{s.count} inputs, {s.failures} findings, "
                  f"{time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 1000))
    state = run_campaign(a.count, a.seed, Path(a.resume) if a.resume else None,
                         jobs=a.jobs, progress=progress)
    print(summary(state, time.perf_counter() - t0))
    return 1 if state.failures else 0


if __name__ == "__main__":
    sys.exit(main())
