"""The conformance runner: the language-neutral suite in ``spec/conformance/``
judged on our interpreter (:class:`Interpreter`), a compiled backend
(:class:`Backend`) or an external implementation (:class:`External`).

A *case* is a TileIR program (``NAME.tile``, or a JSON TileIR document
``NAME.tileir.json``), a recipe ``NAME.json`` for its call arguments, and an
expected verdict (see ``spec/conformance/README.md``):

* ``admitted`` -- the call succeeds; the outputs an implementation produces
  must lie in the admitted sets computed **now** by the oracle
  (``tn.reference``; bitwise where the contract is bitwise, an FP64 envelope
  downstream of permitted reassociation);
* ``error`` with a kind (``parse``, ``verify``, ``type``, ``contract``,
  ``race``, ``bounds``, ``runtime``, ``uninitialized``) -- the implementation
  must reject the program or the call with that kind of error.

A case may also name a *wrong* companion program (``NAME.wrong.tile``): a
plausible misreading of the rule it tests. The suite's self-check runs it on
our interpreter and requires that its outputs are **not** admitted, which is
what makes the case a negative test of the rule for value-only rules.

External implementations are run per case through a command template with
the placeholders ``{case}`` (the program file), ``{inputs}`` (a directory
holding ``call.json`` and one ``ARG.npy`` per argument) and ``{outputs}`` (an
empty directory). The implementation writes ``ARG.npy`` for every tensor
argument with its final contents, or ``error.json`` (``{"kind": ..., "message":
...}``) when it rejects the program or the call, or ``{"kind": "unsupported",
"reason": ...}`` when it does not implement what the case needs (the case is
skipped with that reason). ``bf16`` and FP8 arrays travel as ``uint16`` and
``uint8`` arrays of their bit patterns; every other dtype as itself.
Templates, recipes and outputs are read defensively by
:mod:`tilenest.conformance_files`.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from . import conformance_files as F
from . import errors as ERR
from . import progress as _progress
from .conformance_files import SCHEMA
from .errors import NotAvailableError, TilenestError

#: the root of the suite's test ids: ``tilenest-conformance::GROUP::NAME[RULES]``
#: in the pytest plugin, classname ``tilenest-conformance.GROUP`` in JUnit XML
SUITE_ID = "tilenest-conformance"

#: error kinds a case can expect, most specific class first
ERROR_KINDS: tuple[tuple[str, type], ...] = (
    ("parse", ERR.ParseError),
    ("race", ERR.RaceError),
    ("bounds", ERR.BoundsError),
    ("uninitialized", ERR.UninitializedReadError),
    ("runtime", ERR.RuntimeSemanticError),
    ("contract", ERR.ContractError),
    ("type", ERR.TypeCheckError),
    ("verify", ERR.VerifyError),
    ("capture", ERR.CaptureError),
    ("error", TilenestError),
)
KINDS = tuple(k for k, _ in ERROR_KINDS)


def error_kind(e: BaseException) -> str:
    """The conformance kind of a tilenest error."""
    for kind, cls in ERROR_KINDS:
        if isinstance(e, cls):
            return kind
    return "internal"


def default_suite() -> Path:
    """The suite this installation carries. The package's ``conformance_suite``
    folder holds ``cases``, a link to ``spec/conformance/cases`` in the source
    tree (one copy of the cases; a wheel carries them as files). From a
    source tree the answer is ``spec/conformance`` itself, so that messages
    name the files a contributor edits."""
    packaged = Path(__file__).resolve().parent / "conformance_suite"
    source = packaged.parent.parent / "spec" / "conformance"
    try:
        if (source / "cases").resolve() == (packaged / "cases").resolve():
            return source
    except OSError:  # a link loop, an unreadable folder: the packaged copy decides
        pass
    return packaged


# ----------------------------------------------------------------------------- cases
@dataclass
class Case:
    """One conformance case, as read from its recipe."""

    name: str
    recipe: Path
    program: Path
    rules: tuple[str, ...]
    summary: str
    args: list[dict[str, Any]]
    params: dict[str, int]
    expect: dict[str, Any]
    wrong: Path | None = None
    gap: str | None = None

    @property
    def verdict(self) -> str:
        """``admitted`` or the expected error kind."""
        return "admitted" if self.expect["verdict"] == "admitted" else self.expect["error"]

    @property
    def group(self) -> str:
        return self.recipe.parent.name

    @property
    def negative(self) -> bool:
        """Does the case reject something (an error, or a wrong companion)?"""
        return self.verdict != "admitted" or self.wrong is not None

    @property
    def test_name(self) -> str:
        """The case's test name, ``NAME[RULE,...]``, the same in the pytest
        plugin's node ids and in every JUnit report."""
        return f"{self.name}[{','.join(self.rules)}]"

    @property
    def node_id(self) -> str:
        """``tilenest-conformance::GROUP::NAME[RULE,...]``."""
        return f"{SUITE_ID}::{self.group}::{self.test_name}"


