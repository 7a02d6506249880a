"""The modes: what a job's tasks run, each found through the one table ``MODES``.

A mode is its ``Config`` (the schema of ``conf/mode/<name>.yaml`` over ``base.ModeConfig``, with
its checks) and its ``run(ctx) -> dict`` (what rank 0 writes into ``result.json``), in two modules
because two kinds of process read them:

- ``launcher/modes/<name>.py``: the ``Config`` and the JAX-free helpers its checks use. The CLI
  imports every one (``launcher/cli/schema.py`` registers the schemas with Hydra and runs the checks
  before submission), and a task imports this table before it has set its devices: none of these
  imports JAX or the libraries that do.
- ``launcher/modes/runs/<name>.py``: the ``run`` and its helpers, importing JAX, ``launcher/sharding/``,
  ``launcher/hlo/`` and ``models/`` at their top. Only a task imports one, once JAX is set up
  (``launcher/runtime/task.py``), through the reference its entry here holds
  (``"launcher.modes.runs.<name>:run"``, ``Mode.load``): the one lazy import of the modes.

Adding a mode is those two modules, one line here and its ``conf/mode/<name>.yaml``; its entry
names the functions that render its result on the console (``launcher/cli/console.py``; without
them, a generic listing of its result) and its headline figures (``launcher/figures.py``: a
sweep's table and chart, the objective of Hydra's sweepers). A preset is a config file only:
``conf/mode/cfp.yaml`` takes mode=search's schema (and with it ``code: search``, the entry that
runs it) with lighter defaults and its own ``name``. No mode imports another: what the CFP modes
share is the sharding pipeline's (``launcher/sharding/``) and their common options' (``cfp_config.py``).
"""

from __future__ import annotations

from typing import Any, Mapping

from launcher import figures
from launcher.errors import UserError
from launcher.modes import analysis, check, hlo_replay, profile, run, search, train
from launcher.modes.base import Mode, ModeConfig


def _console(name: str) -> dict:
    """A mode's renderers in launcher/cli/console.py (``<name>_answer`` and ``<name>_line``) and its
    figures in launcher/figures.py (``<name>``)."""
    return {"answer": f"launcher.cli.console:{name}_answer", "headline": f"launcher.cli.console:{name}_line",
            "figures": getattr(figures, name)}


MODES: dict[str, Mode] = {
    "analysis": Mode(analysis.Config, "launcher.modes.runs.analysis:run", **_console("analysis")),
    "check": Mode(check.Config, "launcher.modes.runs.check:run", **_console("check")),
    "hlo_replay": Mode(hlo_replay.Config, "launcher.modes.runs.hlo_replay:run", **_console("replay")),
    "profile": Mode(profile.Config, "launcher.modes.runs.profile:run", **_console("profile")),
    "run": Mode(run.Config, "launcher.modes.runs.run:run", **_console("run"), user_code="launcher.modes.run:user_code"),
    "search": Mode(search.Config, "launcher.modes.runs.search:run", **_console("comparison")),
    "train": Mode(train.Config, "launcher.modes.runs.train:run", **_console("train")),
}


def code_of(mode: Mapping[str, Any]) -> str:
    """The MODES entry a mode config names: its ``code`` (a config without one: its ``name``)."""
    return mode.get("code") or mode.get("name")


def find(mode: Mapping[str, Any]) -> Mode:
    """The mode that runs a mode config (``cfg.mode``); UserError where there is none."""
    code = code_of(mode)
    if code not in MODES:
        key = "mode.code" if mode.get("code") else "mode.name"
        raise UserError(f"{key}={code}: no such mode (known: {', '.join(sorted(MODES))})")
    return MODES[code]


__all__ = ["MODES", "Mode", "ModeConfig", "code_of", "find"]
