"""What the CFP modes' configs share: the analysis's options (mode=analysis, profile, search) and
the profile's (mode=profile, search). Not a mode: ``analysis.py``, ``profile.py`` and
``search.py`` subclass these with their names and their own options.

The profile's options are ``launcher.sharding.options.ProfileOptions``' fields under the same names,
with its defaults: what each does and why its default is what it is, is said there once.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Optional

from launcher.sharding.options import ProfileOptions
from launcher.sharding.search.meshes import AUTO, is_auto, is_list_of_shapes, mesh_shapes, shown
from launcher.errors import UserError
from launcher.modes.base import ModeConfig
from launcher.modes.checks import check_files, check_mesh_shape


@dataclass
class AnalysisConfig(ModeConfig):
    # [] = 1-D over all global devices; e.g. [2, 4]; "auto" (profile, search and cfp) every logical
    # mesh worth searching, or a list of meshes ([[8], [4, 2]]), the fastest plan over them kept
    # (launcher/sharding/search/meshes.py)
    mesh_shape: Any = field(default_factory=list)
    hlo_file: str = ""  # analyse this HLO text module instead of the model's training step
    learning_rate: float = 1e-3  # of the optimizer whose update is part of the analysed step

    @classmethod
    def check(cls, mode, job) -> None:
        """Before submission (``launcher.cli.schema.validate``): the mesh fits the job's devices (a
        dumped module's mesh need not: it is analysed, not run), the module file exists.
        ``job``: ``launcher.modes.checks.Job``."""
        if mode.hlo_file:
            check_files("mode.hlo_file", mode.hlo_file, job)
        shape = mode.mesh_shape
        if is_auto(shape):
            return
        shapes = list(shape) if is_list_of_shapes(shape) else [shape]
        for one in shapes:
            if isinstance(one, str) or not all(isinstance(n, int) and not isinstance(n, bool) for n in one):
                raise UserError(f"mode.mesh_shape={shown(shape)}: give a list of axis sizes, e.g. [4,2], [] for 1-D "
                                f"over every device, {AUTO}, or several meshes to search, e.g. [[8],[4,2]]")
            check_mesh_shape("mode.mesh_shape", one, replace(job, devices=None) if mode.hlo_file else job)
        if len(shapes) > 1 and job.devices is not None:
            mesh_shapes(shape, job.devices)   # each mesh once


@dataclass
class ProfileConfig(AnalysisConfig):
    store_dir: str = ProfileOptions.store_dir
    repeats: int = ProfileOptions.repeats
    warmup: int = ProfileOptions.warmup
    cold_caches: bool = ProfileOptions.cold_caches
    max_segment_space: int = ProfileOptions.max_segment_space
    profile_top_k: int = ProfileOptions.profile_top_k
    measure_resharding: bool = ProfileOptions.measure_resharding
    memory_budget_gb: float = ProfileOptions.memory_budget_gb
    skip_over_budget: bool = ProfileOptions.skip_over_budget
    early_stop_ratio: float = ProfileOptions.early_stop_ratio
    interleave: bool = ProfileOptions.interleave
    overlap_compile: Optional[bool] = ProfileOptions.overlap_compile
    quick_compile: Optional[bool] = ProfileOptions.quick_compile
    # mode=profile's communication study (launcher/sharding/search/studies.py): every uniform plan of
    # the whole step, with its collectives and step time, run iterations steps x run_repeats.
    enumerate: bool = False
    iterations: int = 10
    run_repeats: int = 3

    @classmethod
    def check(cls, mode, job) -> None:
        """Before submission: the analysis's checks, the profile's options (``ProfileOptions``
        refuses bad values), and no mode.hlo_file (see the message)."""
        if mode.hlo_file:
            raise UserError(f"mode={mode.name} runs the model's training step; mode.hlo_file={mode.hlo_file!r} is "
                            "for mode=analysis only (a module alone cannot be re-run under other plans)")
        ProfileOptions.of(mode)
        super().check(mode, job)
