"""Docstrings as Markdown for the API pages (a Griffe extension, loaded by the
mkdocstrings handler of mkdocs.yml).

tilenest's docstrings are written for ``help()`` and Sphinx habits: they name
other objects with roles (``:func:`parse_module```, ``:class:`~a.b.Report```)
and introduce a code sample with a paragraph ending in ``::``. Markdown knows
neither, so a page rendered from them would show the roles and the double
colon as raw text. Before the pages are rendered, every docstring of the
loaded packages is rewritten:

* a role becomes the code span of its target: ``:func:`parse_module``` ->
  `` `parse_module` ``; ``~a.b.C`` keeps the last name (``C``), as Sphinx
  shows it; ``:ref:`title <target>``` keeps the title;
* a line ending in ``::`` before an indented block ends in ``:`` (the
  indented block is already a Markdown code block), and a line holding only
  ``::`` is dropped.

Field lists (``:param x:``, ``:returns:``) are left to the Sphinx docstring
parser, which renders them as tables. Code blocks (fenced or indented) are
not rewritten.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:func|class|meth|mod|attr|data|exc|obj|const|ref|term)"
                  r":`(?P<target>[^`]+)`")
LITERAL = re.compile(r"(?<=\S)::\s*$")


def role_text(target: str) -> str:
    """What a role shows: its title, or its target (the last name under ``~``)."""
    m = re.fullmatch(r"(?P<title>.*?)\s*<(?P<ref>[^>]+)>", target.strip())
    if m and m.group("title"):
        return m.group("title")
    target = target.strip()
    if target.startswith("~"):
        return target[1:].rsplit(".", 1)[-1]
    return target.lstrip("!")


def markdown(doc: str) -> str:
    """``doc`` with its roles and literal markers in Markdown (see above)."""
    lines = doc.split("\n")
    out: list[str] = []
    fence = False
    literal: int | None = None  # the indent of the line that opened a '::' block
    for i, line in enumerate(lines):
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        if literal is not None:
            if not stripped or indent > literal:
                out.append(line)
                continue
            literal = None
        if stripped.startswith(("```", "~~~")):
            fence = not fence
        if fence or stripped.startswith(("```", "~~~")):
            out.append(line)
            continue
        following = next((x for x in lines[i + 1:] if x.strip()), "")
        opens = stripped.endswith("::") and (len(following) - len(following.lstrip())) > indent
        if opens:
            literal = indent
            if stripped == "::":
                continue
            line = LITERAL.sub(":", line)
        out.append(ROLE.sub(lambda m: f"`{role_text(m.group('target'))}`", line))
    return "\n".join(out)


class MarkdownDocstrings(griffe.Extension):
    """Rewrite every docstring of a loaded object with :func:`markdown`."""

    def on_object(self, *, obj: Any, **kwargs: Any) -> None:
        if obj.is_alias or obj.docstring is None:
            return
        obj.docstring.value = markdown(obj.docstring.value)