def _fail(msg: str, path: Path | None = None, hint: str | None = None) -> TilenestError:
    return TilenestError(msg, ERR.Site(str(path), 1) if path else None, hint)


def load_case(recipe: Path) -> Case:
    """Read and validate one recipe file (its shape: :func:`F.check_recipe`)."""
    try:
        text = recipe.read_text(encoding="utf-8")
        d = json.loads(text)
    except json.JSONDecodeError as e:
        raise TilenestError(f"conformance recipe is not JSON: {e.msg}",
                            ERR.Site(str(recipe), e.lineno, e.colno)) from None
    except (OSError, UnicodeDecodeError) as e:
        raise _fail(f"cannot read the conformance recipe: {e}", recipe) from None
    F.check_recipe(d, recipe, text)
    exp = d["expect"]
    if exp.get("verdict") not in ("admitted", "error"):
        raise _fail("expect.verdict must be 'admitted' or 'error'", recipe)
    if exp["verdict"] == "error" and exp.get("error") not in KINDS:
        raise _fail(f"expect.error must be one of {', '.join(KINDS)}", recipe)
    prog = recipe.parent / d["program"]
    if not prog.exists():
        raise _fail(f"conformance case program {prog.name} is missing", recipe)
    wrong = recipe.parent / d["wrong"] if d.get("wrong") else None
    return Case(d["name"], recipe, prog, tuple(d["rules"]), d.get("summary", ""), d["args"],
                dict(d.get("params", {})), exp, wrong, d.get("gap"))


def load_suite(root: Path | None = None, select: Sequence[str] = ()) -> list[Case]:
    """Every case under ``root/cases`` (or ``root`` itself), sorted by name;
    ``select`` keeps cases whose name or one of whose rules contains a pattern."""
    root = Path(root) if root is not None else default_suite()
    base = root / "cases" if (root / "cases").is_dir() else root
    if not base.is_dir():
        raise TilenestError(f"no conformance suite at {root}",
                            hint="pass --suite DIR (a folder with cases/*/NAME.json)")
    cases = [load_case(p) for p in sorted(base.rglob("*.json"))
             if not p.name.endswith(".tileir.json")]
    if select:
        cases = [c for c in cases
                 if any(s in c.name or any(s == r or r.startswith(s + "-") or s == r.split("-")[0]
                                           for r in c.rules) for s in select)]
    return sorted(cases, key=lambda c: (c.group, c.name))


# ------------------------------------------------------------------------ arguments
def _number(v: Any) -> float:
    if isinstance(v, str):
        return float(v)  # "nan", "inf", "-inf", "-0.0"
    return v


