"""Auto-sharding a user's own training step: CFP's passes (or the Alpa-style ILP) over any
function the user jits, the plan handed back as shardings the user's code applies.

    from launcher import autoshard, AutoPlan     # this module's names, as users import them

    plan = autoshard(train_step, state, batch, store_dir="profiles")   # every device JAX sees
    step = plan.apply(train_step)              # jitted, under the plan's layouts
    state, batch = plan.place(state, batch)    # or jax.device_put(x, plan.shardings(state, batch))
    for _ in range(steps):
        state, loss = step(state, batch)
    plan.save("plan.json")                     # AutoPlan.load("plan.json").apply(train_step) elsewhere

What is read from the step and its arguments (which are data, which state is fed back, what is
static) is ``step.py``'s; the passes are ``pipeline.py``'s, as mode=search runs them for the
built-in models, with the baselines a user would compare with: dp, fsdp and the user's own
``in_shardings``. ``mode=search mode.step=pkg.module:make_step`` runs the same search from the
command line (``load_step``: a factory returning the step and its example arguments, or a
``Step``) and writes the ``AutoPlan`` as plan.json. docs/autoshard.md is the reference.

Every process of a multi-process job calls ``autoshard`` alike (inside ``mode=run``, or after
``jax.distributed.initialize``): each runs the same programs, the slowest process's times decide,
so all get the same plan; process 0 writes the profile store and ``save``'s file.

A plan is checked where it is used: ``shardings``, ``place`` and ``apply`` refuse, in one line
(``UserError``), arguments shaped unlike the example ones, a step whose traced program differs
from the one searched (its signature, ``apply.program_signature``) and another device count.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import re
import sys
import tempfile
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable, Hashable, Optional, Sequence, Union

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec, Sharding

from launcher.sharding import pipeline
from launcher.sharding.apply import AXIS_NAMES, constrained_step, make_mesh, pspec, spec_from_json
from launcher.sharding.algorithms.base import Algorithm, Hooks, algorithms, plan_heading
from launcher.sharding.algorithms.cfp.algorithm import CfpOptions
from launcher.sharding.ilp import NAME as ILP_ROW
from launcher.sharding.options import ProfileOptions, SearchOptions
from launcher.sharding.program import TrainingProgram
from launcher.sharding.search.measure import PlanRun
from launcher.sharding.search.meshes import AUTO
from launcher.sharding.measuring.keys import device_signature
from launcher.sharding.measuring.store import ProfileStore
from launcher.sharding.comparison import Comparison, compare
from launcher.sharding.report import Row, table_text
from launcher.sharding.user.console import Console, log_path
from launcher.sharding.user.reading import Loss, combine, program_args, split, step_name, write_back
from launcher.sharding.user.step import (STEP_BASELINES, baseline_constraints, describe_leaves, out_shardings, place,
                                    shapes_of, step_program)
from launcher import jaxcompat
from launcher.errors import UserError
from launcher.typing import Json, JsonValue, PyTree, StepFn
from launcher.runtime import hosts
from launcher.runtime import user_program

# Where autoshard's defaults differ from mode=search's (launcher/sharding/options.py): the final race
# in ten short rounds rather than three long ones (pairing cancels a shared machine's drift round
# by round, and a baseline 1.25x the fastest after three rounds stops racing), rounds of about
# half a second a plan where its steps are slow, and a shortlist of three: a search from Python
# is interactive, and these are where its time went. The ILP's plan races beside CFP's: it costs
# seconds, and the two algorithms miss different plans (on Flax's pjit guide the ILP's ran 0.32x
# the program's own layout, CFP's 0.68x: on a 2-D mesh CFP offers a block 6 plans, the ILP 15);
# baselines named in ``baselines=`` race without it.
AUTOSHARD_DEFAULTS = {"iterations": 10, "run_repeats": 10, "drop_after": 3, "verify_top_k": 3, "round_seconds": 0.5,
                      "baselines": [*STEP_BASELINES, ILP_ROW]}

# "auto" (every 1-D and 2-D logical mesh), one mesh ([4, 2]), or the meshes to try ([[8], [4, 2]]).
MeshShape = Union[str, Sequence[int], Sequence[Sequence[int]]]
FORMAT = "xlaunch-autoshard-plan"
VERSION = 2  # 2: the step's reading (state_argnums, loss) saved, data_argnums in the step's positions
ANSWER_KEY = 3  # the stored answers' key: 3, the user's layout with its mesh (``_layout_key``)


@dataclass
class Step:
    """What a ``mode.step`` factory may return instead of ``(step_fn, example_args)``."""
    fn: StepFn
    args: Sequence[PyTree]
    data_argnums: Optional[Sequence[int]] = None  # default: the last argument
    in_shardings: PyTree = None                      # the user's own layout, raced as the "user" baseline
    state_argnums: Optional[Sequence[int]] = None  # default: the arguments whose new values the step returns
    loss: Loss = None                              # default: its one scalar (reading.py)


def autoshard(step_fn: StepFn, *example_args: PyTree, mesh_shape: MeshShape = AUTO, algorithm: Optional[str] = None,
              data_argnums: Optional[Sequence[int]] = None, in_shardings: PyTree = None,
              state_argnums: Optional[Sequence[int]] = None, loss: Loss = None,
              log: Optional[Callable[[str], None]] = None, reuse: bool = True, **options: Any) -> "AutoPlan":
    """Searches how to shard ``step_fn(*example_args)`` over every device JAX sees.

    ``example_args``: the step's arguments (arrays, or ``jax.ShapeDtypeStruct`` for shapes only;
    any pytree: Flax NNX state or modules, Linen variables, Equinox modules, dicts).
    ``mesh_shape``: ``"auto"`` (every 1-D and 2-D logical mesh of the devices, the fastest plan
    kept), the meshes to search instead, e.g. ``[[8], [4, 2]]``, or one shape, e.g. ``[4, 2]``
    (``[]``: 1-D). ``algorithm``: ``cfp`` (the default: profile the step's segments, then
    search) or ``ilp`` (the Alpa-style ILP, nothing profiled), or any algorithm registered
    (``launcher/sharding/algorithms/``).
    ``data_argnums``: which arguments are data (default: the last one).
    ``in_shardings``: the shardings the user's own code gives the arguments (as for
    ``jax.jit``), raced as the ``user`` baseline (default: the layouts the example arguments
    already have, where laid out). ``state_argnums``: which arguments are state whose new values
    the step returns (default: those it returns a value alike; ``()``: none). ``loss``: a path of
    the step's outputs, or a function returning one (default: its one floating-point scalar).
    ``reuse``: hand back the plan an earlier search of the same step (traced program and
    arguments), devices and options left in the profile store, without searching again (False:
    search again). ``log``: the search's details, a line at a time (default: into a log file
    beside the profile store, with a progress bar and the table on the screen, ``console.py``;
    ``log=print``: every line printed).

    ``options``: the search's settings, any option of the passes by name
    (``launcher/sharding/options.py``, checked there), among them ``memory_budget_gb`` (per
    device, 0 for none), ``store_dir`` (the profile store, reused by later searches),
    ``baselines`` (built-in names raced beside the plan: dp, fsdp; ``alpa_ilp`` the ILP's plan
    beside CFP's), ``iterations``, ``run_repeats``, ``max_segment_space``, ``verify_top_k``,
    ..., and the algorithms' own (``Algorithm.option_names``: the ILP's time limit, ...).

    Returns the ``AutoPlan``. UserError (one line) for bad input: see ``step.step_program``.
    """
    # The program's own mesh context (jax.set_mesh), if any, is left: the search lays the step out
    # on meshes of its own, and so does the plan (``Applied``).
    algorithm = algorithm or Algorithm.default().name
    with jaxcompat.outside_mesh_context():
        return _autoshard(step_fn, example_args, mesh_shape, algorithm, data_argnums, in_shardings, state_argnums,
                          loss, log, reuse, options)


def _autoshard(step_fn: StepFn, example_args: tuple, mesh_shape: MeshShape, algorithm: str,
               data_argnums: Optional[Sequence[int]], in_shardings: PyTree, state_argnums: Optional[Sequence[int]],
               loss: Loss, log: Optional[Callable[[str], None]], reuse: bool, options: dict) -> "AutoPlan":
    """``autoshard``; without ``log``, quiet (``console.py``): the details in a log file, a progress
    bar and the table on the user's screen."""
    Algorithm.named(algorithm, option="algorithm")
    search = lambda log, progress=None, say=None: _search(step_fn, example_args, mesh_shape, algorithm,
                                                          data_argnums, in_shardings, state_argnums, loss,
                                                          _keywords(log), progress, reuse, options, say or log)
    if log is not None:
        return search(log)
    name = step_name(step_fn)
    store_root = Path(options.get("store_dir", ProfileOptions.store_dir)).expanduser().resolve()
    with Console(log_path(store_root, name), is_main=jax.process_index() == 0) as console:
        console.show(f"autoshard: searching {name} on {jax.device_count()} devices (the details: {console.path}; "
                     "log=print shows them here)")
        plan = search(console.log, console.progress, console.show)
        console.show(plan.table())
    return plan


