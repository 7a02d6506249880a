"""The searched plan beside the baselines: a rich table and a bar chart (PNG, Agg backend)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Mapping

from launcher.cfp.search.measure import PlanRun


def table_text(runs: Mapping[str, PlanRun], skipped: Mapping[str, str]) -> str:
    from rich.console import Console
    from rich.table import Table

    best = min(r.step_time_s for r in runs.values())
    t = Table(title="CFP plan against the baselines (same devices)")
    for col in ("plan", "step time (ms)", "vs best", "TFLOPS", "memory (MiB/device)"):
        t.add_column(col, justify="right" if col != "plan" else "left")
    for name, r in runs.items():
        t.add_row(name, f"{r.step_time_s * 1e3:.3f}", f"{r.step_time_s / best:.3f}", f"{r.tflops:.4g}",
                  f"{r.memory_bytes / 2**20:.2f}")
    for name in skipped:
        t.add_row(name, "-", "-", "-", "-")
    console = Console(width=110, record=True, file=io.StringIO())
    console.print(t)
    for name, why in skipped.items():
        console.print(f"{name}: not run: {why}")
    return console.export_text()


def bar_chart(runs: Mapping[str, PlanRun], path: str | Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(runs)
    colors = ["tab:red" if n == "cfp" else "tab:blue" for n in names]
    metrics = [("step time (ms)", [runs[n].step_time_s * 1e3 for n in names]),
               ("TFLOPS", [runs[n].tflops for n in names]),
               ("memory (MiB / device)", [runs[n].memory_bytes / 2**20 for n in names])]
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    for ax, (label, values) in zip(axes, metrics):
        ax.bar(names, values, color=colors)
        ax.set_title(label)
        ax.tick_params(axis="x", rotation=30)
    fig.suptitle("CFP searched plan (red) against built-in plans")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