def _fill(spec: dict[str, Any], shape: tuple[int, ...], dt: Any) -> np.ndarray:
    """The values of one argument from its pattern (deterministic per seed)."""
    p = spec.get("pattern", "zeros")
    n = int(np.prod(shape)) if shape else 1
    rng = np.random.default_rng(int(spec.get("seed", 0)))
    if p == "zeros":
        a = np.zeros(n)
    elif p == "const":
        a = np.full(n, _number(spec["value"]), dtype=np.float64)
    elif p == "nan":
        a = np.full(n, np.nan)
    elif p == "arange":
        a = float(spec.get("start", 0)) + float(spec.get("step", 1)) * np.arange(n)
    elif p == "normal":
        a = rng.standard_normal(n) * float(spec.get("scale", 1.0))
    elif p == "uniform":
        a = rng.uniform(float(spec.get("lo", 0)), float(spec.get("hi", 1)), n)
    elif p == "ints":
        a = rng.integers(int(spec.get("lo", 0)), int(spec.get("hi", 10)), n).astype(np.float64)
    elif p == "ties":
        # few distinct dyadic values, zeros of both signs
        a = rng.integers(-3, 4, n) / 2.0
        a = np.where((a == 0) & (rng.random(n) < 0.5), -0.0, a)
    elif p == "special":
        pool = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 1.0, -1.0, 2.0 ** -140, 3.0e38,
                         -2.5, 0.5], np.float64)
        a = pool[rng.integers(0, len(pool), n)]
    elif p == "cancel":
        a = rng.standard_normal(n) * 10.0 ** rng.integers(-3, 6, n)
    elif p == "values":
        vals = [_number(v) for v in spec["values"]]
        if len(vals) != n:
            raise TilenestError(f"'values' has {len(vals)} entries, the shape needs {n}")
        a = np.array(vals, dtype=np.float64 if not dt.is_int else object)
    else:
        raise TilenestError(f"unknown value pattern '{p}'")
    if dt.is_bool:
        return (a.astype(np.float64) != 0).reshape(shape)
    if dt.is_int:
        if p in ("nan", "special"):
            info = np.iinfo(dt.np)
            return np.full(shape, info.min, dtype=dt.np)
        return np.array([int(x) for x in a.ravel()], dtype=object).astype(dt.np).reshape(shape)
    return a.astype(np.float64).astype(dt.np).reshape(shape)


def materialize(case: Case) -> list[Any]:
    """The call arguments of ``case``, in program order (aliases share arrays)."""
    from .semantics import dtypes as D

    out: list[Any] = []
    by_name: dict[str, Any] = {}
    for a in case.args:
        if "alias" in a:
            v = by_name[a["alias"]]
        elif a["kind"] == "scalar":
            dt = D.parse(a["dtype"])
            x = _number(a["value"])
            v = dt.np.type(x) if not dt.is_bool else bool(x)
        else:
            dt = D.parse(a["dtype"])
            v = _fill(a.get("fill", {}), tuple(a["shape"]), dt)
        by_name[a["name"]] = v
        out.append(v)
    return out




def save_array(path: Path, a: np.ndarray) -> None:
    """``.npy``; the formats numpy's files cannot name (``ml_dtypes``': bf16,
    FP8) as their bit patterns (uint16, uint8)."""
    from .semantics.dtypes import ML_DTYPES

    if a.dtype.name in ML_DTYPES.values():
        a = a.view(np.dtype(f"u{a.dtype.itemsize}"))
    np.save(path, a, allow_pickle=False)


def load_array(path: Path, dtype: str) -> np.ndarray:
    return _as_dtype(np.load(path, allow_pickle=False), dtype)


def write_inputs(case: Case, args: list[Any], folder: Path) -> None:
    """``call.json`` and one ``.npy`` per argument (scalars as 0-d arrays)."""
    from .semantics import dtypes as D

    entries = []
    for spec, v in zip(case.args, args, strict=True):
        e: dict[str, Any] = {"name": spec["name"], "kind": spec.get("kind", "tensor"),
                             "file": f"{spec['name']}.npy"}
        if "alias" in spec:
            e["alias"] = spec["alias"]
            src = next(s for s in case.args if s["name"] == spec["alias"])
            e["kind"] = src.get("kind", "tensor")
            e["dtype"], e["shape"] = src["dtype"], src["shape"]
        else:
            e["dtype"] = spec["dtype"]
            e["shape"] = list(spec.get("shape", []))
        dt = D.parse(e["dtype"])
        arr = np.asarray(v, dtype=dt.np) if e["kind"] == "scalar" else v
        save_array(folder / e["file"], arr)
        entries.append(e)
    (folder / "call.json").write_text(json.dumps(
        {"schema": SCHEMA, "case": case.name, "program": case.program.name, "args": entries,
         "params": case.params}, indent=1))


def read_call(folder: Path) -> tuple[list[Any], dict[str, int], list[dict[str, Any]]]:
    """The arguments an implementation receives (the inverse of :func:`write_inputs`)."""
    call = json.loads((folder / "call.json").read_text())
    args: list[Any] = []
    by_name: dict[str, Any] = {}
    for e in call["args"]:
        if "alias" in e:
            v = by_name[e["alias"]]
        else:
            v = load_array(folder / e["file"], e["dtype"])
            if e["kind"] == "scalar":
                v = v[()]
        by_name[e["name"]] = v
        args.append(v)
    return args, call.get("params", {}), call["args"]


