"""The router is layered one way, drawn from its code: every router/*.py file is parsed (imports inside
functions count too) and each import of another router module is an arrow between files, and between
the rooms they sit in.

    main (router/__main__.py) -> http -> dispatch -> kv -> fleet -> grpc,   every room -> common

`http` is the HTTP API and the service its handlers share; `dispatch` runs a request on a P/D pair;
`kv` is the KV index; `fleet` is the worker registry (both dispatch and kv read it); `grpc` is the
Generate client; `common` is router/errors.py and router/metrics.py. A room may reach past the one
below it (http/app.py builds the KV index and the worker pool), never back up: so no room calls the
one above it, and no file imports itself around a circle. HTTP's own objects (Starlette, FastAPI)
stay in http/: nothing below it gets a Request."""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
ROUTER = ROOT / "router"

# Rooms from the top: a file may import its own room's files and those of any room after it.
LAYERS = ("main", "http", "dispatch", "kv", "fleet", "grpc", "common")
HTTP_FRAMEWORKS = ("starlette", "fastapi")


def _module(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _room(module: str) -> str:
    parts = module.split(".")
    if parts == ["router", "__main__"]:
        return "main"
    if len(parts) > 2 or (ROUTER / parts[-1]).is_dir():  # router.<room>.<file>, or the room's package
        return parts[1]
    return "common"  # router/errors.py, router/metrics.py, router/__init__.py


def _imports(path: pathlib.Path, module: str) -> set[str]:
    """Every module name `path` imports (`from a import b` also names a.b, which may be a module)."""
    out: set[str] = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package up
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            out.add(base)
            out.update(f"{base}.{alias.name}" for alias in node.names)
    return out


def _graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(router module -> the router modules it imports, router module -> every module it imports)."""
    files = {_module(p): p for p in sorted(ROUTER.rglob("*.py"))}
    every = {m: _imports(p, m) for m, p in files.items()}
    inside = {m: {name for name in names if name in files and name != m} for m, names in every.items()}
    return inside, every


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle through each strongly connected group of more than one node (or a node importing itself)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm; the router's graph is a few dozen files deep at most
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1 or v in graph.get(v, ()):
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _room_arrows(inside: dict[str, set[str]]) -> dict[tuple[str, str], list[str]]:
    """(from room, to room) -> the file imports that draw it (between different rooms only)."""
    arrows: dict[tuple[str, str], list[str]] = {}
    for src, targets in inside.items():
        for dst in targets:
            if _room(src) != _room(dst):
                arrows.setdefault((_room(src), _room(dst)), []).append(f"{src} -> {dst}")
    return arrows


def test_every_router_file_sits_in_a_known_room():
    inside, _ = _graph()
    rooms = {_room(m) for m in inside}
    assert rooms <= set(LAYERS), f"router modules outside the known rooms: {rooms - set(LAYERS)}"
    # the graph is the router's real one: the rooms are all there, with the arrows the layering names
    assert rooms == set(LAYERS)
    assert {("http", "dispatch"), ("dispatch", "kv"), ("dispatch", "grpc"), ("dispatch", "fleet"),
            ("kv", "fleet")} <= set(_room_arrows(inside))


def test_rooms_import_only_downward():
    inside, _ = _graph()
    rank = {room: i for i, room in enumerate(LAYERS)}
    upward = {arrow: files for arrow, files in _room_arrows(inside).items() if rank[arrow[0]] > rank[arrow[1]]}
    assert not upward, f"imports against the layering {' -> '.join(LAYERS)}: {upward}"


def test_no_room_level_loops():
    arrows = set(_room_arrows(_graph()[0]))
    for pair in (("http", "dispatch"), ("dispatch", "kv"), ("kv", "fleet"), ("dispatch", "fleet")):
        assert not (pair in arrows and pair[::-1] in arrows), f"{pair[0]} and {pair[1]} import each other"
    rooms: dict[str, set[str]] = {}
    for src, dst in arrows:
        rooms.setdefault(src, set()).add(dst)
    assert _circles(rooms) == []


def test_no_file_level_import_circles():
    inside, _ = _graph()
    assert _circles(inside) == [], "router files that import each other around a circle"


def test_circles_are_found_where_there_are_some():
    """The circle finder itself: a loop of three, a self-import, and a DAG with a shared node."""
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"a"}}) == [["a"]]
    assert _circles({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []


def test_only_the_http_room_imports_the_http_frameworks():
    _, every = _graph()
    outside = {m: sorted(n for n in names if n.split(".")[0] in HTTP_FRAMEWORKS)
               for m, names in every.items() if _room(m) != "http"}
    outside = {m: names for m, names in outside.items() if names}
    assert not outside, f"Starlette/FastAPI below router/http/: {outside}"
    assert any(n.split(".")[0] in HTTP_FRAMEWORKS for n in every["router.http.app"])  # the check sees them


def test_no_router_file_over_400_lines():
    """One concept per file: a router file past 400 lines is split by concept (as kv/holders.py left kv/index.py)."""
    long = {str(p.relative_to(ROOT)): n for p in sorted(ROUTER.rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > 400}
    assert not long, f"router files over 400 lines: {long}"
