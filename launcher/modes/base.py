"""What every mode is: a ``Config`` over ``ModeConfig`` and a ``run``, one ``Mode`` entry each in
the table of ``launcher/modes/__init__.py``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from omegaconf import MISSING


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
    run: Callable[[Any], dict]  # run(ctx: launcher.runtime.context.TaskContext) -> result.json's fields