# ----------------------------------------------------------------------- the oracle
def load_program(path: Path) -> Any:
    """A case program (text or JSON TileIR), read and verified by the one loader
    every program file goes through."""
    from .semantics.loading import load_program_file

    return load_program_file(path)


@dataclass
class Expected:
    """What the oracle says about a case now: admitted sets, or an error."""

    admitted: dict[str, Any] | None = None
    error: str | None = None
    message: str = ""


def oracle(case: Case) -> Expected:
    """Admitted outputs (``tn.reference``) or the error kind the call raises."""
    from .interpreter import interpret, reference

    try:
        prog = load_program(case.program)
        args = materialize(case)
        if any("alias" in a for a in case.args):
            # tn.reference copies each argument separately, which undoes aliasing
            # (spec M-8); run the aliased call itself first so its errors count
            interpret(prog, *materialize(case), params=case.params or None)
        adm = reference(prog, *args, params=case.params or None)
    except TilenestError as e:
        return Expected(None, error_kind(e), e.render())
    except Exception as e:  # noqa: BLE001 - a crash of the reference is reported, not raised
        return Expected(None, "internal", f"{type(e).__name__}: {e}")
    adm = adm if isinstance(adm, tuple) else (adm,)
    return Expected({a.name: a for a in adm})


# ------------------------------------------------------------------ implementations
@dataclass
class Outcome:
    """What an implementation returned for a case."""

    outputs: dict[str, np.ndarray] = field(default_factory=dict)
    error: str | None = None
    message: str = ""
    harness: str | None = None  # the implementation could not be run / its output read
    unsupported: str | None = None  # why the implementation declines the case


class Interpreter:
    """Our reference interpreter, run in-process, one member of the admitted set:
    a random order of parallel children and tree reductions and the fast
    (BLAS/pairwise) paths, so bitwise contracts are checked against a
    different execution than the oracle's."""

    name = "interpreter"

    def __init__(self, seed: int = 1):
        self.seed = seed

    def run(self, case: Case) -> Outcome:
        from .interpreter import interpret, random

        try:
            prog = load_program(case.program)
            args = materialize(case)
            interpret(prog, *args, params=case.params or None, schedule=random(self.seed),
                      fast=True)
        except TilenestError as e:
            return Outcome(error=error_kind(e), message=e.render())
        except Exception as e:  # noqa: BLE001 - a crash is an outcome like any other
            return Outcome(error="internal", message=f"{type(e).__name__}: {e}")
        return Outcome({s["name"]: a for s, a in zip(case.args, args, strict=True)
                        if isinstance(a, np.ndarray)})


class Backend:
    """A compiled backend run in-process (``llvm``: the LLVM CPU JIT; ``cuda``:
    the GPU, or the host emulator where there is none), as a
    checked build: ``bounds.assume`` promises are checked (M-7 lets compiled
    code skip them; the suite asks for the verdict a broken one has). Race
    verdicts come from the compile-time legality gate: the backend refuses a
    program whose race obligations are refuted, before it runs."""

    def __init__(self, target: str):
        from .targets import compiling, row

        runnable = tuple(t for t in compiling() if row(t).runs)
        if target not in runnable:
            raise TilenestError(f"no conformance driver for backend '{target}'",
                                hint="backends: " + ", ".join(runnable))
        self.name = target

    def run(self, case: Case) -> Outcome:
        from .backends import target

        try:
            prog = load_program(case.program)
            ck = target(self.name).compile(prog, None, check_assumes=True)
        except NotAvailableError as e:
            why = self.lacks(prog)
            if why is not None:
                return Outcome(unsupported=f"{why}: {_first(e.render())}"
                               + (f" at {e.sites[0]}" if e.sites else ""))
            return Outcome(error=error_kind(e), message=e.render())
        except TilenestError as e:
            return Outcome(error=error_kind(e), message=e.render())
        except Exception as e:  # noqa: BLE001 - a crash is an outcome like any other
            return Outcome(error="internal", message=f"{type(e).__name__}: {e}")
        # an emulated GPU runs the case under every thread interleaving: a
        # race-free kernel gives one outcome under all of them
        runs = getattr(ck, "interleavings", None) or ({},)
        outs = [self._once(case, ck, how) for how in runs]
        first = outs[0]
        for how, o in zip(runs[1:], outs[1:], strict=True):
            if not _same_outcome(first, o):
                return Outcome(error="internal", message=(
                    f"the outcome differs between thread interleavings ({runs[0]} and {how}): "
                    "the generated code races"))
        return first

    def lacks(self, prog: Any) -> str | None:
        """Why this target cannot run ``prog`` at all, from its registry row
        (a device without f64 and a program holding f64 values), else None.
        A refusal for such a reason makes the case unsupported here (``skip``,
        counted and shown with the refusal's site), not failed; any other
        refusal is judged like every error."""
        from .semantics import dtypes as D
        from .targets import profile

        if not profile(self.name).f64 and prog.first_use_of("f64") is not None:
            return f"the {self.name} target has no f64"
        if not profile(self.name).fp8 and any(prog.first_use_of(d.name) is not None
                                              for d in D.FP8):
            return f"the {self.name} target does not compile FP8 yet"
        return None

    @staticmethod
    def _once(case: Case, ck: Any, how: dict) -> Outcome:
        try:
            args = materialize(case)
            ck(*args, params=case.params or None, **how)
        except TilenestError as e:
            return Outcome(error=error_kind(e), message=e.render())
        except Exception as e:  # noqa: BLE001 - a crash is an outcome like any other
            return Outcome(error="internal", message=f"{type(e).__name__}: {e}")
        return Outcome({s["name"]: a for s, a in zip(case.args, args, strict=True)
                        if isinstance(a, np.ndarray)})


