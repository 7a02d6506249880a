"""The modes: what a job's tasks run, each found through the one table ``MODES``.

A mode is its ``Config`` (the schema of ``conf/mode/<name>.yaml`` over ``base.ModeConfig``, with
its checks) and its ``run(ctx) -> dict`` (what rank 0 writes into ``result.json``). The schemas
are registered with Hydra from this table (``launcher/schema.py``) and the task runs the entry
its config names (``launcher/runtime/task.py``): adding a mode is a module with those two and
one line here.

A preset is a config file only: ``conf/mode/cfp.yaml`` takes mode=search's schema (and with it
``code: search``, the entry that runs it) with lighter defaults and its own ``name``. No mode
imports another: what the CFP modes share is the CFP pipeline's (``launcher/cfp/``) and their
common options' (``cfp_config.py``).
"""

from __future__ import annotations

from typing import Any, Mapping

from launcher.errors import UserError
from launcher.modes import analysis, check, hlo_replay, profile, run, search, train
from launcher.modes.base import Mode, ModeConfig

MODES: dict[str, Mode] = {
    "analysis": Mode(analysis.Config, analysis.run),
    "check": Mode(check.Config, check.run),
    "hlo_replay": Mode(hlo_replay.Config, hlo_replay.run),
    "profile": Mode(profile.Config, profile.run),
    "run": Mode(run.Config, run.run),
    "search": Mode(search.Config, search.run),
    "train": Mode(train.Config, train.run),
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
