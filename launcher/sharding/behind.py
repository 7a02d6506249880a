"""Where the searched plan ran behind the fastest baseline: which segments, and why.

The answer never is a plan the race measured slower than a baseline beside it (``measure.verdict``),
but the searched plan itself can be: the segment profiles rank plans well and not exactly, and the
plan nearest a baseline is not always the baseline's own layout. When the final race measured
CFP's own plan over ``BEHIND`` times the fastest baseline, round by round, the table says so
under it: the segments (and their blocks) where the plan differs from the plan nearest that
baseline, and why that nearest plan is not the baseline's own layout where it is not
(``nearest.Nearest.reason``), or, where it is, that the shortlist measured it and kept the other
(the state stored split, where that twin was kept; where the shortlist raced the kept plan alone
against a plan nearest a baseline, what that duel measured, so the two races' disagreement shows:
the default job's moe-tiny plan measured 0.937 of the plan nearest dp_tp, dp_tp's own program,
and then 1.044x dp_tp), or, where the plan is that nearest plan, that
it compiles to another program than the baseline's (the same program races once, as the
baseline: ``race.same_program``), so XLA's layout of what the blocks leave unsaid or the race's
noise set them apart (miniGPT's plan nearest dp gathers its position table back every step; a
10-round ratio of its steps is good to about 5% on a 2-core machine: docs/benchmarks.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Sequence

from launcher.sharding.algorithms.base import Behind, Planned
from launcher.sharding.search.nearest import nearest

if TYPE_CHECKING:
    import jax

BEHIND = 1.02   # the searched plan over the fastest baseline, paired, beyond which the table says why


def behind_note(planned: Planned, title: str, baseline: str, ratio: float, devices: Sequence[jax.Device]) -> Optional[str]:
    """The note for ``planned`` (``title``: how the table names it) measured ``ratio`` times
    ``baseline`` (module doc), or None when it is not behind by ``BEHIND``."""
    found = behind(planned, title, baseline, ratio, devices)
    return found.detail if found is not None else None


def behind(planned: Planned, title: str, baseline: str, ratio: float, devices: Sequence[jax.Device]) -> Optional[Behind]:
    """``behind_note``'s account, with its short form."""
    if ratio <= BEHIND:
        return None
    a, program = planned.on.analyzed.analysis, planned.on.analyzed.program
    # What the algorithm says of its plan (``Planned``): one plan per block, where it is one.
    assignment = planned.assignment
    head = f"{title} ran {ratio:.3f}x {baseline} (over {BEHIND:g}x)"
    if assignment is None:
        note = (f"{head}: it lays out the contractions of a block apart, not one plan per block, so no block can be "
                f"named where it differs from {baseline}")
        kept = ("its cost model predicted it faster (it measures no plan)" if not planned.measured_before_race
                else planned.kept_because or "its algorithm kept it")
        return Behind(_cut(f"Behind {baseline}: {kept}", 220), note)
    # (Only now: finding the nearest plan traces the step again.)
    found = nearest(a, program, baseline, devices) if program is not None else None
    if found is None:
        note = f"{head}: {baseline} has no plan nearest it on mesh {planned.on.shape}, so none was measured beside it"
        return Behind(f"Behind {baseline}: its search has no plan near {baseline}'s layout on mesh {planned.on.shape}",
                      note)
    differ = [b for b, (mine, near) in enumerate(zip(assignment, found.assignment, strict=True)) if mine != near]
    segments = sorted({s.index for s in a.segments for b in differ if s.start <= b < s.end})
    where = (f"it differs from the plan nearest {baseline} in block{'s' if len(differ) > 1 else ''} "
             f"{', '.join(map(str, differ[:8]))}{' ...' if len(differ) > 8 else ''}"
             + (f" (segment{'s' if len(segments) > 1 else ''} {', '.join(map(str, segments))})" if segments else ""))
    if not differ:
        where = f"it is the plan nearest {baseline} on mesh {planned.on.shape}"
    # The shortlist's twin of a nearest plan (``cfp.choose``): the same blocks, the state stored split.
    split = planned.state_stored_split
    duel = planned.duel
    if split:
        where += ", with the state stored split over every device"
    short = (f"its {'search' if planned.measured_before_race else 'cost model'} kept it over the plan nearest "
             f"{baseline} (the log says why)")
    if not found.exact:
        why = f"that plan is not {baseline}'s layout: {found.reason(a)}"
        short = f"no plan of its search lays the step out as {baseline} does: {found.in_words(a)}"
    elif differ and duel is not None and duel.against == f"nearest {baseline}":
        why = (f"that plan is {baseline}'s own layout; the shortlist raced the two alone, {duel.rounds} rounds, and "
               f"measured the kept plan {duel.ratio:.3f} of that plan's time, where this race measured it {ratio:.3f}x "
               f"{baseline}: two races of the same layouts apart by more than the margin, either way, are the "
               "machine's noise between them (more verify_repeats and run_repeats race them longer)")
        short = (f"the shortlist measured it {duel.ratio:.3f} of {baseline}'s layout: two races that far apart are the "
                 "machine's noise")
        duel = None   # said: not again below
    elif differ:
        why = f"that plan is {baseline}'s own layout; {planned.kept_because or 'its algorithm predicted it faster'}"
        if not planned.measured_before_race:
            short = f"its cost model predicted it faster than {baseline}'s layout (it measures no plan)"
    elif split:
        why = (f"{baseline} stores it as the plan nearest it computes with it; the shortlist's short rounds measured "
               f"the state stored split faster than that plan, {baseline}'s own layout (more verify_repeats race them "
               "longer)")
        short = f"it stores the state split, which the shortlist measured faster than {baseline}'s own layout"
    else:   # the same layout, and yet not the baseline's program: that one would have raced once (same_program)
        why = (f"that plan is {baseline}'s own layout in what its blocks make, yet compiles to another program than "
               f"{baseline}'s (one program would have raced once): XLA's layout of the rest or the race's noise set "
               "them apart (more run_repeats race them longer)")
        short = f"it is {baseline}'s layout, yet XLA compiles it to another program"
    if duel is not None:
        why += (f"; the shortlist raced it alone against the plan {duel.against}, {duel.rounds} rounds, and measured it "
                f"{duel.ratio:.3f} of that plan's time")
    return Behind(_cut(f"Behind {baseline}: {short}", 220), f"{head}: {where}; {why}")


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 3] + "..."
