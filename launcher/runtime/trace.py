"""A ``jax.profiler`` trace per rank, with ``launcher.trace=true``.

    with trace.recording(ctx, "train"):
        ...  # the measured steps

writes ``<run dir>/traces/rank<N>/plugins/profile/<time>/<host>.xplane.pb`` on every rank (and a
Perfetto ``*.trace.json.gz`` beside it, which ``launcher/runtime/trace_stats.py`` reads without
TensorBoard). Open them with ``tensorboard --logdir <run dir>/traces`` (each rank is a run; the
Profile tab needs ``pip install tensorboard-plugin-profile``, or ``xprof --logdir <run dir>/traces``)
or drop the ``.trace.json.gz`` on https://ui.perfetto.dev. A requeued job's next run adds a
trace of its own (another ``<time>`` folder). Without ``launcher.trace`` it does nothing.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Iterator

import jax

from launcher import jaxcompat

TRACES = "traces"


def rank_dir(run_dir: Path, rank: int) -> Path:
    return Path(run_dir) / TRACES / f"rank{rank}"


@contextlib.contextmanager
def recording(ctx: Any, what: str = "") -> Iterator[Path | None]:
    """Traces what runs inside on this rank when ``launcher.trace`` is set (yields the rank's
    trace dir, else None). Every rank records its own: a trace is per process."""
    if not ctx.cfg.launcher.get("trace", False):
        yield None
        return
    out = rank_dir(ctx.run_dir, ctx.rank.process_id)
    out.mkdir(parents=True, exist_ok=True)
    jaxcompat.start_trace(str(out))
    try:
        yield out
    finally:
        # Also on the way out of an exception (a signal's requeue included): a trace that was
        # started must be stopped, or the profiler stays busy for the rest of the process.
        jax.profiler.stop_trace()
        ctx.log.info("trace%s: written to %s", f" of {what}" if what else "", out)
