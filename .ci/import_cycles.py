"""Report import cycles among xlaunch's own modules, lazy (function-level) imports included.

Every ``import`` and ``from ... import`` statement anywhere in a module's source counts, at
module level or inside a function, class or ``if TYPE_CHECKING:`` block: a lazy import still
ties two modules together, and a cycle through one only waits for the first call that closes
it. ``models/`` is reached as ``launcher.models`` (pyproject.toml says why). An import names
its target module: ``from launcher.sharding import options`` is an edge to ``launcher.sharding.options``
when that is a module, else to the package ``launcher.sharding``. A package's own ``__init__`` is
not an edge of every import beneath it (Python already holds a package that is importing).

The folders are checked too: no loop between folders, each folder's modules taken together (a
folder is a package; its own loose modules are one node, its subfolders others). An edge between
a package's loose modules and its subfolders does not count: they are shared by the subfolders
(``launcher/errors.py``, ``launcher/sharding/apply.py``) or sit on top of them
(``launcher/sharding/pipeline.py``). A loop between two folders means neither can be read, tested
or replaced without the other (``profile/`` once imported ``ilp/``, which imported ``profile/``).

Run from the repository's top: ``python .ci/import_cycles.py``. Prints each cycle found (one
line, the modules or folders in import order) and exits 1 when there is one, else prints nothing
and exits 0.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Source trees and the dotted prefix each is imported under.
TREES = {"launcher": "launcher", "models": "launcher.models"}


def modules() -> dict[str, Path]:
    """Every module of the package, by dotted name (a package by its own name)."""
    found = {}
    for tree, prefix in TREES.items():
        for path in sorted((ROOT / tree).rglob("*.py")):
            rel = path.relative_to(ROOT / tree).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            # launcher/models and launcher/conf are links into the trees above.
            if tree == "launcher" and parts and parts[0] in ("models", "conf"):
                continue
            found[".".join([prefix, *parts])] = path
    return found


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    """The longest known module that ``name`` is, or lies in."""
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


def imports(module: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The modules of ours that ``module`` imports, anywhere in its source."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base]) if base else ".".join(anchor)
            # `from pkg import mod` imports the module pkg.mod; `from mod import name` imports mod.
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                     for alias in node.names]
        else:
            continue
        for name in names:
            if name.startswith("models."):
                name = "launcher." + name
            target = _resolve(name, known)
            if target is not None and target != module:
                targets.add(target)
    return targets


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle for each strongly connected component with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_one_cycle(graph, set(c), c[0]) for c in components]


def _one_cycle(graph: dict[str, set[str]], members: set[str], start: str) -> list[str]:
    """A shortest cycle through ``start`` inside one strongly connected component."""
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & members):
                if w == start:
                    return paths[v] + [start]
                if w not in paths:
                    paths[w] = paths[v] + [w]
                    nxt.append(w)
        frontier = nxt
    return [start]


# Module imports that close a loop between folders, left for issue 46's point 4 (the launch side
# layered: runtime/ taking what it needs from its callers rather than importing clusters/ and the
# modes' table). Each is reported once it is gone, so that its line goes too.
PENDING = {
    ("launcher.runtime.requeue", "launcher.clusters.base"),
    ("launcher.runtime.task", "launcher.modes"),
}


def folder_of(module: str, known: dict[str, Path]) -> str:
    """The folder (package) a module lies in; a package's ``__init__`` is its own folder's."""
    return module if known[module].name == "__init__.py" else module.rpartition(".")[0]


def folder_graph(graph: dict[str, set[str]], known: dict[str, Path]) -> dict[str, set[str]]:
    """Folder -> the folders its modules import, neither holding the other (the module's doc)."""
    out: dict[str, set[str]] = {folder_of(m, known): set() for m in graph}
    for m, targets in graph.items():
        a = folder_of(m, known)
        for t in targets:
            b = folder_of(t, known)
            if a != b and not b.startswith(a + ".") and not a.startswith(b + ".") and (m, t) not in PENDING:
                out[a].add(b)
    return out


def main() -> int:
    known = modules()
    graph = {m: imports(m, p, known) for m, p in known.items()}
    found = cycles(graph)
    for cycle in found:
        print("import cycle: " + " -> ".join(cycle))
    loops = cycles(folder_graph(graph, known))
    for loop in loops:
        print("import cycle between folders: " + " -> ".join(f"{f.replace('.', '/')}/" for f in loop))
    stale = sorted((m, t) for m, t in PENDING if t not in graph.get(m, set()))
    for m, t in stale:
        print(f"PENDING lists {m} -> {t}, an import no longer made: remove its line from .ci/import_cycles.py")
    return 1 if found or loops or stale else 0


if __name__ == "__main__":
    sys.exit(main())
