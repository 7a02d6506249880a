"""The code's own rules, checked with every test run: ruff's (pyproject.toml, [tool.ruff.lint]:
pyflakes, bugbear, a complexity ceiling, imports at the top of modules unless the line says why)
and no import cycle among the package's modules, lazy imports included (.ci/import_cycles.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_ruff_finds_nothing():
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "."], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_no_import_cycle_lazy_imports_included():
    proc = subprocess.run([sys.executable, ".ci/import_cycles.py"], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and not proc.stdout, proc.stdout + proc.stderr
