"""Report import cycles among xlaunch's own modules, lazy (function-level) imports included.

Every ``import`` and ``from ... import`` statement anywhere in a module's source counts, at
module level or inside a function, class or ``if TYPE_CHECKING:`` block: a lazy import still
ties two modules together, and a cycle through one only waits for the first call that closes
it. A string that names one of our modules (``"launcher.modes.runs.search:run"``, a
``_target_``, ``-m launcher.clusters.ray``) is an import made at run time (by
``launcher.plugins.function``, Hydra, a new process): it counts for the floors and the folders
below, not for cycles among modules, since it is made once both modules are whole (a config
naming its model's class, which imports the config, is Hydra's way, not a cycle). ``models/`` is reached as ``launcher.models`` (pyproject.toml says why). An import names
its target module: ``from launcher.sharding import options`` is an edge to ``launcher.sharding.options``
when that is a module, else to the package ``launcher.sharding``. A package's own ``__init__`` is
not an edge of every import beneath it (Python already holds a package that is importing).

The folders are checked too: no loop between folders, each folder's modules taken together (a
folder is a package). A package's loose modules where it has subfolders (``launcher/sharding/``'s
``pipeline.py``, ``apply.py``) are nodes of their own, each beside the subfolders, and every edge
counts: ``pipeline.py`` sits on top of ``algorithms/`` and ``predict/`` and neither imports it back,
``apply.py`` is shared by the subfolders and imports none that imports it. A loop between two
folders means neither can be read, tested or replaced without the other (``profile/`` once imported
``ilp/``, which imported ``profile/``; CFP's profile pass once lived in ``pipeline.py``, which its
algorithm imported back).

And the floors (``FLOORS``, top first): no module imports from a floor above its own, lazy imports
included, so the command line sits on the backends, which sit on what runs in a task, and never the
other way round.

Run from the repository's top: ``python .ci/import_cycles.py``. Prints each cycle found (one
line, the modules or folders in import order) and each import up a floor, and exits 1 when there
is one, else prints nothing and exits 0.
"""

from __future__ import annotations

import ast
import re
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


# A string that names one of our modules, as ``plugins.function`` and Hydra's ``_target_`` load
# one: "launcher.modes.runs.search:run", "launcher.models.gpt.GPT", "launcher.sharding.user.api".
_DOTTED = re.compile(r"(launcher|models)(\.[A-Za-z_]\w*)+(:[A-Za-z_][\w.]*)?")


def string_import(text: str, known: dict[str, Path]) -> str | None:
    """The module a string names, for an import made at run time from it (``"module:attr"``, a
    dotted module, or a module and one attribute), else None: a config key such as
    ``"launcher.straggler.factor"`` names no module of ours beyond the package itself."""
    if not _DOTTED.fullmatch(text):
        return None
    dotted, _, attr = text.partition(":")
    if dotted.startswith("models."):
        dotted = "launcher." + dotted
    target = _resolve(dotted, known)
    if target is None:
        return None
    rest = dotted[len(target):].lstrip(".").split(".") if dotted != target else []
    return target if len(rest) <= (0 if attr else 1) and (target != "launcher" or not rest) else None


def named_in_strings(module: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The modules of ours that ``module`` names in a string (``string_import``), an f-string's
    leading text included (``f"launcher.cli.console:{name}_answer"``)."""
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        text = None
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
        elif isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
            head = str(node.values[0].value)
            text = head.rstrip(":") if ":" in head else None   # "pkg.module:" then the attribute's name
        target = string_import(text, known) if text else None
        if target is not None and target != module:
            targets.add(target)
    return targets


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


# The floors, top first: a module imports only from its own floor or those below it, never up.
# The public facade re-exports (launcher/__init__.py, the deprecated import paths); the command
# line is above the backends that start tasks and the modes' schemas; the libraries the modes run
# (sharding, HLO replay) are above what runs in a task (runtime/: the task itself takes the mode
# to run and what its backend can do from the launcher, by reference: launcher/runtime/context.py
# Launch; launcher/api.py, what a user's program asks of its task, is of that floor); below those,
# what every floor shares; the models import nothing of the launcher.
FLOORS = [
    ("the public facade", ("launcher", "launcher.__main__", "launcher._deprecated", "launcher.cfp",
                           "launcher.sharding.autoshard")),
    ("the command line", ("launcher.cli",)),
    ("the backends and the modes", ("launcher.clusters", "launcher.modes")),
    ("the libraries", ("launcher.sharding", "launcher.hlo")),
    ("a task's runtime", ("launcher.runtime", "launcher.api")),
    ("what every floor shares", ("launcher.errors", "launcher.jaxcompat", "launcher.plugins", "launcher.figures",
                                 "launcher.typing")),
    ("the models", ("launcher.models",)),
]


def floor_of(module: str) -> int:
    """The floor a module is on: the longest name in FLOORS that it is or lies in (the package
    ``launcher`` itself is only its ``__init__``); len(FLOORS) where none is."""
    best = (-1, len(FLOORS))
    for i, (_, names) in enumerate(FLOORS):
        for p in names:
            inside = module.startswith(p + ".") and p != "launcher"
            if (module == p or inside) and len(p) > best[0]:
                best = (len(p), i)
    return best[1]


def upward(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Every import that runs up a floor (module, what it imports)."""
    return sorted((m, t) for m, targets in graph.items() for t in targets if floor_of(t) < floor_of(m))


def folder_of(module: str, known: dict[str, Path]) -> str:
    """The folder (package) a module lies in; a package's ``__init__`` is its own folder's."""
    return module if known[module].name == "__init__.py" else module.rpartition(".")[0]


def node_of(module: str, known: dict[str, Path], folders: set[str]) -> str:
    """A module's node among the folders: its folder, or the module itself where it is a loose
    module of a package that has subfolders (the module's doc)."""
    folder = folder_of(module, known)
    if known[module].name != "__init__.py" and any(f.startswith(folder + ".") for f in folders):
        return module
    return folder


def folder_graph(graph: dict[str, set[str]], known: dict[str, Path]) -> dict[str, set[str]]:
    """Node (a folder, or a loose module beside subfolders) -> the nodes its modules import."""
    folders = {folder_of(m, known) for m in known}
    out: dict[str, set[str]] = {node_of(m, known, folders): set() for m in graph}
    for m, targets in graph.items():
        a = node_of(m, known, folders)
        for t in targets:
            b = node_of(t, known, folders)
            if a != b:
                out[a].add(b)
    return out


def main() -> int:
    known = modules()
    graph = {m: imports(m, p, known) for m, p in known.items()}
    # What each module reaches, by a statement or by a string naming a module (the module doc).
    reach = {m: graph[m] | named_in_strings(m, p, known) for m, p in known.items()}
    found = cycles(graph)
    for cycle in found:
        print("import cycle: " + " -> ".join(cycle))
    loops = cycles(folder_graph(reach, known))
    for loop in loops:
        print("import cycle between folders: " + " -> ".join(f"{f.replace('.', '/')}/" for f in loop))
    unfloored = sorted(m for m in graph if floor_of(m) == len(FLOORS))
    for m in unfloored:
        print(f"{m} is on no floor: add its package to FLOORS in .ci/import_cycles.py")
    up = upward(reach)
    for m, t in up:
        print(f"import up a floor: {m} ({FLOORS[floor_of(m)][0]}) imports {t} ({FLOORS[floor_of(t)][0]})")
    return 1 if found or loops or unfloored or up else 0


if __name__ == "__main__":
    sys.exit(main())
