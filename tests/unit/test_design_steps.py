"""docs/design.md and docs/structure.md name the functions that do each step of a request: every
`Name` or `Class.method` written right before the file it lives in, as in
"`DecodeWorker.run` (`decode_node/worker.py`)", is defined there (a renamed or moved function
fails here, not in a newcomer's search)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = tuple(f"docs/{name}.md" for name in ("design", "structure"))
CITE = re.compile(r"`([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)?)(?:\(\))?` \(((?:`(?:[\w-]+/)+[\w-]+\.py`(?:,\s*)?)+)")
PATH = re.compile(r"`([\w/-]+\.py)`")


def citations() -> list[tuple[str, str, str]]:
    """(doc, name, paths): a name and the file or files it is cited in, "a.py, b.py"."""
    out = []
    for doc in DOCS:
        text = (ROOT / doc).read_text()
        out += [(doc, name, ", ".join(PATH.findall(paths))) for name, paths in CITE.findall(text)]
    return out


def defined(path: Path) -> set[str]:
    """Top-level functions, classes and assignments, and Class.method / Class.attribute."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    names.add(f"{node.name}.{item.name}")
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    names.add(f"{node.name}.{item.target.id}")
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def test_the_docs_cite_enough_steps_to_check():
    assert len(citations()) >= 10


@pytest.mark.parametrize("doc, name, paths", citations())
def test_each_cited_function_is_defined_where_the_doc_says(doc, name, paths):
    files = [ROOT / p for p in paths.split(", ")]
    missing = [str(f.relative_to(ROOT)) for f in files if not f.is_file()]
    assert not missing, f"{doc}: `{name}` cited in {missing}, which do not exist"
    assert any(name in defined(f) for f in files), f"{doc}: `{name}` is not defined in {paths}"


PACKAGES = ("engine", "pdorch", "prefill_node", "decode_node", "router", "store_client")
METHOD = re.compile(r"`([A-Z]\w*\.[a-z_]\w*)(?:\(\))?`")


def test_each_cited_method_exists_somewhere():
    """`Class.method` cited without its file (as "`RouterService.make_job`") names a real method."""
    everywhere = set()
    for package in PACKAGES:
        for f in (ROOT / package).rglob("*.py"):
            everywhere |= defined(f)
    cited = {(doc, m) for doc in DOCS for m in METHOD.findall((ROOT / doc).read_text())}
    assert len(cited) >= 10
    missing = sorted(f"{doc}: `{m}`" for doc, m in cited if m not in everywhere)
    assert not missing, missing