def _same_outcome(a: Outcome, b: Outcome) -> bool:
    """Equal errors, or bitwise-equal output arrays."""
    if a.error or b.error:
        return a.error == b.error
    return a.outputs.keys() == b.outputs.keys() and all(
        x.dtype == b.outputs[k].dtype and x.shape == b.outputs[k].shape
        and x.tobytes() == b.outputs[k].tobytes() for k, x in a.outputs.items())


class External:
    """An external implementation run per case by a command template
    (:class:`tilenest.conformance_files.Template`). A template that cannot be
    split, has no ``{case}`` or names a program that cannot be started is a
    usage error here, before any case runs."""

    def __init__(self, template: str, timeout: float = 120.0, keep: Path | None = None,
                 option: str = "--impl"):
        self.template = F.Template.parse(template, option)
        self.template.check_program(option)
        self.words = list(self.template.words)
        self.name = self.template.program
        self.timeout = timeout
        self.keep = keep
        self.option = option

    def run(self, case: Case) -> Outcome:
        """Run the implementation on ``case``; raises
        :class:`~tilenest.conformance_files.CannotStart` when the command
        cannot be started at all."""
        tmp = Path(tempfile.mkdtemp(prefix=f"tn-conf-{case.name}-", dir=self.keep))
        try:
            inp, outp = tmp / "inputs", tmp / "outputs"
            inp.mkdir()
            outp.mkdir()
            try:
                write_inputs(case, materialize(case), inp)
            except TilenestError as e:
                return Outcome(harness=f"cannot materialize the inputs: {e.message}")
            cmd = self.template.argv({"{case}": str(case.program), "{inputs}": str(inp),
                                      "{outputs}": str(outp)})
            done = F.run_command(cmd, self.timeout, self.option)
            if done is None:
                return Outcome(harness=f"timed out after {self.timeout:g} s")
            try:
                return self._read(case, outp, done)
            except F.OutputError as e:
                return Outcome(harness=str(e))
        finally:
            if self.keep is None:
                _rmtree(tmp)

    @staticmethod
    def _read(case: Case, outp: Path, done: F.Finished) -> Outcome:
        err = outp / "error.json"
        if os.path.lexists(err):
            d = F.read_error_json(err)
            if d["kind"] == "unsupported":
                why = d.get("reason", d.get("message"))
                return Outcome(unsupported=str(why) if why else "unsupported by the "
                                                                 "implementation")
            return Outcome(error=d["kind"], message=str(d.get("message", "")))
        if done.returncode != 0:
            return Outcome(harness=f"exit status {done.returncode} without error.json: "
                                   + done.tail)
        outs: dict[str, np.ndarray] = {}
        for spec in case.args:
            src = spec.get("alias", spec["name"])
            f = outp / f"{spec['name']}.npy"
            if not os.path.lexists(f):
                f = outp / f"{src}.npy"
            if os.path.lexists(f):
                decl = next(s for s in case.args if s["name"] == src)
                outs[spec["name"]] = _as_dtype(F.read_npy(f, _output_limit(decl)),
                                               decl["dtype"])
        return Outcome(outs)


