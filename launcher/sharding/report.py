"""The searched plan beside the baselines: a rich table and a bar chart (PNG, Agg backend), from
the race's runs or, as the run dir and the console show them, from a search's result fields
(``comparison_text``, ``rows_of``): one rendering for comparison.txt and the console alike."""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence

from rich.console import Console
from rich.table import Table

from launcher.sharding.algorithms.base import Algorithm, plan_heading, plan_title
from launcher.sharding.comparison import paired_over

if TYPE_CHECKING:  # measure.py imports JAX; the modes import this module with their schemas
    from launcher.sharding.search.measure import PlanRun


def table_text(runs: Mapping[str, PlanRun | Row], skipped: Mapping[str, str], title: str, rounds: int = 0,
               why_fewer: str = "", answer: str = "", notes: Sequence[str] = (), tie: str = "") -> str:
    """The plans run, one row each, the ``answer``'s marked, and ``tie``'s (a searched plan ahead
    of it within the race's noise); below it, the plans that ran fewer than ``rounds`` rounds
    (``why_fewer``), the baselines that could not run, each named once, and ``notes`` (which
    plan is the answer and why)."""

    # Each plan against the answer round by round (``comparison.paired_over``), the figure the
    # answer was decided on: against the fastest median instead, a race of a few noisy rounds
    # read "dp (answer) 1.545" beside "cfp 1.000" under a note saying CFP's plan ran 1.074x dp.
    ref = runs[answer] if answer in runs else min(runs.values(), key=lambda r: r.step_time_s)

    def vs(r: PlanRun | Row) -> float:
        if r.repeat_times_s and ref.repeat_times_s:
            return paired_over(r.repeat_times_s, ref.repeat_times_s)
        return r.step_time_s / ref.step_time_s   # a result that kept no rounds

    # What an algorithm predicted for its plan, beside what the race measured (a built-in plan has
    # no prediction): the model's error in plain sight, as result.json keeps it (prediction_error).
    predicted = any(getattr(r, "predicted_s", None) for r in runs.values())
    # And what the one model of a step predicts for every plan raced (predict/price.py), with its error.
    modelled = any(getattr(r, "model_s", None) for r in runs.values())
    t = Table(title=title)
    for col in ("plan", "step time (ms)", "vs answer" if answer in runs else "vs best", "TFLOPS",
                "memory (MiB/device)", *(["predicted (ms)"] if predicted else []),
                *(["model (ms)", "model error"] if modelled else [])):
        t.add_column(col, justify="right" if col != "plan" else "left")
    for name, r in runs.items():
        label = f"{name} (answer)" if name == answer else f"{name} (tie)" if name == tie else name
        guess, model = getattr(r, "predicted_s", None), getattr(r, "model_s", None)
        t.add_row(label, f"{r.step_time_s * 1e3:.3f}", f"{vs(r):.3f}", f"{r.tflops:.4g}",
                  f"{r.memory_bytes / 2**20:.2f}", *([f"{guess * 1e3:.3f}" if guess else ""] if predicted else []),
                  *([f"{model * 1e3:.3f}", f"{r.step_time_s / model - 1:+.0%}"] if model else ["", ""])
                  if modelled else ())
    console = Console(width=140 if modelled else 110, record=True, file=io.StringIO())
    console.print(t)
    fewer = [f"{name} ({len(r.repeat_times_s)})" for name, r in runs.items() if len(r.repeat_times_s) < rounds]
    if fewer:
        console.print(f"fewer of the {rounds} rounds: {', '.join(fewer)}: {why_fewer}")
    for name, why in skipped.items():
        console.print(f"not run: {name}: {why}")
    for line in notes:   # whole, however long: the console and the tests read it back
        console.print(line, soft_wrap=True, markup=False, highlight=False)
    return console.export_text()


