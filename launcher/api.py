"""What a user's own program (``mode=run``) may ask the launcher: ``launcher.context()``.

    import launcher

    ctx = launcher.context()
    ctx.rank, ctx.num_processes, ctx.is_main   # this process among the job's (jax.process_index())
    ctx.run_dir, ctx.checkpoint_dir            # the run's directory; where to save, every restart alike
    ctx.restart                                # 0, or how often SLURM requeued the job
    if ctx.should_stop():                      # SLURM asked the job to stop: save, then return
        ...

``should_stop()`` gives every process the same answer at the same call (the processes agree on
it), so call it at the same point on all of them, once a step or every few steps. Once it has
said True, a program that returns (or exits with status 0) is requeued: it starts again in the
same run dir with ``restart`` one higher and resumes from what it saved
(``launcher/runtime/stop.py`` has the mechanism).

Run by hand (``python train.py``) the same calls describe a single process working in the
current directory: rank 0 of 1, restart 0, checkpoints in ``./checkpoints``, and should_stop()
is never true. So a program written with it runs unchanged without the launcher.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional


@dataclass(frozen=True)
class Context:
    run_dir: Path
    rank: int
    num_processes: int
    restart: int
    checkpoint_dir: Path
    launched: bool = False  # started by the launcher (mode=run); False when run by hand
    _should_stop: Callable[[], bool] = field(default=lambda: False, repr=False, compare=False)

    @property
    def is_main(self) -> bool:
        """Whether this is the job's first process (the one that writes shared files)."""
        return self.rank == 0

    def should_stop(self) -> bool:
        """True once SLURM has asked the job to stop (its time limit is near, or it is being
        preempted): save, then return. The same answer on every process at the same call."""
        return self._should_stop()


_current: Optional[Context] = None


def context() -> Context:
    """The running program's context (see the module's docstring)."""
    if _current is not None:
        return _current
    here = Path.cwd()
    return Context(run_dir=here, rank=0, num_processes=1, restart=0, checkpoint_dir=here / "checkpoints")


def _install(ctx: Optional[Context]) -> None:
    """Set by mode=run for the program it runs (None: back to a program run by hand)."""
    global _current
    _current = ctx
