"""A pytest plugin for implementers of the Tile DSL.

Two things, independent of each other:

* ``pytest --tilenest-impl 'CMD {case} {inputs} {outputs}'`` adds one test item
  per case of the conformance suite (the one the package carries, or
  ``--tilenest-suite DIR``). Each item runs the implementation on its case
  through the runner of ``tilenest conformance --impl``
  (:mod:`tilenest.conformance`: the same file protocol, oracle and judge) and

  - passes when the runner's judge passes the case,
  - **fails** with the oracle's verdict (the first element not admitted and its
    admitted range, or the error kind expected and received),
  - is **skipped** with the implementation's reason when it answers
    ``{"kind": "unsupported", "reason": ...}`` in ``error.json``,
  - is an **error** (in setup) when the implementation's outputs could not be
    judged (exit status without ``error.json``, a timeout, an unreadable
    output), or when the case itself is broken,
  - is an expected failure where the case exposes a known gap of the reference
    that the implementation shares.

  A command that cannot be split, lacks ``{case}`` or cannot be started is one
  usage error (exit status 4) before anything runs.

  Items are named ``tilenest-conformance::GROUP::CASE[RULE,...]`` and behave
  as pytest's own: a node id on the command line selects them
  (``tilenest-conformance``, ``...::memory``, ``...::memory::M05-zero-and-fill``
  with or without its ``[RULES]``), ``--lf`` reruns the last failures, and a
  command line naming only files or folders runs those alone (the suite joins a
  run that names no path, or is named by node id). ``-k V-22`` selects the
  cases citing rule V-22 by substring (it also matches V-220 if the spec had
  one); ``-k "[V-2]"`` selects rule V-2 alone, and ``-k values`` a spec group.
  Every item carries the marker ``tilenest_conformance``. pytest's own
  ``--junitxml`` (with the same test ids as ``tilenest conformance --junit``),
  ``-x``, ``-n`` (xdist) apply as to any item. Without the option the plugin
  adds no item and runs nothing.

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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from . import errors as ERR

MARKER = "tilenest_conformance"
ROOT_NAME = "tilenest-conformance"  # tilenest.conformance.SUITE_ID, kept import-free here


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
                     "placeholders {case} {inputs} {outputs} (spec/conformance/README.md; "
                     "in a 'sh -c' script they are shell-quoted)")
    g.addoption("--tilenest-suite", metavar="DIR", default=None,
                help="the conformance suite folder (default: the suite tilenest carries)")
    g.addoption("--tilenest-timeout", metavar="SECONDS", type=_seconds, default=120.0,
                help="seconds the implementation may take per case (default 120)")


@dataclass
class Run:
    """The conformance run of one pytest session: the implementation's command
    template, the runner's driver for it, the suite's folder, and which of its
    items join the session (all, those under the node ids in ``selectors``,
    or none when the command line names only paths)."""

    template: str
    implementation: Any  # tilenest.conformance.External
    suite: Path
    selectors: tuple[str, ...] = ()
    included: bool = True


def _is_suite_id(arg: str) -> bool:
    return arg == ROOT_NAME or arg.startswith(ROOT_NAME + "::")


def _selects(selector: str, nodeid: str) -> bool:
    """Does a node id given on the command line name this item (itself, a
    collector above it, or the item without its ``[RULES]``)?"""
    return nodeid == selector or nodeid.startswith((selector + "::", selector + "["))


def _take_selectors(config: pytest.Config) -> tuple[tuple[str, ...], bool]:
    """The suite's node ids among the command line's arguments (removed from
    ``config.args``, where pytest would look for them on disk) and whether the
    suite joins the session: when node ids name it, or when the command line
    names no path at all (pytest's default of testpaths or the current folder)."""
    selectors = tuple(a for a in config.args if _is_suite_id(a))
    explicit = config.args_source == pytest.Config.ArgsSource.ARGS
    if selectors:
        config.args[:] = [a for a in config.args if not _is_suite_id(a)]
    return selectors, bool(selectors) or not explicit


RUN = pytest.StashKey[Run]()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{MARKER}: a case of the tilenest conformance suite "
                                       "(added by --tilenest-impl)")
    template = config.getoption("tilenest_impl")
    if template is None:
        named = [a for a in config.args if _is_suite_id(a)]
        if named:
            raise _usage(f"{named[0]} names the tilenest conformance suite, which runs only "
                         "on an implementation",
                         "pass --tilenest-impl 'my-impl {case} {inputs} {outputs}'")
        return
    from . import conformance as C

    try:
        impl = C.External(template, config.getoption("tilenest_timeout"),
                          option="--tilenest-impl")
    except ERR.TilenestError as e:
        raise _usage(e.message, e.hint or "") from e
    given = config.getoption("tilenest_suite")
    suite = Path(given) if given else C.default_suite()
    if not suite.is_dir():
        hint = ("pass --tilenest-suite DIR (a folder with cases/GROUP/NAME.json)" if given else
                "this installation lacks its conformance suite: pass --tilenest-suite DIR")
        raise _usage(f"no conformance suite at {suite}", hint)
    selectors, included = _take_selectors(config)
    config.stash[RUN] = Run(template, impl, suite.resolve(), selectors, included)


def pytest_report_header(config: pytest.Config) -> list[str]:
    run = config.stash.get(RUN, None)
    return [] if run is None else [f"tilenest conformance: {run.template!r} on {run.suite}"]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                  items: list[pytest.Item]) -> None:
    """Append the suite's items before ``-k``, ``-m``, ``--deselect`` and
    ``--lf`` select among all items (ordinary modifyitems hooks run after
    this one; ``--lf``'s wrapper around them all)."""
    run = config.stash.get(RUN, None)
    if run is None or not run.included:
        return
    root = Suite.from_parent(session, name=ROOT_NAME, path=run.suite, nodeid=ROOT_NAME)
    items.extend(_selected(session.genitems(root), run.selectors))


def _selected(found: Iterable[pytest.Item], selectors: tuple[str, ...]) -> list[pytest.Item]:
    """The items the command line's node ids name (all without node ids); a
    node id that names none is a usage error, as pytest's own are."""
    found = list(found)
    if not selectors:
        return found
    for sel in selectors:
        if not any(_selects(sel, it.nodeid) for it in found):
            groups = sorted({it.nodeid.split("::")[1] for it in found})
            raise _usage(f"no conformance case has the node id {sel}",
                         f"ids are {ROOT_NAME}::GROUP::CASE[RULES], GROUP one of "
                         f"{', '.join(groups)}; --collect-only -q lists them")
    return [it for it in found if any(_selects(sel, it.nodeid) for sel in selectors)]


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
        # the id is given whole so that pytest reads "[RULES]" as the item's
        # parameters, as in the ids that --lf and node-id arguments hold
        return [CaseItem.from_parent(self, name=c.test_name, nodeid=c.node_id, case=c)
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

        from .conformance_files import CannotStart

        run = self.config.stash[RUN]
        with np.errstate(all="ignore"):
            expected = C.oracle(self.case)
            try:
                got = run.implementation.run(self.case)
            except CannotStart as e:  # the same for every case: end the session once
                pytest.exit(e.render(), returncode=pytest.ExitCode.USAGE_ERROR)
            status, detail = C.judge(self.case, expected, got)
        if status == "skip":  # reported at the case's recipe, not at this line
            raise pytest.skip.Exception(detail, _use_item_location=True)
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

    def reportinfo(self) -> tuple[Path, int, str]:
        return self.case.recipe, 0, self.name


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
