"""What a mode's ``Config.check`` is given (``Job``: what the composed config says about the job)
and the checks several modes share. Below ``launcher.cli.schema`` and the modes alike: the schema
validates a config by calling each mode's check, and the modes' checks use these."""

from __future__ import annotations

import glob
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from launcher.errors import UserError


@dataclass(frozen=True)
class Job:
    """What a composed config says about the job, for the modes' checks (``Config.check``)."""

    devices: Optional[int]  # global devices, where the config alone tells (None: TPU chips, ...)
    files_here: bool  # input files are read from this machine's file systems (not a TPU VM's)
    model: Any = None  # cfg.model, for a mode that checks how the model fits the devices
    after: str = ""  # launcher.after: the run dir (or job id) the job waits for, whose files may not be there yet
    # The tasks run the launcher's own python (no container, not TPU workers): what it can
    # import, they can.
    same_python: bool = False


def check_files(key: str, spec: Any, job: Job) -> None:
    """``spec`` (a path, a glob, or a list of either) names at least one file each."""
    patterns = [spec] if isinstance(spec, str) else list(spec or [])
    if not patterns or not all(str(p) for p in patterns):
        raise UserError(f"{key} is not set: give the input file, e.g. {key}=dump/module_0001.jit_step.before_optimizations.txt")
    if not job.files_here:
        return  # read on the TPU workers, whose file systems are not this machine's
    for pattern in map(str, patterns):
        if not any(Path(m).is_file() for m in glob.glob(pattern)):
            where = "" if Path(pattern).is_absolute() else f" (relative to {Path.cwd()})"
            raise UserError(f"{key}={pattern}{where}: no such file; give an existing file, or a glob that matches one")


def check_mesh_shape(key: str, shape: Any, job: Job) -> None:
    """Every entry positive, and their product the job's device count where the config tells it."""
    shape = list(shape)
    if any(s < 1 for s in shape):
        raise UserError(f"{key}={shape}: every entry must be at least 1 (or leave it [] for 1-D over every device)")
    n = 1
    for s in shape:
        n *= s
    if shape and job.devices is not None and n != job.devices:
        raise UserError(f"{key}={shape} has {n} devices but the job has {job.devices}: make the product of {key} "
                        "the global device count (nodes x tasks_per_node x cpu_devices_per_task, or nodes x "
                        "gpus_per_node), or leave it [] for 1-D")
