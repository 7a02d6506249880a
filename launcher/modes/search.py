"""mode=search: a sharding algorithm (``mode.algorithm``: CFP's profiling search by default,
``ilp`` the Alpa-style ILP, or one registered from ``mode.algorithm_module``) over the model's
training step, or a user's own (``mode.step``), raced beside the baselines; ``mode=cfp`` is its
preset with lighter defaults. What it does, what each option and each file of the run dir is:
docs/cfp.md and docs/autoshard.md. The options are ``launcher/sharding/options.py``'s, the algorithms
``launcher/sharding/algorithms/``, the run ``launcher/modes/runs/search.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, make_dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

from launcher.sharding.algorithms.base import Algorithm
from launcher.sharding.options import SearchOptions
from launcher.sharding.search.meshes import AUTO
from launcher.errors import UserError
from launcher.figures import Figure, Figures, seconds
from launcher.modes.cfp_config import AnalysisConfig, ProfileConfig
from launcher.runtime.user_program import check_target, parse_target


@dataclass
class _Search(ProfileConfig):
    """mode=search's options: the profile's and ``SearchOptions``' (launcher/sharding/options.py
    says what each does, and why its default), and the algorithms' (``Config`` below)."""

    name: str = "search"
    code: str = "search"
    # Every logical mesh worth searching ([8], [4,2], [2,4] for 8 devices), the fastest plan kept:
    # the search space then holds every baseline's layout (launcher/sharding/search/meshes.py).
    mesh_shape: Any = AUTO
    iterations: int = SearchOptions.iterations
    run_repeats: int = SearchOptions.run_repeats
    round_seconds: float = SearchOptions.round_seconds
    drop_after: int = SearchOptions.drop_after
    drop_slower_than: float = SearchOptions.drop_slower_than
    baselines: List[str] = field(default_factory=lambda: list(SearchOptions.baselines))
    mesh_gate: float = SearchOptions.mesh_gate
    verify_margin: float = SearchOptions.verify_margin
    price_race: bool = SearchOptions.price_race
    # The algorithm (launcher/sharding/algorithms/; default: the one its class says is): cfp, CFP's
    # profiling search; ilp, the Alpa-style ILP alone (nothing profiled). With cfp, mode.baselines
    # may name alpa_ilp to race the ILP's plan beside CFP's.
    algorithm: str = field(default_factory=lambda: Algorithm.default().name)
    # A module defining more algorithms (launcher/sharding/algorithms/base.py), importable from the
    # directory the launcher starts in or PYTHONPATH.
    algorithm_module: Optional[str] = None
    # Options of an algorithm's own (its option_names), e.g. +mode.algorithm_options.my_option=1.
    algorithm_options: Dict[str, Any] = field(default_factory=dict)
    # pkg.module:make_step: search this factory's training step instead of the model (docs/autoshard.md).
    step: Optional[str] = None
    # Predict instead of run: the plans for the cluster's nodes ranked by predicted step time,
    # computed in the launcher's own process on virtual CPU devices, nothing submitted
    # (docs/predict.md). mode.links: the link model (conf/links/: lumi, tpu-v5e, h100; or a path);
    # null: the cluster's (lumi for cluster=lumi, tpu-v5e for cluster=tpu). Without predict, the
    # link model the race's predictions use (mode.price_race; null: this job's, measured).
    predict: bool = False
    links: Optional[str] = SearchOptions.links
    link_repeats: int = SearchOptions.link_repeats   # measuring this job's link model (price_race)

    @classmethod
    def check(cls, mode, job) -> None:
        """Before submission: the profile's checks, the search's options (``SearchOptions``
        refuses bad values: baselines that are neither built-in plans nor alpa_ilp...), a
        known algorithm, and a ``mode.step`` that can be imported without options it overrides."""
        super().check(mode, job)
        algorithm_of(mode)
        if mode.links:   # a name or file that is no link model: refused before submission
            from launcher.sharding.predict.links import load   # noqa: PLC0415  it imports JAX; only then

            load(mode.links)
        if mode.step:
            parse_target(mode.step, "mode.step")
            if mode.learning_rate != AnalysisConfig.learning_rate:
                raise UserError(f"mode.learning_rate={mode.learning_rate} sets the optimizer of the model's step; "
                                f"mode.step={mode.step} brings its own step and optimizer: leave "
                                "mode.learning_rate out")
            if job.same_python:
                check_target(mode.step, {}, Path.cwd(), "mode.step")


# The package's algorithms' own options, each a key of the mode with its default (CFP's shortlist,
# mode.verify_top_k...; the ILP's time limit), as each algorithm declares them (Algorithm.option_defaults).
Config = make_dataclass("Config", [(name, type(default), field(default=default))
                                   for name, default in Algorithm.package_options().items()],
                        bases=(_Search,))
Config.__module__, Config.__doc__ = __name__, _Search.__doc__


def algorithm_of(cfg: Mapping[str, Any], seed: int = 0) -> Algorithm:
    """The run's algorithm (``mode.algorithm``) with its options, made once from the mode's config
    (``SearchOptions`` refuses bad values: baselines that are neither built-in plans nor an
    algorithm's...)."""
    algorithm = Algorithm.named(cfg["algorithm"], cfg.get("algorithm_module"))
    own = dict(cfg.get("algorithm_options") or {})
    unknown = sorted(set(own) - set(algorithm.option_names))
    if unknown:
        raise UserError(f"mode.algorithm_options.{unknown[0]}: mode.algorithm={algorithm.name} has no such option "
                        f"(its options: {', '.join(algorithm.option_names) or 'none'})")
    return algorithm(SearchOptions.of(cfg, seed=seed), {**cfg, **own})


# --- what a run of it says (launcher/cli/console.py; a sweep's table: figures) ------------------------

# search and cfp: the answer (the plan plan.json holds), its step time and its time over the
# fastest baseline's (paired over the final race's rounds).
figures = Figures((
    Figure("step_time", "step time", "s", True, lambda r: r["answer"]["step_time_s"]),
    Figure("answer", "answer", "", None, lambda r: r["answer"]["name"], numeric=False),
    Figure("vs_best_baseline", "vs best baseline", "x", True, lambda r: r["answer"]["vs_best_baseline_paired"]),
))


def answer(r: dict) -> str:
    """The comparison table, from the result's fields as comparison.txt has it (plain text;
    under it, which plan is the answer and why), the chart beside it, and the answer's plan file."""
    chosen = r.get("answer") or {}
    if r.get("baselines") is not None and r.get("repeat_times_s") and chosen.get("searched"):
        from launcher.sharding.report import comparison_text  # noqa: PLC0415  rich: at the run's end only

        lines = [comparison_text(r).rstrip("\n")]
    else:
        lines = [f"{r.get('mode')}: searched plan {seconds(r.get('step_time_s', math.nan))}/step"]
        if chosen.get("why"):
            lines.append(chosen["why"])
    if r.get("chart"):
        lines.append(f"chart: {r['chart']}")
    if chosen.get("plan_file"):
        lines.append(f"plan: {chosen['plan_file']} ({chosen.get('name')}; mode=train mode.plan=<it> trains with it)")
    return "\n".join(lines)


def line(r: dict) -> str:
    chosen = r.get("answer") or {}
    if "vs_best_baseline" not in r:
        text = f"searched plan {seconds(r.get('step_time_s', math.nan))}/step"
    else:
        text = f"searched plan {r.get('vs_best_baseline_paired', r['vs_best_baseline']):.3f}x {r.get('best_baseline')}"
    return f"answer {chosen['name']}; {text}" if chosen.get("name") else text
