"""The code's own rules, checked with every test run: ruff's (pyproject.toml, [tool.ruff.lint]:
pyflakes, bugbear, a complexity ceiling, imports at the top of modules unless the line says why)
and no import cycle among the package's modules, lazy imports included, nor between its folders
(.ci/import_cycles.py);
and the test modules that share work (module-scoped fixtures, the uninterrupted training run)
are those conftest.SharedWork keeps on one xdist worker."""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

from tests.conftest import MODULE_FIXTURES, START_FIRST, TRAIN_REFERENCE

REPO = Path(__file__).resolve().parents[1]


def test_ruff_finds_nothing():
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "."], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_no_import_cycle_lazy_imports_included():
    proc = subprocess.run([sys.executable, ".ci/import_cycles.py"], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and not proc.stdout, proc.stdout + proc.stderr


def test_the_import_check_sees_a_module_named_in_a_string(tmp_path):
    """An import made at run time from a string (``plugins.function``'s "module:attr", an
    f-string's leading "module:", a ``_target_``) counts as an edge; a config key that only
    looks dotted does not. The modes once named the command line's renderers this way, an import
    up a floor that no check saw."""
    spec = importlib.util.spec_from_file_location("import_cycles", REPO / ".ci" / "import_cycles.py")
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    known = check.modules()
    assert check.string_import("launcher.cli.console:check_answer", known) == "launcher.cli.console"
    assert check.string_import("launcher.models.gpt.GPT", known) == "launcher.models.gpt"
    assert check.string_import("models.gpt.GPT", known) == "launcher.models.gpt"
    assert check.string_import("launcher.sharding.user.api", known) == "launcher.sharding.user.api"
    assert check.string_import("launcher.straggler.factor", known) is None   # a config key
    assert check.string_import("launcher.cli.console.a.b", known) is None
    source = tmp_path / "mode.py"
    source.write_text('def entry(name):\n    return {"answer": f"launcher.cli.console:{name}_answer"}\n')
    named = check.named_in_strings("launcher.modes.fake", source, known)
    assert named == {"launcher.cli.console"}
    assert check.upward({"launcher.modes.fake": named}) == [("launcher.modes.fake", "launcher.cli.console")]


def test_the_folder_check_counts_a_subfolder_importing_its_package_s_loose_module_back():
    """No exemption: an algorithm (a subfolder's module) importing the orchestration above it (a
    loose module of the package), which imports the algorithms, is a loop, as CFP's profile pass
    in pipeline.py once made it; a loose module shared by the subfolders (apply.py) is not."""
    spec = importlib.util.spec_from_file_location("import_cycles", REPO / ".ci" / "import_cycles.py")
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    known = {"s": Path("s/__init__.py"), "s.pipeline": Path("s/pipeline.py"), "s.apply": Path("s/apply.py"),
             "s.algorithms": Path("s/algorithms/__init__.py"), "s.algorithms.cfp": Path("s/algorithms/cfp.py"),
             "s.search.dp": Path("s/search/dp.py")}
    graph = {"s.pipeline": {"s.algorithms.cfp", "s.apply"}, "s.algorithms.cfp": {"s.search.dp", "s.apply"},
             "s.search.dp": {"s.apply"}, "s.apply": set(), "s": set(), "s.algorithms": set()}
    assert check.cycles(check.folder_graph(graph, known)) == []
    graph["s.algorithms.cfp"].add("s.pipeline")
    loops = check.cycles(check.folder_graph(graph, known))
    assert len(loops) == 1 and set(loops[0]) == {"s.pipeline", "s.algorithms"}, loops


# ``Any`` in launcher/'s annotations: at most this many uses (issue 67: 753 before the seams were
# named; a pytree is ``launcher.typing.PyTree``, a JSON object ``Json``, a mesh ``Mesh``). Lower it
# when a change names more; a change that needs more names the type instead.
ANY_CEILING = 391


def any_uses(root: Path) -> dict[str, int]:
    """Each module's uses of ``typing.Any`` (the name, or ``typing.Any``), imports aside; the
    package's links to models/ and conf/ are not its own modules."""
    uses = {}
    for path in sorted(root.rglob("*.py")):
        if any(p.is_symlink() for p in (path, *path.parents)):
            continue
        tree = ast.parse(path.read_text())
        n = sum(1 for node in ast.walk(tree) if (isinstance(node, ast.Name) and node.id == "Any")
                or (isinstance(node, ast.Attribute) and node.attr == "Any"))
        if n:
            uses[str(path.relative_to(root))] = n
    return uses


def test_any_does_not_rise_in_the_launcher(tmp_path):
    uses = any_uses(REPO / "launcher")
    worst = sorted(uses.items(), key=lambda kv: -kv[1])[:5]
    assert sum(uses.values()) <= ANY_CEILING, f"{sum(uses.values())} uses of Any in launcher/ (at most {ANY_CEILING}): {worst}"
    # The count sees a use in an annotation, a subscript and a typing.Any, not the import.
    (tmp_path / "m.py").write_text("import typing\nfrom typing import Any\n"
                                   "def f(x: Any, y: dict[str, Any]) -> typing.Any: ...\n")
    assert sum(any_uses(tmp_path).values()) == 3


def _module_scoped(tree: ast.AST) -> bool:
    return any(isinstance(node, ast.Call) and ast.unparse(node.func) in ("pytest.fixture", "fixture")
               and any(k.arg == "scope" and ast.literal_eval(k.value) == "module" for k in node.keywords)
               for node in ast.walk(tree))


def _imports_train_reference(tree: ast.AST) -> bool:
    return any(isinstance(node, ast.ImportFrom) and node.module == "tests.train_reference" for node in ast.walk(tree))


def test_every_module_that_shares_work_runs_on_one_worker():
    trees = {p.name: ast.parse(p.read_text()) for p in (REPO / "tests").glob("test_*.py")}
    assert {name for name, tree in trees.items() if _module_scoped(tree)} == MODULE_FIXTURES
    assert {name for name, tree in trees.items() if _imports_train_reference(tree)} == TRAIN_REFERENCE


def test_the_tests_started_first_are_tests_of_the_suite():
    for name in START_FIRST:
        path, function = name.split("::")
        tree = ast.parse((REPO / path).read_text())
        assert any(isinstance(node, ast.FunctionDef) and node.name == function for node in tree.body), name
