"""mode=analysis's run: the CFP analysis pass (``launcher.sharding.pipeline.analyze``) and its files.
The options and what they mean: ``launcher/modes/analysis.py``."""

from __future__ import annotations


from launcher.sharding import pipeline
from launcher.runtime.context import TaskContext


def run(ctx: TaskContext) -> dict:
    cfg = ctx.mode_cfg
    analyzed = pipeline.analyze(None if cfg.hlo_file else ctx.model(), mesh_shape=cfg.mesh_shape,
                                hlo_file=cfg.hlo_file, learning_rate=cfg.learning_rate,
                                log=lambda line: ctx.log.info("%s", line))
    result = analyzed.analysis
    ctx.write_files(result.files())
    return {**result.summary(), "mesh_shape": list(result.mesh_shape), "source": result.graph.source,
            "num_ops": len(result.graph.ops), "analysis_time_s": analyzed.seconds}
