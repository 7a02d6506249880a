"""A sweep's table: one row per point (its number, the overrides that vary, its mode's headline
figures, what it cost in node-hours, its run dir, its state), bounded to a screen, with every
point in ``sweep.csv``.

A sweep of up to ``ALL_ROWS`` points is shown whole. A bigger one shows the ``FEW`` best and the
``FEW`` worst points by the objective (``launcher/figures.py``), the count of points in each
state, and the first failures; ``sweep.csv`` in the sweep dir has every row and every figure.
A failed point's state carries its error's first line.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any, Optional

from launcher.figures import Figure, formatted
from launcher.cli.sweep.points import Point, SweepView

ALL_ROWS = 24  # a sweep this small is shown whole
FEW = 8  # else the best and the worst this many
FAILURES_SHOWN = 3
CELL = 40  # an override's value longer than this is cut in the table (sweep.csv has it whole)
STATE = 100  # the state column's width at most (an error's first line is cut there)

CSV = "sweep.csv"


def ranked(view: SweepView) -> list[Point]:
    """The points with an objective value, best first."""
    objective = view.objective
    if objective is None:
        return []
    valued = [p for p in view.points if p.state == "done" and objective.value(p.result) is not None]
    return sorted(valued, key=lambda p: (objective.value(p.result) * (1 if objective.lower_is_better else -1), p.num))


def best(view: SweepView) -> Optional[Point]:
    order = ranked(view)
    return order[0] if order else None


def text(view: SweepView, csv_path: Optional[Path] = None, chart: str = "") -> str:
    """The table and the lines around it (several lines, no trailing newline); ``chart``: the
    line that says where the chart is, or why there is none."""
    lines = [_heading(view)]
    if not view.points:
        lines.append("no point has started yet")
        return "\n".join(lines)
    shown, cut = _rows_shown(view)
    rows = [_header(view)] + [_row(view, p) for p in shown]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    rendered = ["  ".join(c.ljust(w) for c, w in zip(r[:-1], widths, strict=True)) + "  " + r[-1] for r in rows]
    if cut:
        at = 1 + cut[0]
        rendered.insert(at, f"... {cut[1]} more point(s) between these (all in {CSV})")
    lines += [line.rstrip() for line in rendered]
    lines += _footer(view, shown)
    top = best(view)
    if top is not None:
        lines.append(f"best: #{top.num} {_overrides_line(view, top)}: "
                     f"{view.objective.name} {formatted(view.objective.figure, view.objective.value(top.result))}")
    if chart:
        lines.append(chart)
    if csv_path is not None:
        lines.append(f"every point: {csv_path}")
    unfinished = sum(p.state in ("queued", "running", "requeued", "pending", "starting") for p in view.points)
    if unfinished and not view.running:
        lines.append(f"{unfinished} point(s) not finished (submitted with launcher.wait=false?): "
                     f"xlaunch sweep {view.dir} shows them again")
    return "\n".join(lines)


# The order the heading counts the points' states in.
_STATES = ("done", "failed", "running", "requeued", "queued", "starting", "pending", "cancelled", "dry run", "not run",
           "unknown")


def _heading(view: SweepView) -> str:
    counts = ", ".join(f"{n} {state}" for state, n in sorted(
        view.counts().items(), key=lambda kv: _STATES.index(kv[0]) if kv[0] in _STATES else len(_STATES)))
    sweeper = view.record.get("sweeper")
    how = f" by hydra/sweeper={sweeper}" if sweeper and sweeper != "basic" else ""
    trials = view.record.get("trials")
    of = f" of {trials} trials" if trials else ""
    still = ", still running" if view.running else ""
    objective = f"; objective {view.objective.describe()}" if view.objective else ""
    return f"sweep {view.dir}{how}: {len(view.points)} point(s){of} ({counts}){still}{objective}"


def _rows_shown(view: SweepView) -> tuple[list[Point], Optional[tuple[int, int]]]:
    """The points the table shows, and where a cut goes (after how many rows, how many points)."""
    points = view.points
    if len(points) <= ALL_ROWS:
        return points, None
    order = ranked(view) or points
    if len(order) <= 2 * FEW:
        return order, None
    head, tail = order[:FEW], order[-FEW:]
    return head + tail, (FEW, len(points) - 2 * FEW)


def _footer(view: SweepView, shown: list[Point]) -> list[str]:
    """For a cut table: the failures it does not show (their first lines), and what else there is."""
    if len(shown) == len(view.points):
        return []
    lines = []
    failed = [p for p in view.points if p.state == "failed" and p not in shown]
    for p in failed[:FAILURES_SHOWN]:
        lines.append(f"failed #{p.num} {_overrides_line(view, p)}: {p.detail}")
    if len(failed) > FAILURES_SHOWN:
        lines.append(f"... {len(failed) - FAILURES_SHOWN} more failed point(s) in {CSV}")
    return lines


def _figures(view: SweepView) -> list[Figure]:
    """The figures' columns: the objective's first."""
    first = view.objective.name if view.objective else None
    return sorted(view.figures, key=lambda f: f.name != first)


def _header(view: SweepView) -> list[str]:
    return ["#", *view.varying, *(f.heading + (f" ({f.unit})" if _unit_in_heading(f) else "") for f in _figures(view)),
            "node-h", "run dir", "state"]


def _unit_in_heading(f: Figure) -> bool:
    """A unit the heading says once (GB/s, MiB); times and ratios say theirs in each cell."""
    return bool(f.unit) and f.unit not in ("s", "x")


def _row(view: SweepView, p: Point) -> list[str]:
    values = [_cut(p.overrides.get(k, ""), CELL) for k in view.varying]
    figures = [_figure_cell(p, f) for f in _figures(view)]
    state = f"{p.state}: {p.detail}" if p.detail and p.state not in ("done",) else p.state
    node_hours = f"{p.node_hours:.3g}" if p.node_hours is not None else ""
    return [str(p.num), *values, *figures, node_hours, _relative(p.run_dir, view.dir), _cut(state, STATE)]


def _figure_cell(p: Point, f: Figure) -> str:
    if f.name not in {g.name for g in p.figures}:
        return ""
    value = p.value(f)
    if value is None:
        return ""
    return f"{value:.4g}" if _unit_in_heading(f) else formatted(f, value)


def _overrides_line(view: SweepView, p: Point) -> str:
    keys = view.varying or list(p.overrides)
    return " ".join(f"{k}={p.overrides.get(k, '')}" for k in keys)


def _relative(path: Path, root: Path) -> str:
    try:
        return str(Path(path).relative_to(root))
    except ValueError:
        return str(path)


def _cut(text: str, n: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[:n - 3] + "..."


def csv_text(view: SweepView) -> str:
    """Every point: its number, every override, every figure (as numbers), state, detail, run dir."""
    keys: list[str] = []
    for p in view.points:
        keys += [k for k in p.overrides if k not in keys]
    figures = view.figures
    out = io.StringIO()
    w = csv.writer(out)
    w.writerow(["num", *keys, *(_csv_heading(f) for f in figures), "node_hours", "state", "detail", "run_dir"])
    for p in view.points:
        w.writerow([p.num, *(p.overrides.get(k, "") for k in keys), *(_csv_value(p, f) for f in figures),
                    "" if p.node_hours is None else p.node_hours, p.state, p.detail, str(p.run_dir)])
    return out.getvalue()


def _csv_heading(f: Figure) -> str:
    return f"{f.name} ({f.unit})" if f.unit else f.name


def _csv_value(p: Point, f: Figure) -> Any:
    value = p.value(f) if f.name in {g.name for g in p.figures} else None
    return "" if value is None else value
