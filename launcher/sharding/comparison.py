"""What a race measured, and its answer, computed once: every output of a search (the console's
table, ``result.json``, ``AutoPlan.comparison()``, the benches) reads ``Comparison``.

The plans of a race run in interleaved rounds (``search/race.py: race``), so they are
compared round by round: ``paired_over`` (the one paired ratio: the median over rounds of one
plan's time over another's in the same round) and ``paired_ratios`` (each plan's over every
round's median). ``winner`` picks the fastest, the incumbents kept within a margin; ``verdict``
is the answer of a final race: the searched plan only where it beat the fastest baseline by the
margin, else that baseline. ``compare`` reads a race's round times (the slowest process's, the
same on every process) into a ``Comparison``: the answer, the fastest baseline, the fastest
plan, and the answer's and the searched plan's ratios over the fastest baseline (and over the
user's own layout, where it ran).

No JAX here: the console and the modes' schemas read results with it.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace
from typing import Mapping, Optional, Sequence

from launcher.sharding.options import USER_BASELINE


def winner(rounds: Sequence[Sequence[float]], incumbents: Sequence[int] = (), margin: float = 0.0) -> int:
    """The plan (index into ``rounds``: each plan's time in each round) with the least
    ``paired_ratios``, except that the fastest of the ``incumbents`` (plans known to be as fast
    as a hand-written one: those nearest the baselines) stays unless the winner's time over its
    own, round by round, has a median below ``1 - margin``. A few short rounds cannot tell plans
    apart within their noise, and where they cannot the plan that matches a baseline is the safe
    one: on bert-tiny (4x2) the DP's optimum came out 1% ahead of the plan nearest dp_tp in 4
    rounds of 5 steps, and 7-15% behind it in 10 or 14 rounds of 10."""
    ratios = paired_ratios(rounds)
    best = min(range(len(rounds)), key=lambda i: ratios[i])
    if incumbents and best not in incumbents:
        safe = min(incumbents, key=lambda i: ratios[i])
        if paired_over(rounds[best], rounds[safe]) > 1 - margin:
            return safe
    return best


def paired_over(times: Sequence[float], reference: Sequence[float]) -> float:
    """The median over rounds of a plan's time over ``reference``'s in the same round: the one
    paired ratio. Over the rounds both ran (a plan the race cut, ``Cut``, ran its first ones)."""
    n = min(len(times), len(reference))
    return statistics.median(t / u for t, u in zip(times[:n], reference[:n], strict=True))


def paired_ratios(rounds: Sequence[Sequence[float]]) -> list[float]:
    """Per plan (its time in each round), the median over rounds of its time over that round's
    median plan time. The plans of a round run minutes apart at most, those of different rounds
    further: on a machine whose speed drifts, ratios within a round compare plans where medians
    of raw times would compare the moments they ran at. A plan cut from the race (``Cut``)
    counts in the rounds it ran (``search/race.py: Cut``)."""
    per_round = [statistics.median(times[k] for times in rounds if len(times) > k)
                 for k in range(max(map(len, rounds)))]
    return [statistics.median(t / m for t, m in zip(times, per_round, strict=False)) for times in rounds]



def noise_floor(times: Sequence[float], reference: Sequence[float]) -> float:
    """How far from 1 the paired ratio of ``times`` over ``reference`` (``paired_over``) lands by
    the race's noise alone: the half-width of its 95% interval from the spread of the rounds'
    own ratios (their median absolute deviation, which one slow round moves no more than it moves
    the paired median; a median's standard error is about 1.25 of the mean's, sigma over root n;
    Student's t for the few rounds, and 1.2 more for the deviation's own spread). Simulated A/A
    races, one program against itself, land ahead by more 2-4 times in 100 from 4 rounds up
    (``tests/test_cfp_search.py`` races them so); ``bench/bench_race_noise.py`` measured such
    races of the default job's plans at 0.95-1.06x over 10 rounds. 0 with fewer than 3 rounds."""
    n = min(len(times), len(reference))
    if n < 3:
        return 0.0
    logs = [math.log(t / u) for t, u in zip(times[:n], reference[:n], strict=True)]
    centre = statistics.median(logs)
    sigma = 1.4826 * statistics.median(abs(x - centre) for x in logs)
    return 1 - math.exp(-1.2 * _t975(n - 1) * 1.2533 * sigma / math.sqrt(n))


def _t975(df: int, z: float = 1.959964) -> float:
    """Student's t at 97.5% for ``df`` degrees of freedom (Cornish-Fisher, within 4% from 3 up)."""
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


@dataclass(frozen=True)
class Verdict:
    """Which plan of a final race is the answer (``verdict``), and the figures it was decided on."""
    answer: int                        # index into the race's plans: 0 (the searched plan) or best_baseline
    best_baseline: int | None          # the fastest baseline, round by round; None where none ran
    searched_over_best: float | None   # the searched plan's time over best_baseline's, paired
    rounds: int                        # the rounds decided on
    # How far from 1 that ratio lands by the race's noise alone (``noise_floor``): a searched plan
    # ahead by less is a tie, and the answer is the baseline.
    noise: float = 0.0

    @property
    def tie(self) -> bool:
        """The searched plan ahead of the fastest baseline, but not beyond the race's noise."""
        return (self.answer != 0 and self.searched_over_best is not None and self.searched_over_best < 1
                and self.searched_over_best >= 1 - self.noise)

    @property
    def answer_over_best(self) -> float | None:
        return 1.0 if self.answer == self.best_baseline else self.searched_over_best


def verdict(rounds: Sequence[Sequence[float]], baselines: Sequence[int], margin: float) -> Verdict:
    """The answer of a final race (``rounds``: each plan's time in each round; plan 0 the searched
    plan): the searched plan only where it beats the fastest of ``baselines`` by ``margin`` and
    beyond the race's own noise (``noise_floor``), round by round, else that baseline
    (``winner``, the baselines as incumbents): a plan handed to the user is never one the same
    rounds measured slower than a plan beside it, and a tie within the rounds' noise goes to the
    hand-written plan (miniGPT's "win" at 0.958x dp paired was inside its race's 5%). Only plans
    that ran every round count: a baseline the race dropped (``Cut``) was far behind the fastest."""
    n = len(rounds[0])
    full = [0, *(i for i in baselines if len(rounds[i]) == n)]
    if len(full) == 1:
        return Verdict(0, None, None, n)
    ran = [rounds[i] for i in full]
    ratios = paired_ratios(ran)
    best = min(range(1, len(full)), key=lambda k: ratios[k])
    noise = noise_floor(ran[0], ran[best]) if margin < 1 else 0.0
    chosen = full[winner(ran, range(1, len(full)), max(margin, noise))]
    return Verdict(chosen, full[best], paired_over(ran[0], ran[best]), n, noise)


@dataclass(frozen=True)
class Comparison:
    """A race compared, once (``compare``): which plan is the answer, the fastest baseline round by
    round (of those that ran every round), and the ratios every output names."""
    names: tuple[str, ...]                   # the plans raced: the searched plan first
    times: tuple[tuple[float, ...], ...]     # each one's time per round (the slowest process's)
    verdict: Verdict                         # decided on ``times`` (indices into ``names``)
    margin: float                            # mode.verify_margin, where the race decided the answer
    # Under mode.memory_budget_gb: the plans whose measured memory is over it (never the answer,
    # nor the fastest baseline), and the budget in bytes.
    over_budget: tuple[str, ...] = ()
    budget_bytes: Optional[float] = None

    @property
    def searched(self) -> str:
        return self.names[0]

    @property
    def answer(self) -> str:
        return self.names[self.verdict.answer]

    @property
    def best_baseline(self) -> Optional[str]:
        """The fastest baseline, round by round (``paired_ratios``), of those that ran every round."""
        return self.names[self.verdict.best_baseline] if self.verdict.best_baseline is not None else None

    @property
    def rounds(self) -> int:
        return self.verdict.rounds

    @property
    def searched_vs_best_baseline_paired(self) -> Optional[float]:
        return self.verdict.searched_over_best

    @property
    def vs_best_baseline_paired(self) -> Optional[float]:
        """The answer's time over the fastest baseline's, paired (1 where it is that baseline)."""
        return self.verdict.answer_over_best

    def step_time_s(self, name: str) -> float:
        """``name``'s step time: the median of its rounds."""
        return statistics.median(self.times[self.names.index(name)])

    @property
    def fastest(self) -> str:
        """The plan of least median step time, searched or baseline."""
        return min(self.names, key=self.step_time_s)

    def over(self, name: str, other: str) -> float:
        """``name``'s time over ``other``'s, paired (``paired_over``)."""
        return paired_over(self.times[self.names.index(name)], self.times[self.names.index(other)])

    def vs_best_baseline(self, name: str) -> Optional[float]:
        """``name``'s median step time over the fastest baseline's."""
        best = self.best_baseline
        return self.step_time_s(name) / self.step_time_s(best) if best is not None else None

    @property
    def vs_user_paired(self) -> Optional[float]:
        """The answer's time over the user's own layout's, paired, where it ran (below 1: the answer beat it)."""
        return self.over(self.answer, USER_BASELINE) if USER_BASELINE in self.names else None

    def fields(self) -> dict:
        """What the race measured, named as it ran (``AutoPlan.comparison()``): the answer; the
        fastest plan and its time; the fastest baseline and the answer's time over it (medians,
        and paired) and the searched plan's (paired); the answer's over the user's own layout."""
        out: dict = {"answer": self.answer, "fastest": self.fastest,
                     "fastest_step_time_s": self.step_time_s(self.fastest)}
        if self.best_baseline is None:
            return out
        out.update(best_baseline=self.best_baseline, vs_best_baseline=self.vs_best_baseline(self.answer),
                   vs_best_baseline_paired=self.vs_best_baseline_paired,
                   searched_vs_best_baseline_paired=self.searched_vs_best_baseline_paired)
        if self.vs_user_paired is not None:
            out["vs_user_paired"] = self.vs_user_paired
        return out


def compare(times: Mapping[str, Sequence[float]], searched: str, margin: float = 0.0,
            answer: Optional[str] = None, over_budget: Sequence[str] = (),
            budget_bytes: Optional[float] = None) -> Comparison:
    """The race of ``times`` ({plan: its time per round}; ``searched`` among them, every other a
    baseline) compared: its answer decided by ``verdict`` with ``margin``, or ``answer`` where it
    was decided already (a saved plan's), read against the same fastest baseline. ``over_budget``:
    plans over the memory budget, never the answer nor the fastest baseline (the searched plan
    among them: the fastest baseline within the budget is the answer, whatever the margin)."""
    names = (searched, *(n for n in times if n != searched))
    rounds = tuple(tuple(times[n]) for n in names)
    within = [i for i in range(1, len(names)) if names[i] not in over_budget]
    v = verdict(rounds, within, margin if searched not in over_budget else 1.0)
    if answer is not None:
        v = replace(v, answer=names.index(answer))
    return Comparison(names, rounds, v, margin, tuple(over_budget), budget_bytes)
