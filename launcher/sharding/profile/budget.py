"""A memory budget no plan can meet, said as soon as it is known rather than after profiling.

A plan's memory per device, as the search adds it up, is the sum of its units' figures
(``candidates.memory_of``): each unit's arguments, results and temporaries, less the arguments
another unit produces. Two lower bounds on it refuse a budget early (``mode.memory_budget_gb``
with the skip-over-budget shortcut, ``candidates.Shortcuts``):

- before any profiling, ``state_floor_bytes``: every program input the step reads (parameters,
  optimizer state, batch) is an argument of some unit, and no layout leaves a device less than
  its 1/n share of it over n devices. Below that, no mesh of the job's devices has a plan: the
  profile pass refuses the job (``UserError``, exit 2) before compiling anything;
- while profiling, ``least_plan_bytes``: once the memory of every combination of a unit kind is
  known (compiled now or stored), every plan holds one of them in each unit of that kind. When
  the sum over such kinds passes the budget, this mesh has no plan within it: its profile stops
  there (the entries measured so far stay in the store) and says so (``Profiles.infeasible``);
  another mesh may still do, and a job whose every mesh stops so is refused
  (``refuse_if_nothing_fits``).
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence


from launcher.sharding.analysis.core import Analysis
from launcher.sharding.analysis.graph import itemsize
from launcher.errors import UserError


# What a plan's segments add up to over what XLA allocates for the whole step under it: each
# segment's temporaries, its copies of what several segments read, are all counted, while the
# whole step reuses one buffer for many (up to 1.9x on the scanned LM, bench/results/
# bench_autoshard.json's budget sweep). The sum is a first filter only: a segment combination, a
# plan or a mesh is ruled out by it where the sum passes this many times the budget, so none
# that XLA would fit within the budget is; what fits is then decided by the whole step's own
# memory analysis (``search/fit.py``). A power of two: budgets scaled by it stay exact.
UNITS_OVER_STEP = 4.0


def state_floor_bytes(a: Analysis) -> int:
    """Per device, the least share of the program inputs the step reads that any plan leaves a
    device: their bytes over the device count (see the module's docstring)."""
    g, n = a.graph, math.prod(a.mesh_shape)
    total = sum(math.prod(g.shape(v)) * itemsize(g.vars[v].dtype) for v in g.inputs if g.consumers[v])
    return total // n


def least_plan_bytes(memory: Mapping[Any, Mapping[Any, int]], combos: Mapping[Any, int],
                     instances: Mapping[Any, int]) -> int:
    """The least memory any plan needs as far as known: for every unit kind whose ``combos``
    combinations all have a ``memory``, its least one in each of its ``instances`` units."""
    return sum(instances[k] * min(known.values()) for k, known in memory.items()
               if known and len(known) == combos[k])


def gb_at_least(n_bytes: float) -> str:
    """``n_bytes`` in GB, rounded up to 3 significant digits (a budget given so is enough)."""
    gb = n_bytes / 2**30
    if gb <= 0:
        return "0"
    step = 10 ** (math.floor(math.log10(gb)) - 2)
    return f"{math.ceil(gb / step - 1e-9) * step:.3g}"


def no_plan_fits(budget_bytes: float, least_bytes: float, where: str, why: str) -> str:
    """The one line saying so, with what to give instead."""
    return (f"no plan {where}fits mode.memory_budget_gb={budget_bytes / 2**30:.6g}: every plan needs at least "
            f"{least_bytes / 2**30:.6g} GB per device ({why}); give mode.memory_budget_gb="
            f"{gb_at_least(least_bytes)} or more (0: no limit)")


def refuse_if_nothing_fits(shapes: Sequence[Sequence[int]], profiles: Sequence[Any]) -> None:
    """Refuses the job when the profile of every mesh (``shapes``) stopped with no plan within
    the budget (``Profiles.infeasible``)."""
    if not profiles or not all(p.infeasible for p in profiles):
        return
    if len(profiles) == 1:
        raise UserError(profiles[0].infeasible)
    least = min(p.least_plan_bytes for p in profiles)
    each = ", ".join(f"{list(s)}: {p.least_plan_bytes / 2**30:.6g} GB" for s, p in zip(shapes, profiles, strict=True))
    raise UserError(no_plan_fits(profiles[0].budget_bytes, least, "on any mesh searched ",
                                 f"the least of the meshes' profiled bounds, {each}"))
