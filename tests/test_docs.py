"""The docs site (mkdocs.yml, docs/) and the README: the site builds with
warnings as errors, its API pages render docstrings as Markdown and document
what users call, and every Python code block of the hand-written pages and
of the README runs.

Pages under spec/ of the site are the spec files themselves; their examples
are run by tests/test_spec_examples.py and tests/test_interchange.py, so only
the blocks of docs/*.md and README.md are run here:

* a ```python block of docs/ runs on its own (a fresh namespace, a temporary
  working directory);
* the README's ```python blocks are one program: each runs after every
  earlier one, in one namespace (they build on each other, as its text does);
* a ```python block with ``title="test_NAME.py"`` is a pytest file: it is
  written under that name and run by pytest in a subprocess (the tilenest
  plugin loaded), and each of its test functions must pass;
* a ```sh block's lines of docs/ that start with ``tilenest`` run from the
  repository root and must exit 0.

Subprocesses of a block import the tilenest under test. A block is skipped
only when the line before its fence is ``<!-- docs-test: skip REASON -->``
with a non-empty reason; ``<!-- docs-test: device -->`` marks a block that
needs a GPU (the pytest marker ``device``: it runs with ``-m device``)."""

from __future__ import annotations

import html
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README = ROOT / "README.md"
BLOCK = re.compile(r"^(?:<!--\s*docs-test:\s*(?P<mark>skip|device)(?P<reason>[^\n]*?)-->\n)?"
                   r"```(?P<lang>[\w-]*)(?P<info>[^\n]*)\n(?P<code>.*?)^```\s*$", re.S | re.M)
TEST_FILE = re.compile(r'\btitle="(?P<file>test_\w+\.py)"')


@dataclass(frozen=True)
class Block:
    """One fenced code block: ``name`` is ``PAGE:LINE`` of its first line."""

    name: str
    lang: str
    code: str
    skip: str | None  # the reason of a skip marker
    device: bool
    test_file: str | None  # the file name of a pytest-file block


def pages() -> list[Path]:
    """The hand-written pages (the hook folder holds no pages)."""
    return sorted(p for p in DOCS.rglob("*.md") if "hooks" not in p.relative_to(DOCS).parts)


def read_blocks(page: Path, label: str) -> list[Block]:
    """The fenced blocks of one Markdown file, in order."""
    text = page.read_text(encoding="utf-8")
    out = []
    for m in BLOCK.finditer(text):
        line = text.count("\n", 0, m.start("code"))
        mark, reason = m.group("mark"), m.group("reason")
        title = TEST_FILE.search(m.group("info"))
        out.append(Block(f"{label}:{line}", m.group("lang"), m.group("code"),
                         reason.strip() if mark == "skip" else None, mark == "device",
                         title.group("file") if title else None))
    return out


def blocks(lang: str) -> list[tuple[str, str, str | None]]:
    """(id, code, skip reason or None) of every ``lang`` block of the docs pages
    (pytest-file blocks excepted)."""
    return [(b.name, b.code, b.skip) for page in pages()
            for b in read_blocks(page, page.relative_to(DOCS).as_posix())
            if b.lang == lang and b.test_file is None]


def _param(b: Block, *values: object) -> object:
    return pytest.param(*values, id=b.name, marks=[pytest.mark.device] if b.device else [])


DOC_BLOCKS = [b for page in pages() for b in read_blocks(page, page.relative_to(DOCS).as_posix())]
README_BLOCKS = read_blocks(README, "README.md")
PYTHON = blocks("python")
README_PYTHON = [b for b in README_BLOCKS if b.lang == "python" and b.test_file is None]
TEST_FILES = [b for b in DOC_BLOCKS + README_BLOCKS if b.lang == "python" and b.test_file]
SHELL = [(name, line.split("#")[0].strip(), reason)
         for name, code, reason in blocks("sh")
         for line in code.splitlines() if line.startswith("tilenest ")]
HAS_MKDOCS = all(importlib.util.find_spec(m) for m in ("mkdocs", "material", "mkdocstrings"))


def _block_env(tmp: Path) -> dict[str, str]:
    """The environment of a block's subprocesses: this checkout's tilenest
    first on the path, a private cache, and pytest plugins loaded as an
    installed tilenest would have them."""
    env = {**os.environ, "TILENEST_CACHE_DIR": str(tmp / "cache"),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                        os.environ.get("PYTHONPATH")]))}
    env.pop("PYTEST_DISABLE_PLUGIN_AUTOLOAD", None)
    return env


def test_blocks_found_and_skips_give_a_reason():
    assert len(PYTHON) >= 8 and len(SHELL) >= 3
    assert len(README_PYTHON) >= 4 and len(TEST_FILES) >= 2
    for name, _, reason in PYTHON + SHELL:
        assert reason is None or reason, f"{name}: a skipped block must say why"
    for b in README_BLOCKS + DOC_BLOCKS:
        assert b.skip is None or b.skip, f"{b.name}: a skipped block must say why"


