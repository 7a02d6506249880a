"""mode=hlo_replay's run: the dumped modules replayed by ``launcher.hlo.replay`` on this job's
devices. The options and what they mean: ``launcher/modes/hlo_replay.py``."""

from __future__ import annotations

from pathlib import Path

from launcher.hlo.module import expand
from launcher.hlo.options import ReplayOptions
from launcher.hlo.replay import replay
from launcher.runtime import trace
from launcher.runtime.context import TaskContext


def run(ctx: TaskContext) -> dict:
    cfg = ctx.mode_cfg
    output_file = None
    if cfg.output_file:
        output_file = Path(cfg.output_file)
        output_file = output_file if output_file.is_absolute() else ctx.run_dir / output_file
    options = ReplayOptions(
        run=cfg.run,
        argument_mode=cfg.argument_mode,
        arguments_file=cfg.arguments_file,
        seed=ctx.cfg.seed if cfg.seed is None else cfg.seed,
        num_repeats=cfg.num_repeats,
        num_replicas=cfg.num_replicas,
        num_partitions=cfg.num_partitions,
        output_file=output_file,
        xla_flags=cfg.xla_flags or (),
        backend_only=cfg.backend_only,
    )
    with trace.recording(ctx, "hlo_replay"):  # launcher.trace: compilation and the timed repeats
        results = [r.summary() for r in replay(expand(cfg.hlo_file), options, log=ctx.log)]
    if len(results) == 1:
        return results[0]
    return {"modules": results}
