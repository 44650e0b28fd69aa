"""``tilenest check --sarif``: the checker's verdicts as a SARIF 2.1.0 log.

A code-scanning dashboard (GitHub code scanning, Azure DevOps, VS Code's SARIF
viewer, ...) lists *alerts*: things a person should look at, each at a line of
the source. The log therefore holds one ``result`` per obligation that needs
attention, built from the :class:`~tilenest.proofs.obligation.Obligation`
objects of :func:`tilenest.proofs.report.check` exactly as the terminal table
shows them (title, counterexample lines, reason, sites); nothing is re-derived.

==================================  =========  ===========================================
obligation                          ``level``  why
==================================  =========  ===========================================
required, ``refuted``               error      a concrete counterexample: the program is wrong
required, ``unknown``               warning    not proved (the exit status is 2); never
                                               silently passed
``assumed`` (``--assume``)          note       kept, with a SARIF ``suppression`` of kind
                                               ``external`` naming the selector: a person
                                               accepted it without proof; viewers hide it by
                                               default but keep it for audit
evidence (``role = "evidence"``)    (omitted)  information only: it never decides the exit
                                               status (e.g. a float law a policy permits), so
                                               it is no alert; a kernel that passes has no
                                               result at all
``proved``                          (omitted)  nothing to act on; hundreds of passing rows
                                               would bury the refutations
==================================  =========  ===========================================

The counts of every verdict, omitted ones included, stay in the run's
``properties.tilenest.kernels[*].summary``.

Rules: one ``reportingDescriptor`` per obligation kind checked, with the
section of the obligation catalogue that states its formula. Its ``helpUri``
is that section on the documentation site, whose root is
``$TILENEST_DOCS_URL`` or else the ``Documentation`` URL of the installed
package's metadata (``[project.urls]`` in ``pyproject.toml``); with neither,
rules carry no ``helpUri`` (SARIF requires an absolute URI there) and their
help text names the section.

Locations: the obligation's first site is the result's location; further
sites are ``relatedLocations``. A site in a file under the working directory
(``root``) is a relative URI with ``uriBaseId`` ``%SRCROOT%`` (the run's
``originalUriBaseIds`` maps it to ``root``), so that the same file has the
same URI on every machine -- dashboards match alerts by path. Other files are
absolute ``file://`` URIs. A site without a file (a TileIR text position) is in
the input file. An obligation with no site at all is reported at line 1 of the
input file (dashboards need a line). Lines and columns are the sites' own
(1-based); a site without a column gives no ``startColumn``.

Tracking across runs: ``partialFingerprints["tilenestObligation/v1"]`` hashes
the kernel, the kind, the file and the obligation's title (with an occurrence
count for identical ones), but not the line, so an alert survives edits that
move the kernel and disappears when the obligation is proved.

``invocations[0].executionSuccessful`` says whether the check ran to the end
(refuted and unknown verdicts are a completed analysis: true); ``exitCode`` is
the command's exit status, unchanged by ``--sarif``. A check that stopped on an
error writes a log with ``executionSuccessful: false``, no results and the
error as a ``toolExecutionNotification``, so a CI job that uploads the file
shows the failure instead of a clean scan.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

from .errors import Site, TilenestError, UsageError
from .proofs.obligation import ASSUMED, PROVED, REFUTED, Obligation
from .proofs.report import Report

VERSION = "2.1.0"
SCHEMA_URI = ("https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/"
              "sarif-schema-2.1.0.json")
SRCROOT = "%SRCROOT%"
FINGERPRINT = "tilenestObligation/v1"

#: kind (or kind prefix ending in ``.``) -> (short description, section of
#: spec/obligations.md); the longest matching entry describes a kind
_RULES: dict[str, tuple[str, str]] = {
    "noninterference": ("Parallel children never touch an element one of them writes", "O-2"),
    "coverage.cover": ("Every element of an output is written", "O-3"),
    "coverage.once": ("No element of an output is written twice", "O-3"),
    "coverage.": ("Outputs are covered as the program requires", "O-3"),
    "bounds": ("Unguarded accesses stay inside their views", "O-4"),
    "layout.": ("A memory layout is injective and within its allocation", "O-5"),
    "parallelmap.": ("A ParallelMap is well formed", "O-5"),
    "tau.": ("An execution remap is a bijection between old and new instances", "O-6"),
    "cut.": ("An execution remap factors across its cuts", "O-6"),
    "split.": ("A split factors its level as declared", "O-6"),
    "rewrite": ("A rewrite preserves the program's structure", "O-6"),
    "binding.": ("A binding fits the target's scopes and limits", "O-7"),
    "fusion.": ("A fusion keeps every dependence on the diagonal", "O-8"),
    "pipeline.": ("A pipeline schedule respects its dependences and versions", "O-8"),
    "reduction.law.": ("A reduction's merge satisfies the laws its policy relies on", "O-9"),
    "reduction.": ("A reduction placement is legal for its policy", "O-9"),
    "taskmap.": ("A task map covers its domain", "O-11"),
    "barrier.": ("Barriers order every cross-thread dependence", "O-12"),
    "shared.": ("Shared memory fits the target's capacity", "O-13"),
}


def _rule_text(kind: str) -> tuple[str, str]:
    best = max((k for k in _RULES if kind == k or (k.endswith(".") and kind.startswith(k))),
               key=len, default=None)
    return _RULES[best] if best is not None else (f"Proof obligation {kind}", "O-1")


def rule(kind: str) -> dict[str, Any]:
    """The SARIF ``reportingDescriptor`` of an obligation kind (the rule id is
    the kind itself)."""
    short, section = _rule_text(kind)
    return {
        "id": kind,
        "name": "".join(p[:1].upper() + p[1:] for p in kind.replace("_", ".").split(".")),
        "shortDescription": {"text": short},
        "fullDescription": {"text": f"{short} (tilenest obligation '{kind}', "
                                    f"spec/obligations.md {section})."},
        "help": {"text": f"{short}. tilenest check states this obligation with symbolic "
                         f"extents and decides it with ISL or Z3: 'refuted' comes with a "
                         f"concrete counterexample (parameter values and coordinates), "
                         f"'unknown' with the reason no decision was reached. See "
                         f"spec/obligations.md {section} for the formula; '--assume "
                         f"{kind}' takes it as an axiom (reported, never counted as proved)."},
        "defaultConfiguration": {"level": "error"},
        **({"helpUri": help_uri(section)} if docs_root() else {}),
    }


def docs_root() -> str | None:
    """The documentation site's root URL, ending in ``/`` (module docstring),
    or None when none is configured."""
    url = os.environ.get("TILENEST_DOCS_URL", "").strip()
    if not url:
        try:
            from importlib.metadata import PackageNotFoundError, metadata

            for entry in metadata("tilenest").get_all("Project-URL") or ():
                label, _, value = entry.partition(",")
                if label.strip().lower() in ("documentation", "docs"):
                    url = value.strip()
                    break
        except PackageNotFoundError:
            pass
    if not url or "://" not in url:
        return None
    return url if url.endswith("/") else url + "/"


def help_uri(section: str) -> str:
    """The docs page of spec/obligations.md at ``section`` (``O-2`` ->
    ``.../spec/obligations/#o-2``: the site's page of that file and the anchor
    the site gives rule headings)."""
    root = docs_root()
    assert root is not None
    return f"{root}spec/obligations/#{section.lower()}"


def level(o: Obligation) -> str | None:
    """The result level of ``o`` (module docstring); None: not a result."""
    if o.status == PROVED or o.role != "required":
        return None
    if o.status == ASSUMED:
        return "note"
    return "error" if o.status == REFUTED else "warning"


def message(kernel: str, o: Obligation) -> str:
    """What the terminal table says about ``o``, as one text: the title, then
    the counterexample lines (refuted) or the reason (unknown, assumed)."""
    parts = [f"{o.title} (kernel {kernel})"]
    if o.status == REFUTED:
        cls = o.counterexample_lines()
        if cls:
            parts.append("counterexample: " + "; ".join(cls))
        if o.reason and not o.details:
            parts.append(o.reason)
    elif o.reason:
        parts.append(f"{o.status}: {o.reason}")
    if o.role != "required":
        parts.append("evidence only: it does not decide the exit status")
    return ". ".join(p.rstrip(".") for p in parts) + "."


def _uri(path: Path, root: Path) -> tuple[str, str | None]:
    """``(uri, uriBaseId)``: relative to ``root`` when ``path`` lies under it."""
    p = path if path.is_absolute() else root / path
    p = Path(os.path.normpath(p))
    try:
        rel = p.relative_to(root)
    except ValueError:
        return p.as_uri(), None
    return quote(rel.as_posix()), SRCROOT


def _site_file(site: Site | None, input_file: Path, root: Path) -> Path:
    """The file a site names: the input for TileIR positions; a relative name
    is taken relative to ``root`` if it exists there, else to the input's folder
    (a TileIR file records its kernel's file name relative to where it was
    captured)."""
    if site is None or site.file is None:
        return input_file
    f = Path(site.file)
    if f.is_absolute() or (root / f).exists():
        return f
    beside = input_file.parent / f
    return beside if beside.exists() else f


def location(site: Site | None, input_file: Path, root: Path) -> dict[str, Any]:
    """A SARIF ``location`` for ``site`` (None: line 1 of the input file)."""
    uri, base = _uri(_site_file(site, input_file, root), root)
    art: dict[str, Any] = {"uri": uri}
    if base is not None:
        art["uriBaseId"] = base
    region: dict[str, Any] = {"startLine": max(site.line, 1) if site is not None else 1}
    if site is not None and site.col > 0:
        region["startColumn"] = site.col
    return {"physicalLocation": {"artifactLocation": art, "region": region}}


def _fingerprint(kernel: str, o: Obligation, uri: str, seen: dict[str, int]) -> str:
    base = json.dumps([kernel, o.kind, uri, o.title])
    n = seen.get(base, 0)
    seen[base] = n + 1
    return hashlib.sha256(f"{base}#{n}".encode()).hexdigest()[:32]


def result(kernel: str, o: Obligation, rule_index: int, input_file: Path, root: Path,
           seen: dict[str, int]) -> dict[str, Any]:
    """The SARIF ``result`` of an obligation that :func:`level` reports."""
    lv = level(o)
    assert lv is not None
    first = location(o.sites[0] if o.sites else None, input_file, root)
    uri = first["physicalLocation"]["artifactLocation"]["uri"]
    r: dict[str, Any] = {
        "ruleId": o.kind,
        "ruleIndex": rule_index,
        "level": lv,
        "message": {"text": message(kernel, o)},
        "locations": [first],
        "partialFingerprints": {FINGERPRINT: _fingerprint(kernel, o, uri, seen)},
        "properties": {"tilenest": {"kernel": kernel, **o.to_json()}},
    }
    if len(o.sites) > 1:
        r["relatedLocations"] = [
            {"id": i, **location(s, input_file, root),
             "message": {"text": f"the obligation also concerns {s}"}}
            for i, s in enumerate(o.sites[1:], 1)]
    if o.status == ASSUMED:
        r["suppressions"] = [{"kind": "external", "status": "accepted",
                              "justification": f"assumed with --assume {o.assumed_by!r}, "
                                               "not proved"}]
    return r


def document(reports: Sequence[Report], input_file: str | Path, *,
             exit_status: int | None = None, root: Path | None = None,
             error: BaseException | None = None,
             command_line: Sequence[str] | None = None) -> dict[str, Any]:
    """The SARIF 2.1.0 log of one ``tilenest check`` of ``input_file``: one
    run, the rules of every obligation kind checked, a result per obligation
    that needs attention (module docstring). ``error``: the check stopped on it
    (``executionSuccessful`` false, the error as a notification)."""
    from . import __version__

    root = Path(os.path.abspath(root if root is not None else Path.cwd()))
    inp = Path(os.path.abspath(input_file))
    kinds = list(dict.fromkeys(o.kind for r in reports for o in r.obligations))
    index = {k: i for i, k in enumerate(kinds)}
    seen: dict[str, int] = {}
    results = [result(r.kernel, o, index[o.kind], inp, root, seen)
               for r in reports for o in r.obligations if level(o) is not None]
    invocation: dict[str, Any] = {"executionSuccessful": error is None}
    if exit_status is not None:
        invocation["exitCode"] = exit_status
    if command_line is not None:
        invocation["arguments"] = list(command_line)
    if error is not None:
        text = error.message if isinstance(error, TilenestError) else \
            f"{type(error).__name__}: {error}"
        invocation["toolExecutionNotifications"] = [
            {"level": "error", "message": {"text": f"tilenest check stopped: {text}"},
             "locations": [location(None, inp, root)]}]
    run: dict[str, Any] = {
        "tool": {"driver": {"name": "tilenest", "version": __version__,
                            "semanticVersion": __version__,
                            "rules": [rule(k) for k in kinds]}},
        "originalUriBaseIds": {SRCROOT: {"uri": root.as_uri().rstrip("/") + "/"}},
        "invocations": [invocation],
        "results": results,
        "properties": {"tilenest": {"kernels": [
            {"kernel": r.kernel, "target": r.target, "steps": list(r.steps),
             "summary": r.counts(), "notes": list(r.notes)} for r in reports]}},
    }
    return {"$schema": SCHEMA_URI, "version": VERSION, "runs": [run]}


def check_destination(path: str) -> None:
    """Raise a :class:`~tilenest.errors.UsageError` unless ``path`` names a
    file that can be written (checked before the obligations are discharged,
    so that a long check is not lost to a typo)."""
    hint = "give a file in an existing, writable directory, e.g. --sarif check.sarif"
    if path == "-":
        raise UsageError("--sarif -: the SARIF log goes to a file; standard output carries "
                         "the check's report", hint=hint)
    p = Path(path)
    if p.is_dir():
        raise UsageError(f"--sarif {path}: is a directory", hint=hint)
    parent = p.absolute().parent
    for q in (parent, *parent.parents):
        if q.exists():
            if not q.is_dir():
                raise UsageError(f"--sarif {path}: {q} is a file, not a directory", hint=hint)
            break
    if not parent.is_dir():
        raise UsageError(f"--sarif {path}: the directory {parent} does not exist", hint=hint)
    if not os.access(parent, os.W_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise UsageError(f"--sarif {path}: permission denied", hint=hint)


def write(doc: dict[str, Any], path: str) -> None:
    """Write ``doc`` as JSON to ``path``; failure is a UsageError naming ``--sarif``."""
    try:
        Path(path).write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    except OSError as e:
        raise UsageError(f"--sarif {path}: cannot write the SARIF log ({e.strerror or e})",
                         hint="give a file in an existing, writable directory") from None