def _output_limit(spec: dict[str, Any]) -> int:
    """The most bytes an output file of argument ``spec`` may hold: room for a
    wider dtype or a wrong shape (which the judge reports), not for a header
    that claims terabytes."""
    from .semantics import dtypes as D

    n = 1
    for d in spec.get("shape", []):
        n *= int(d)
    return 8 * n * D.parse(spec["dtype"]).np.itemsize + (1 << 20)


def _as_dtype(a: np.ndarray, dtype: str) -> np.ndarray:
    """An array read in the argument's dtype where the protocol transports it
    as another (bf16 and FP8 as their bit patterns, :func:`save_array`)."""
    from .semantics import dtypes as D

    want = D.parse(dtype).np
    if want.name in D.ML_DTYPES.values() and a.dtype == np.dtype(f"u{want.itemsize}"):
        return a.view(want)
    return a


def _rmtree(p: Path) -> None:
    shutil.rmtree(p, ignore_errors=True)


# -------------------------------------------------------------------------- judging
@dataclass
class CaseResult:
    """The verdict of one case on one implementation."""

    case: Case
    #: pass | fail | error (the case or the harness is broken) | xfail (known gap)
    #: | skip (the implementation declares the case unsupported)
    status: str
    detail: str = ""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status in ("pass", "xfail", "skip")


def judge(case: Case, exp: Expected, got: Outcome) -> tuple[str, str]:
    """``(status, detail)`` of an outcome against the oracle.

    A case with a ``gap`` exposes a known gap of the reference: the spec rejects
    the call but the oracle admits it (or crashes). An implementation that rejects it as the
    spec says passes; one that shares the gap is an expected failure (``xfail``).
    An implementation that declares the case unsupported skips it (``skip``),
    unless the case itself is broken.
    """
    unsupported = ("skip", f"unsupported: {got.unsupported}")
    if case.gap and case.verdict != "admitted" and exp.error != case.verdict:
        if got.unsupported is not None:
            return unsupported
        if got.error == case.verdict:
            return "pass", f"{got.error}: {_first(got.message)}"
        return "xfail", f"known gap of the reference: {case.gap}"
    if exp.error == "internal":
        return "error", f"the oracle crashed: {exp.message}"
    if exp.error is not None and case.verdict == "admitted":
        return "error", f"the oracle rejects this case ({exp.error}): {_first(exp.message)}"
    if exp.error is None and case.verdict != "admitted":
        return "error", f"the oracle admits the call, but the case expects {case.verdict}"
    if exp.error is not None and exp.error != case.verdict:
        return "error", (f"the oracle raises {exp.error}, the case expects {case.verdict}: "
                         f"{_first(exp.message)}")
    if got.harness is not None:
        return "fail", got.harness
    if got.unsupported is not None:
        return unsupported
    if case.verdict != "admitted":
        if got.error is None:
            return "fail", f"expected a {case.verdict} error, the implementation returned outputs"
        if got.error != case.verdict:
            return "fail", (f"expected a {case.verdict} error, got {got.error}: "
                            f"{_first(got.message)}")
        return "pass", f"{got.error}: {_first(got.message)}"
    if got.error is not None:
        return "fail", f"unexpected {got.error} error: {_first(got.message)}"
    assert exp.admitted is not None
    for name, adm in exp.admitted.items():
        if name not in got.outputs:
            return "fail", f"no output for '{name}'"
        v = adm.admits(got.outputs[name])
        if not v:
            return "fail", v.reason
    return "pass", f"{len(exp.admitted)} output(s) admitted"


def _first(msg: str) -> str:
    return msg.strip().splitlines()[0] if msg.strip() else ""


