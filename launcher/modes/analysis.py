"""mode=analysis: the CFP analysis pass (ParallelBlocks, strategy map, unique segments).

Analyses the configured model's whole training step, or a dumped HLO module (``mode.hlo_file``),
for a logical mesh (``mode.mesh_shape``; empty means 1-D over every global device) and writes
``parallel_blocks.txt``, ``strategy_map.txt``, ``segments.txt`` and ``analysis.json`` into the run
dir. The files depend only on the program and the mesh: the same input gives the same bytes.
The pass itself is ``launcher.cfp.pipeline.analyze``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from launcher.cfp import pipeline
from launcher.cfp.search.meshes import AUTO, is_auto
from launcher.errors import UserError
from launcher.modes.cfp_config import AnalysisConfig


@dataclass
class Config(AnalysisConfig):
    name: str = "analysis"
    code: str = "analysis"

    @classmethod
    def check(cls, mode, job) -> None:
        """Before submission: one mesh (not ``auto``), and the analysis's checks."""
        if is_auto(mode.mesh_shape):
            raise UserError(f"mode.mesh_shape={AUTO}: mode=analysis analyses one mesh; give its shape, e.g. "
                            "mode.mesh_shape=[4,2], or [] for 1-D (mode=profile, search and cfp take auto)")
        super().check(mode, job)


def run(ctx: Any) -> dict:
    cfg = ctx.mode_cfg
    analyzed = pipeline.analyze(None if cfg.hlo_file else ctx.model(), mesh_shape=cfg.mesh_shape,
                                hlo_file=cfg.hlo_file, learning_rate=cfg.learning_rate,
                                log=lambda line: ctx.log.info("%s", line))
    result = analyzed.analysis
    ctx.write_files(result.files())
    return {**result.summary(), "mesh_shape": list(result.mesh_shape), "source": result.graph.source,
            "num_ops": len(result.graph.ops), "analysis_time_s": analyzed.seconds}
