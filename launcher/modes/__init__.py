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

Adding a mode is those two modules, one line here and its ``conf/mode/<name>.yaml``. Beside its
``Config``, the first module holds what the command line shows of a run's result: ``answer`` and
``line`` (the console's lines when it ends and ``xlaunch runs``'s one line, functions of
``result.json``; ``launcher/cli/console.py`` calls them) and ``figures`` (its headline figures,
``launcher/figures.py``: a sweep's table and chart, the objective of Hydra's sweepers). The entry
holds them, not their names: the command line sits a floor above the modes, and a mode names
nothing of it. A preset is a config file only:
``conf/mode/cfp.yaml`` takes mode=search's schema (and with it ``code: search``, the entry that
runs it) with lighter defaults and its own ``name``. No mode imports another: what the CFP modes
share is the sharding pipeline's (``launcher/sharding/``) and their common options' (``cfp_config.py``).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, Mapping

from launcher.errors import UserError
from launcher.modes import analysis, check, hlo_replay, profile, run, search, train
from launcher.modes.base import Mode, ModeConfig


def _entry(module: ModuleType, run: str, **extra: str) -> Mode:
    """A mode's entry: its module's schema (``Config``), renderers (``answer``, ``line``) and
    figures (``figures``), and its run's reference (loaded by the task, once JAX is set up)."""
    return Mode(module.Config, run, answer=module.answer, headline=module.line, figures=module.figures, **extra)


MODES: dict[str, Mode] = {
    "analysis": _entry(analysis, "launcher.modes.runs.analysis:run"),
    "check": _entry(check, "launcher.modes.runs.check:run"),
    "hlo_replay": _entry(hlo_replay, "launcher.modes.runs.hlo_replay:run"),
    "profile": _entry(profile, "launcher.modes.runs.profile:run"),
    "run": _entry(run, "launcher.modes.runs.run:run", user_code="launcher.modes.run:user_code"),
    "search": _entry(search, "launcher.modes.runs.search:run"),
    "train": _entry(train, "launcher.modes.runs.train:run"),
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
