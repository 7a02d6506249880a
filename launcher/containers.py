"""The python command a task runs: on the host, or inside a container.

(Placeholder for cluster backends other than local until the container helper lands.)
"""
from __future__ import annotations

import shlex
import sys
from pathlib import Path


def python_command(cfg, run_dir: Path) -> str:
    return shlex.quote(sys.executable)
