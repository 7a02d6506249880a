"""``sweep.png``: the sweep's objective over what it varied.

Drawn where the points that are done have the objective (``launcher/figures.py``) and one of
the keys the sweep varies gives its x axis: a key whose values are all numbers (a line over
them), or else one of a few named choices (a bar each). The other keys that vary make one line,
or one bar in each group, per combination, while there are at most ``SERIES``. Otherwise no
chart is drawn, and the table says why.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from launcher.figures import formatted
from launcher.cli.sweep.points import Point, SweepView

CHART = "sweep.png"
CHOICES = 8  # named values on the x axis at most
SERIES = 6  # lines (or bars per group) at most


def draw(view: SweepView, path: Path) -> tuple[Optional[Path], str]:
    """Draws the chart into ``path``; (the path, what it shows), or (None, why there is none)."""
    objective = view.objective
    if objective is None:
        return None, "no chart: the points share no objective (launcher.objective.figure names one)"
    done = [p for p in view.points if p.state == "done" and objective.value(p.result) is not None]
    if len(done) < 2:
        return None, f"no chart yet: {len(done)} point(s) with {objective.name}"
    axis = _x_axis(view, done)
    if axis is None:
        return None, (f"no chart: {objective.name} of {len(done)} point(s), over no key with several numbers "
                      f"or at most {CHOICES} named values")
    key, numeric = axis
    others = [k for k in view.varying if k != key]
    series: dict[str, list[Point]] = {}
    for p in done:
        series.setdefault(", ".join(f"{k}={p.overrides.get(k, '')}" for k in others), []).append(p)
    if len(series) > SERIES:
        return None, f"no chart: {objective.name} over {key} would need {len(series)} lines (at most {SERIES})"
    _plot(view, key, numeric, series, path)
    return path, f"{objective.name} over {key}" + (f", one {'line' if numeric else 'bar'} per {', '.join(others)}"
                                                    if others else "")


def _x_axis(view: SweepView, done: list[Point]) -> Optional[tuple[str, bool]]:
    """The key for the x axis and whether its values are numbers: the first numeric key with
    several values, else the key with the fewest named values (two to CHOICES)."""
    candidates = []
    for key in view.varying:
        values = {p.overrides.get(key, "") for p in done}
        if len(values) < 2:
            continue
        if all(_float(v) is not None for v in values):
            return key, True
        if len(values) <= CHOICES:
            candidates.append((len(values), key))
    return (min(candidates)[1], False) if candidates else None


def _plot(view: SweepView, key: str, numeric: bool, series: dict[str, list[Point]], path: Path) -> None:
    import matplotlib  # noqa: PLC0415  import cost: a sweep's end only

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415  import cost: a sweep's end only

    objective = view.objective
    figure = objective.figure
    fig, ax = plt.subplots(figsize=(7, 4.2))
    if numeric:
        for label, points in series.items():
            points = sorted(points, key=lambda p: _float(p.overrides.get(key, "")))
            xs = [_float(p.overrides.get(key, "")) for p in points]
            ys = [objective.value(p.result) for p in points]
            # A value swept twice (an optimizer's repeated pick): its points, not a line through them.
            ax.plot(xs, ys, marker="o", linestyle="-" if len(set(xs)) == len(xs) else "none", label=label or None)
            for x, y in zip(xs, ys, strict=True):
                ax.annotate(formatted(figure, y), (x, y), textcoords="offset points", xytext=(0, 6), ha="center",
                            fontsize=8)
        ticks = sorted({_float(p.overrides.get(key, "")) for ps in series.values() for p in ps})
        if len(ticks) <= 12:  # the values swept, not matplotlib's round numbers between them
            ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
        ax.set_xlabel(key)
    else:
        names = sorted({p.overrides.get(key, "") for ps in series.values() for p in ps})
        width = 0.8 / len(series)
        for j, (label, points) in enumerate(series.items()):
            at = {p.overrides.get(key, ""): objective.value(p.result) for p in points}
            xs = [i + j * width for i, n in enumerate(names) if n in at]
            ys = [at[n] for n in names if n in at]
            bars = ax.bar(xs, ys, width=width, label=label or None)
            ax.bar_label(bars, labels=[formatted(figure, y) for y in ys], fontsize=8)
        ax.set_xticks([i + width * (len(series) - 1) / 2 for i in range(len(names))], names)
        ax.set_xlabel(key)
    unit = f" ({figure.unit})" if figure.unit else ""
    ax.set_ylabel(f"{figure.heading}{unit}")
    ax.set_title(f"{figure.heading} by {key} ({'lower' if objective.lower_is_better else 'higher'} is better)")
    if any(series):
        ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    ax.margins(x=0.08, y=0.15)  # room for the labels over the first and last points
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _float(text: str) -> Optional[float]:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None
