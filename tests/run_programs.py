"""A user's function for tests/test_run.py's mode=run jobs (``mode.target=tests.run_programs:describe``)."""

import os
import sys

import launcher
import jax


def describe(x, tag="point"):
    """What a program sees of its launch. With ``x=2`` it also calls ``jax.distributed.initialize()``,
    as a script written for multi-host jobs does; otherwise it never touches JAX. With ``x=3`` the
    second process fails: ``sys.exit(3)``."""
    ctx = launcher.context()
    print(f"describe {tag}: rank {ctx.rank} of {ctx.num_processes}, x={x}")
    if x == 3 and ctx.rank == 1:
        sys.exit(3)
    seen = {"x": x, "tag": tag, "rank": ctx.rank, "num_processes": ctx.num_processes, "is_main": ctx.is_main,
            "restart": ctx.restart, "run_dir": str(ctx.run_dir), "checkpoint_dir": str(ctx.checkpoint_dir),
            "checkpoint_dir_exists": ctx.checkpoint_dir.is_dir(), "launched": ctx.launched, "cwd": os.getcwd()}
    if x == 2:

        jax.distributed.initialize()
        seen["global_devices"] = jax.device_count()
    return seen
