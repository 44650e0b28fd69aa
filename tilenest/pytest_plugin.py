"""A pytest plugin for implementers of the Tile DSL.

Two things, independent of each other:

* ``pytest --tilenest-impl 'CMD {case} {inputs} {outputs}'`` adds one test item
  per case of the conformance suite (``spec/conformance``). Each item runs the
  implementation on its case through the runner of ``tilenest conformance
  --impl`` (:mod:`tilenest.conformance`: the same file protocol, oracle and
  judge) and

  - passes when the runner's judge passes the case,
  - **fails** with the oracle's verdict (the first element not admitted and its
    admitted range, or the error kind expected and received),
  - is an **error** (in setup) when the implementation could not be run or its
    outputs could not be read (exit status without ``error.json``, a timeout,
    a missing command), or when the case itself is broken,
  - is an expected failure where the case exposes a known gap of the reference
    that the implementation shares.

  Items are named ``tilenest-conformance::GROUP::CASE[RULE,...]``; ``-k V-22``
  selects the cases citing rule V-22 by substring (it also matches V-220 if the
  spec had one); ``-k "[V-2]"`` selects rule V-2 alone, and ``-k values`` a spec
  group. Every item carries the marker ``tilenest_conformance``. pytest's own
  ``--junitxml``, ``-x``, ``-n`` (xdist) apply as to any item. Without the option
  the plugin adds no item and runs nothing.

* Fixtures for a project's own tests: ``tilenest_oracle`` (an :class:`Oracle`)
  and ``admitted`` (its :meth:`Oracle.admitted`), so a test can say::

      def test_my_add(admitted):
          x = np.arange(8, dtype=np.float32); y = np.zeros_like(x)
          assert admitted(add_one, (x, y)).admits(my_backend.add_one(x))

Installed, the plugin is the ``pytest11`` entry point ``tilenest`` and loads
itself; with ``PYTEST_DISABLE_PLUGIN_AUTOLOAD`` set, ``-p tilenest`` loads it
(``-p tilenest.pytest_plugin`` where the entry point is not installed, and only
there: pytest refuses one module registered under two names).
"""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from . import errors as ERR

MARKER = "tilenest_conformance"
ROOT_NAME = "tilenest-conformance"


def _usage(message: str, hint: str) -> pytest.UsageError:
    """A mistake in the plugin's options: the tilenest usage error, rendered as
    pytest's own (printed without a traceback, exit status 4; pytest's class
    is final, so the tilenest error travels as its cause)."""
    err = ERR.UsageError(message, hint=hint)
    usage = pytest.UsageError(err.render())
    usage.__cause__ = err
    return usage


# ------------------------------------------------------------------------- options
def _seconds(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        v = float("nan")
    if not v > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return v


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("tilenest", "tilenest conformance suite")
    g.addoption("--tilenest-impl", metavar="CMD", default=None,
                help="run every conformance case on this implementation: a command with the "
                     "placeholders {case} {inputs} {outputs} (spec/conformance/README.md)")
    g.addoption("--tilenest-suite", metavar="DIR", default=None,
                help="the conformance suite folder (default: spec/conformance of the source "
                     "tree tilenest belongs to)")
    g.addoption("--tilenest-timeout", metavar="SECONDS", type=_seconds, default=120.0,
                help="seconds the implementation may take per case (default 120)")


@dataclass
class Run:
    """The conformance run of one pytest session: the implementation's command
    template, the runner's driver for it and the suite's folder."""

    template: str
    implementation: Any  # tilenest.conformance.External
    suite: Path


RUN = pytest.StashKey[Run]()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{MARKER}: a case of the tilenest conformance suite "
                                       "(added by --tilenest-impl)")
    template = config.getoption("tilenest_impl")
    if template is None:
        return
    from . import conformance as C

    try:
        impl = C.External(template, config.getoption("tilenest_timeout"))
    except ERR.TilenestError as e:
        hint = "e.g. --tilenest-impl 'my-impl {case} {inputs} {outputs}'"
        raise _usage(e.message.replace("--impl", "--tilenest-impl"), hint) from e
    given = config.getoption("tilenest_suite")
    suite = Path(given) if given else C.default_suite()
    if not suite.is_dir():
        hint = ("pass --tilenest-suite DIR (a folder with cases/GROUP/NAME.json)" if given else
                "this installation has no source tree beside it: pass --tilenest-suite DIR")
        raise _usage(f"no conformance suite at {suite}", hint)
    config.stash[RUN] = Run(template, impl, suite.resolve())


