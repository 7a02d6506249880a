"""Curves for TensorBoard: scalars written as event files in the run dir (tensorboardX, which
needs no TensorFlow).

Who writes what: mode=train each step's loss, step time, throughput and TFLOPS, and the step's
memory (``launcher/modes/runs/train.py``); a mode=run program what it passes to
``launcher.context().log(step, **scalars)``; the sharding search each plan's step time in each
round of its final race (``race/<plan>``); and, for every run that wrote a curve, each attempt's
time accounting (``time/<what>_s`` at step = the attempt, ``launcher/runtime/timing.py``).

Rank 0 writes into the run dir itself, so ``tensorboard --logdir outputs/`` shows every run side
by side, named by its run dir; another rank writes only when its program asks
(``every_rank=True``), into ``<run dir>/rank<N>/``, a run of its own. A restarted or requeued
attempt's first step purges what earlier attempts wrote at that step and after (TensorBoard's
purge step), so a resumed curve continues instead of doubling back.

tensorboardX is an extra (``pip install 'xlaunch[tensorboard]'``): without it the first scalar
says so once in the rank's log, the run goes on, and nothing is written. The last value of each
scalar stays in ``last`` (mode=run puts them into result.json as ``logged``).
"""

from __future__ import annotations

import numbers
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

# How often the writer's own thread flushes what it holds to disk: a run followed live in
# TensorBoard shows its steps within this many seconds. (Closing flushes the rest.)
FLUSH_S = 5

INSTALL = "pip install 'xlaunch[tensorboard]'"


class Scalars:
    """One process's scalars: rank 0's into ``run_dir``, another rank's (only where asked) into
    ``run_dir/rank<N>``. ``warn`` says once that tensorboardX is missing."""

    def __init__(self, run_dir: Path, rank: int, attempt: int = 0, warn: Callable[[str], Any] = print) -> None:
        self.run_dir, self.rank, self.attempt, self.warn = Path(run_dir), rank, attempt, warn
        self.last: dict[str, float] = {}
        self.purged_from: Optional[int] = None  # the step this attempt's writer purged from
        self._writer: Any = None
        self._missing = False

    @property
    def log_dir(self) -> Path:
        return self.run_dir if self.rank == 0 else self.run_dir / f"rank{self.rank}"

    @property
    def written(self) -> bool:
        """Whether this process has written a scalar (an event file is open)."""
        return self._writer is not None

    def add(self, step: int, values: Mapping[str, Any], prefix: str = "", every_rank: bool = False) -> None:
        """``values`` (name -> number: Python's, NumPy's, a 0-d array) at ``step``, each under
        ``prefix + name``; on a rank other than 0 only with ``every_rank``. TypeError for a value
        that is not a number (NaN is one: a diverging loss shows as such)."""
        found = {}
        for name, value in values.items():
            v = _number(value)
            if v is None:
                raise TypeError(f"scalar {name}={value!r}: not a number; give numbers (a float, an int, a 0-d array)")
            found[f"{prefix}{name}"] = v
        if self.rank != 0 and not every_rank:
            return
        self.last.update(found)
        writer = self._open(int(step)) if found else None
        if writer is None:
            return
        for tag, v in found.items():
            writer.add_scalar(tag, v, int(step))

    def _open(self, first_step: int) -> Any:
        if self._writer is not None or self._missing:
            return self._writer
        try:
            from tensorboardX import SummaryWriter  # noqa: PLC0415  optional: the tensorboard extra
        except ImportError:
            self._missing = True
            self.warn(f"TensorBoard scalars are not written: tensorboardX is not installed ({INSTALL})")
            return None
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.purged_from = first_step if self.attempt else None
        # A later attempt purges what the earlier ones wrote from its first step on. The suffix
        # keeps two writers of one host in one second (an attempt and its quick restart) apart.
        self._writer = SummaryWriter(logdir=str(self.log_dir), flush_secs=FLUSH_S,
                                     purge_step=self.purged_from,
                                     filename_suffix=f".attempt{self.attempt}")
        return self._writer

    def flush(self) -> None:
        """Onto disk now: what was written survives this process being killed (a checkpoint's
        steps, which a restart does not run again)."""
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


def _number(value: Any) -> Optional[float]:
    """A float from a Python or NumPy number or a 0-d array (a JAX scalar included); None for
    anything else."""
    if isinstance(value, bool):
        return float(value)
    if not isinstance(value, numbers.Real):
        try:
            value = value.item() if getattr(value, "shape", None) == () else None  # 0-d arrays
        except (TypeError, ValueError):
            return None
        if value is None or not isinstance(value, numbers.Real):
            return None
    return float(value)