def self_check(case: Case, exp: Expected) -> str | None:
    """For a case with a wrong companion: ``None`` when the companion's outputs
    are rejected by the case's oracle, else why the case fails to discriminate."""
    if case.wrong is None or exp.admitted is None:
        return None
    from .interpreter import interpret

    try:
        prog = load_program(case.wrong)
        args = materialize(case)
        interpret(prog, *args, params=case.params or None)
    except TilenestError as e:
        return f"the wrong companion does not run: {_first(e.render())}"
    except Exception as e:  # noqa: BLE001
        return f"the wrong companion crashes the interpreter: {type(e).__name__}: {e}"
    outs = {s["name"]: a for s, a in zip(case.args, args, strict=True)}
    if all(adm.admits(outs[n]) for n, adm in exp.admitted.items() if n in outs):
        return "the wrong companion's outputs are admitted: the case does not discriminate"
    return None


@dataclass
class Report:
    """All case results of one run."""

    implementation: str
    suite: str
    results: list[CaseResult]
    seconds: float

    @property
    def passed(self) -> int:
        return sum(r.status == "pass" for r in self.results)

    @property
    def xfailed(self) -> int:
        return sum(r.status == "xfail" for r in self.results)

    @property
    def skipped(self) -> int:
        """Cases the implementation declared unsupported."""
        return sum(r.status == "skip" for r in self.results)

    @property
    def failed(self) -> int:
        return sum(r.status == "fail" for r in self.results)

    @property
    def errors(self) -> int:
        return sum(r.status == "error" for r in self.results)

    @property
    def ok(self) -> bool:
        return self.failed == 0 and self.errors == 0

    def rules(self) -> dict[str, dict[str, int]]:
        """Per rule: how many positive and negative cases ran and passed."""
        out: dict[str, dict[str, int]] = {}
        for r in self.results:
            for rule in r.case.rules:
                d = out.setdefault(rule, {"positive": 0, "negative": 0, "passed": 0, "cases": 0})
                d["cases"] += 1
                d["passed"] += r.status == "pass"
                if r.case.verdict == "admitted":
                    d["positive"] += 1
                if r.case.negative:
                    d["negative"] += 1
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": "tilenest.conformance-report/1",
            "implementation": self.implementation, "suite": self.suite,
            "summary": {"cases": len(self.results), "passed": self.passed,
                        "failed": self.failed, "errors": self.errors, "xfailed": self.xfailed,
                        "skipped": self.skipped,
                        "seconds": round(self.seconds, 3)},
            "cases": [{"name": r.case.name, "group": r.case.group, "rules": list(r.case.rules),
                       "expect": r.case.verdict, "status": r.status, "detail": r.detail,
                       "seconds": round(r.seconds, 4)} for r in self.results],
            "rules": self.rules(),
        }

    def to_junit(self) -> str:
        """JUnit XML whose test ids (classname ``tilenest-conformance.GROUP``,
        name ``NAME[RULES]``) are those pytest's ``--junitxml`` writes for the
        plugin's items, so that a CI history survives a switch between them."""
        suite = ET.Element("testsuite", name=f"{SUITE_ID}[{self.implementation}]",
                           tests=str(len(self.results)), failures=str(self.failed),
                           errors=str(self.errors), skipped=str(self.xfailed + self.skipped),
                           time=f"{self.seconds:.3f}")
        for r in self.results:
            tc = ET.SubElement(suite, "testcase", classname=f"{SUITE_ID}.{r.case.group}",
                               name=r.case.test_name, time=f"{r.seconds:.4f}")
            if r.status == "fail":
                ET.SubElement(tc, "failure", message=r.detail[:500]).text = r.detail
            elif r.status == "error":
                ET.SubElement(tc, "error", message=r.detail[:500]).text = r.detail
            elif r.status in ("xfail", "skip"):
                kind = "pytest.xfail" if r.status == "xfail" else "pytest.skip"
                ET.SubElement(tc, "skipped", type=kind, message=r.detail[:500])
            else:
                ET.SubElement(tc, "system-out").text = r.detail
        root = ET.Element("testsuites")
        root.append(suite)
        ET.indent(root)
        return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def run_suite(cases: list[Case], impl: Any, check_companions: bool = True,
              progress: Callable[[CaseResult], None] | None = None, suite: str = "") -> Report:
    """Judge ``impl`` on every case; on a terminal, a progress bar on stderr
    steps once per case, labelled with the case's name (:mod:`tilenest.progress`:
    silent when redirected or in CI, so reports are never interleaved with it)."""
    t0 = time.perf_counter()
    results = []
    with _progress.bar(f"conformance ({impl.name})", len(cases)) as step:
        for case in cases:
            t = time.perf_counter()
            with np.errstate(all="ignore"):
                exp = oracle(case)
                status, detail = judge(case, exp, impl.run(case))
                if status == "pass" and check_companions:
                    why = self_check(case, exp)
                    if why is not None:
                        status, detail = "error", why
            r = CaseResult(case, status, detail, time.perf_counter() - t)
            results.append(r)
            step(case.name)
            if progress is not None:
                progress(r)
    return Report(impl.name, suite, results, time.perf_counter() - t0)


