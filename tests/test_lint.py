"""The code's own rules, checked with every test run: ruff's (pyproject.toml, [tool.ruff.lint]:
pyflakes, bugbear, a complexity ceiling, imports at the top of modules unless the line says why)
and no import cycle among the package's modules, lazy imports included (.ci/import_cycles.py);
and the test modules whose tests share module-scoped fixtures are those that run on one xdist
worker (tests/conftest.py)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from tests.conftest import MODULE_FIXTURES

REPO = Path(__file__).resolve().parents[1]


def test_ruff_finds_nothing():
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "."], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_no_import_cycle_lazy_imports_included():
    proc = subprocess.run([sys.executable, ".ci/import_cycles.py"], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and not proc.stdout, proc.stdout + proc.stderr


def _module_scoped(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and ast.unparse(node.func) in ("pytest.fixture", "fixture"):
            if any(k.arg == "scope" and ast.literal_eval(k.value) == "module" for k in node.keywords):
                return True
    return False


def test_every_module_with_module_scoped_fixtures_runs_on_one_worker():
    have = {p.name for p in (REPO / "tests").glob("test_*.py") if _module_scoped(p)}
    assert have == MODULE_FIXTURES