# ---------------------------------------------------------------------------- the site
NAV_PAGE = re.compile(r"^\s*-\s+(?:[^:\n]+:\s+)?(?P<page>[\w./-]+\.md)\s*$", re.M)


def test_every_page_of_the_nav_exists():
    """Without mkdocs installed this is what can be checked of the nav: a page
    is a file of docs/, or (under spec/) a file of spec/ that the hook adds."""
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8").split("\nnav:", 1)[1]
    listed = NAV_PAGE.findall(nav)
    assert "api.md" in listed and "testing.md" in listed
    for page in listed:
        path = ROOT / page if page.startswith("spec/") else DOCS / page
        assert path.is_file(), f"mkdocs.yml lists {page}, which does not exist"


def test_make_docs_installs_only_the_docs_extra(tmp_path):
    """``make docs`` in a fresh checkout installs tilenest with its ``docs``
    extra and nothing else (not the test or cuda extras of ``make test``)."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    r = subprocess.run(["make", "-n", "docs", f"VENV={tmp_path / 'venv'}"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    installs = [line for line in r.stdout.splitlines() if " install " in line]
    extras = {x.strip() for line in installs for group in re.findall(r"\.\[([^\]]*)\]", line)
              for x in group.split(",")}
    assert extras == {"docs"}, r.stdout
    assert "mkdocs build --strict" in r.stdout


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The site, built once with ``--strict``."""
    if not HAS_MKDOCS:
        pytest.skip("mkdocs, mkdocs-material or mkdocstrings is not installed "
                    "(pip install -e '.[docs]')")
    out = tmp_path_factory.mktemp("docs") / "site"
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet",
                        "--config-file", str(ROOT / "mkdocs.yml"), "--site-dir", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=180,
                       env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert r.returncode == 0, r.stdout + r.stderr
    return out


def test_site_builds_strict(site):
    for page in ("index.html", "getting-started/index.html", "spec/values/index.html",
                 "spec/obligations/index.html", "targets/llvm/index.html",
                 "targets/cuda/index.html", "api/index.html", "testing/index.html"):
        assert (site / page).is_file(), page
    # rule anchors and included spec sections are there
    assert 'id="v-1"' in (site / "spec/values/index.html").read_text()
    assert "The LLVM backend" in (site / "targets/llvm/index.html").read_text()
    assert "The external protocol" in (site / "testing/index.html").read_text()


def _prose(html: str) -> str:
    """A page's HTML without its code blocks (where any text may stand)."""
    return re.sub(r"<pre\b.*?</pre>", "", html, flags=re.S)


def html_text(page: str) -> str:
    """The text a reader sees on a page."""
    return html.unescape(re.sub(r"<[^>]+>", "", page))


SPHINX = re.compile(r":(?:func|class|meth|mod|attr|data|exc|obj):(?:`|<code>)|::</p>")


def test_rendered_pages_show_no_sphinx_markup(site):
    """Docstrings are rendered as Markdown: no ``:func:`x``` role and no
    ``::`` literal marker is left as text on any page."""
    for page in sorted(site.rglob("*.html")):
        found = SPHINX.findall(_prose(page.read_text(encoding="utf-8")))
        assert not found, f"{page.relative_to(site)}: raw Sphinx markup {found[:5]}"


#: what users call, each documented on the API pages (id: its anchor)
DOCUMENTED = {
    "api": ["tilenest.interpret", "tilenest.reference", "tilenest.interpreter.oracle.Admitted",
            "tilenest.interpreter.oracle.Admitted.admits", "tilenest.interpreter.oracle.Verdict",
            "tilenest.Kernel.compile", "tilenest.parse", "tilenest.parse_module",
            "tilenest.lowering.Schedule", "tilenest.proofs.transform",
            "tilenest.proofs.transform.split", "tilenest.proofs.remap.Transformed.result",
            "tilenest.validate", "tilenest.validation.inputs.generate",
            "tilenest.validation.fuzz.specs", "tilenest.validation.fuzz.check_spec",
            "tilenest.tune", "tilenest.backends.cuda.tune.TuneReport", "tilenest.clear_cache",
            "tilenest.errors.TilenestError"],
    "testing": ["tilenest.conformance.run_suite", "tilenest.conformance.External",
                "tilenest.pytest_plugin.Oracle.admitted", "tilenest.pytest_plugin.admitted",
                "tilenest.pytest_plugin.tilenest_oracle",
                "tilenest.pytest_plugin.AdmittedOutputs.admits"],
}

#: internals the API pages once rendered, which users never call
INTERNAL = ["tilenest.diskcache.check_stat", "tilenest.diskcache.atomic_write",
            "tilenest.diskcache.Store", "tilenest.backends.kernelcache.kernel_key",
            "tilenest.backends.kernelcache.source_digest", "tilenest.lowering.Schedule.key",
            "tilenest.Kernel.bind_arguments", "tilenest.errors.user_site"]


