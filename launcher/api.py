"""What a user's own program (``mode=run``) may ask the launcher: ``launcher.context()``.

    import launcher

    ctx = launcher.context()
    ctx.rank, ctx.num_processes, ctx.is_main   # this process among the job's (jax.process_index())
    ctx.run_dir, ctx.checkpoint_dir            # the run's directory; where to save, every restart alike
    ctx.restart                                # 0, or how often SLURM requeued the job
    if ctx.should_stop():                      # SLURM asked the job to stop: save, then return
        ...
    ctx.step()                                 # once a step: this process is making progress
    ctx.log(step, loss=loss, lr=lr)            # scalars for TensorBoard, in the run dir

``should_stop()`` gives every process the same answer at the same call (the processes agree on
it), so call it at the same point on all of them, once a step or every few steps. Once it has
said True, a program that returns (or exits with status 0) is requeued: it starts again in the
same run dir with ``restart`` one higher and resumes from what it saved
(``launcher/runtime/stop.py`` has the mechanism).

``step()`` tells the launcher that this process is making progress; where no process of the
job has (nor written to its log) for ``launcher.hang_timeout_s``, every process writes the
stacks of its threads into its log, the launcher says where each one was (``ranks 0,2 at
train.py:41 in main (loss = step(batch)); rank 1 at loader.py:12 in next (...)``) and the job
ends as hung. A program that never calls it is judged by its log alone.

``log(step, **scalars)`` writes each number (a float, an int, a NumPy or JAX scalar) as a
TensorBoard scalar of that name at ``step``, into event files in the run dir beside the job's own
(``tensorboard --logdir outputs/`` shows them; ``launcher/runtime/scalars.py``). Rank 0's calls
write and the others' are dropped, so every process may call it alike; ``every_rank=True`` has
each other rank write its own too, into ``<run dir>/rank<N>/``. The last value of each name goes
into ``result.json`` (``logged``), where a sweep's table and Hydra's sweepers find it
(``launcher.objective.figure=<name>``). Run by hand, it writes into the current directory (with
tensorboardX installed; without it, nothing).

Run by hand (``python train.py``) the same calls describe a single process working in the
current directory: rank 0 of 1, restart 0, checkpoints in ``./checkpoints``, and should_stop()
is never true. So a program written with it runs unchanged without the launcher.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from launcher.runtime.scalars import Scalars


@dataclass(frozen=True)
class Context:
    run_dir: Path
    rank: int
    num_processes: int
    restart: int
    checkpoint_dir: Path
    launched: bool = False  # started by the launcher (mode=run); False when run by hand
    _should_stop: Callable[[], bool] = field(default=lambda: False, repr=False, compare=False)
    # This process's step ended (its number, or None): RankReporter.stepped.
    _progressed: Callable[..., None] = field(default=lambda step=None: None, repr=False, compare=False)
    _scalars: Any = field(default=None, repr=False, compare=False)  # launcher.runtime.scalars.Scalars

    @property
    def is_main(self) -> bool:
        """Whether this is the job's first process (the one that writes shared files)."""
        return self.rank == 0

    def should_stop(self) -> bool:
        """True once SLURM has asked the job to stop (its time limit is near, or it is being
        preempted): save, then return. The same answer on every process at the same call."""
        return self._should_stop()

    def step(self) -> None:
        """This process finished a step (call once a step, or at any point it passes often): what
        ``launcher.hang_timeout_s`` watches. Cheap: written at most once a second."""
        self._progressed()

    def log(self, step: int, /, every_rank: bool = False, **scalars: Any) -> None:
        """Each of ``scalars`` (name=number) as a TensorBoard scalar at ``step``: rank 0's into
        the run dir; another rank's only with ``every_rank`` (into ``<run dir>/rank<N>/``).
        TypeError for a value that is not a number. A new ``step`` is a step ended, as ``step()``
        says (on every rank: how its host work per step compares with the others')."""
        self._scalars.add(step, scalars, every_rank=every_rank)
        self._progressed(int(step))


_current: Optional[Context] = None


def context() -> Context:
    """The running program's context (see the module's docstring)."""
    global _by_hand
    if _current is not None:
        return _current
    here = Path.cwd()
    if _by_hand is None or _by_hand.run_dir != here:  # one writer for a program run by hand
        _by_hand = Context(run_dir=here, rank=0, num_processes=1, restart=0, checkpoint_dir=here / "checkpoints",
                           _scalars=Scalars(here, 0))
    return _by_hand


_by_hand: Optional[Context] = None


def _install(ctx: Optional[Context]) -> None:
    """Set by mode=run for the program it runs (None: back to a program run by hand)."""
    global _current
    _current = ctx
