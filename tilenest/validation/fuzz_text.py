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
  :data:`HANG_S` processor seconds (kind ``hang``).

Both limits count processor time, not wall-clock time: the readers only
compute (no input makes them wait on anything), so the processor time an
input costs is a property of the input, while wall-clock time also counts
every other process sharing the machine and would report a busy machine as
slow inputs. A reader that loops forever burns processor time, so the hang
limit still catches it.

The campaign loop is :mod:`tilenest.validation.campaign`'s: input ``i`` is
checked by :func:`check_item`, its record is appended to a JSON-lines state
file (``--state FILE``; running the same command again resumes it and checks
only the inputs it lacks), inputs are spread over ``--workers`` processes,
and the summary is computed from the whole file::

    python -m tilenest.validation.fuzz_text --count N --seed S --state FILE --workers W
"""

from __future__ import annotations

import argparse
import copy
import gc
import importlib.util
import json
import random
import re
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
from . import campaign
from .campaign import CampaignState

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

    from ..conformance import default_suite

    seeds: list[Seed] = []
    # the installed suite (a wheel has no spec/ folder) unless another tree is named
    cases = (default_suite() if root == ROOT else root / "spec" / "conformance") / "cases"
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
    except Exception as e:  # noqa: BLE001 - the finding this fuzzer is for
        return "crash", f"{type(e).__name__}: {e}"[:2000], traceback.format_exc()[-8000:]
    try:
        problem = round_trip_problem(p)
    except Exception as e:  # noqa: BLE001
        return "roundtrip", f"{type(e).__name__}: {e}"[:2000], traceback.format_exc()[-8000:]
    if problem:
        return "roundtrip", problem, ""
    return "accepted", "", ""


# ---------------------------------------------------------------------------
# campaign


#: the campaign's name in its state file
CAMPAIGN = "fuzz-text"
#: inputs per task handed to a worker process (inputs take milliseconds)
CHUNK = 100
#: outcomes that are not findings
_FINE = ("accepted", "rejected")

_SEEDS: list[Seed] | None = None


def init_worker(seeds: list[Seed] | None = None) -> None:
    """Set up a process that checks inputs: the corpus (given, or built here,
    once per process: building it reads every case and imports every example),
    room for the readers' deepest legitimate recursion, and the readers
    themselves, warmed by checking one text and one JSON seed -- so that the
    modules they import on first use are not timed as the first input's
    reading (a fresh worker would otherwise report its first input slow)."""
    global _SEEDS
    _SEEDS = seeds if seeds is not None else corpus()
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 1000))
    for kind in ("text", "json"):
        s = next((s for s in _SEEDS if s.kind == kind), None)
        if s is not None:
            check_one(s.kind, s.text)


def _corpus() -> list[Seed]:
    if _SEEDS is None:
        init_worker()
    assert _SEEDS is not None
    return _SEEDS


def check_item(seed: int, i: int, shrink_secs: float = 0.0) -> dict[str, Any]:
    """The campaign record of input ``i`` of campaign ``seed``: ``status`` is
    the reader's outcome (see :func:`check_one`), or ``slow`` for an input
    that reads fine but took more than :data:`SLOW_S` processor seconds (on
    two readings, the second after a garbage collection).
    ``read_secs`` is the processor time of reading and the round trips
    (making the input is not counted). Findings carry ``"bug": true``, the
    error, its traceback and the input itself; with ``shrink_secs > 0`` a
    crash, unlocated error or round-trip failure is also shrunk here, in the
    process that found it (:func:`tilenest.validation.shrink.shrink_text`):
    ``shrunk`` holds the shortest input found that fails the same way."""
    s, text = make_input(_corpus(), seed, i)
    t0 = time.process_time()
    outcome, error, tb = check_one(s.kind, text)
    dt = time.process_time() - t0
    if dt > SLOW_S:
        # slow must mean reproducibly slow: a garbage collection of the
        # process's whole heap (a long-lived test worker) lands on whichever
        # input happens to trigger it. Collect first, time it again, keep the
        # faster of the two.
        gc.collect()
        t0 = time.process_time()
        check_one(s.kind, text)
        dt = min(dt, time.process_time() - t0)
    rec: dict[str, Any] = {"status": outcome, "outcome": outcome, "reader": s.kind,
                           "from": s.name, "read_secs": round(dt, 4)}
    if dt > SLOW_S:
        rec["slow"] = True
        if outcome in _FINE:
            rec["status"], error = "slow", f"took {dt:.2f} s"
    if rec["status"] not in _FINE:
        rec.update(bug=True, message=error, input=text[:MAX_RECORDED])
        if tb:
            rec["traceback"] = tb
        if shrink_secs > 0 and rec["status"] != "slow":
            rec["shrunk"] = _shrink(s.kind, text, outcome, error, shrink_secs)
    return rec


def _shrink(kind: str, text: str, outcome: str, error: str, budget: float) -> dict[str, Any]:
    """The record of ``text`` shrunk while it keeps its outcome (and, for a
    crash, its exception type)."""
    import os
    import socket

    from .shrink import shrink_text

    def fails(t: str) -> bool:
        got, err, _ = check_one(kind, t)
        return got == outcome and (outcome != "crash" or err.split(":")[0] == error.split(":")[0])

    out = shrink_text(text, fails, budget)
    return {"input": out.value, "chars": len(out.value), "from_chars": len(text),
            "tries": out.tries, "kept": out.kept, "cpu_secs": out.secs, "stopped": out.stopped,
            "host": socket.gethostname(), "pid": os.getpid()}


def run_campaign(count: int, seed: int, state: Path | None = None, *,
                 seeds: list[Seed] | None = None, workers: int = 1,
                 time_limit: float = HANG_S,
                 progress: Callable[[CampaignState, dict[str, Any]], None] | None = None
                 ) -> CampaignState:
    """Inputs ``0 .. count-1`` of campaign ``seed`` through
    :func:`tilenest.validation.campaign.run_campaign`: resumed from the
    JSON-lines file ``state`` (if given) and recorded there as they finish,
    on ``workers`` processes, each input stopped after ``time_limit``
    processor seconds (a ``timeout``, reported as a hang). ``seeds`` is the
    corpus (built once per process when omitted)."""
    return campaign.run_campaign(CAMPAIGN, check_item, count, seed, state=state,
                                 workers=workers, time_limit=time_limit, chunk=CHUNK,
                                 progress=progress, init=init_worker, init_args=(seeds,))


@dataclass
class Tally:
    """A campaign's figures in this fuzzer's terms, computed from its records:
    ``counts`` per reader and per outcome (a slow input also counts under its
    outcome; a campaign timeout is a ``hang``), the findings, and the
    processor time of reading."""

    seed: int
    count: int
    counts: dict[str, int]
    findings: list[Finding] = field(default_factory=list)
    seconds: float = 0.0
    max_seconds: float = 0.0
    slowest: int = -1

    @property
    def failures(self) -> int:
        """Inputs with a finding (each counted once)."""
        return len(self.findings)


def tally(st: CampaignState, seeds: list[Seed] | None = None) -> Tally:
    """The :class:`Tally` of a campaign's records. A record the campaign made
    itself (a timeout, or a crash outside the reader) holds no input: it is
    made again from ``(seed, index)`` with ``seeds`` (or this process's corpus)."""
    c = dict.fromkeys(("inputs", "text", "json", "accepted", "rejected", "crash", "unlocated",
                       "roundtrip", "slow", "hang"), 0)
    t = Tally(st.seed, st.count, c)
    for i in sorted(st.records):
        r = st.records[i]
        outcome = r.get("outcome", "hang" if r["status"] == "timeout" else r["status"])
        c["inputs"] += 1
        c[outcome] = c.get(outcome, 0) + 1
        if "reader" in r:
            c[r["reader"]] += 1
        c["slow"] += bool(r.get("slow"))
        secs = r.get("read_secs", r.get("cpu_secs", 0.0))
        t.seconds += secs
        if secs > t.max_seconds:
            t.max_seconds, t.slowest = secs, i
        if campaign.is_bug(r):
            if "input" in r:
                reader, origin, text = r["reader"], r["from"], r["input"]
            else:
                s, text = make_input(seeds if seeds is not None else _corpus(), st.seed, i)
                reader, origin = s.kind, s.name
            kind = "hang" if r["status"] == "timeout" else r["status"]
            t.findings.append(Finding(i, kind, reader, origin, secs, r.get("message", ""),
                                      text, r.get("traceback", "")))
    return t


def summary(st: CampaignState, wall: float | None = None, new: int | None = None,
            seeds: list[Seed] | None = None) -> str:
    """The campaign's figures and findings, as printed at the end (``wall``
    and ``new``: this run's wall-clock time and number of inputs checked)."""
    t = tally(st, seeds)
    c = t.counts
    this_run = [f"{wall:.1f} s wall"] if wall is not None else []
    this_run += [f"{new} new inputs"] if new is not None else []
    lines = [
        (f"fuzz_text seed {t.seed}: {c['inputs']} inputs ({c['text']} text, "
         f"{c['json']} JSON) of {t.count}"),
        f"  accepted {c['accepted']}, rejected with a located TilenestError {c['rejected']}",
        (f"  crashes {c['crash']}, unlocated errors {c['unlocated']}, round-trip failures "
         f"{c['roundtrip']}, slow (> {SLOW_S:g} s) {c['slow']}, hangs {c['hang']}"),
        f"  reading time {t.seconds:.1f} s"
        + (f" (this run {', '.join(this_run)})" if this_run else "")
        + f", slowest input {t.slowest} at {t.max_seconds * 1000:.0f} ms",
    ]
    for f in t.findings[:20]:
        lines.append(f"  [{f.kind}] input {f.index} ({f.reader}, from {f.seed}, "
                     f"{f.seconds:.2f} s): {f.error.splitlines()[0] if f.error else ''}")
        if f.traceback:
            lines += ["      " + ln for ln in f.traceback.strip().splitlines()[-4:]]
    if len(t.findings) > 20:
        lines.append(f"  ... and {len(t.findings) - 20} more findings in the state file")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python -m tilenest.validation.fuzz_text [--count N] [--seed S]
    [--state FILE] [--workers W]``: a mutation campaign over the readers;
    with ``--state`` it is resumable (rerun the same command to continue).
    Exit status 1 on any finding."""
    ap = argparse.ArgumentParser(
        prog="python -m tilenest.validation.fuzz_text",
        description="mutation fuzzing of the TileIR text and JSON readers "
                    "(exit 1 on any crash, unlocated error, round-trip failure, slow input "
                    "or hang)")
    ap.add_argument("--count", type=int, default=2000, help="inputs in the campaign")
    ap.add_argument("--seed", type=int, default=0, help="campaign seed")
    ap.add_argument("--state", type=Path, metavar="FILE",
                    help="JSON-lines state file: resumed if it exists, every input recorded")
    ap.add_argument("--workers", type=int, default=1, help="worker processes (default 1)")
    ap.add_argument("--time-limit", type=float, default=HANG_S,
                    help=f"processor seconds after which an input is a hang ({HANG_S:g})")
    ap.add_argument("--quiet", action="store_true", help="no progress lines")
    a = ap.parse_args(argv)
    if a.count < 0:
        ap.error("--count must be >= 0")
    if a.workers < 1:
        ap.error("--workers must be >= 1")
    t0 = time.perf_counter()
    last = [t0]
    new = [0]

    def progress(st: CampaignState, rec: dict[str, Any]) -> None:
        new[0] += 1
        now = time.perf_counter()
        if not a.quiet and now - last[0] > 5:
            last[0] = now
            bugs = sum(campaign.is_bug(r) for r in st.records.values())
            print(f"  ... {len(st.records)}/{st.count} inputs, {bugs} findings, "
                  f"{now - t0:.0f} s", file=sys.stderr, flush=True)

    seeds = corpus()
    st = run_campaign(a.count, a.seed, a.state, seeds=seeds, workers=a.workers,
                      time_limit=a.time_limit, progress=progress)
    print(summary(st, time.perf_counter() - t0, new[0], seeds))
    return 1 if st.summary()["bugs"] else 0


if __name__ == "__main__":
    sys.exit(main())