def _search(step_fn: StepFn, example_args: tuple, mesh_shape: MeshShape, algorithm: str,
            data_argnums: Optional[Sequence[int]], in_shardings: PyTree, state_argnums: Optional[Sequence[int]],
            loss: Loss, log: Callable[[str], None], progress: Any, reuse: bool, options: dict,
            say: Callable[[str], None]) -> "AutoPlan":
    """The search (``say``: the one line on the user's screen when a stored answer is handed back)."""
    kind = Algorithm.named(algorithm, option="algorithm")
    program = step_program(step_fn, example_args, data_argnums=data_argnums, in_shardings=in_shardings,
                           state_argnums=state_argnums, loss=loss, log=log)
    settings = {**AUTOSHARD_DEFAULTS, **options}   # the algorithms' own among them (verify_top_k)
    search = search_options(program, settings)
    store = ProfileStore(Path(search.profile.store_dir).expanduser().resolve())
    key = _answer_key(program, mesh_shape, algorithm, search, settings)
    if reuse:
        earlier = _stored_answer(store, key)
        if earlier is not None:
            say(f"autoshard: the stored answer of an earlier search of {program.name} with these arguments, layout, "
                f"devices and options ({store.root}); reuse=False searches again")
            return earlier
    out = pipeline.run_search(program, kind(search, settings), mesh_shape=mesh_shape,
                              hooks=Hooks(log=log, progress=progress, is_main=jax.process_index() == 0))
    plan = AutoPlan.of(program, out)
    own = replace(plan.own, why=as_keywords(plan.own.why)) if plan.own is not None else None
    plan = replace(plan, why=as_keywords(plan.why), own=own)
    if jax.process_index() == 0:
        store.put(key, {"plan": plan.to_json()})
    return plan