def pytest_report_header(config: pytest.Config) -> list[str]:
    run = config.stash.get(RUN, None)
    return [] if run is None else [f"tilenest conformance: {run.template!r} on {run.suite}"]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                  items: list[pytest.Item]) -> None:
    """Append the suite's items before ``-k``, ``-m`` and ``--deselect`` select
    among all items (they are ordinary modifyitems hooks, run after this one)."""
    run = config.stash.get(RUN, None)
    if run is None:
        return
    root = Suite.from_parent(session, name=ROOT_NAME, path=run.suite, nodeid=ROOT_NAME)
    items.extend(session.genitems(root))


# ----------------------------------------------------------------------- collection
class Suite(pytest.Collector):
    """The conformance suite: one child per spec group (``cases/GROUP/``)."""

    def collect(self) -> list[pytest.Collector]:
        from . import conformance as C

        cases = C.load_suite(self.path)
        if not cases:
            raise ERR.TilenestError(f"the conformance suite at {self.path} has no cases",
                                    hint="pass --tilenest-suite DIR (cases/GROUP/NAME.json)")
        groups: dict[str, list[Any]] = {}
        for c in cases:
            groups.setdefault(c.group, []).append(c)
        return [Group.from_parent(self, name=g, path=cs[0].recipe.parent, cases=cs)
                for g, cs in groups.items()]

    # a Collector's repr_failure takes no style, unlike the Node's it overrides
    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException]) -> Any:  # type: ignore[override]
        """A broken recipe is shown as its located tilenest error."""
        if isinstance(excinfo.value, ERR.TilenestError):
            return excinfo.value.render()
        return super().repr_failure(excinfo)


class Group(pytest.Collector):
    """The cases of one spec group, in the suite's order."""

    def __init__(self, *, cases: list[Any], **kw: Any):
        super().__init__(**kw)
        self.cases = cases

    def collect(self) -> list[pytest.Item]:
        return [CaseItem.from_parent(self, name=f"{c.name}[{','.join(c.rules)}]", case=c)
                for c in self.cases]


class CaseItem(pytest.Item):
    """One conformance case run on the session's implementation. Setup runs the
    implementation and the oracle and judges (a case that cannot be judged is
    an error of setup); the test reports the verdict."""

    def __init__(self, *, case: Any, **kw: Any):
        super().__init__(**kw)
        self.case = case
        self.verdict: tuple[str, str] | None = None
        # exact per-rule keywords: `-k "[V-2]"` does not also select V-20
        self.extra_keyword_matches.update(case.rules)
        self.extra_keyword_matches.update(f"[{r}]" for r in case.rules)
        self.add_marker(MARKER)

    def setup(self) -> None:
        import numpy as np

        from . import conformance as C

        run = self.config.stash[RUN]
        with np.errstate(all="ignore"):
            expected = C.oracle(self.case)
            got = run.implementation.run(self.case)
            status, detail = C.judge(self.case, expected, got)
        if status == "error":
            pytest.fail(self._explain(f"the case is broken: {detail}"), pytrace=False)
        if status == "fail" and got.harness is not None:
            pytest.fail(self._explain(f"the implementation could not be judged: {detail}"),
                        pytrace=False)
        self.verdict = (status, detail)

    def runtest(self) -> None:
        assert self.verdict is not None
        status, detail = self.verdict
        if status == "xfail":
            pytest.xfail(detail)
        if status == "fail":
            pytest.fail(self._explain(detail), pytrace=False)

    def _explain(self, why: str) -> str:
        """The verdict with the case's files and the command that reruns it
        keeping its inputs and outputs."""
        c, run = self.case, self.config.stash[RUN]
        timeout = run.implementation.timeout
        again = shlex.join(["tilenest", "conformance", "--suite", str(run.suite), "--case",
                            c.name, "--impl", run.template, "--keep", "DIR"]
                           + (["--timeout", f"{timeout:g}"] if timeout != 120.0 else []))
        return "\n".join([f"{c.name} (rule {', '.join(c.rules)}; expects {c.verdict}): {why}",
                          f"  program: {c.program}", f"  recipe:  {c.recipe}",
                          f"  rerun keeping its files: {again}"])

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.case.recipe, None, self.name


