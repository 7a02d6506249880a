"""One uninterrupted training run, made once per test session and shared by the checkpoint and
requeue tests: what a resumed or requeued run must end with, loss for loss.

2 processes x 1 CPU device (plan dp over both), checkpoints every CHECKPOINT_EVERY steps and a
trace per rank: the run ``python -m launcher mode=train model=gpt-tiny mode.checkpoint_every=N
launcher.trace=true`` is. The SLURM tests run the same on 2 nodes x 1 task: the same two
processes, the same program, so the same floats.
"""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path

from tests.launch import run_cli

STEPS = 64  # long enough that a signal sent at the first checkpoint lands mid-training
CHECKPOINT_EVERY = 8
TRAIN = ("mode=train", "model=gpt-tiny", f"mode.steps={STEPS}", "mode.warmup_steps=1",
         f"mode.checkpoint_every={CHECKPOINT_EVERY}")
LOCAL = ("cluster=local", "cluster.tasks_per_node=2", "cluster.cpu_devices_per_task=1")
SLURM = ("cluster=slurm", "cluster.nodes=2", "cluster.tasks_per_node=1", "cluster.cpu_devices_per_task=1")


@functools.lru_cache(maxsize=None)
def uninterrupted() -> Path:
    """The run dir of the uninterrupted run (made on first use, removed when the session ends)."""
    root = Path(tempfile.mkdtemp(prefix="xlaunch-train-reference-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    run = root / "run"
    run_cli(*TRAIN, *LOCAL, "launcher.trace=true", run_dir=run, timeout=600)
    return run
