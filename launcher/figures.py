"""Each mode's headline figures: what a sweep's table shows of a point, what its chart plots, and
the objective Hydra's sweepers optimize (``launcher.objective``); and how a figure reads as text.

A mode's ``Figures`` are its module's (``launcher/modes/<name>.py``: ``figures``), which its
entry in ``launcher.modes.MODES`` holds: a few ``Figure``s, each a name (what
``launcher.objective.figure`` says), a heading, a unit, whether lower is better, and how to read
it from ``result.json``. The first with a direction is the
mode's objective by default (check: bandwidth; train, search and cfp: step time; hlo_replay: the
replay's time; profile: its time). mode=run is open: its figures are what the program returned
(a number is ``returned``; a dict's numbers by their keys) and the last value of each scalar it
logged (``launcher.context().log``), so any name is accepted before the run, and lower is better
unless ``launcher.objective.lower_is_better=false`` says otherwise (as Optuna minimizes by
default). Nothing here imports JAX: the CLI checks the objective before submission. Below
them, how a figure reads as text: in a sweep's table (``formatted``) and in a mode's answer
(``seconds``, ``mib``, ``devices``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Optional

from launcher.errors import UserError


@dataclass(frozen=True)
class Figure:
    name: str  # what launcher.objective.figure names
    heading: str  # the table's column
    unit: str  # "s": a time (formatted as one); otherwise printed after the number
    lower_is_better: Optional[bool]  # None: no direction of its own (a count, a name)
    read: Callable[[dict], Any]  # its value from result.json
    numeric: bool = True  # False: a name (the answer's plan), shown but never optimized

    def value(self, result: dict) -> Any:
        """Its value in ``result`` (None where the result has none)."""
        try:
            v = self.read(result)
        except (KeyError, IndexError, TypeError, ValueError, ZeroDivisionError):
            return None
        if self.numeric:
            return _number(v)
        return v if isinstance(v, str) and v else None


@dataclass(frozen=True)
class Figures:
    """A mode's figures: ``fixed`` ones, and for an ``open`` mode (run) whatever its result holds."""

    fixed: tuple[Figure, ...] = ()
    open: bool = False

    def of(self, result: dict | None) -> list[Figure]:
        """The figures a result has (an open mode's come from the result itself)."""
        if not self.open:
            return list(self.fixed)
        return [*self.fixed, *_program_figures(result or {})]

    def names(self) -> list[str]:
        return [f.name for f in self.fixed]

    def default(self) -> Optional[Figure]:
        """The mode's objective when ``launcher.objective.figure`` names none."""
        return next((f for f in self.fixed if f.numeric and f.lower_is_better is not None), None)

    def named(self, name: str) -> Optional[Figure]:
        """The figure called ``name``; for an open mode, one read from what the program
        returned or logged under that name."""
        found = next((f for f in self.fixed if f.name == name), None)
        if found is None and self.open:
            return _program_figure(name)
        return found


def _number(v: Any) -> Optional[float]:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    v = float(v)
    return v if math.isfinite(v) else None


# How many of a program's returned or logged scalars a table shows (all stay in result.json).
_PROGRAM_SHOWN = 4


def _program_figures(result: dict) -> list[Figure]:
    returned = result.get("returned")
    names: list[str] = []
    if _number(returned) is not None:
        names.append("returned")
    elif isinstance(returned, dict):
        names += [k for k, v in returned.items() if _number(v) is not None]
    names += [k for k in (result.get("logged") or {}) if k not in names]
    return [_program_figure(n) for n in names[:_PROGRAM_SHOWN]]


def _program_figure(name: str) -> Figure:
    def read(r: dict) -> Any:
        returned = r.get("returned")
        if name == "returned" and not isinstance(returned, dict):
            return returned
        if isinstance(returned, dict) and name in returned:
            return returned[name]
        return r["logged"][name]

    return Figure(name, name, "", None, read)


# --- the objective --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Objective:
    """The figure a sweep ranks its points by and Hydra's sweepers optimize."""

    figure: Figure
    lower_is_better: bool

    @property
    def name(self) -> str:
        return self.figure.name

    @property
    def direction(self) -> str:
        """Optuna's word for it (``hydra.sweeper.direction``)."""
        return "minimize" if self.lower_is_better else "maximize"

    def value(self, result: dict | None) -> Optional[float]:
        return self.figure.value(result) if result is not None else None

    def describe(self) -> str:
        return f"{self.name} ({'lower' if self.lower_is_better else 'higher'} is better)"


def objective(figures: Figures, mode_name: str, wanted: Any) -> Optional[Objective]:
    """The objective of a point whose mode (the option ``mode_name``) reports ``figures``, as
    ``wanted`` (``launcher.objective``) says; None where the mode has no default and none is named.
    UserError (one line) for a figure the mode does not report, or one that is not a number."""
    name = str(wanted.get("figure") or "")
    if not name:
        figure = figures.default()
        if figure is None:
            return None
    else:
        figure = figures.named(name)
        if figure is None:
            raise UserError(f"launcher.objective.figure={name}: mode={mode_name} reports no such figure; it reports "
                            f"{describe(figures)}")
        if not figure.numeric:
            raise UserError(f"launcher.objective.figure={name}: mode={mode_name}'s {name} is a name, not a number "
                            f"to optimize; choose one of {describe(figures, numeric=True)}")
    lower = wanted.get("lower_is_better")
    if lower is None:
        lower = figure.lower_is_better if figure.lower_is_better is not None else True
    return Objective(figure, bool(lower))


def describe(figures: Figures, numeric: bool = False) -> str:
    """The figures a mode reports, in words (for messages)."""
    listed = [f for f in figures.fixed if f.numeric or not numeric]
    words = []
    for f in listed:
        way = {True: "lower is better", False: "higher is better", None: "no direction"}[f.lower_is_better]
        words.append(f"{f.name} ({f.unit + ', ' if f.unit else ''}{way})" if f.numeric else f"{f.name} (a name)")
    if figures.open:
        words.append("any number its program returns or logs with launcher.context().log")
    return ", ".join(words) or "no figures"


def formatted(figure: Figure, value: Any) -> str:
    """A figure's value as the table shows it."""
    if value is None:
        return ""
    if not figure.numeric:
        return str(value)
    if figure.unit == "s":
        return _seconds(value)
    unit = f" {figure.unit}" if figure.unit and figure.unit != "x" else figure.unit
    return f"{value:.4g}{unit}"


def seconds(s: float) -> str:
    """A duration as the console prints it (a mode's answer, a job's progress)."""
    if s == 0 or math.isnan(s):
        return f"{s:g} s"
    if s < 1e-3:
        return f"{s * 1e6:.3g} us"
    if s < 1:
        return f"{s * 1e3:.3g} ms"
    if s < 120:
        return f"{s:.3g} s"
    return f"{int(s // 60)} min {s % 60:.0f} s"


def mib(n: float) -> str:
    return f"{n / 2**20:.3g} MiB"


def devices(r: dict) -> str:
    """A result's devices and processes, as a mode's answer names them."""
    return f"{r.get('global_devices', '?')} {r.get('platform', '')} devices in {r.get('num_processes', '?')} processes"


def _seconds(s: float) -> str:   # a table's cell: signed, and never in minutes
    if s == 0:
        return "0 s"
    if abs(s) < 1e-3:
        return f"{s * 1e6:.3g} us"
    if abs(s) < 1:
        return f"{s * 1e3:.3g} ms"
    return f"{s:.3g} s"