def _answer_key(program: TrainingProgram, mesh_shape: MeshShape, algorithm: str, search: SearchOptions,
                settings: dict) -> dict:
    """What an answer depends on: the traced step and its arguments, the devices, the options
    (the store it is kept in aside), the user's own layout. A profile-store key: its fields are
    the store's format."""
    # The package's algorithms' own options, at the values given or their defaults (Algorithm.option_defaults).
    own = {name: settings.get(name, default) for name, default in Algorithm.package_options().items()}
    # CFP's shortlist options were the search's (SearchOptions) when answers were first keyed, and
    # are kept among its options: the key, the store's format, is the same.
    shortlist = {name: own.pop(name) for name in CfpOptions.defaults()}
    # How often the link model for the race's predictions times a collective changes no answer
    # (and came after the key's format): left out, as the store's folder is.
    searched = {k: v for k, v in dataclasses.asdict(search).items() if k != "link_repeats"}
    options = {**searched, **shortlist,
               "profile": {k: v for k, v in dataclasses.asdict(search.profile).items() if k != "store_dir"}}
    user = _layout_key(program.in_shardings)
    return {"version": ANSWER_KEY, "kind": "autoshard-answer", "program": program.signature,
            "args": describe_leaves(program.args), "devices": device_signature(make_mesh([jax.device_count()])),
            "mesh_shape": str(mesh_shape), "algorithm": algorithm, "options": json.loads(json.dumps(options, default=str)),
            **own, "user": user, "loss": program.reading.loss_path}


