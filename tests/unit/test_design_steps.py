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


# ---------------------------------------------------------------- every file and symbol design.md names
# A path (`router/http/hot_path.py`, backticked or in the layout block) is a file of the repository; a
# bare file name (`drain.py`) is one somewhere in it. A symbol (`PrefixRead`, `Dispatcher._pick`,
# `engine.page_allocator.pages_for`) is defined where the doc says: in a file named in the same
# paragraph or list item when it names any that define it, so "`PrefixRead` (... `decode_node/messages.py`)"
# fails when PrefixRead lives elsewhere; a proto message (`Grammar`, `SamplingParams.resumed_tokens`) in proto/.
DESIGN = "docs/design.md"
ANY_PY = re.compile(r"(?<![\w./-])((?:[\w-]+/)*[\w-]+\.py)\b")
SYMBOL = re.compile(r"`([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)(?:\(\))?`")
CAMEL = re.compile(r"[A-Z][A-Z0-9]*[a-z]\w*")  # a class: `PromptKV`, `HotCycle` (not `KEY`, `NOTE`)
PROTO_MESSAGE = re.compile(r"^\s*(?:message|service|enum)\s+(\w+)\s*\{(.*?)^\}", re.DOTALL | re.MULTILINE)
PROTO_RPC = re.compile(r"^\s*rpc\s+(\w+)\s*\(", re.MULTILINE)
# Other projects' names the doc uses as they spell them.
FOREIGN = {"TransferEngine"}  # Mooncake's


def _proto_names() -> dict[str, str]:
    """Messages, services and enums (-> their bodies) and RPCs (-> "") of proto/."""
    out: dict[str, str] = {}
    for f in sorted((ROOT / "proto").rglob("*.proto")):
        text = f.read_text()
        out |= {m.group(1): m.group(2) for m in PROTO_MESSAGE.finditer(text)}
        out |= {name: "" for name in PROTO_RPC.findall(text)}
    return out


def _blocks(text: str) -> list[str]:
    """Paragraphs and list items: what a symbol's file is looked for in."""
    out, cur = [], []
    for line in text.splitlines():
        starts_item = re.match(r"\s*(?:[-*]|\d+[a-z]?\.)\s", line) is not None
        if not line.strip() or starts_item:
            if cur:
                out.append("\n".join(cur))
            cur = [line] if line.strip() else []
        else:
            cur.append(line)
    if cur:
        out.append("\n".join(cur))
    return out


def _py_files() -> dict[str, list[Path]]:
    by_name: dict[str, list[Path]] = {}
    for f in ROOT.rglob("*.py"):
        if not {".venv", ".git", "__pycache__", "build"}.intersection(f.relative_to(ROOT).parts):
            by_name.setdefault(f.name, []).append(f)
    return by_name


def design_problems(text: str) -> list[str]:
    """What is false in `text` (design.md's content): files that do not exist, symbols not defined
    where it says."""
    out: list[str] = []
    by_name = _py_files()
    proto = _proto_names()
    cache: dict[Path, set[str]] = {}

    def names_in(f: Path) -> set[str]:
        if f not in cache:
            cache[f] = defined(f)
        return cache[f]

    everywhere = None
    blocks = _blocks(text)
    paths = []  # per block: the files it names that exist
    for block in blocks:
        files = []
        for rel in dict.fromkeys(ANY_PY.findall(block)):
            if "/" in rel:
                f = ROOT / rel
                if not f.is_file():
                    out.append(f"{rel} does not exist")
                    continue
                files.append(f)
            elif rel not in by_name:
                out.append(f"{rel} is not a file of the repository")
        paths.append(files)
    for i, block in enumerate(blocks):
        # NOTE: a step of a walk may name a symbol of the step before or after it ("-> `x.py`: ... waits in `X.wait`")
        files = list(dict.fromkeys(f for j in (i - 1, i, i + 1) if 0 <= j < len(blocks) for f in paths[j]))
        for sym in dict.fromkeys(SYMBOL.findall(block)):
            parts = sym.split(".")
            if parts[0] in PACKAGES and len(parts) >= 3:  # module.path.symbol
                module = ROOT.joinpath(*parts[:-1]).with_suffix(".py")
                if not module.is_file():
                    out.append(f"`{sym}`: {module.relative_to(ROOT)} does not exist")
                elif parts[-1] not in names_in(module):
                    out.append(f"`{sym}`: {parts[-1]} is not defined in {module.relative_to(ROOT)}")
                continue
            if not CAMEL.fullmatch(parts[0]) or len(parts) > 2 or parts[0] in FOREIGN:
                continue  # a config key, a field, a Mooncake call: not a symbol of ours
            if parts[0] in proto:
                if len(parts) == 2 and not re.search(rf"\b{parts[1]}\s*=", proto[parts[0]]):
                    out.append(f"`{sym}`: the proto message {parts[0]} has no field {parts[1]}")
                continue
            if any(sym in names_in(f) for f in files):
                continue
            if files and any(parts[0] in names_in(f) for f in files):
                out.append(f"`{sym}` is not defined in {', '.join(str(f.relative_to(ROOT)) for f in files)}")
                continue
            if everywhere is None:
                everywhere = {}
                for package in PACKAGES:
                    for f in (ROOT / package).rglob("*.py"):
                        for name in names_in(f):
                            everywhere.setdefault(name, []).append(f)
            homes = everywhere.get(sym)
            if homes is None:
                out.append(f"`{sym}` is defined nowhere")
            elif files:
                out.append(f"`{sym}` is cited with {', '.join(str(f.relative_to(ROOT)) for f in files)} "
                           f"but lives in {', '.join(str(h.relative_to(ROOT)) for h in homes)}")
    return out


def test_every_file_and_symbol_design_md_names_is_where_it_says():
    found = design_problems((ROOT / DESIGN).read_text())
    assert not found, "\n".join(found)


def test_every_path_structure_md_names_exists():
    """structure.md names paths from the root or from its list item's package (`fixtures/netns.py` in tests/)."""
    text = (ROOT / "docs/structure.md").read_text()
    files = {str(f.relative_to(ROOT)) for fs in _py_files().values() for f in fs}
    missing = sorted({p for p in ANY_PY.findall(text) if "/" in p
                      and p not in files and not any(f.endswith("/" + p) for f in files)})
    assert not missing, missing


@pytest.mark.parametrize("text, expected", [
    ("the scheduler (`decode_node/scheduler.py`) posts `PrefixRead`", ["is cited with decode_node/scheduler.py"]),
    ("tags (`decode_node/messages.py`): `PrefixRead`", ["but lives in decode_node/prefix_load.py"]),
    ("`PrefixRead` (`decode_node/prefix_load.py`)", []),
    ("see `decode_node/no_such_file.py`", ["does not exist"]),
    ("see no_such_file.py", ["not a file of the repository"]),
    ("`NoSuchClass` does it", ["defined nowhere"]),
    ("`DecodeWorker.no_such_method` (`decode_node/worker.py`)", ["is not defined in decode_node/worker.py"]),
    ("`engine.page_allocator.pages_for`", []),
    ("`engine.page_allocator.no_such`", ["is not defined in engine/page_allocator.py"]),
    ("`SamplingParams.resumed_tokens`, `Grammar`", []),
    ("`SamplingParams.no_such_field`", ["has no field no_such_field"]),
])
def test_the_design_checker_catches_what_it_should(text, expected):
    found = design_problems(text)
    assert len(found) == len(expected), found
    for got, want in zip(found, expected):
        assert want in got, (got, want)