@dataclass
class Row:
    """A plan's run as a result's fields hold it (``PlanRun.summary``): what the table and the
    chart show of it."""
    step_time_s: float
    tflops: float
    memory_bytes: float
    repeat_times_s: list = field(default_factory=list)
    predicted_s: Optional[float] = None   # what its algorithm predicted (a searched plan, the ILP's)
    model_s: Optional[float] = None       # what the one model of a step predicted (every plan raced)

    @classmethod
    def of(cls, fields: Mapping[str, Any], predicted_s: Optional[float] = None) -> "Row":
        return cls(fields["step_time_s"], fields["tflops"], fields["memory_gb"] * 2**30,
                   list(fields.get("repeat_times_s") or []), predicted_s or fields.get("predicted_step_time_s"),
                   fields.get("model_step_time_s"))


def rows_of(result: Mapping[str, Any]) -> dict[str, Row]:
    """The race's rows from a search's result fields: the searched plan's, then each baseline's."""
    searched = (result.get("answer") or {}).get("searched") or Algorithm.default().row
    return {searched: Row.of(result), **{name: Row.of(b) for name, b in (result.get("baselines") or {}).items()}}


def comparison_text(result: Mapping[str, Any]) -> str:
    """A search's comparison from its result fields (``launcher/sharding/results.py``): the table
    of the plans raced, the answer marked, the plans that ran fewer rounds and the baselines that
    could not run named below it, and which plan is the answer and why."""
    answer = result.get("answer") or {}
    searched = answer.get("searched") or Algorithm.default().row   # a result from before results said
    why = answer.get("why", "")
    if why and answer.get("name") == searched:
        why += " (plan.json)"
    elif why:
        why += f" (plan.json; {plan_title(searched)} is {Path(answer.get('searched_plan_file', '')).name})"
    drop = result.get("drop_slower_than")
    plan = result.get("plan") if isinstance(result.get("plan"), dict) else {}
    if plan.get("across_processes"):   # a job of several processes: the searched plan's axis between them
        why = (f"{plan_title(searched)}: mesh {plan.get('mesh_shape')}, {plan['across_processes']} across processes "
               f"(plan.json's across)\n" + why).strip()
    model = result.get("model") or {}
    scored = ([f"model: predicted with {model.get('links', '?')}; over the {len(model['scored'])} programs raced, mean error "
               f"{model['mean_abs_error']:.0%}, Kendall's tau {model['kendall_tau']:.2f}, the predicted best measured "
               f"{model['predicted_best_over_measured_best']:.3f}x the fastest"] if model.get("scored") else [])
    return table_text(rows_of(result), result.get("baselines_skipped") or {},
                      title=f"{plan_heading(searched)} against the baselines (same devices)",
                      rounds=len(result.get("repeat_times_s") or []),
                      why_fewer=f"over {drop:g}x the fastest baseline in each, mode.drop_slower_than" if drop else "",
                      answer=answer.get("name", ""), notes=([why] if why else []) + scored,
                      tie=searched if answer.get("tie") else "")


def bar_chart(runs: Mapping[str, PlanRun | Row], path: str | Path, answer: str = "") -> Path:
    """Step time, TFLOPS and memory per plan; the ``answer``'s bars hatched and outlined."""
    import matplotlib  # noqa: PLC0415  import cost; the backend is chosen before pyplot loads

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415  import cost; the backend is chosen before pyplot loads

    names = list(runs)
    # Each algorithm's plan in its colour (CFP's red, the ILP's orange), built-in plans blue.
    planned = {n: a for n in names if (a := Algorithm.of_row(n)) is not None}
    colors = [planned[n].color if n in planned else "tab:blue" for n in names]
    metrics = [("step time (ms)", [runs[n].step_time_s * 1e3 for n in names]),
               ("TFLOPS", [runs[n].tflops for n in names]),
               ("memory (MiB / device)", [runs[n].memory_bytes / 2**20 for n in names])]
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    for ax, (label, values) in zip(axes, metrics, strict=True):
        bars = ax.bar(names, values, color=colors)
        if answer in names:
            bars[names.index(answer)].set(hatch="//", edgecolor="black", linewidth=1.5)
        ax.set_title(label)
        ax.tick_params(axis="x", rotation=30)
    title = " and ".join(f"{a.title} ({a.color.removeprefix('tab:')})" for a in planned.values())
    title = title[:1].upper() + title[1:] + " against built-in plans"
    if answer in names:
        title += f"\nthe answer (plan.json, hatched): {answer}"
    fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