def _layout_key(shardings: PyTree) -> Optional[dict]:
    """The user's own layout (read from the arguments or given) as a key: each leaf's spec and
    the mesh it is on (axis names and sizes, devices in mesh order), so that another layout,
    the same specs on another mesh among them, is searched and measured anew."""
    if shardings is None:
        return None
    leaves = jax.tree.leaves(shardings)
    meshes = list(dict.fromkeys(s.mesh for s in leaves))
    return {"meshes": [{"axes": {str(k): int(v) for k, v in m.shape.items()},
                        "devices": [int(d.id) for d in m.devices.flat]} for m in meshes],
            "leaves": [[meshes.index(s.mesh), str(s.spec)] for s in leaves]}


def _stored_answer(store: ProfileStore, key: dict) -> Optional["AutoPlan"]:
    """The stored plan for ``key``, rank 0's decision on every process (they share the store)."""
    entry = store.get(key) if jax.process_index() == 0 else None
    if not hosts.broadcast(np.array([int(entry is not None)], dtype=np.int32))[0]:
        return None
    entry = entry if entry is not None else store.get(key)
    return AutoPlan.from_dict(entry["plan"], "the profile store")


def search_options(program: TrainingProgram, settings: dict, seed: int = 0) -> SearchOptions:
    """The search's options from ``settings`` (their fields by name, and the algorithms' own,
    ``Algorithm.option_names``); the user's own shardings raced where the program has them."""
    names = {f.name for cls in (SearchOptions, ProfileOptions) for f in fields(cls)} - {"profile"}
    own = {n for a in algorithms().values() for n in a.option_names}
    unknown = sorted(set(settings) - names - own)
    if unknown:
        # One short line: the nearest names, not all forty (docs/autoshard.md lists them).
        near = sorted({m for u in unknown for m in difflib.get_close_matches(u, names | own, n=2)})
        raise UserError(f"autoshard: no option {', '.join(unknown)}"
                        + (f"; did you mean {' or '.join(near)}?" if near else "")
                        + " (the options: launcher/sharding/options.py, docs/autoshard.md)")
    defaults = {f.name: f.default for cls in (SearchOptions, ProfileOptions) for f in fields(cls)
                if f.name != "profile"}
    config = {**defaults, **AUTOSHARD_DEFAULTS, "seed": seed, **{k: v for k, v in settings.items() if k in names}}
    return pipeline.with_user_baseline(SearchOptions.of(config), program)


def _keywords(log: Callable[[str], None]) -> Callable[[str], None]:
    """``log`` speaking autoshard's keywords (``as_keywords``)."""
    return lambda line: log(as_keywords(line))


def as_keywords(text: str) -> str:
    """The passes speak the command line's keys (``mode.verify_margin``); from Python they are
    autoshard's keywords (``verify_margin=``)."""
    return re.sub(r"\bmode\.([a-z_]+)", r"\1", text)


# ---------------------------------------------------------------------------------------------
# The plan


