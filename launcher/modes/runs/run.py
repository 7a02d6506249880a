"""mode=run's run: the user's program (``mode.target`` or ``mode.script``) with the launcher's
context installed (``launcher.context()``) and SLURM's stop requests handled. The options and
what the program gets: ``launcher/modes/run.py`` and docs/run.md."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import jax
from omegaconf import OmegaConf

from launcher import api
from launcher.errors import UserError
from launcher.modes.run import code_dir_of
from launcher.runtime import checkpoint, requeue, stop, user_program
from launcher.runtime.context import _json_default
from launcher.runtime.context import TaskContext


def run(ctx: TaskContext) -> dict:
    cfg = ctx.mode_cfg
    # A backend that copied the code (TPU) says where; elsewhere the launcher's directory is shared.
    code_dir = Path(os.environ.get(user_program.CODE_DIR_ENV) or code_dir_of(cfg))
    user_program.enter(code_dir)
    what = cfg.target or cfg.script
    kwargs = OmegaConf.to_container(cfg.kwargs, resolve=True)
    if cfg.target:
        function = user_program.load_target(cfg.target, kwargs)
    else:
        user_program.check_script(cfg.script, code_dir)
        script = user_program.script_path(cfg.script, code_dir)

    checkpoints = checkpoint.directory(ctx.run_dir)
    checkpoints.mkdir(parents=True, exist_ok=True)
    stops = stop.StopRequests(ctx.run_dir, ctx.rank.process_id, ctx.rank.num_processes, ctx.attempt,
                              cfg.stop_grace_s, ctx.log, forced_end=lambda requeued: _forced_end(ctx, requeued))
    stops.install(ctx.reporter.listen)
    api._install(api.Context(run_dir=ctx.run_dir, rank=ctx.rank.process_id, num_processes=ctx.rank.num_processes,
                             restart=ctx.attempt, checkpoint_dir=checkpoints, launched=True,
                             _should_stop=stops.should_stop,
                             _progressed=ctx.reporter.stepped if ctx.reporter is not None else lambda step=None: None,
                             _scalars=ctx.scalars))
    ctx.log.info("running %s in %s%s", what, code_dir, f" (restart {ctx.attempt})" if ctx.attempt else "")
    returned = None
    with _initialized_already(ctx):
        try:
            if cfg.target:
                returned = user_program.call_target(cfg.target, function, kwargs)
            else:
                user_program.run_script(script, list(cfg.args))
        except BaseException:
            stops.close()
            raise
        finally:
            api._install(None)
    stops.after_program()  # if the program stopped as asked: requeue (this raises) or wait for it
    out: dict[str, Any] = {"program": what, "code_dir": str(code_dir), "restart": ctx.attempt}
    if ctx.scalars is not None and ctx.scalars.last:  # what it logged (launcher.context().log): each name's last
        out["logged"] = dict(ctx.scalars.last)
    if cfg.target:
        try:
            json.dumps(returned, default=_json_default)
        except (TypeError, ValueError) as e:
            raise UserError(f"mode.target={cfg.target} returned a {type(returned).__name__}, which result.json cannot "
                            f"hold ({e}): return numbers, strings, lists and dicts") from None
        out["returned"] = returned
    return out


class _initialized_already:
    """While the program runs, its own ``jax.distributed.initialize()`` (a script written for
    multi-host jobs has one) is a no-op: the task has initialised JAX already."""

    def __init__(self, ctx) -> None:
        self.ctx = ctx

    def __enter__(self) -> None:
        self.original = jax.distributed.initialize
        rank = self.ctx.rank

        def initialize(*args: Any, **kwargs: Any) -> None:
            self.ctx.log.info("the program called jax.distributed.initialize: the launcher has initialised JAX "
                              "already (process %d of %d), so the call does nothing", rank.process_id,
                              rank.num_processes)

        jax.distributed.initialize = initialize

    def __exit__(self, *exc: Any) -> None:
        jax.distributed.initialize = self.original


def _forced_end(ctx, requeued: bool) -> None:
    """Ends rank 0 when the program did not stop within its grace period (``StopRequests``)."""
    if requeued:
        ctx.reporter.set("requeued", f"attempt {ctx.attempt} ended; the job was requeued")
        ctx.log.warning("this run ends here: the job was requeued")
    else:
        why = requeue.why_not(ctx.cfg, ctx.run_dir, ctx.attempt, ctx.launch.requeues, ctx.launch.requeuers) or \
            "the job could not be requeued"
        ctx.reporter.set("failed", why)
        ctx.log.error("rank %d ended: %s", ctx.rank.process_id, why)
    for handler in ctx.log.handlers:
        handler.flush()
    os._exit(255 if requeued else 1)
