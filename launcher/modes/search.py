"""mode=search: the CFP search pass, and the searched plan run beside the baselines.

Reuses the profile store: combinations already measured for this model, mesh and devices are
read, missing ones are measured first (the log says how many of each). The analysis is redone
(it takes seconds and the plan is applied to the traced program anyway). Then dynamic
programming picks a combination per segment under ``mode.memory_budget_gb``, the plan runs on the
whole training step (``mode.iterations`` steps, ``mode.run_repeats`` repeats) next to the
built-in plans, and the run dir gets ``plan.json`` (for ``mode=train mode.plan=...``),
``after_ir.txt`` (the compiled program with its shardings), ``comparison.txt`` and
``comparison.png``. ``mode=cfp`` is this mode with lighter defaults (``conf/mode/cfp.yaml``).

``plan.json`` is the answer (``pipeline.Answer``): the searched plan where it beat the fastest
baseline by ``mode.verify_margin`` in the final race, else that baseline's plan; the searched
plan is always ``cfp_plan.json`` (``alpa_ilp_plan.json`` for the ILP's), and ``after_ir.txt``
is the answer's program (the searched plan's too, ``<plan>_after_ir.txt``, where it is not the
answer). The table, the chart and the console name the answer and say why (docs/cfp.md).

``alpa_ilp`` in ``mode.baselines`` races the Alpa-style ILP's plan (``launcher/cfp/ilp/``)
beside CFP's (and writes ``alpa_ilp_plan.json``, ``ilp_plan.txt``). ``mode.algorithm=ilp`` runs
that ILP instead of CFP's search, nothing profiled: every mesh of ``mode.mesh_shape`` analysed
in full (the ILP drops the strategies that leave an axis repeating work itself), the collectives
calibrated into ``mode.store_dir`` once per mesh, the ILP solved on each under
``mode.memory_budget_gb`` and the plan its model predicts fastest raced beside the baselines;
``plan.json``, ``ilp_plan.txt`` (every contraction's strategy), ``after_ir.txt`` and the
comparison as above.

``mode.step=pkg.module:make_step`` searches a user's own training step instead of the model
(``launcher/cfp/autoshard.py``, docs/autoshard.md): the factory, importable from the directory
the launcher starts in, returns the step function and its example arguments (or an
``autoshard.Step``); the baselines are dp, fsdp and the user's own shardings where the factory
gives them (the built-in plans that name the model's logical axes are skipped, saying why), and
plan.json is the ``AutoPlan`` that ``AutoPlan.load`` reads.

The options are ``launcher.cfp.options``' (``SearchOptions``, ``IlpOptions``, and the profile's
through ``cfp_config.ProfileConfig``), the passes ``launcher.cfp.pipeline``'s, the result's
fields ``launcher.cfp.results``'; ``launcher/modes/runs/search.py`` runs them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, List, Mapping, Optional

from launcher.cfp.options import IlpOptions, SearchOptions
from launcher.cfp.search.meshes import AUTO
from launcher.errors import UserError
from launcher.modes.cfp_config import AnalysisConfig, ProfileConfig
from launcher.runtime.program import check_target, parse_target


@dataclass
class Config(ProfileConfig):
    """mode=search's options: the profile's, ``SearchOptions``' and the ILP's (launcher/cfp/options.py
    says what each does, and why its default)."""

    name: str = "search"
    code: str = "search"
    # Every logical mesh worth searching ([8], [4,2], [2,4] for 8 devices), the fastest plan kept:
    # the search space then holds every baseline's layout (launcher/cfp/search/meshes.py).
    mesh_shape: Any = AUTO
    iterations: int = SearchOptions.iterations
    run_repeats: int = SearchOptions.run_repeats
    drop_after: int = SearchOptions.drop_after
    drop_slower_than: float = SearchOptions.drop_slower_than
    baselines: List[str] = field(default_factory=lambda: list(SearchOptions.baselines))
    verify_top_k: int = SearchOptions.verify_top_k
    verify_nearest: bool = SearchOptions.verify_nearest
    verify_iterations: int = SearchOptions.verify_iterations
    verify_repeats: int = SearchOptions.verify_repeats
    verify_margin: float = SearchOptions.verify_margin
    # cfp: CFP's profiling search. ilp: the Alpa-style ILP alone (launcher/cfp/ilp/, nothing
    # profiled); with cfp, mode.baselines may name alpa_ilp to race the ILP's plan beside CFP's.
    algorithm: str = "cfp"
    ilp_time_limit_s: float = IlpOptions.time_limit_s
    # pkg.module:make_step: search this factory's training step instead of the model (docs/autoshard.md).
    step: Optional[str] = None

    @classmethod
    def check(cls, mode, job) -> None:
        """Before submission: the profile's checks, the search's options (``SearchOptions``
        refuses bad values: baselines that are neither built-in plans nor alpa_ilp...), a
        known algorithm, and a ``mode.step`` that can be imported without options it overrides."""
        super().check(mode, job)
        search_options(mode)
        if mode.algorithm not in ("cfp", "ilp"):
            raise UserError(f"mode.algorithm={mode.algorithm!r}: choose cfp (CFP's profiling search) or ilp (the "
                            "Alpa-style ILP)")
        if mode.step:
            parse_target(mode.step, "mode.step")
            if mode.learning_rate != AnalysisConfig.learning_rate:
                raise UserError(f"mode.learning_rate={mode.learning_rate} sets the optimizer of the model's step; "
                                f"mode.step={mode.step} brings its own step and optimizer: leave "
                                "mode.learning_rate out")
            if job.same_python:
                check_target(mode.step, {}, Path.cwd(), "mode.step")


def search_options(cfg: Mapping[str, Any], seed: int = 0) -> SearchOptions:
    """The search's options (and in them the profile's) from the mode's config."""
    return SearchOptions.of(cfg, seed=seed)


def ilp_options(cfg: Mapping[str, Any]) -> IlpOptions:
    return IlpOptions.of(cfg, time_limit_s=cfg["ilp_time_limit_s"])