@dataclass
class AutoPlan:
    """A searched plan of a user's step: its mesh, its layouts (per operator and per argument,
    ``apply.py``'s ``constraints``, with the step's signature), the arguments it was searched
    for, and what was predicted and measured beside the baselines."""

    mesh_shape: list[int]
    constraints: Json
    args: list[dict]                  # per array leaf of the program's arguments (reading.py): path, shape, dtype
    data_argnums: list[int]           # the step's data arguments (its own positions)
    device_count: int
    algorithm: str                    # cfp | ilp
    step: str                         # the step function's name
    source: str                       # which plan the search kept (search optimum, nearest dp, ILP...)
    predicted_step_time_s: Optional[float]   # the search's prediction (None for a baseline's plan)
    predicted_memory_gb: Optional[float]
    measured: dict                    # the plan's run: step_time_s, repeat_times_s, memory_gb, tflops, losses
    baselines: dict[str, dict]        # name -> its run, likewise
    skipped: dict[str, str] = field(default_factory=dict)  # baselines not run, and why
    meshes: list[dict] = field(default_factory=list)       # per logical mesh searched: its optimum (or why none)
    # Its row in the race: the searched plan's (cfp; alpa_ilp under the ILP), or the baseline
    # that was the answer (dp, fsdp, user, alpa_ilp beside CFP); "" in files before there were answers.
    name: str = ""
    why: str = ""                     # which plan this is of the race, and why, in words
    # How the step was read (reading.py), beyond data_argnums: its state arguments where given,
    # and the path of its loss among its outputs ("" where none).
    state_argnums: Optional[list[int]] = None
    loss: str = ""
    # This session's Planned.details: CFP's shortlist and nearest plans, the ILP's solution; not saved.
    searched: Any = field(default=None, repr=False, compare=False)
    # The searched plan itself, where another plan is the answer (this one); not saved.
    own: Optional["AutoPlan"] = field(default=None, repr=False, compare=False)
    # The mesh axis the devices' processes change along (a job of several processes: the axis
    # between hosts, ``plans.arranged``); None: one process, or the first axis.
    across: Optional[str] = None
    # Python numbers in the arguments traced as arrays, as jax.jit takes them (``Reading.scalars``);
    # files from before this was read say nothing and closed over them (``from_dict``).
    scalars: bool = True
    # Under mode.memory_budget_gb: the plans the race measured over it (never the answer, nor the
    # fastest baseline) and the budget per device, so that the plan, loaded, compares as the
    # search's result did.
    over_budget: list[str] = field(default_factory=list)
    budget_bytes: Optional[float] = None

    @classmethod
    def of(cls, program: TrainingProgram, out: pipeline.Searched) -> "AutoPlan":
        """The answer of a search (``pipeline.run_search``'s ``Searched``): the algorithm's plan
        where the final race measured it faster than the fastest baseline by the margin, else
        that baseline's (``answered``)."""
        return cls.searched_by(program, out).answered(program, out.answer)

    @classmethod
    def searched_by(cls, program: TrainingProgram, out: pipeline.Searched) -> "AutoPlan":
        """The algorithm's own plan, whichever plan is the answer."""
        p, reading = out.planned, program.reading
        memory = p.predicted_memory_bytes / 2**30 if p.predicted_memory_bytes is not None else None
        plan = cls([int(n) for n in p.mesh_shape], dict(p.plan.constraints), describe_leaves(program.args),
                   list(reading.user_data_argnums), jax.device_count(), p.algorithm, program.name, p.source,
                   p.predicted_step_time_s, memory, _run_json(out.searched, priced=out.priced.get(out.searched.name)),
                   {name: _run_json(r, out.others.get(name), out.priced.get(name)) for name, r in out.baselines.items()},
                   dict(out.skipped), list(p.meshes),
                   state_argnums=list(reading.user_state_argnums) if reading.user_state_argnums is not None else None,
                   loss=reading.loss_path, across=getattr(p.plan, "across", None), scalars=reading.scalars,
                   over_budget=list(out.answer.comparison.over_budget), budget_bytes=out.answer.comparison.budget_bytes)
        plan.name, plan.searched = plan.row, p.details
        return plan

    def answered(self, program: TrainingProgram, answer: pipeline.Answer) -> "AutoPlan":
        """This plan where it is ``answer`` (``pipeline.Answer``, the fastest plan measured:
        docs/cfp.md, "The answer"), else the answer's: a baseline's layouts (its argument
        shardings, nothing pinned inside the step) or the ILP's, with the same race's figures."""
        if answer.name == self.row:
            return replace(self, why=answer.why())
        runs = {self.row: self.measured, **self.baselines}
        other = Algorithm.of_row(answer.name)
        if other is not None:  # another algorithm's plan, raced as a baseline
            mesh_shape = [int(n) for _, n in answer.plan.mesh_axes]
            constraints, source = dict(answer.plan.constraints), other.name.upper()
        else:
            mesh_shape, constraints = baseline_constraints(program, answer.name)
            source = f"baseline {answer.name}"
        return replace(self, name=answer.name, why=answer.why(), mesh_shape=mesh_shape, constraints=constraints,
                       source=source, predicted_step_time_s=None, predicted_memory_gb=None,
                       across=getattr(answer.plan, "across", None),
                       measured=runs.pop(answer.name), baselines=runs, own=self)

    # --- what it says --------------------------------------------------------------------------

    @property
    def signature(self) -> str:
        return self.constraints.get("program", "")

    @property
    def row(self) -> str:
        """Its row in the comparison: cfp, alpa_ilp, or the baseline that was the answer."""
        return self.name or self._searched_row

    @property
    def _searched_row(self) -> str:
        """The searched plan's row: its algorithm's (cfp, alpa_ilp)."""
        algorithm = algorithms().get(self.algorithm)
        return algorithm.row if algorithm is not None else self.algorithm

    @property
    def step_time_s(self) -> float:
        return self.measured["step_time_s"]

    def comparison(self) -> dict:
        """What the race measured, named as it ran (``comparison.Comparison.fields``, as the
        search's result and table have it): ``fastest`` (the plan of least median step time,
        searched or baseline) and its time; ``best_baseline`` (the fastest baseline round by round,
        of those that ran every round: never the searched plan) and the answer's time over it
        (``vs_best_baseline``, medians; ``vs_best_baseline_paired``, round by round); the searched
        plan's own over it (``searched_vs_best_baseline_paired``); and against the user's own
        shardings where they ran (``vs_user_paired``: below 1, the answer beat them)."""
        return self.compared().fields()

    def compared(self) -> Comparison:
        """The race this plan came from, compared (``comparison.compare``), its answer this plan."""
        runs = {self.row: self.measured, **self.baselines}
        searched = self._searched_row if self._searched_row in runs else self.row
        return compare({name: r["repeat_times_s"] for name, r in runs.items()}, searched, answer=self.row,
                       over_budget=tuple(self.over_budget), budget_bytes=self.budget_bytes)

    def table(self) -> str:
        """The comparison table (``report.py``), as mode=search writes comparison.txt."""
        title = f"{plan_heading(self._searched_row)} of {self.step} against the baselines (same devices)"
        across = [f"mesh {self.mesh_shape}: {self.across} across processes"] if self.across else []
        searched = self.own or self   # the searched plan's prediction, where a baseline is the answer
        runs = {name: Row.of(r, searched.predicted_step_time_s if name == self._searched_row else None)
                for name, r in {self.row: self.measured, **self.baselines}.items()}
        tie = self._searched_row if self._searched_row != self.row and self.compared().verdict.tie else ""
        return table_text(runs, self.skipped, title=title, answer=self.row,
                          notes=across + ([self.why] if self.why else []), tie=tie)

    # --- using it ------------------------------------------------------------------------------

    def mesh(self, devices: Optional[Sequence[jax.Device]] = None) -> Mesh:
        """The plan's logical mesh over ``devices`` (default: every device, which must be as
        many as it was searched on)."""
        devices = list(devices) if devices is not None else jax.devices()
        if len(devices) != self.device_count:
            raise UserError(f"this plan was searched on {self.device_count} devices, and this job has {len(devices)}: "
                            f"run on {self.device_count} devices, or autoshard the step again on these")
        return make_mesh(self.mesh_shape, devices, AXIS_NAMES.index(self.across) if self.across else None)

    def shardings(self, *args: PyTree) -> tuple:
        """A ``NamedSharding`` per array leaf of the step's arguments as the program takes them
        (``reading.py``: Flax NNX objects as their joint state, first), as the plan lays them out:
        ``jax.device_put``, ``jax.jit(in_shardings=...)``. Non-array leaves (static) get None."""
        pargs, _ = program_args(args, self.scalars)
        arrays, _ = split(pargs)
        self._check_args(arrays)
        mesh = self.mesh()
        leaves, tree = jax.tree_util.tree_flatten_with_path(arrays)
        return tuple(jax.tree.unflatten(tree, [self._sharding(jax.tree_util.keystr(p), mesh) for p, _ in leaves]))

    def place(self, *args: PyTree) -> tuple:
        """``args`` laid out as the plan says (``shardings``): a value the same on every process
        (host arrays, or jax arrays each process holds whole) becomes a global array; Flax NNX
        objects are updated in place (and returned)."""
        pargs, at = program_args(args, self.scalars)
        arrays, static = split(pargs)
        with jaxcompat.outside_mesh_context():
            placed = combine(jax.tree.map(_placed, arrays, self.shardings(*args)), static)
        return write_back(args, at, tuple(placed))

    def apply(self, step_fn: StepFn, *, donate_argnums: Sequence[int] = ()) -> "Applied":
        """``step_fn`` jitted under the plan, called as the step is (Flax NNX objects updated in
        place, as ``nnx.jit`` does): its arguments laid out as ``shardings`` (placed there when
        they are not), every layout the plan fixes inside the step pinned (sharding
        constraints), the state it returns laid out as it came in, the rest replicated."""
        return Applied(self, step_fn, tuple(donate_argnums))

    def _sharding(self, path: str, mesh: Mesh) -> NamedSharding:
        entry = self.constraints.get(f"in:{path}")
        return NamedSharding(mesh, pspec(spec_from_json(entry)) if entry is not None else PartitionSpec())

    def _check_args(self, arrays: PyTree) -> None:
        given = describe_leaves(shapes_of(arrays))
        if [a["path"] for a in given] != [a["path"] for a in self.args]:
            missing = sorted({a["path"] for a in self.args} ^ {a["path"] for a in given})
            raise UserError(f"the arguments are not those the plan was searched for (leaves {missing[:3]} differ): "
                            f"give {self.step}'s arguments as autoshard had them, or autoshard again")
        for g, a in zip(given, self.args, strict=True):
            if g != a:
                raise UserError(f"argument {g['path']} is {g['dtype']}{g['shape']}, and the plan was searched for "
                                f"{a['dtype']}{a['shape']}: give arguments shaped as the example ones, or autoshard "
                                "the step again for these shapes")

    # --- saving ------------------------------------------------------------------------------

    def to_json(self) -> dict:
        out = {"format": FORMAT, "version": VERSION,
               **{f.name: getattr(self, f.name) for f in fields(self) if f.name not in _NOT_SAVED}}
        out["comparison"] = self.comparison()
        return out

    def save(self, path: str | os.PathLike) -> Path:
        """Writes the plan as JSON (process 0 only, whole or not at all); ``AutoPlan.load`` reads it."""
        path = Path(path)
        if jax.process_index() == 0:
            path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=path.name, suffix=".tmp",
                                             delete=False) as f:
                json.dump(self.to_json(), f, indent=1, default=float)
            os.replace(f.name, path)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> "AutoPlan":
        """The plan saved at ``path``: a plan file, or the run dir of ``mode=search mode.step=...``
        (its plan.json, the answer)."""
        if Path(path).is_dir():
            path = Path(path) / "plan.json"
        try:
            data = json.loads(Path(path).read_text())
        except FileNotFoundError:
            raise UserError(f"{path}: no such plan file; give the path autoshard's plan.save or mode=search "
                            "mode.step=... wrote, or that search's run dir once it has ended") from None
        except (OSError, ValueError) as e:
            raise UserError(f"{path}: not a plan file ({e})") from None
        return cls.from_dict(data, str(path))

    @classmethod
    def from_dict(cls, data: JsonValue, where: str) -> "AutoPlan":
        """A plan from ``to_json``'s dict (read from ``where``)."""
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise UserError(f"{where} is not an auto-sharding plan (a plan.json of mode=search for a built-in model "
                            "runs with mode=train mode.plan=...; this loads what autoshard or mode=search "
                            "mode.step=... wrote)")
        if data.get("version") != VERSION:
            raise UserError(f"{where}: plan format version {data.get('version')}, and this xlaunch reads {VERSION}: "
                            "autoshard the step again")
        known = {f.name for f in fields(cls)} - _NOT_SAVED
        return cls(**{"scalars": False, **{k: v for k, v in data.items() if k in known}})


