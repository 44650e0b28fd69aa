"""The docs site's view of ``spec/``: the specification files become pages
under ``spec/`` of the site, unchanged on disk, and hand-written pages can
include one section of a spec file.

What the hook guarantees (so ``mkdocs build --strict`` stays meaningful):

* every ``spec/*.md`` is a page ``spec/NAME.md`` of the site; its text is the
  file's, read at build time, so the site can never drift from the spec;
* a rule heading ``### X-n Title`` (``## O-n`` in obligations.md) gets the anchor ``x-n``, so the citation
  form of spec/README.md (``reductions.md#r-5``) is a working link;
* a relative link is resolved against the spec file it was written in: a link
  to another spec page becomes a link to that page (relative to the page it
  appears on), a link to a file outside the site (code, tests, the
  conformance cases) becomes its repository path in code text, so it neither
  breaks the build nor points nowhere; links inside code blocks are untouched;
* a line ``<!-- include: FILE "Heading" -->`` in a hand-written page is
  replaced by the section of ``spec/FILE`` under that heading, up to the next
  heading of the same or a higher level (headings inside code blocks do not
  count); an unknown file or heading is a build error, not an empty section.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "spec"
SITE_DIR = "spec"  # where the spec pages live inside the site

FENCE = re.compile(r"^\s*(```|~~~)")
LINK = re.compile(r"(?<!!)\[([^\]\n]*)\]\(([^)\s]+)\)")
RULE = re.compile(r"^(#{2,3} ([A-Z])-(\d+)\b[^\n{]*?)\s*$", re.M)
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*$")
INCLUDE = re.compile(r'^<!--\s*include:\s*(\S+)\s+"([^"]+)"\s*-->\s*$', re.M)


def spec_files() -> list[Path]:
    """The spec pages: the Markdown files directly in ``spec/``."""
    return sorted(SPEC.glob("*.md"))


def chunks(text: str) -> list[tuple[bool, str]]:
    """``text`` cut into (inside a fenced code block?, lines) runs, in order."""
    out: list[tuple[bool, list[str]]] = []
    fence: str | None = None
    for line in text.splitlines(keepends=True):
        m = FENCE.match(line)
        opens = fence is None and m is not None
        closes = fence is not None and m is not None and m.group(1) == fence
        code = fence is not None or opens
        if not out or out[-1][0] != code:
            out.append((code, []))
        out[-1][1].append(line)
        if opens:
            fence = m.group(1)  # type: ignore[union-attr]
        elif closes:
            fence = None
    return [(code, "".join(lines)) for code, lines in out]


def rewrite_links(text: str, source: Path, page_uri: str) -> str:
    """The links of ``text`` (written in ``source``) as seen from the site page
    ``page_uri``; see the module docstring."""
    page_dir = posixpath.dirname(page_uri)
    own = f"{SITE_DIR}/{source.relative_to(SPEC).as_posix()}"

    def one(m: re.Match) -> str:
        label, target = m.group(1), m.group(2)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, mailto: ...
            return m.group(0)
        path, _, anchor = target.partition("#")
        if not path:  # an anchor of the source file itself
            if own == page_uri:
                return m.group(0)
            return f"[{label}]({posixpath.relpath(own, page_dir)}#{anchor})"
        resolved = (source.parent / path).resolve()
        suffix = f"#{anchor}" if anchor else ""
        if resolved.parent == SPEC and resolved.suffix == ".md" and resolved.is_file():
            site = f"{SITE_DIR}/{resolved.name}"
            return f"[{label}]({posixpath.relpath(site, page_dir)}{suffix})"
        try:
            repo_path = resolved.relative_to(ROOT).as_posix()
        except ValueError:
            repo_path = path
        if label.strip("`") == repo_path:
            return f"`{repo_path}`"
        return f"{label} (`{repo_path}`)"

    return "".join(t if code else LINK.sub(one, t) for code, t in chunks(text))


def anchor_rules(text: str) -> str:
    """Rule headings with their citation anchor ``x-n`` (outside code blocks)."""
    return "".join(
        t if code else RULE.sub(lambda m: f"{m.group(1)} {{ #{m.group(2).lower()}-{m.group(3)} }}", t)
        for code, t in chunks(text))


def section(source: Path, title: str) -> str:
    """The section of ``source`` under the heading ``title``, heading included."""
    lines: list[str] = []
    level = 0
    for code, t in chunks(source.read_text(encoding="utf-8")):
        for line in t.splitlines(keepends=True):
            m = None if code else HEADING.match(line)
            if level and m and len(m.group(1)) <= level:
                return "".join(lines)
            if not level and m and m.group(2) == title:
                level = len(m.group(1))
            if level:
                lines.append(line)
    if not level:
        raise PluginError(f"include: no heading {title!r} in spec/{source.name}")
    return "".join(lines)


def expand_includes(markdown: str, page_uri: str) -> str:
    """Replace each include line of a hand-written page by its spec section."""

    def one(m: re.Match) -> str:
        source = SPEC / m.group(1)
        if not source.is_file():
            raise PluginError(f"{page_uri}: include of a missing spec file {m.group(1)!r}")
        return rewrite_links(anchor_rules(section(source, m.group(2))), source, page_uri)

    return INCLUDE.sub(one, markdown)


def on_files(files: Files, config) -> Files:  # noqa: ANN001  (mkdocs hook signature)
    """Add every spec file as the page ``spec/NAME.md``."""
    for f in spec_files():
        uri = f"{SITE_DIR}/{f.name}"
        if files.get_file_from_path(uri) is not None:
            raise PluginError(f"docs/{uri} would hide spec/{f.name}; remove it")
        files.append(File.generated(config, uri, abs_src_path=str(f)))
    return files


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ANN001
    """Spec pages: anchors and links; other pages: includes."""
    uri = page.file.src_uri
    if uri.startswith(f"{SITE_DIR}/"):
        source = SPEC / uri.removeprefix(f"{SITE_DIR}/")
        return rewrite_links(anchor_rules(markdown), source, uri)
    return expand_includes(markdown, uri)
