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


def xla_flags(*flags: str) -> str:
    """``XLA_FLAGS`` for a process a test starts with flags of its own: ``flags``, and the
    session's compile-time flags (``conftest.py``'s ``FAST_COMPILE``, those this jaxlib knows)."""
    return " ".join([*flags, os.environ.get("XLAUNCH_TEST_XLA_FLAGS", "")]).strip()


def read_result(run_dir: Path) -> dict:
    return json.loads((Path(run_dir) / "result.json").read_text())


def read_scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """The TensorBoard scalars of the event files in ``log_dir`` (not its subfolders), read with
    TensorBoard's own reader: each tag's (step, value) pairs in the order written."""
    from tensorboard.backend.event_processing.event_accumulator import (  # noqa: PLC0415  only the tests of curves read them
        SCALARS,
        EventAccumulator,
    )

    events = EventAccumulator(str(log_dir), size_guidance={SCALARS: 0})  # 0: every value, none sampled away
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()[SCALARS]}