_NOT_SAVED = {"searched", "own"}  # this session's objects


def _placed(x: PyTree, sharding: Sharding) -> PyTree:
    """``x`` laid out as ``sharding``: as it is where it already is, on the plan's own mesh (an
    equivalent layout on another mesh, the program's own, is moved: jit takes one mesh)."""
    if isinstance(x, jax.Array) and isinstance(x.sharding, NamedSharding) and x.sharding.mesh == sharding.mesh \
            and x.sharding.is_equivalent_to(sharding, x.ndim):
        return x
    if isinstance(x, jax.ShapeDtypeStruct):
        raise UserError("plan.place and plan.apply take arrays; a jax.ShapeDtypeStruct has no values to place")
    return place(x, sharding)


def _run_json(r: PlanRun, planned: Any = None, priced: Any = None) -> dict:
    """A run as a plan file keeps it; another algorithm's plan (``planned``) with its prediction;
    the one model's prediction of it (``priced``, predict/price.py) and its error, where priced."""
    predicted = getattr(planned, "predicted_step_time_s", None)
    return {**r.summary(), "losses": list(r.losses), "flops": r.flops,
            **({"predicted_step_time_s": predicted} if predicted else {}),
            **(priced.against(r.step_time_s) if priced is not None else {})}


class Applied:
    """A plan applied to a step function (``AutoPlan.apply``): called as the step is. The first
    call with arguments of a structure traces the step, checks it is the one searched, and jits
    it under the plan; later calls run the compiled step."""

    def __init__(self, plan: AutoPlan, fn: StepFn, donate_argnums: tuple[int, ...]) -> None:
        self.plan, self.fn, self.donate_argnums = plan, fn, donate_argnums
        self._compiled: dict[Any, tuple[TrainingProgram, Any, Any]] = {}

    def __call__(self, *args: PyTree) -> PyTree:
        with jaxcompat.outside_mesh_context():  # the plan's mesh, not the program's (autoshard)
            return self._call(args)

    def _call(self, args: tuple) -> PyTree:
        pargs, _ = program_args(args, self.plan.scalars)
        arrays, static = split(pargs)
        # Shapes too: arguments shaped otherwise than the plan's are refused in one line (``_build``).
        key = (jax.tree.structure(arrays), tuple((np.shape(x), str(x.dtype)) for x in jax.tree.leaves(arrays)),
               jax.tree.structure(static), tuple(map(_key, jax.tree.leaves(static))))
        if key not in self._compiled:
            self._compiled[key] = self._build(args)
        program, jitted, shardings = self._compiled[key]

        def run(*pargs: PyTree) -> PyTree:
            arrays, _ = split(pargs)
            return program.step.whole(jitted(*jax.tree.map(_placed, arrays, shardings)))

        return program.reading.call(run, args)

    def _build(self, args: tuple) -> tuple[TrainingProgram, Any, Any]:
        plan = self.plan
        shardings = plan.shardings(*args)
        program = step_program(self.fn, args, data_argnums=plan.data_argnums, state_argnums=plan.state_argnums,
                               loss=plan.loss or None, scalars=plan.scalars)
        if program.signature != plan.signature:
            raise UserError(f"this plan was searched for another step ({plan.step}, signature {plan.signature}); "
                            f"{program.name}'s traced program differs ({program.signature}): apply the plan to the "
                            "step it was searched for, or autoshard this one")
        mesh = plan.mesh()
        body, in_shardings, _ = constrained_step(program.step, program.args, plan.constraints, mesh,
                                                 plan=f"autoshard {plan.step}")
        outs = out_shardings(program, in_shardings, NamedSharding(mesh, PartitionSpec()))
        donate = tuple(sorted({program.reading.program_position(i) for i in self.donate_argnums}))
        jitted = jax.jit(body, in_shardings=in_shardings, out_shardings=outs, donate_argnums=donate)
        return program, jitted, shardings


