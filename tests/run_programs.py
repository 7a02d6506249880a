"""Users' functions for the tests' mode=run jobs (``mode.target=tests.run_programs:describe``, ...)."""

import atexit
import os
import sys
import time
from pathlib import Path

import jax
import numpy as np

import launcher


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


def curves(steps=5):
    """Scalars for TensorBoard through ``launcher.context().log``: rank 0's (loss as a float, lr as
    a NumPy float32, a JAX scalar), and each rank's own ``rank_loss`` with ``every_rank``."""
    ctx = launcher.context()
    for step in range(steps):
        ctx.log(step, loss=1.0 / (step + 1), lr=np.float32(0.5), doubled=jax.numpy.asarray(2.0 * step))
        ctx.log(step, every_rank=True, rank_loss=float(10 * ctx.rank + step))
    return {"steps": steps, "final": 1.0 / steps}


def stuck_at_exit(rank=1, seconds=600.0):
    """Returns at once, but process ``rank`` then takes ``seconds`` to exit, as one stuck tearing
    down its collectives does: the job is done, its process is not gone."""
    ctx = launcher.context()
    if ctx.rank == rank:
        atexit.register(time.sleep, seconds)
    return {"rank": ctx.rank}


def hold(until, x=0, stop_delay_s=0.0, ready=None):
    """Runs until the file ``until`` exists (a job that stays running while a test looks at it).
    Stopped (SIGINT), it takes ``stop_delay_s`` to end, as a program that saves something first does.
    ``ready``: a file made once it runs (so a test stops it here, not while it is being imported)."""
    ctx = launcher.context()
    try:
        if ready:
            Path(ready).touch()
        while not Path(until).exists():
            ctx.step()
            time.sleep(0.2)
    except KeyboardInterrupt:
        time.sleep(stop_delay_s)
        raise
    return {"x": x}
