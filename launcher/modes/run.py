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
docs/run.md is the reference; ``launcher/modes/runs/run.py`` runs the program.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, List, Optional

from omegaconf import DictConfig, OmegaConf

from launcher.errors import UserError
from launcher.figures import Figures, devices, seconds
from launcher.modes.base import ModeConfig
from launcher.runtime import user_program


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
        """Before submission (``launcher.cli.schema.validate``): one program, and where the launcher's
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
            user_program.check_script(mode.script, code_dir)  # a relative path is in code_dir, which is here
        if mode.target:
            user_program.parse_target(mode.target)
            if job.same_python:
                user_program.check_target(mode.target, OmegaConf.to_container(mode.kwargs, resolve=True), code_dir)


def code_dir_of(mode) -> Path:
    """Where the program's code is on this machine: ``mode.code_dir``, else the working directory."""
    return Path(mode.code_dir or os.getcwd()).resolve()


def user_code(mode) -> tuple[Path, list[str]]:
    """The code the tasks run (the table's ``user_code``): its directory here, and ``mode.include``,
    what of it workers that share no file system need (none: what git keeps)."""
    return code_dir_of(mode), list(mode.include)


# --- what a run of it says (launcher/cli/console.py; a sweep's table: figures) ------------------------

# Open: a run's figures are what its program returned and logged (launcher/figures.py).
figures = Figures(open=True)


def answer(r: dict) -> str:
    """The user's program: what it was, and what its function returned (JSON, short)."""
    lines = [f"run {r.get('program')} on {devices(r)}: done in {seconds(r.get('mode_time_s', 0.0))}"
             + (f" (restart {r['restart']})" if r.get("restart") else "")]
    if "returned" in r:
        text = json.dumps(r["returned"], default=str)
        lines.append("returned: " + (text if len(text) <= 400 else text[:400] + " ..."))
    return "\n".join(lines)


def line(r: dict) -> str:
    text = json.dumps(r.get("returned"), default=str) if "returned" in r else "done"
    return text if len(text) <= 60 else text[:57] + "..."
