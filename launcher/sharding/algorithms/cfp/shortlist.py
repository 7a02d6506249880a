"""CFP's shortlist measured on the whole step (``pick``): the search's optimum, its runners-up and
the plans nearest the baselines raced in short rounds, and a plan that beat the incumbent (the
fastest plan nearest a baseline) raced against it alone, a duel, before it replaces it.
``cfp/algorithm.py: choose`` builds the shortlist and calls it.
"""

from __future__ import annotations

import statistics
from typing import Any, Sequence


from launcher.sharding.analysis.core import Analysis
from launcher.sharding.comparison import paired_over, paired_ratios, winner
from launcher.sharding.measuring.timing import slowest_process
from launcher.runtime import compile_share
from launcher.sharding.search.measure import PlanRunner, plan_runner
from launcher.sharding.search.race import Cut, race


def pick(entries: Sequence[tuple[Analysis, Any, Any, Any]], *, iterations: int, repeats: int = 3, seed: int = 0,
         incumbents: Sequence[int] = (), margin: float = 0.0, progress: Any = None,
         drop_slower_than: float = 0.0, name: str = "searched", compiled: Sequence[Any] = (),
         round_s: float = 0.0) -> tuple[PlanRunner, list[dict]]:
    """The fastest of a shortlist measured on the whole step (``winner``). ``entries``:
    (analysis, program, mesh, ``search.Candidate``) per plan, the search's optimum first; plans
    of different logical meshes of the same devices race together, in ``repeats`` interleaved
    rounds of ``iterations`` steps each. ``incumbents``: the entries nearest the baselines.
    Every process measures every candidate and the slowest process's round times decide, so all
    processes pick the same plan.

    A plan that wins the short rounds against the incumbents by ``margin`` has still won only a
    few short rounds: it then races the fastest incumbent alone, twice as many rounds again, and
    replaces it only if it wins those by ``margin`` as well. In the default job the DP's optimum on
    4x2 beat the plan nearest dp_tp by 5% in 4 rounds of 5 steps and then ran 1.067x dp_tp over
    10 rounds; the duel costs a few seconds beside compiling the shortlist. Not so where the
    incumbent took over ``CLEARLY_AHEAD`` (1.25) times the plan's time, beyond ``margin``, in
    every short round: no round's noise spans that, and on a user's step of 60-250 ms the duel
    cost 20 s of a 125 s search, so the plan replaces it without one (its row's ``won_clearly``).

    ``drop_slower_than`` (0: none) cuts the race as the final race cuts its baselines (``Cut``):
    after half the rounds, a plan over that many times the fastest in each of them runs no more
    (its figures are those of its rounds), except the fastest incumbent, which the winner must
    beat. ``compiled``: a runner per entry compiled already (None: compile it here; ``fit.py``
    compiles the plans within a memory budget first). ``round_s``: ``race``'s, the rounds of slow
    steps shortened. Returns the chosen runner (compiled, to
    race as ``name``, rounds cleared, its ``candidate`` set) and a row per candidate."""
    given = list(compiled) or [None] * len(entries)
    with compile_share.shared():  # each process compiles some of the candidates and loads the others
        runners = [r if r is not None else plan_runner(a, program, dict(enumerate(c.assignment)), mesh, seed=seed,
                                                       name=name, stored=c.stored)
                   for (a, program, mesh, c), r in zip(entries, given, strict=True)]
    for r in runners:
        r.name = name
    measured: list[float | None] = [None] * len(runners)
    ratios: list[float | None] = [None] * len(runners)
    over_incumbent: list[float | None] = [None] * len(runners)
    duel: list[float | None] = [None] * len(runners)   # the duel's time over the incumbent's
    ran = [0] * len(runners)                            # short rounds each ran
    duel_rounds = 0
    won_clearly = False
    best = 0
    if len(runners) > 1:
        cut = Cut(frozenset(range(len(runners))), max(repeats // 2, 1), drop_slower_than, frozenset(incumbents)) \
            if drop_slower_than and repeats > 1 else None
        race(runners, iterations=iterations, repeats=repeats, progress=progress, cut=cut, round_s=round_s)
        slowest = iter(slowest_process([t for r in runners for t in r.rounds]))
        rounds = [[next(slowest) for _ in r.rounds] for r in runners]
        ran = [len(ts) for ts in rounds]
        measured = [statistics.median(ts) for ts in rounds]
        ratios = paired_ratios(rounds)
        full = [i for i, ts in enumerate(rounds) if len(ts) == repeats]   # not cut
        best = full[winner([rounds[i] for i in full], [full.index(i) for i in incumbents if i in full], margin)]
        if incumbents:
            full_ratios = dict(zip(full, paired_ratios([rounds[i] for i in full]), strict=True))
            safe = min((i for i in incumbents if i in full), key=full_ratios.__getitem__)
            over_incumbent = [paired_over(times, rounds[safe][:len(times)]) for times in rounds]
            won_clearly = best not in incumbents and _clearly_ahead(rounds[best], rounds[safe], margin)
            if best not in incumbents and not won_clearly:
                pair = [runners[best], runners[safe]]
                for r in pair:
                    r.rounds = []
                race(pair, iterations=iterations, repeats=2 * repeats, until=lambda ts: _decided(ts, 2 * repeats, margin),
                     round_s=round_s)
                slowest = slowest_process([t for r in pair for t in r.rounds])
                n = duel_rounds = len(pair[0].rounds)
                duel[best] = paired_over(slowest[:n], slowest[n:])
                duel[safe] = 1.0
                if duel[best] > 1 - margin:
                    best = safe
    chosen = runners[best]
    chosen.rounds = []  # the short rounds choose; they are not the searched plan's timing
    chosen.candidate = entries[best][3]
    rows = [{"assignment": list(c.assignment), "mesh_shape": list(a.mesh_shape), "source": c.source,
             "predicted_step_time_s": c.predicted_time_s, "predicted_memory_gb": c.predicted_memory_bytes / 2**30,
             "measured_step_time_s": seconds, "paired_ratio": ratio, "chosen": i == best, "search_optimum": i == 0,
             "incumbent": i in incumbents, "over_incumbent_paired": over, "duel_over_incumbent_paired": duel[i],
             "rounds": ran[i], "duel_rounds": duel_rounds if duel[i] is not None else 0,
             "won_clearly": won_clearly and i == best}
            for i, ((a, _, _, c), seconds, ratio, over) in enumerate(zip(entries, measured, ratios, over_incumbent, strict=True))]
    return chosen, rows


# How far ahead of the incumbent, beyond ``1 - margin``, a plan must be in every short round to
# replace it without a duel: the default ``drop_slower_than``'s gap, which no round's noise spans
# (``bench_race_noise.py``: a round's time moves by 8-10%). Not the option itself: a race cut
# hard (``mode.drop_slower_than=1.01``) would then skip the duels that catch a lead of 5%.
CLEARLY_AHEAD = 1.25


def _clearly_ahead(times: Sequence[float], incumbent: Sequence[float], margin: float) -> bool:
    """Whether a plan beat the incumbent by ``CLEARLY_AHEAD`` beyond ``1 - margin`` in every
    round both ran."""
    return all(t * CLEARLY_AHEAD <= (1 - margin) * u for t, u in zip(times, incumbent, strict=True))


def _decided(rounds: Sequence[Sequence[float]], of: int, margin: float) -> bool:
    """Whether a duel (the challenger's times, then the incumbent's, round by round) of ``of``
    rounds is decided already: once more than half of them fall on one side of ``1 - margin``,
    the median of all of them does too, whatever the rest."""
    below = sum(t / u <= 1 - margin for t, u in zip(*rounds, strict=True))
    return max(below, len(rounds[0]) - below) > of // 2
