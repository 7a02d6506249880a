"""mode=run: the user's own program, on every task, with everything the built-in modes get.

    python -m launcher mode=run mode.script=train.py "mode.args=[--steps,100]"
    python -m launcher mode=run mode.target=mypkg.train:main mode.kwargs.lr=0.1

Before the program starts, the task has done what it does for every mode (rank from the
environment, device visibility, ``jax.distributed.initialize``, its rank log, the peer
watchdog), so the program finds ``jax.devices()`` global and its output in its rank's log. A
function (``mode.target``, called with ``mode.kwargs``) returns what rank 0 writes into
``result.json`` under ``returned``; a script (``mode.script``, run as ``__main__`` with
``sys.argv`` set from ``mode.args``) succeeds by ending or ``sys.exit(0)``, and any other exit
fails the job like any exception, naming the rank, its host and its log. A program's own call
of ``jax.distributed.initialize`` is let through as done already.

The program asks the launcher what it needs through ``launcher.context()`` (``launcher/api.py``):
its rank, the run and checkpoint directories, the restart count, and whether SLURM has asked
the job to stop (``launcher/runtime/stop.py``). The code directory (``mode.code_dir``, default the
directory the launcher was started from) is the program's working directory and comes first on
its ``sys.path``; on a TPU pod it is copied to every worker first (``launcher/clusters/_code.py``).
docs/run.md is the reference.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, List, Optional

from omegaconf import DictConfig, OmegaConf

from launcher import api
from launcher.errors import UserError
from launcher.modes.base import ModeConfig
from launcher.runtime import program, requeue, stop
from launcher.runtime.context import _json_default


def _open_mapping() -> Any:
    # Not a struct: `mode.kwargs.lr=0.1` adds a key from the command line (or a -m sweep) without
    # the `+` Hydra asks for elsewhere, since the function's arguments are not known to the schema.
    return OmegaConf.create({}, flags={"struct": False})


@dataclass
class Config(ModeConfig):
    name: str = "run"
    code: str = "run"
    target: Optional[str] = None  # module:function, e.g. mypkg.train:main
    kwargs: Any = field(default_factory=_open_mapping)  # the function's keyword arguments
    script: Optional[str] = None  # path/to/train.py, relative to code_dir
    args: List[str] = field(default_factory=list)  # the script's command-line arguments
    code_dir: Optional[str] = None  # the program's directory; default: where the launcher was started
    # What a TPU pod's workers get of code_dir: these globs only (relative to it); empty: every
    # file git would not ignore (.gitignore honoured).
    include: List[str] = field(default_factory=list)
    # After a stop request, how long the program has to save and return before the job is handed
    # over for requeue without it (SLURM signals 90 s before the time limit).
    stop_grace_s: float = 60.0

    @classmethod
    def check(cls, mode, job) -> None:
        """Before submission (``launcher.schema.validate``): one program, and where the launcher's
        python can tell (``job.same_python``), that it exists and takes its arguments."""
        if bool(mode.target) == bool(mode.script):
            raise UserError("mode=run runs one program: give mode.target=module:function (with mode.kwargs) "
                            "or mode.script=path/to/script.py (with mode.args), not both" if mode.target else
                            "mode=run needs a program: mode.script=path/to/train.py (with mode.args=[...]) or "
                            "mode.target=module:function (with mode.kwargs.<name>=<value>)")
        if not isinstance(mode.kwargs, DictConfig):
            raise UserError(f"mode.kwargs={mode.kwargs}: must be a mapping of argument names to values, e.g. "
                            "mode.kwargs.lr=0.1")
        if mode.script and mode.kwargs:
            raise UserError("mode.kwargs is for mode.target; a script takes its arguments from mode.args=[...]")
        if mode.target and mode.args:
            raise UserError("mode.args is for mode.script; a function takes mode.kwargs.<name>=<value>")
        if mode.stop_grace_s <= 0:
            raise UserError(f"mode.stop_grace_s={mode.stop_grace_s}: must be more than 0 seconds")
        code_dir = code_dir_of(mode)
        if not code_dir.is_dir():
            raise UserError(f"mode.code_dir={mode.code_dir}: no such directory")
        if mode.script and (job.files_here or not Path(mode.script).is_absolute()):
            program.check_script(mode.script, code_dir)  # a relative path is in code_dir, which is here
        if mode.target:
            program.parse_target(mode.target)
            if job.same_python:
                program.check_target(mode.target, OmegaConf.to_container(mode.kwargs, resolve=True), code_dir)


def code_dir_of(mode) -> Path:
    """Where the program's code is on this machine: ``mode.code_dir``, else the working directory."""
    return Path(mode.code_dir or os.getcwd()).resolve()


