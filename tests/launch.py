"""Running the real CLI from tests: ``python -m launcher ...`` in a subprocess, as a user would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"


def run_cli(*overrides: str, run_dir: Path | None = None, timeout: float = 300, env: dict | None = None,
            check: bool = True, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Runs the launcher with Hydra overrides (or an ``xlaunch`` command: ``status``, ...); the
    run dir is ``run_dir`` when given. From ``cwd`` (default: the repository) with this
    checkout's code."""
    args = [sys.executable, "-m", "launcher", *overrides]
    if run_dir is not None:
        args.append(f"hydra.run.dir={run_dir}")
    full_env = {**os.environ, **(env or {})}
    if cwd is not None:
        full_env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [full_env.get("PYTHONPATH")])])
    proc = subprocess.run(args, cwd=cwd or REPO, capture_output=True, text=True, timeout=timeout, env=full_env)
    if check and proc.returncode != 0:
        raise AssertionError(f"launcher exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc


def read_result(run_dir: Path) -> dict:
    return json.loads((Path(run_dir) / "result.json").read_text())