# ------------------------------------------------------------------------- printing
def print_report(report: Report, verbose: bool = False, file: Any = None) -> None:
    """A table per spec file (and every failing case) with ``rich``."""
    from rich.console import Console
    from rich.table import Table

    con = Console(file=file, width=120, highlight=False)
    groups: dict[str, list[CaseResult]] = {}
    for r in report.results:
        groups.setdefault(r.case.group, []).append(r)
    t = Table(title=f"tilenest conformance -- {report.implementation}", show_lines=False)
    for col in ("group", "cases", "passed", "failed", "errors", "xfail", "skipped", "rules"):
        t.add_column(col, justify="right" if col not in ("group",) else "left")
    for g, rs in sorted(groups.items()):
        rules = {rule for r in rs for rule in r.case.rules}
        t.add_row(g, str(len(rs)), str(sum(r.status == "pass" for r in rs)),
                  str(sum(r.status == "fail" for r in rs)),
                  str(sum(r.status == "error" for r in rs)),
                  str(sum(r.status == "xfail" for r in rs)),
                  str(sum(r.status == "skip" for r in rs)), str(len(rules)))
    t.add_row("total", str(len(report.results)), str(report.passed), str(report.failed),
              str(report.errors), str(report.xfailed), str(report.skipped),
              str(len(report.rules())), style="bold")
    con.print(t)
    shown = [r for r in report.results if verbose or r.status != "pass"]
    if shown:
        d = Table(title="cases" if verbose else "cases not passed", show_lines=False)
        for col in ("case", "rules", "expect", "result", "detail"):
            d.add_column(col, overflow="fold")
        for r in shown:
            style = {"pass": "green", "fail": "red", "error": "yellow", "xfail": "blue",
                     "skip": "magenta"}[r.status]
            d.add_row(r.case.name, " ".join(r.case.rules), r.case.verdict,
                      f"[{style}]{r.status}[/{style}]", r.detail[:200])
        con.print(d)
    xf = f", {report.xfailed} expected failures (known gaps)" if report.xfailed else ""
    if report.skipped:
        xf += f", {report.skipped} skipped (unsupported by the implementation)"
    con.print(f"{report.passed}/{len(report.results)} passed in {report.seconds:.1f} s{xf}"
              + ("" if report.ok else f"; {report.failed} failed, {report.errors} errors"))


def main(suite: str | None = None, impl: str | None = None, select: Sequence[str] = (),
         json_report: str | None = None, junit: str | None = None, verbose: bool = False,
         as_json: bool = False, timeout: float = 120.0, keep: str | None = None,
         seed: int = 1, backend: str | None = None) -> int:
    """The ``tilenest conformance`` command; returns the exit status (0 when no
    case fails; known gaps of the reference are expected failures, cases the
    implementation declares unsupported are skipped)."""
    if impl and backend:
        raise TilenestError("--impl and --backend exclude each other")
    # the command is checked before anything runs: one usage error, not one per case
    external = External(impl, timeout, Path(keep) if keep else None) if impl else None
    root = Path(suite) if suite else default_suite()
    cases = load_suite(root, select)
    if not cases:
        raise TilenestError(f"no conformance case matches {' '.join(select)!r}"
                            if select else f"the suite at {root} has no cases")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
    implementation: Any
    if external is not None:
        implementation = external
    elif backend:
        implementation = Backend(backend)
    else:
        implementation = Interpreter(seed)
    report = run_suite(cases, implementation, check_companions=isinstance(implementation,
                                                                          Interpreter),
                       suite=str(root))
    if json_report:
        Path(json_report).write_text(json.dumps(report.to_json(), indent=1) + "\n")
    if junit:
        Path(junit).write_text(report.to_junit())
    if as_json:
        print(json.dumps(report.to_json(), indent=1))
    else:
        print_report(report, verbose)
    return 0 if report.ok else 1
