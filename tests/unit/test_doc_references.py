"""Every pointer to a doc names a file in this repository, and every cited section exists.

A newcomer follows "see docs/workers.md, "Fencing D's pages"" or "docs/design.md section 4": a
pointer to a file that is not in the tree, or to a heading that was renamed, costs them the trail.
Forms checked, in `*.py` files, `docs/*.md` and README.md:

    name.md                       docs/name.md or ./name.md exists
    name.md, "Title"  name.md ("Title")  name.md: "Title"     a heading of it starts with Title
    name.md section 4a                                          a heading of it starts with "4a."
    [text](name.md#anchor)                                      a heading of it has that anchor
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SKIP_DIRS = {".venv", ".git", "node_modules", "build", "dist", "__pycache__"}
# Docs of other projects that pdorch's comments cite by their own names (not files of this repo).
EXTERNAL = ("PROTOCOL-HTTP2.md",)
# Maps kept outside the repository once; nothing may point at them any more.
GONE = ("DESIGN" + ".md", "mooncake" + ".md", "FIND" + "INGS")

DOC = r"(?<![\w./-])(?:docs/)?([A-Za-z0-9_-]+\.md)"
SECTION_QUOTED = re.compile(DOC + r"\)?[,:]?\s*\(?(?:section\s+)?\"([^\"]+)\"")
SECTION_NUMBER = re.compile(DOC + r",?\s+sections?\s+(\d+[a-z]?)\b")
ANCHOR = re.compile(r"\]\((?:docs/)?([A-Za-z0-9_-]+\.md)#([A-Za-z0-9_-]+)\)")
FILE = re.compile(DOC)


def sources() -> list[Path]:
    found = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for path in sorted(ROOT.rglob("*.py")):
        if not SKIP_DIRS.intersection(path.relative_to(ROOT).parts):
            found.append(path)
    return found


def doc_path(name: str) -> Path | None:
    for candidate in (ROOT / "docs" / name, ROOT / name):
        if candidate.is_file():
            return candidate
    return None


def headings(path: Path) -> list[str]:
    return [line.lstrip("#").strip().replace("`", "") for line in path.read_text().splitlines()
            if line.startswith("#")]


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to dashes."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def problems(text: str, name: str) -> list[str]:
    """What is wrong with the pointers in `text` (the content of file `name`)."""
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        where = f"{name}:{n}"
        for gone in GONE:
            if gone in line:
                out.append(f"{where}: points at {gone}, which is not in the repository")
        for m in FILE.finditer(line):
            if m.group(1) not in EXTERNAL + GONE and doc_path(m.group(1)) is None:
                out.append(f"{where}: {m.group(1)} does not exist")
        for m in SECTION_QUOTED.finditer(line):
            doc = doc_path(m.group(1))
            title = m.group(2).replace("`", "").strip().lower()
            if doc and not any(h.lower().startswith(title) for h in headings(doc)):
                out.append(f"{where}: {m.group(1)} has no section \"{m.group(2)}\"")
        for m in SECTION_NUMBER.finditer(line):
            doc = doc_path(m.group(1))
            if doc and not any(h.startswith(m.group(2) + ".") for h in headings(doc)):
                out.append(f"{where}: {m.group(1)} has no section {m.group(2)}")
        for m in ANCHOR.finditer(line):
            doc = doc_path(m.group(1))
            if doc and m.group(2) not in {anchor(h) for h in headings(doc)}:
                out.append(f"{where}: {m.group(1)} has no anchor #{m.group(2)}")
    return out


def test_every_cited_doc_and_section_exists():
    found = [p for path in sources() if path != Path(__file__).resolve()
             for p in problems(path.read_text(errors="replace"), str(path.relative_to(ROOT)))]
    assert not found, "\n".join(found)


@pytest.mark.parametrize("text, expected", [
    ('see docs/workers.md, "Fencing D\'s pages"', []),
    ('see docs/workers.md, "No such heading"', ['has no section "No such heading"']),
    ("docs/design.md section 4", []),
    ("docs/design.md section 12", ["has no section 12"]),
    ("[x](operations.md#a-decode-worker-dies-mid-stream)", []),
    ("[x](operations.md#nowhere)", ["has no anchor #nowhere"]),
    ("docs/nothing_here.md", ["nothing_here.md does not exist"]),
    ("DESIGN" + ".md section 3", ["not in the repository"]),
])
def test_the_checker_catches_what_it_should(text, expected):
    found = problems(text, "probe")
    assert len(found) == len(expected), found
    for got, want in zip(found, expected):
        assert want in got, (got, want)
