"""mode=analysis: the CFP analysis pass (ParallelBlocks, strategy map, unique segments).

Analyses the configured model's whole training step, or a dumped HLO module (``mode.hlo_file``),
for a logical mesh (``mode.mesh_shape``; empty means 1-D over every global device) and writes
``parallel_blocks.txt``, ``strategy_map.txt``, ``segments.txt`` and ``analysis.json`` into the run
dir. The files depend only on the program and the mesh: the same input gives the same bytes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, List


@dataclass
class Config:
    name: str = "analysis"
    mesh_shape: List[int] = field(default_factory=list)  # [] = 1-D over all global devices; e.g. [2, 4]
    hlo_file: str = ""  # analyse this HLO text module instead of the model's training step
    learning_rate: float = 1e-3  # of the optimizer whose update is part of the analysed step


def mesh_shape_of(cfg: Any) -> list[int]:
    import jax

    return list(cfg.mesh_shape) or [jax.device_count()]


def run_analysis(ctx: Any) -> tuple[Any, Any, float]:
    """(Analysis, TrainingProgram or None for an HLO module, seconds); writes the four files."""
    from launcher.cfp.analysis import analyze, analyze_graph
    from launcher.cfp.hlo_text import read_hlo
    from launcher.cfp.program import training_program

    cfg = ctx.mode_cfg
    mesh_shape = mesh_shape_of(cfg)
    t0 = time.perf_counter()
    if cfg.hlo_file:
        program = None
        result = analyze_graph(read_hlo(cfg.hlo_file), mesh_shape)
    else:
        program = training_program(ctx.model(), cfg.learning_rate)
        result = analyze(program.step, program.args, mesh_shape)
    seconds = time.perf_counter() - t0
    for name, text in result.files().items():
        ctx.write_text(name, text)
    ctx.log.info("analysis: %d contractions, %d ParallelBlocks, %d segments over %d templates; exhaustive space "
                 "%d, segment space %d (%.2f s)", len(result.contractions), len(result.blocks),
                 len(result.segments), len(result.templates), result.exhaustive_space, result.segment_space, seconds)
    for line in result.segments_txt().splitlines():
        if line.startswith(("ParallelBlocks sequence", "template")):
            ctx.log.info("%s", line)
    return result, program, seconds


def run(ctx: Any) -> dict:
    result, _, seconds = run_analysis(ctx)
    return {**result.summary(), "mesh_shape": list(result.mesh_shape), "source": result.graph.source,
            "num_ops": len(result.graph.ops), "analysis_time_s": seconds}