def _key(x: PyTree) -> Hashable:
    try:
        hash(x)
        return x
    except TypeError:
        return id(x)


# ---------------------------------------------------------------------------------------------
# A step named on the command line (mode=search mode.step=pkg.module:make_step)


def load_step(target: str, code_dir: Optional[str] = None, log: Callable[[str], None] = lambda line: None
              ) -> TrainingProgram:
    """The program of the step factory ``target`` (``module:function``, importable from
    ``code_dir``, default the working directory): called with no arguments, it returns
    ``(step_fn, example_args)`` or a ``Step``."""
    code_dir = str(Path(code_dir or os.getcwd()).resolve())
    if code_dir not in sys.path:
        sys.path.insert(0, code_dir)
    made = user_program.load_target(target, {}, option="mode.step")()
    if isinstance(made, tuple) and len(made) == 2 and callable(made[0]):
        made = Step(made[0], made[1])
    if not isinstance(made, Step) or not callable(made.fn) or not isinstance(made.args, (tuple, list)):
        raise UserError(f"mode.step={target} returned a {type(made).__name__}; a step factory returns (step_fn, "
                        "example_args) or launcher.Step(fn, args, data_argnums=..., in_shardings=...)")
    return step_program(made.fn, made.args, data_argnums=made.data_argnums, in_shardings=made.in_shardings,
                        state_argnums=made.state_argnums, loss=made.loss, log=log)
