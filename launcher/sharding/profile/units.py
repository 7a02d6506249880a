"""What the profile pass measures: units (a segment, or a part of one when its template has
more plan combinations than ``max_space``), and the combinations of each."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Sequence

from launcher.sharding.analysis.core import Analysis


@dataclass
class Unit:
    """A profiled piece of the block sequence: a segment, or a part of one."""
    index: int
    segment: int
    kind: tuple[int, int]        # (template id, part): units of one kind share profiles
    start: int                   # first block
    end: int
    plan_counts: list[int]
    trips: int = 1               # how often a step runs it (a scanned body's segment: the trip count)

    def combos(self) -> list[tuple[int, ...]]:
        return list(itertools.product(*(range(n) for n in self.plan_counts)))

    def assignment(self, combo: Sequence[int]) -> dict[int, int]:
        return {self.start + i: p for i, p in enumerate(combo)}


def split_parts(plan_counts: Sequence[int], max_space: int) -> list[tuple[int, int]]:
    """Consecutive (start, end) offsets whose plan-count products stay within ``max_space``."""
    parts, start, product = [], 0, 1
    for i, n in enumerate(plan_counts):
        if i > start and product * n > max_space:
            parts.append((start, i))
            start, product = i, 1
        product *= n
    parts.append((start, len(plan_counts)))
    return parts


def profiling_units(a: Analysis, max_space: int) -> list[Unit]:
    units = []
    for seg in a.segments:
        t = a.templates[seg.template]
        for part, (lo, hi) in enumerate(split_parts(t.plan_counts, max_space)):
            units.append(Unit(len(units), seg.index, (t.id, part), seg.start + lo, seg.start + hi,
                              t.plan_counts[lo:hi], seg.trips))
    return units


def first_units(units: Sequence[Unit]) -> dict[tuple[int, int], Unit]:
    """The first unit of each kind: the one whose program is profiled for all of that kind."""
    first: dict[tuple[int, int], Unit] = {}
    for u in units:
        first.setdefault(u.kind, u)
    return first