def run(ctx) -> dict:
    from launcher.runtime import checkpoint  # noqa: PLC0415  JAX: the CLI imports this module

    cfg = ctx.mode_cfg
    # A backend that copied the code (TPU) says where; elsewhere the launcher's directory is shared.
    code_dir = Path(os.environ.get(program.CODE_DIR_ENV) or code_dir_of(cfg))
    program.enter(code_dir)
    what = cfg.target or cfg.script
    kwargs = OmegaConf.to_container(cfg.kwargs, resolve=True)
    if cfg.target:
        function = program.load_target(cfg.target, kwargs)
    else:
        program.check_script(cfg.script, code_dir)
        script = program.script_path(cfg.script, code_dir)

    checkpoints = checkpoint.directory(ctx.run_dir)
    checkpoints.mkdir(parents=True, exist_ok=True)
    stops = stop.StopRequests(ctx.run_dir, ctx.rank.process_id, ctx.rank.num_processes, ctx.attempt,
                              cfg.stop_grace_s, ctx.log, forced_end=lambda requeued: _forced_end(ctx, requeued))
    stops.install()
    api._install(api.Context(run_dir=ctx.run_dir, rank=ctx.rank.process_id, num_processes=ctx.rank.num_processes,
                             restart=ctx.attempt, checkpoint_dir=checkpoints, launched=True,
                             _should_stop=stops.should_stop))
    ctx.log.info("running %s in %s%s", what, code_dir, f" (restart {ctx.attempt})" if ctx.attempt else "")
    returned = None
    with _initialized_already(ctx):
        try:
            if cfg.target:
                returned = program.call_target(cfg.target, function, kwargs)
            else:
                program.run_script(script, list(cfg.args))
        except BaseException:
            stops.close()
            raise
        finally:
            api._install(None)
    stops.after_program()  # if the program stopped as asked: requeue (this raises) or wait for it
    out: dict[str, Any] = {"program": what, "code_dir": str(code_dir), "restart": ctx.attempt}
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
        import jax  # noqa: PLC0415  JAX: the CLI imports this module

        self.original = jax.distributed.initialize
        rank = self.ctx.rank

        def initialize(*args: Any, **kwargs: Any) -> None:
            self.ctx.log.info("the program called jax.distributed.initialize: the launcher has initialised JAX "
                              "already (process %d of %d), so the call does nothing", rank.process_id,
                              rank.num_processes)

        jax.distributed.initialize = initialize

    def __exit__(self, *exc: Any) -> None:
        import jax  # noqa: PLC0415  JAX: the CLI imports this module

        jax.distributed.initialize = self.original


def _forced_end(ctx, requeued: bool) -> None:
    """Ends rank 0 when the program did not stop within its grace period (``StopRequests``)."""
    if requeued:
        ctx.reporter.set("requeued", f"attempt {ctx.attempt} ended; the job was requeued")
        ctx.log.warning("this run ends here: the job was requeued")
    else:
        why = requeue.why_not(ctx.cfg, ctx.run_dir, ctx.attempt) or "the job could not be requeued"
        ctx.reporter.set("failed", why)
        ctx.log.error("rank %d ended: %s", ctx.rank.process_id, why)
    for handler in ctx.log.handlers:
        handler.flush()
    os._exit(255 if requeued else 1)