def test_api_pages_document_what_users_call(site):
    for page, ids in DOCUMENTED.items():
        text = (site / page / "index.html").read_text(encoding="utf-8")
        for ident in ids:
            assert f'id="{ident}"' in text, f"{page}: {ident} is not documented"
    testing = html_text((site / "testing" / "index.html").read_text(encoding="utf-8"))
    for words in ("--impl", '"unsupported"', "--lf", "tilenest-conformance::memory",
                  "--tilenest-impl"):
        assert words in testing, f"the testing page does not explain {words}"


def test_api_pages_leave_internals_out(site):
    html = "".join((site / page / "index.html").read_text(encoding="utf-8")
                   for page in DOCUMENTED)
    for ident in INTERNAL:
        assert f'id="{ident}"' not in html, f"{ident} is an internal"


def _griffe_roles():
    pytest.importorskip("griffe")
    spec = importlib.util.spec_from_file_location("griffe_roles",
                                                  DOCS / "hooks" / "griffe_roles.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_docstring_roles_become_markdown():
    md = _griffe_roles().markdown
    assert md("See :func:`parse_module` and :class:`~tilenest.conformance.Report`.") == \
        "See `parse_module` and `Report`."
    assert md(":ref:`the protocol <external>` and :meth:`Oracle.admitted`") == \
        "`the protocol` and `Oracle.admitted`"
    # a literal block: its marker becomes a colon, its code is left alone
    assert md("So a test says::\n\n    f(:func:`x`)\n\nThen.") == \
        "So a test says:\n\n    f(:func:`x`)\n\nThen."
    assert md("Text\n::\n\n    code\n") == "Text\n\n    code\n"
    # a '::' not followed by an indented block is not a marker
    assert md("a ratio 1::2 here") == "a ratio 1::2 here"


# -------------------------------------------------------------------------- the blocks
@pytest.mark.parametrize("name,code,reason", PYTHON, ids=[b[0] for b in PYTHON])
def test_python_block(name, code, reason, tmp_path, monkeypatch):
    if reason is not None:
        pytest.skip(reason)
    src = tmp_path / (re.sub(r"\W", "_", name) + ".py")
    src.write_text(code)
    monkeypatch.chdir(tmp_path)
    for k, v in _block_env(tmp_path).items():
        monkeypatch.setenv(k, v)
    exec(compile(code, str(src), "exec"), {"__name__": "docs_block", "__file__": str(src)})


class ReadmeProgram:
    """The README's Python blocks as one program, run as far as a test needs:
    every earlier block that is neither skipped nor device-only first, once,
    in one namespace and one working directory."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.ns: dict[str, object] = {"__name__": "readme"}
        self.ran: set[int] = set()
        self.broken: str | None = None

    def run_through(self, index: int) -> None:
        for i, b in enumerate(README_PYTHON[:index + 1]):
            if i in self.ran or (i < index and (b.skip is not None or b.device)):
                continue
            if self.broken is not None:
                pytest.fail(f"an earlier README block failed: {self.broken}")
            src = self.folder / f"readme_{i}.py"
            src.write_text(b.code)
            with pytest.MonkeyPatch.context() as mp:
                mp.chdir(self.folder)
                for k, v in _block_env(self.folder).items():
                    mp.setenv(k, v)
                try:
                    exec(compile(b.code, str(src), "exec"), self.ns)
                except BaseException:
                    self.broken = b.name
                    raise
            self.ran.add(i)


@pytest.fixture(scope="module")
def readme(tmp_path_factory):
    return ReadmeProgram(tmp_path_factory.mktemp("readme"))


@pytest.mark.parametrize("index,reason", [_param(b, i, b.skip)
                                          for i, b in enumerate(README_PYTHON)])
def test_readme_block(index, reason, readme):
    if reason is not None:
        pytest.skip(reason)
    readme.run_through(index)


@pytest.mark.parametrize("block", [_param(b, b) for b in TEST_FILES])
def test_pytest_file_block(block, tmp_path):
    """A block titled ``test_NAME.py`` passes under pytest, every test of it."""
    if block.skip is not None:
        pytest.skip(block.skip)
    (tmp_path / block.test_file).write_text(block.code)
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        block.test_file], cwd=tmp_path, capture_output=True, text=True,
                       timeout=300, env=_block_env(tmp_path))
    tests = len(re.findall(r"^def test_\w+\(", block.code, re.M))
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"{tests} passed" in r.stdout, r.stdout


@pytest.mark.parametrize("name,command,reason", SHELL, ids=[f"{b[0]}:{b[1]}" for b in SHELL])
def test_shell_command(name, command, reason, tmp_path):
    if reason is not None:
        pytest.skip(reason)
    exe = Path(sys.executable).with_name("tilenest")
    argv = [str(exe) if exe.exists() else "tilenest", *shlex.split(command)[1:]]
    r = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env=_block_env(tmp_path))
    assert r.returncode == 0, f"{command}: exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert r.stdout.strip(), f"{command} printed nothing"
