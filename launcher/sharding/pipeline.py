"""The passes as functions of their options (``options.py``), each returning a dataclass, and
the one orchestration of every sharding algorithm (``run_search``), which knows none of them.

    searched = pipeline.run_search(model, Cfp(SearchOptions()), mesh_shape="auto")   # -> Searched
    searched.answer.plan                     # plan.json: the searched plan or the fastest baseline's

``run_search`` analyses the subject on each logical mesh (``analyze_meshes``; ``auto``: every
mesh worth searching, ``search/meshes.py``), has the algorithm (``algorithms/``) plan it,
races the plan beside the baselines (``race_plans``) and answers (``Answer``, docs/cfp.md): the
searched plan or, where the final race did not measure it faster by ``verify_margin``, the
fastest baseline's. The analysis and the profile pass stay callable one by one (mode=analysis,
mode=profile), and CFP's search pass after them (``algorithms/cfp/``), as the paper has them:

    analyzed = pipeline.analyze(model, mesh_shape=[4, 2])                       # -> Analyzed
    mesh = pipeline.make_mesh(analyzed.analysis.mesh_shape)
    profiled = cfp_profile.profile(analyzed, mesh, ProfileOptions(store_dir="store"))   # -> Profiled (algorithms/cfp/)
    planned = Cfp(SearchOptions()).search([OnMesh(analyzed, mesh, profiled.profiles)], Hooks())

``log`` takes one line of text; ``progress(total, what)`` returns a context manager whose value
has ``advance()`` (``None``: no progress bar); ``algorithms.base.Hooks`` carries them. The modes
(``launcher/modes/``) build the options from their config, call these and write files
(``results.py`` gives their result fields); ``autoshard`` and the benches call the same functions.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Optional, Sequence

import jax
from jax.sharding import Mesh

from launcher.sharding.algorithms.base import (
    Algorithm,
    Analyzed,
    Hooks,
    Log,
    OnMesh,
    Planned,
    algorithm_baselines,
    builtin_baselines,
    no_progress,
    plan_title,
    silent,
)
from launcher.sharding.analysis.core import analyze_graph
from launcher.sharding.analysis.core import analyze as analyze_step
from launcher.sharding.analysis.hlo_text import read_hlo
from launcher.sharding.apply import make_mesh as build
from launcher.sharding.comparison import Comparison, compare
from launcher.sharding.options import (
    BASELINES,  # noqa: F401  (pipeline.BASELINES: the benches' baselines)
    USER_BASELINE,
    SearchOptions,
)
from launcher.sharding.predict import links as links_mod, price
from launcher.sharding.profile.budget import gb_at_least
from launcher.sharding.model_program import training_program
from launcher.sharding.program import TrainingProgram
from launcher.sharding.search.measure import PlanRun, baseline_runners
from launcher.sharding.search.race import Cut, agreed, race, same_program
from launcher.sharding.behind import BEHIND, behind
from launcher.sharding.search.meshes import for_each_mesh, is_several, mesh_shapes, shown
from launcher.errors import NoPlanFits, UserError
from launcher.models.plans import Plan


# --- analysis ---------------------------------------------------------------------------------

def default_mesh_shape(mesh_shape: Sequence[int] = ()) -> list[int]:
    """``mesh_shape``, or 1-D over every global device when it is empty."""
    return list(mesh_shape) or [jax.device_count()]


def make_mesh(mesh_shape: Sequence[int], devices: Optional[Sequence[Any]] = None, across: Optional[int] = None
              ) -> Mesh:
    """The logical mesh (axes cfp0, cfp1, cfp2) over ``devices`` (default: all global devices),
    ordered by process, the processes changing along axis ``across`` (default the first)."""
    return build(list(mesh_shape), devices, across)


def analyze(model: Any = None, *, mesh_shape: Sequence[int] = (), hlo_file: str = "", learning_rate: float = 1e-3,
            two_axis_only: bool = False, log: Log = silent) -> Analyzed:
    """The analysis pass over ``model``'s whole training step (or the program itself, a
    ``TrainingProgram``: a user's step, ``user/step.py: step_program``), or the HLO text module
    ``hlo_file``, for a logical mesh (``mesh_shape``; empty: 1-D over every global device).
    ``two_axis_only``: on a 2-D mesh, only plans splitting two roles (``search/meshes.py``)."""

    mesh_shape = default_mesh_shape(mesh_shape)
    t0 = time.perf_counter()
    if hlo_file:
        program = None
        result = analyze_graph(read_hlo(hlo_file), mesh_shape, two_axis_only)
    else:
        program = model if isinstance(model, TrainingProgram) else training_program(model, learning_rate)
        # Its baselines' layouts, where the blocks can offer them (analysis/references.py): a
        # user's step has no logical axes, and its baselines lay out its inputs alone.
        result = analyze_step(program.step, program.args, mesh_shape, two_axis_only,
                              program.references(natural_only=two_axis_only))
        result.fed_back = fed_back_pairs(result.graph, program)
    seconds = time.perf_counter() - t0
    log("analysis on mesh %s: %d contractions, %d ParallelBlocks, %d segments over %d templates; exhaustive space "
        "%d, segment space %d (%.2f s)" % (list(mesh_shape), len(result.contractions), len(result.blocks), len(result.segments),
                                           len(result.templates), result.exhaustive_space, result.segment_space,
                                           seconds))
    for line in result.segments_txt().splitlines():
        if line.startswith(("ParallelBlocks sequence", "template")):
            log(line)
    return Analyzed(result, program, seconds)


def fed_back_pairs(g: Any, program: TrainingProgram) -> tuple[tuple[int, int], ...]:
    """(output var, input var) of each state leaf ``program`` returns first and takes back next
    step (``feeds_back``: the new state's leaves lead its outputs, in its inputs' order)."""
    sizes = [len(jax.tree.leaves(a)) for a in program.args]
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    ins = [g.inputs[starts[i] + k] for i in program.feeds_back for k in range(sizes[i])]
    return tuple((out, v) for out, v in zip(g.outputs, ins, strict=False) if out is not None)


def analyze_meshes(model: Any, mesh_shape: Any, *, learning_rate: float = 1e-3, two_axis_only: bool = True,
                   log: Log = silent) -> list[OnMesh]:
    """``analyze`` on each logical mesh of ``mesh_shape`` (``auto``: every mesh worth searching,
    ``search/meshes.py``; a list of shapes: those; else the one shape given, [] for 1-D): an
    ``OnMesh`` each, not yet profiled. Of several meshes, the 2-D ones are analysed with
    ``two_axis_only`` where the 1-D mesh is searched too (the plans it leaves out are the 1-D
    mesh's), a mesh the model cannot divide is left out (the log says why) and each mesh's files
    go in a folder of their own (``OnMesh.folder``); the one shape given is refused."""
    several, n = is_several(mesh_shape), jax.device_count()
    shapes = mesh_shapes(mesh_shape, n, jax.process_count())
    given = shown(mesh_shape)
    if several:
        log("mode.mesh_shape=%s: searching the logical meshes %s of the %d devices" % (given, shapes, n))
    meshes = [make_mesh(shape) for shape in shapes]  # a mesh that does not fit fails first
    two_axis_only = two_axis_only and several and [n] in shapes
    analyzed, _ = for_each_mesh(
        shapes, lambda i: analyze(model, mesh_shape=shapes[i], learning_rate=learning_rate,
                                  two_axis_only=two_axis_only, log=log),
        refuse=UserError if several else (), log=log,
        none_fit=lambda why: UserError("mode.mesh_shape=%s: the model divides none of the meshes of %d devices: "
                                       "%s" % (given, n, why)))
    return [OnMesh(a, mesh, folder=f"mesh_{'x'.join(map(str, shape))}/" if several else "")
            for a, mesh, shape in zip(analyzed, meshes, shapes, strict=True) if a is not None]


# --- the search: one orchestration for every algorithm -----------------------------------------

@dataclass
class Searched:
    """A search's outcome (``run_search``): the algorithm's plan, its run beside the baselines',
    and the answer."""
    planned: Planned               # the algorithm's plan, on its mesh
    searched: PlanRun              # that plan's run
    baselines: dict[str, PlanRun]  # name -> its run (built-in plans, the user's, other algorithms' plans)
    skipped: dict[str, str]        # baselines that do not fit, with the reason
    answer: Answer                 # the plan handed to the user (plan.json)
    others: dict[str, Planned] = field(default_factory=dict)  # row -> another algorithm's plan raced as a baseline
    also: dict[str, PlanRun] = field(default_factory=dict)    # name -> run of ``run_search``'s ``also`` plans
    priced: dict[str, Any] = field(default_factory=dict)      # name -> the model's ``price.Priced`` of a plan raced
    links: str = ""                                           # the link model those are priced with, described

    @property
    def plan(self) -> Plan:
        """The searched plan's ``models.plans.Plan``."""
        return self.planned.plan


@dataclass
class Answer:
    """The plan handed to the user as ``plan.json``: the searched plan where the final race
    measured it faster than the fastest baseline by ``mode.verify_margin``, round by round, by
    the slowest process's times (``comparison.verdict``), else that baseline's, which may be
    another algorithm's plan. The searched plan's own figures stay beside it, so the search's
    quality is never hidden by the fallback. What the race measured is ``comparison``, the one
    account of it every output reads."""
    comparison: Comparison       # the race compared: the answer, the fastest baseline, the ratios
    run: PlanRun                 # the answer's run
    plan: Optional[Plan]         # plan.json (None: a user step's baseline)
    behind: str = ""             # where the searched plan ran behind the fastest baseline: which segments, why
    same_as: str = ""            # the baseline whose own program the searched plan compiled to (raced once)

    @property
    def name(self) -> str:
        """Its row in the comparison: the searched plan's, or a baseline's (dp_tp, alpa_ilp, ...)."""
        return self.comparison.answer

    @property
    def searched(self) -> str:
        """The searched plan's row: its algorithm's."""
        return self.comparison.searched

    @property
    def best_baseline(self) -> Optional[str]:
        """The fastest baseline that ran every round (None: none did)."""
        return self.comparison.best_baseline

    @property
    def searched_vs_best_baseline_paired(self) -> Optional[float]:
        return self.comparison.searched_vs_best_baseline_paired

    @property
    def vs_best_baseline_paired(self) -> Optional[float]:
        """The answer's time over the fastest baseline's, paired (1 where it is that baseline)."""
        return self.comparison.vs_best_baseline_paired

    @property
    def margin(self) -> float:
        return self.comparison.margin

    @property
    def rounds(self) -> int:
        return self.comparison.rounds

    @property
    def source(self) -> str:
        """The algorithm whose plan it is (its ``source``), or baseline (a built-in plan)."""
        algorithm = Algorithm.of_row(self.name)
        return algorithm.source if algorithm is not None else "baseline"

    def why(self) -> str:
        """Which plan is the answer and why, in plain words: what the race measured (the searched
        plan's time over the fastest baseline's, round by round) and what the answer asks of it."""
        own, best = plan_title(self.searched), self.best_baseline
        over = self.comparison.over_budget
        budget = (f"; over the memory budget ({self.comparison.budget_bytes / 2**20:.2f} MiB per device) as "
                  f"measured, so never the answer: {', '.join(over)}" if over else "")
        if self.searched in over:
            return f"{own} is over the memory budget: the answer is the fastest plan within it, " \
                   f"{plan_title(self.name)}{budget}"
        return self._why(own, best) + budget + (f". {self.behind}" if self.behind else "")

    def _why(self, own: str, best: Optional[str]) -> str:
        if best is None:
            return f"no baseline ran every round beside it: the answer is {own}"
        ratio = self.searched_vs_best_baseline_paired
        measured = (f"{own} ran {ratio:.3f}x the time of the fastest baseline, {best}, round by round (paired over "
                    f"{self.rounds} rounds)")
        if self.same_as:
            measured = (f"{own} compiles to {self.same_as}'s own program, raced once as {self.same_as}: it "
                        f"{measured[len(own) + 1:]}")
        noise = self.comparison.verdict.noise
        if self.comparison.verdict.tie and noise > self.margin:
            return (f"a tie: {measured}, within the race's own noise (±{noise * 100:.1f}%), so the answer is "
                    f"{plan_title(self.name)}")
        asked = f" by the {self.margin * 100:g}% mode.verify_margin asks" if self.margin else ""
        if self.name == self.searched:
            beyond = f" and beyond the race's noise (±{noise * 100:.1f}%)" if noise > self.margin else ""
            return f"{measured}: faster{asked}{beyond}, so the answer is {own}"
        return f"{measured}: not faster{asked}, so the answer is {plan_title(self.name)}"


def answer(runners: Sequence[Any], runs: Sequence[PlanRun], plans: Callable[[int], Optional[Plan]], margin: float,
           budget: Optional[float] = None) -> Answer:
    """The answer of a final race (``runs``, agreed by every process, ``race.agreed``; the
    searched plan first, then the baselines; ``runners`` theirs): ``comparison.compare``'s.
    ``plans(i)``: the i-th plan's ``Plan`` where an algorithm planned it (the searched plan,
    another algorithm's raced as a baseline); a built-in plan is written with its mesh axes sized
    as it ran, so ``mode=train mode.plan=`` runs it on the same mesh. ``budget`` (bytes per
    device): only a plan whose measured memory is within it is the answer (the others race, and
    the comparison names them); none: NoPlanFits naming the least memory measured."""
    over = tuple(r.name for r in runs if budget and r.memory_bytes > budget)
    if len(over) == len(runs):
        least = min(runs, key=lambda r: r.memory_bytes)
        raise NoPlanFits(f"no plan fits mode.memory_budget_gb={budget / 2**30:.6g}: the least memory a plan measured "
                         f"is {least.memory_bytes / 2**30:.6g} GB per device ({least.name}); give "
                         f"mode.memory_budget_gb={gb_at_least(least.memory_bytes)} or more")
    compared = compare({r.name: r.repeat_times_s for r in runs}, runs[0].name, margin, over_budget=over,
                       budget_bytes=budget)
    i = compared.verdict.answer
    plan = plans(i) if i == 0 or Algorithm.of_row(runs[i].name) is not None else runners[i].answer_plan()
    return Answer(compared, runs[i], plan)


def with_user_baseline(options: SearchOptions, subject: Any) -> SearchOptions:
    """``options``, racing the user's own layout (``user``) too where ``subject`` is a user's step
    given with its ``in_shardings``."""
    if isinstance(subject, TrainingProgram) and subject.in_shardings is not None \
            and USER_BASELINE not in options.baselines:
        return replace(options, baselines=(*options.baselines, USER_BASELINE))
    return options


def run_search(subject: Any, algorithm: Algorithm, *, mesh_shape: Any = (), learning_rate: float = 1e-3,
               hooks: Optional[Hooks] = None,
               also: Optional[Callable[[Planned, Sequence[OnMesh]], Sequence[Any]]] = None) -> Searched:
    """The one orchestration of every sharding algorithm (``algorithms/``): ``subject`` (a
    built-in model, or a ``TrainingProgram``: a user's step) analysed on each logical mesh of
    ``mesh_shape`` (``analyze_meshes``), planned by ``algorithm`` on them, the plans of the
    algorithms ``mode.baselines`` names by their row (alpa_ilp) made on the same meshes, and the
    race: the plan beside those and the built-in baselines (``race_plans``), and the answer.
    ``also`` (a benchmark's): called with the plan and the meshes analysed as the race begins,
    more runners raced in the same rounds, never dropped and never the answer (``Searched.also``)."""
    options, hooks = algorithm.options, hooks or Hooks()
    on = analyze_meshes(subject, mesh_shape, learning_rate=learning_rate, two_axis_only=algorithm.two_axis_only,
                        log=hooks.log)
    hooks.write({path: text for o in on for path, text in o.files().items()})
    planned = algorithm.plan(on, hooks)
    hooks.write(planned.files)
    others, unplanned = {}, {}
    for row in algorithm_baselines(options.baselines):
        if row != planned.row:
            try:
                other = Algorithm.of_row(row)(options, algorithm.settings).plan(on, hooks)
            except UserError as e:   # a baseline that cannot plan (under a budget, say) costs the search nothing
                hooks.log(f"{row}: not raced: {e}")
                unplanned[row] = str(e)
                continue
            # Its plan file beside its own: it may be the answer (the searched plan's is written
            # with the answer, as an AutoPlan for a user's step).
            hooks.write({**other.files, f"{row}_plan.json": other.plan.to_json()})
            others[row] = other
    return race_plans(planned, others, options, hooks, algorithm=algorithm,
                      also=(lambda p: also(p, on)) if also is not None else None, unplanned=unplanned)


def race_plans(planned: Planned, others: Mapping[str, Planned], options: SearchOptions,
               hooks: Optional[Hooks] = None, *, algorithm: Optional[Algorithm] = None,
               also: Optional[Callable[[Planned], Sequence[Any]]] = None,
               unplanned: Optional[Mapping[str, str]] = None) -> Searched:
    """The final race: ``planned`` run beside the built-in ``options.baselines`` and ``others``
    (other algorithms' plans) on its devices (``iterations`` steps, ``run_repeats`` interleaved
    rounds; after ``drop_after`` rounds a built-in baseline slower than ``drop_slower_than`` times
    the fastest one in each of them stops, ``race.Cut``, 0 keeps every one), and the answer
    (``Answer``): the plan only where it beat the fastest baseline by ``verify_margin`` in
    those rounds. Where it ran over ``BEHIND`` times that baseline, ``algorithm`` (the one that
    made it) is asked why (``Algorithm.behind``), else the search's own account says."""
    hooks = hooks or Hooks()
    log, progress = hooks.log, hooks.progress or no_progress
    final_run = hooks.final_run or contextlib.nullcontext
    iterations, run_repeats, seed = options.iterations, options.run_repeats, options.seed
    drop_after, drop_slower_than = options.drop_after, options.drop_slower_than
    program, where = planned.on.analyzed.program, planned.on
    runners = [planned.runner]
    more, skipped = baseline_runners(program, list(where.mesh.devices.flat), seed=seed, log=log,
                                     names=list(builtin_baselines(options.baselines)))
    skipped = {**skipped, **(unplanned or {})}   # other algorithms that made no plan, and why
    runners += more
    runners += [o.runner for o in others.values()]
    extra = list(also(planned)) if also is not None else []
    # The searched plan compiled to a baseline's own program is not raced beside it: its figures
    # are that baseline's (race.same_program). That baseline then runs every round.
    # Another algorithm's plan alike (the ILP's beside CFP's) is looked at too, after the built-in ones.
    twin = same_program(planned.runner, runners[1:])
    if twin is not None:
        log(f"{plan_title(planned.row)} compiles to {runners[1 + twin].name}'s program (the same instructions): "
            f"raced once, as {runners[1 + twin].name}")
    racing = runners[1:] if twin is not None else runners
    skip = len(runners) - len(racing)   # runners[i] races as racing[i - skip]
    # Under a budget, a baseline over it (its compiled memory) races but is never the yardstick a
    # baseline within it is dropped against: the answer is the fastest plan that fits.
    budget = options.profile.memory_budget_bytes
    among = frozenset(i - skip for i in range(1, 1 + len(more))
                      if (not budget or runners[i].peak_memory_bytes <= budget) and i - 1 != twin)
    cut = Cut(among, drop_after, drop_slower_than) if drop_slower_than and among else None
    with final_run(), progress(iterations * run_repeats * len(racing + extra), "searched plan and baselines") as bar:
        raced = agreed(race(racing + extra, iterations=iterations, repeats=run_repeats, progress=bar, cut=cut,
                            round_s=options.round_seconds))
    raced, extra_runs = raced[:len(racing)], raced[len(racing):]
    if twin is not None:
        raced = [replace(raced[twin], name=planned.runner.name, compiled=planned.runner.compiled,
                         compile_time_s=planned.runner.compile_time_s), *raced]
    searched, *rest = raced
    log("%s: step %.3f ms, %.2f MiB per device%s" % (
        plan_title(planned.row), searched.step_time_s * 1e3, searched.memory_bytes / 2**20,
        f" (predicted {planned.predicted_step_time_s * 1e3:.3f} ms)" if planned.predicted_step_time_s else ""))
    log("searched training cost: %s" % [round(t, 6) for t in searched.repeat_times_s])
    log("tflops: %s" % [round(t, 6) for t in searched.tflops_per_repeat()])
    runs = {r.name: r for r in rest}
    for name, r in runs.items():
        log(f"baseline {name}: step {r.step_time_s * 1e3:.3f} ms, {r.memory_bytes / 2**20:.2f} MiB per device"
            + (f" ({len(r.repeat_times_s)} of {run_repeats} rounds: over {drop_slower_than:g}x the fastest baseline "
               f"in each, mode.drop_slower_than)" if len(r.repeat_times_s) < run_repeats else ""))
    plans = {0: planned.plan, **{1 + len(more) + k: o.plan for k, o in enumerate(others.values())}}
    chosen = answer(runners, raced, plans.get, options.verify_margin, budget)
    chosen.same_as = runners[1 + twin].name if twin is not None else ""
    ratio = chosen.searched_vs_best_baseline_paired
    if chosen.best_baseline is not None and ratio is not None and ratio > BEHIND \
            and Algorithm.of_row(chosen.best_baseline) is None:
        trails = (algorithm.behind(planned, chosen.best_baseline, ratio) if algorithm is not None else None) \
            or behind(planned, plan_title(planned.row), chosen.best_baseline, ratio, list(where.mesh.devices.flat))
        if trails is not None:   # the table says it in a user's words, the log all of it
            chosen.behind = trails.short
            log(f"why it trails: {trails.detail}")
    log(chosen.why())
    priced, links = price_plans({searched.name: searched, **runs}, options, hooks)
    return Searched(planned, searched, runs, skipped, chosen, dict(others), {r.name: r for r in extra_runs},
                    priced, links)


def price_plans(runs: Mapping[str, PlanRun], options: SearchOptions, hooks: Hooks) -> tuple[dict[str, Any], str]:
    """Each plan raced, predicted by the one model of a step (``predict/price.py``) on
    ``options.links`` or this job's link model (measured once per kind of devices, kept in the
    user's cache: ``price.job_links``), and logged
    beside what the race measured; ({name: Priced}, the link model described). Process 0's alone
    (the others get nothing): the model informs, it decides nothing here. A program the model
    cannot read is logged and left unpriced: the search's answer stands without it."""
    if not options.price_race or not runs:
        return {}, ""
    if options.links:
        model, domains = links_mod.load(options.links), price.node_domains
    else:
        model, now, seconds = price.job_links(repeats=options.link_repeats, is_main=hooks.is_main, log=hooks.log)
        domains = price.process_domains
        if now:
            hooks.log(f"link model measured in {seconds:.1f} s: {model.describe()}")
    if model is None:
        return {}, ""
    priced = {}
    for name, run in runs.items():
        try:
            p = price.price(run.compiled, model, domains(run.compiled, model))
        except Exception as e:  # noqa: BLE001 - a program the model cannot read costs the search nothing
            hooks.log(f"model: {name}: not priced: {type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}")
            continue
        if p.step_s <= 0:
            hooks.log(f"model: {name}: not priced: its program reads as doing nothing")
            continue
        priced[name] = p
        hooks.log(f"model: {name}: predicted {p.step_s * 1e3:.3f} ms (compute {p.compute_s * 1e3:.3f} + communication "
                  f"{p.comm_s * 1e3:.3f}), measured {run.step_time_s * 1e3:.3f} ms: error "
                  f"{run.step_time_s / p.step_s - 1:+.1%}")
    return priced, model.describe()