# ------------------------------------------------------------------------- fixtures
@dataclass(frozen=True)
class AdmittedOutputs:
    """What the reference admits for one call: an ``Admitted`` set per tensor the
    program stores to, in argument order. An implementation's outputs conform
    when every one of them lies in its set."""

    sets: tuple[Any, ...]

    def __repr__(self) -> str:
        def one(a: Any) -> str:
            kind = "bitwise" if a.lo is None or a.exact_mask.all() else "envelope"
            return f"{a.name}: {a.dtype}{list(a.value.shape)} {kind}"

        return f"AdmittedOutputs({', '.join(one(a) for a in self.sets)})"

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.sets)

    @property
    def reference(self) -> dict[str, Any]:
        """The canonical evaluation of each output (itself always admitted)."""
        return {a.name: a.value for a in self.sets}

    def __getitem__(self, name: str) -> Any:
        for a in self.sets:
            if a.name == name:
                return a
        raise self._no_output(name)

    def admits(self, outputs: Any) -> Any:
        """The verdict (truthy when admitted) on ``outputs``: one array when the
        call stores one tensor; otherwise a mapping from argument name to array
        or a tuple in argument order. Not admitted: the verdict names the first
        offending element of the first offending output and why."""
        from .interpreter.oracle import Verdict

        for a, out in zip(self.sets, self._split(outputs), strict=True):
            if out is None:
                return Verdict(False, None, f"no output for '{a.name}'")
            v = a.admits(out)
            if not v:
                reason = v.reason if v.reason.startswith(a.name) else f"{a.name}: {v.reason}"
                return Verdict(False, v.index, reason, v.undetermined)
        return Verdict(True)

    def _split(self, outputs: Any) -> list[Any]:
        if isinstance(outputs, Mapping):
            for k in outputs:
                if k not in self.names:
                    raise self._no_output(k)
            return [outputs.get(n) for n in self.names]
        if isinstance(outputs, tuple):
            if len(outputs) != len(self.sets):
                raise ERR.UsageError(f"{len(outputs)} outputs given, the call stores "
                                     f"{len(self.sets)} ({', '.join(self.names)})",
                                     hint="pass a tuple in argument order, or a mapping by name")
            return list(outputs)
        if len(self.sets) != 1:
            raise ERR.UsageError(f"the call stores {len(self.sets)} tensors "
                                 f"({', '.join(self.names) or 'none'}), one array was given",
                                 hint="pass a tuple in argument order, or a mapping by name")
        return [outputs]

    def _no_output(self, name: str) -> ERR.TilenestError:
        return ERR.UsageError(f"the call stores no tensor named '{name}'",
                              hint=f"it stores: {', '.join(self.names) or 'nothing'}")


class Oracle:
    """The reference interpreter as a test's oracle: for a kernel and its inputs,
    the set of outputs every conforming implementation may produce (bitwise
    where the contract is bitwise, an FP64 envelope downstream of permitted
    reassociation). ``schedule`` is the reference run's order of ``parallel``
    children (``tn.reference``'s; ``'exhaustive'`` also checks that the result
    does not depend on the order)."""

    def __init__(self, schedule: Any = None):
        self.schedule = schedule

    def admitted(self, kernel: Any, inputs: Any = (), /, **options: Any) -> AdmittedOutputs:
        """The admitted outputs of calling ``kernel`` (a ``@tn.kernel``, a
        TileProgram, or the path of a ``.tile`` / TileIR ``.json`` file) on
        ``inputs`` (its arguments in signature order, or a mapping by name for a
        kernel); ``options`` are those of ``tn.reference`` (``params=``,
        compile-time constants by name). The inputs are not modified. A call the
        reference rejects raises its tilenest error (a race, out of bounds)."""
        import tilenest as tn

        from . import conformance as C

        if isinstance(kernel, (str, Path)):
            kernel = C.load_program(Path(kernel))
        options.setdefault("schedule", self.schedule)
        if isinstance(inputs, Mapping):
            sets = tn.reference(kernel, **inputs, **options)
        else:
            sets = tn.reference(kernel, *inputs, **options)
        return AdmittedOutputs(sets if isinstance(sets, tuple) else (sets,))

    __call__ = admitted


@pytest.fixture(scope="session")
def tilenest_oracle() -> Oracle:
    """The reference interpreter as an :class:`Oracle` (canonical schedule)."""
    return Oracle()


@pytest.fixture(scope="session")
def admitted(tilenest_oracle: Oracle) -> Any:
    """``admitted(kernel, inputs, **options) -> AdmittedOutputs``: what the
    reference admits for a call; ``.admits(out)`` is the verdict on outputs."""
    return tilenest_oracle.admitted
