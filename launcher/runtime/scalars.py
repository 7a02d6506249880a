"""A run's curves: scalars handed to its experiment tracker (``launcher.tracker``:
TensorBoard's event files in the run dir by default, W&B or MLflow; ``trackers.py``).

Who writes what: mode=train each step's loss, step time, throughput and TFLOPS, and the step's
memory (``launcher/modes/runs/train.py``); a mode=run program what it passes to
``launcher.context().log(step, **scalars)``; the sharding search each plan's step time in each
round of its final race (``race/<plan>``); and, for every run that wrote a curve, each attempt's
time accounting (``time/<what>_s`` at step = the attempt, ``launcher/runtime/timing.py``).

Rank 0 writes into the run dir itself, so ``tensorboard --logdir outputs/`` shows every run side
by side, named by its run dir; another rank writes only when its program asks
(``every_rank=True``), into ``<run dir>/rank<N>/``, a run of its own. A restarted or requeued
attempt goes on with the same tracker run (``trackers.py``), its steps continuing.

The trackers are extras (``pip install 'xlaunch[tensorboard]'``, ``[wandb]``, ``[mlflow]``):
without the chosen one's library the first scalar says so once in the rank's log, the run goes
on, and nothing is written. The last value of each scalar stays in ``last`` (mode=run puts them
into result.json as ``logged``).
"""

from __future__ import annotations

import numbers
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

from launcher.runtime.trackers import Tracker, tracker_for

class Scalars:
    """One process's scalars: rank 0's into ``run_dir``, another rank's (only where asked) into
    ``run_dir/rank<N>``, through the tracker ``tracker`` with the run's ``params`` (its resolved
    config and commit: ``trackers.params_of``). ``warn`` says once that its library is missing."""

    def __init__(self, run_dir: Path, rank: int, attempt: int = 0, warn: Callable[[str], Any] = print,
                 tracker: str = "tensorboard", params: Optional[Mapping[str, Any]] = None) -> None:
        self.run_dir, self.rank, self.attempt, self.warn = Path(run_dir), rank, attempt, warn
        self.tracker_name, self.params = tracker, dict(params or {})
        Tracker.named(tracker)   # a name that is none fails here, before a step runs
        self.last: dict[str, float] = {}
        self._tracker: Optional[Tracker] = None
        self._missing = False

    @property
    def log_dir(self) -> Path:
        return self.run_dir if self.rank == 0 else self.run_dir / f"rank{self.rank}"

    @property
    def written(self) -> bool:
        """Whether this process has written a scalar (its tracker run is open)."""
        return self._tracker is not None

    @property
    def purged_from(self) -> Optional[int]:
        """The step this attempt's TensorBoard writer purged from (None: nothing purged)."""
        return self._tracker.purged_from if self._tracker is not None else None

    def add(self, step: int, values: Mapping[str, Any], prefix: str = "", every_rank: bool = False,
            axis: str = "step") -> None:
        """``values`` (name -> number: Python's, NumPy's, a 0-d array) at ``step``, each under
        ``prefix + name``; on a rank other than 0 only with ``every_rank``; ``axis``: what
        ``step`` counts where it is not the run's steps (``attempt``). TypeError for a value
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
        tracker = self._open(int(step)) if found else None
        if tracker is not None:
            tracker.log(int(step), found, axis)

    def _open(self, first_step: int) -> Optional[Tracker]:
        if self._tracker is not None or self._missing:
            return self._tracker
        tracker = tracker_for(self.tracker_name, self.log_dir, self.run_dir, self.attempt, self.params, self.warn)
        if tracker is None:
            self._missing = True
            return None
        tracker.open(first_step)
        self._tracker = tracker
        return tracker

    def flush(self) -> None:
        """Onto disk now: what was written survives this process being killed (a checkpoint's
        steps, which a restart does not run again)."""
        if self._tracker is not None:
            self._tracker.flush()

    def close(self) -> None:
        if self._tracker is not None:
            self._tracker.close()


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
