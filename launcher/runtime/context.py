"""What a mode sees when it runs inside a task.

A mode is a ``Config`` dataclass (its Hydra schema) and a ``run(ctx) -> dict`` function, an entry
of ``launcher.modes.MODES``. By the time ``run`` is called, device visibility is set, JAX is
imported and ``jax.distributed`` is initialised, so ``jax.devices()`` lists every global device.
The dict it returns is written by rank 0 into ``result.json`` at the root of the run dir.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional

from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from launcher.errors import BAD_INPUT, UserError
from launcher.runtime.ranks import RankInfo
from launcher.runtime.scalars import Scalars
from launcher.runtime.timing import AttemptClock
from launcher.runtime.watch import RankReporter, remaining_s


@dataclass(frozen=True)
class Launch:
    """What the launching side decided for a job's tasks, the same for every rank, handed to the
    Task at submission (``launcher/runtime/task.py``): so the task side imports neither the backends nor the modes' table."""

    # The jax.distributed coordinator port, decided once (launcher.cli.submit.coordinator_port).
    coordinator_port: int
    # The mode's run, "module:function" (its launcher.modes.MODES entry), and which entry ran (a
    # preset's, cfp's, is search's).
    run: str
    mode_code: str
    # Whether the ranks share one run dir; else each has a copy (TPU workers) and watches its own
    # (launcher/runtime/watch.py).
    shared_run_dir: bool = True
    # Whether the backend can requeue the job in its run dir (SLURM), and the backends that can,
    # named where this one cannot (launcher/runtime/requeue.py).
    requeues: bool = False
    requeuers: str = "SLURM"
    # The code's git commit where the job was submitted ("" outside a repository): the
    # tracker's run records it (launcher/runtime/trackers.py).
    commit: str = ""


@dataclass
class TaskContext:
    cfg: DictConfig
    run_dir: Path
    rank: RankInfo
    log: logging.Logger
    attempt: int = 0  # 0 on the job's first run, n after SLURM requeued it n times (runtime/requeue.py)
    # This rank's status and its watch of the job (runtime/watch.py), for a mode that must end the
    # rank from a thread of its own, or hear what the job was asked (mode=run's stop requests);
    # None outside a task.
    reporter: Optional[RankReporter] = None
    clock: Optional[AttemptClock] = None  # this attempt's times (runtime/timing.py): modes add theirs
    launch: Optional[Launch] = None  # what the launcher decided for the job's tasks (runtime/task.py)
    # This process's TensorBoard scalars (launcher/runtime/scalars.py): rank 0's go into the run
    # dir as event files. None outside a task.
    scalars: Optional[Scalars] = None

    @property
    def is_main(self) -> bool:
        return self.rank.process_id == 0

    @property
    def mode_cfg(self) -> DictConfig:
        return self.cfg.mode

    def model(self) -> Any:
        """The configured model, built from ``cfg.model`` (its ``_target_`` and fields)."""
        try:
            return instantiate(self.cfg.model, _convert_="all")
        except InstantiationException as e:
            # A model's own error names the field to fix; Hydra's wrapper would bury it.
            if isinstance(e.__cause__, BAD_INPUT):
                raise e.__cause__ from None
            raise UserError(f"model._target_={self.cfg.model.get('_target_')!r}: {e}") from None

    def path(self, name: str) -> Path:
        return self.run_dir / name

    def write_text(self, name: str, text: str) -> Path | None:
        """Writes a run-dir artifact; only rank 0 writes, so ranks never race on one file."""
        if not self.is_main:
            return None
        p = self.path(name)
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(p.name + f".tmp{self.rank.process_id}")
        tmp.write_text(text)
        tmp.replace(p)
        return p

    def write_files(self, files: Mapping[str, Any]) -> None:
        """Each (run-dir path, content) of ``files``: text as it is, anything else as JSON."""
        for name, content in files.items():
            (self.write_text if isinstance(content, str) else self.write_json)(name, content)

    def write_json(self, name: str, obj: Any) -> Path | None:
        return self.write_text(name, json.dumps(obj, indent=2, sort_keys=True, default=_json_default) + "\n")

    @contextlib.contextmanager
    def progress(self, total: int, description: str) -> Iterator["_Progress"]:
        """Progress over ``total`` units of work, with ETA.

        Rank 0 publishes it in the job's watch, where the waiting launcher draws a live rich bar on
        the user's terminal (or, with none, prints a plain line every launcher.progress_every_s),
        and logs a plain line every tenth of the way (a log is no terminal).
        Other ranks get a silent counter.
        """
        p = _Progress(self, total, description)
        p.advance(0)
        yield p
        p.advance(0, force_log=True)


class _Progress:
    def __init__(self, ctx: TaskContext, total: int, description: str) -> None:
        self.ctx, self.total, self.description = ctx, max(total, 1), description
        self.completed = 0
        self.start = time.perf_counter()
        self.started = time.time()  # published: the launcher's plain progress lines give elapsed and ETA
        self.first: tuple[float, float] | None = None   # (when, completed) at the first unit done: the pace's start
        self._logged_tenth = -1

    def advance(self, n: int = 1, description: str | None = None, force_log: bool = False) -> None:
        self.completed += n
        if self.first is None and self.completed > 0:
            self.first = (time.time(), self.completed)
        if description:
            self.description = description
        if self.ctx.reporter is not None:
            self.ctx.reporter.progressed()  # every rank: what launcher.hang_timeout_s watches
        if not self.ctx.is_main:
            return
        if self.ctx.reporter is not None:  # the job's watch carries it to the launcher (runtime/watch.py)
            self.ctx.reporter.report_progress(self.description, self.completed, self.total, self.started, self.first)
        tenth = int(10 * self.completed / self.total)
        if tenth != self._logged_tenth or force_log:
            self._logged_tenth = tenth
            elapsed = time.perf_counter() - self.start
            eta = remaining_s(self.completed, self.total, self.first, time.time())
            eta = float("nan") if eta is None else eta
            self.ctx.log.info("%s: %d/%d (%.0f%%), elapsed %.1f s, eta %.1f s", self.description,
                              self.completed, self.total, 100 * self.completed / self.total, elapsed, eta)


    def stepped(self) -> None:
        """A step of the work ended on this rank (a round of the search's race): its host work
        is compared with the other ranks' (``RankReporter.stepped``)."""
        if self.ctx.reporter is not None:
            self.ctx.reporter.stepped()


def _json_default(o: Any) -> Any:
    if isinstance(o, (DictConfig,)):
        return OmegaConf.to_container(o, resolve=True)
    if isinstance(o, Path):
        return str(o)
    if hasattr(o, "tolist"):
        return o.tolist()
    if hasattr(o, "item"):
        return o.item()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")
