"""mode=analysis: the CFP analysis pass (ParallelBlocks, strategy map, unique segments).

Analyses the configured model's whole training step, or a dumped HLO module (``mode.hlo_file``),
for a logical mesh (``mode.mesh_shape``; empty means 1-D over every global device) and writes
``parallel_blocks.txt``, ``strategy_map.txt``, ``segments.txt`` and ``analysis.json`` into the run
dir. The files depend only on the program and the mesh: the same input gives the same bytes.
The pass itself is ``launcher.sharding.pipeline.analyze``, run by ``launcher/modes/runs/analysis.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

from launcher.sharding.search.meshes import is_several, shown
from launcher.errors import UserError
from launcher.figures import Figure, Figures
from launcher.modes.cfp_config import AnalysisConfig


@dataclass
class Config(AnalysisConfig):
    name: str = "analysis"
    code: str = "analysis"

    @classmethod
    def check(cls, mode, job) -> None:
        """Before submission: one mesh (not ``auto`` nor a list of them), and the analysis's checks."""
        if is_several(mode.mesh_shape):
            raise UserError(f"mode.mesh_shape={shown(mode.mesh_shape)}: mode=analysis analyses one mesh; give its shape, e.g. "
                            "mode.mesh_shape=[4,2], or [] for 1-D (mode=profile, search and cfp take several)")
        super().check(mode, job)


# --- what a run of it says (launcher/cli/console.py; a sweep's table: figures) ------------------------

figures = Figures((
    Figure("blocks", "blocks", "", None, lambda r: r["num_blocks"]),
    Figure("segments", "segments", "", None, lambda r: len(r["segments"])),
))


def answer(r: dict) -> str:
    return (f"analysis on mesh {r.get('mesh_shape')}: {r.get('num_contractions')} contractions in "
            f"{r.get('num_blocks')} parallel blocks, {len(r.get('segments') or [])} segments; plan space "
            f"{r.get('exhaustive_space')} exhaustive, {r.get('segment_space')} by segments")


def line(r: dict) -> str:
    return f"{r.get('num_blocks')} blocks, {len(r.get('segments') or [])} segments"
