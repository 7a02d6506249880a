"""mode=analysis: the CFP analysis pass (ParallelBlocks, strategy map, unique segments).

Analyses the configured model's whole training step, or a dumped HLO module (``mode.hlo_file``),
for a logical mesh (``mode.mesh_shape``; empty means 1-D over every global device) and writes
``parallel_blocks.txt``, ``strategy_map.txt``, ``segments.txt`` and ``analysis.json`` into the run
dir. The files depend only on the program and the mesh: the same input gives the same bytes.
The pass itself is ``launcher.cfp.pipeline.analyze``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Config:
    name: str = "analysis"
    # [] = 1-D over all global devices; e.g. [2, 4]; "auto" (profile, search and cfp) every logical
    # mesh worth searching, the fastest plan over them kept (launcher/cfp/search/meshes.py)
    mesh_shape: Any = field(default_factory=list)
    hlo_file: str = ""  # analyse this HLO text module instead of the model's training step
    learning_rate: float = 1e-3  # of the optimizer whose update is part of the analysed step

    @classmethod
    def check(cls, mode, job) -> None:
        """Before submission (``launcher.schema.validate``): the mesh fits the job's devices (a
        dumped module's mesh need not: it is analysed, not run), the module file exists.
        ``job``: ``launcher.schema.Job``."""
        from dataclasses import replace

        from launcher.schema import check_files, check_mesh_shape

        from launcher.cfp.search.meshes import AUTO, is_auto
        from launcher.errors import UserError

        if mode.hlo_file:
            check_files("mode.hlo_file", mode.hlo_file, job)
        shape = mode.mesh_shape
        if is_auto(shape):
            if mode.name == "analysis":
                raise UserError(f"mode.mesh_shape={AUTO}: mode=analysis analyses one mesh; give its shape, e.g. "
                                "mode.mesh_shape=[4,2], or [] for 1-D (mode=profile, search and cfp take auto)")
            return
        if isinstance(shape, str) or not all(isinstance(n, int) and not isinstance(n, bool) for n in shape):
            raise UserError(f"mode.mesh_shape={shape}: give a list of axis sizes, e.g. [4,2], [] for 1-D over "
                            f"every device, or {AUTO}")
        check_mesh_shape("mode.mesh_shape", shape, replace(job, devices=None) if mode.hlo_file else job)


def write_files(ctx: Any, analyzed: Any, folder: str = "") -> None:
    """The analysis files (``parallel_blocks.txt``, ``strategy_map.txt``, ``segments.txt``,
    ``analysis.json``) into the run dir (``folder``: a folder in it)."""
    for name, text in analyzed.analysis.files().items():
        ctx.write_text(folder + name, text)


def run(ctx: Any) -> dict:
    from launcher.cfp import pipeline

    cfg = ctx.mode_cfg
    analyzed = pipeline.analyze(None if cfg.hlo_file else ctx.model(), mesh_shape=cfg.mesh_shape,
                                hlo_file=cfg.hlo_file, learning_rate=cfg.learning_rate,
                                log=lambda line: ctx.log.info("%s", line))
    write_files(ctx, analyzed)
    result = analyzed.analysis
    return {**result.summary(), "mesh_shape": list(result.mesh_shape), "source": result.graph.source,
            "num_ops": len(result.graph.ops), "analysis_time_s": analyzed.seconds}
