"""What every mode is: a ``Config`` over ``ModeConfig`` and a ``run``, one ``Mode`` entry each in
the table of ``launcher/modes/__init__.py``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from omegaconf import MISSING

from launcher.figures import Figures
from launcher.plugins import function


@dataclass
class ModeConfig:
    """What every mode's config has. Each mode's own options are in its subclass, ``Config`` in
    ``launcher/modes/<name>.py``, beside its checks (``Config.check(mode, job)``, before submission)."""

    # The run's name: in its run dir's (outputs/<date>/<time>-<name>-<cluster>) and in
    # result.json's "mode". A preset gives its own (conf/mode/cfp.yaml: cfp).
    name: str = MISSING
    # The MODES entry that runs the config: the mode's own name, which its presets keep (they
    # take its schema; conf/mode/cfp.yaml says code: search).
    code: str = MISSING


@dataclass(frozen=True)
class Mode:
    config: type  # its ModeConfig subclass: the schema of conf/mode/<name>.yaml, with its checks
    # "module:function", the function run(ctx: launcher.runtime.context.TaskContext) -> result.json's
    # fields: launcher/modes/runs/<name>.py's run, loaded by the task (load) once JAX is set up.
    run: str
    # Its module's functions turning result.json into the console's text (launcher/cli/console.py):
    # the lines printed when the run ends, and the one-line headline of `xlaunch runs` (None: generic).
    answer: Optional[Callable[[dict], str]] = None
    headline: Optional[Callable[[dict], str]] = None
    # Its headline figures (launcher/figures.py): a sweep's table and chart, and what Hydra's
    # sweepers optimize (launcher.objective). None named: the numbers its result holds.
    figures: Figures = Figures(open=True)

    # "module:function" of the mode's config module: (the user's code directory on this machine,
    # the globs of its files workers that share no file system need) for a mode that runs the
    # user's code (mode=run), which the backends ship or bind ("": none).
    user_code: str = ""

    def renderer(self, which: str) -> Optional[Callable[[dict], str]]:
        """Its ``answer`` or ``headline`` renderer (None: it has none)."""
        return getattr(self, which)

    def code(self, mode: Any) -> Optional[tuple[Path, list[str]]]:
        """The user's code its tasks run (``user_code``), for this mode config, or None."""
        return function(self.user_code)(mode) if self.user_code else None

    def load(self) -> Callable[[Any], dict]:
        """The mode's ``run``. Imported here, not with the table: a run's module imports JAX and the
        libraries at its top, and the processes that read the table must not import JAX (the CLI,
        which only needs the schemas; a task, until it has set its devices: launcher/runtime/task.py)."""
        return function(self.run)
