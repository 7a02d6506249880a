"""mode=hlo_replay: run a dumped XLA module on this job's devices, without the program that made it.

    python -m launcher mode=hlo_replay mode.hlo_file='dump/*jit_step*before_optimizations.txt' \\
        mode.num_repeats=5 cluster.tasks_per_node=2 cluster.cpu_devices_per_task=4 \\
        "mode.xla_flags='--xla_cpu_enable_fast_math=false'" mode.output_file=outputs.npz

Dumps come from ``XLA_FLAGS=--xla_dump_to=DIR --xla_dump_hlo_as_text`` (or ``launcher.xla_dump=true``,
which writes them under the run dir's ``xla_dump/rank<N>/``).

The module is compiled for as many replicas and partitions as it asks for (its header, else its
sharding annotations, else what its collectives address; ``mode.num_replicas``/``mode.num_partitions``
override, but never below what the collectives need) across every process's devices; the work
itself lives in ``launcher.hlo``, called by ``launcher/modes/runs/hlo_replay.py``.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any, Optional

from launcher.modes.checks import check_files
from launcher.errors import UserError
from launcher.figures import Figure, Figures, devices, seconds
from launcher.hlo.options import ArgumentMode
from launcher.modes.base import ModeConfig


@dataclass
class Config(ModeConfig):
    name: str = "hlo_replay"
    code: str = "hlo_replay"
    hlo_file: Any = None  # a path, a glob, or a list of them
    run: bool = True  # false: compile only
    argument_mode: ArgumentMode = ArgumentMode.random
    arguments_file: Optional[str] = None  # .npz, one array per parameter in order (argument_mode=file)
    seed: Optional[int] = None  # default: the top-level seed
    num_repeats: int = 1
    num_replicas: Optional[int] = None  # default: from the module
    num_partitions: Optional[int] = None  # default: from the module
    output_file: Optional[str] = None  # .npz of the outputs; relative paths are under the run dir
    # Compile options for these modules only: a list ["--xla_name=value", ...] or one string of
    # space-separated flags, as in XLA_FLAGS.
    xla_flags: Any = field(default_factory=list)
    backend_only: bool = False  # after-optimizations dumps: compile with XLA's HLO passes disabled

    @classmethod
    def check(cls, mode, job) -> None:
        """Before submission (``launcher.cli.schema.validate``): the module files (and an arguments
        file) exist. ``job``: ``launcher.modes.checks.Job``."""
        check_files("mode.hlo_file", mode.hlo_file, job)
        if mode.argument_mode == ArgumentMode.file and not mode.arguments_file:
            raise UserError("mode.argument_mode=file needs mode.arguments_file=<file.npz>")
        if mode.arguments_file:
            check_files("mode.arguments_file", mode.arguments_file, job)
        for key in ("num_replicas", "num_partitions"):
            if mode[key] is not None and mode[key] < 1:
                raise UserError(f"mode.{key}={mode[key]}: must be at least 1 (or null: from the module)")


# --- what a run of it says (launcher/cli/console.py; a sweep's table: figures) ------------------------

def _replay_time(r: dict) -> float:
    """Each module's median execution time, summed (one module: its median)."""
    return sum(statistics.median(m["execution_times_s"]) for m in (r.get("modules") or [r]))


figures = Figures((Figure("replay_time", "replay time", "s", True, _replay_time),))


def answer(r: dict) -> str:
    modules = r.get("modules") or [r]
    lines = [f"hlo_replay on {devices(r)}:"]
    for m in modules:
        times = sorted(m.get("execution_times_s") or [])
        ran = (f"{seconds(times[len(times) // 2])} per execution (median of {len(times)})" if times
               else "not executed")
        lines.append(f"  {m.get('module')}: {ran}, compiled in {seconds(m.get('compile_time_s', 0.0))}")
    return "\n".join(lines)


def line(r: dict) -> str:
    modules = r.get("modules") or [r]
    medians = [sorted(t)[len(t) // 2] for t in (m.get("execution_times_s") or [] for m in modules) if t]
    return f"{len(modules)} module(s), " + (f"median {seconds(medians[0])}" if len(medians) == 1 else
                                           f"{len(medians)} timed")
