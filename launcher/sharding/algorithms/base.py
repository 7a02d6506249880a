"""The public API of a sharding algorithm: what it is given, what it provides, and the registry
of them (as ``runtime/ranks.py`` registers environments: by subclassing).

An algorithm plans a program on the logical meshes the orchestration analysed
(``pipeline.run_search``): given an ``OnMesh`` per mesh (the mesh, the program and its
analysis), it returns one ``Planned``, a plan on one of them with what it predicted; ``OnMesh``
makes the plan of a choice per ParallelBlock and its runner (``plan_of``, ``runner``).
Everything else is the orchestration's, the same for every algorithm: the analysis, the race
beside the baselines (and beside other algorithms' plans named in ``mode.baselines`` by their
``row``), the answer, the result fields and the files. Adding an algorithm is one module
defining a subclass that imports this module alone (outside the package: ``mode.algorithm_module``,
or imported before ``autoshard``; ``tests/toy_algorithm.py`` is one), docs/architecture.md.

This module imports no JAX: the command line checks ``mode.algorithm`` with it (``OnMesh``'s
helpers import what they run when called).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar, ContextManager, Mapping, Optional, Sequence

from launcher.errors import UserError
from launcher.plugins import import_all
from launcher.sharding.options import BASELINES, USER_BASELINE, SearchOptions

if TYPE_CHECKING:  # they import JAX: the command line imports this module
    from jax.sharding import Mesh

    from launcher.models.plans import Plan
    from launcher.sharding.analysis.core import Analysis
    from launcher.sharding.profile.profiler import Profiles
    from launcher.sharding.program import TrainingProgram
    from launcher.sharding.search.measure import PlanRunner

Log = Callable[[str], None]
Progress = Callable[[int, str], ContextManager]


def silent(line: str) -> None:
    """A ``Log`` that says nothing (the passes' default)."""


def no_progress(total: int, what: str) -> ContextManager:
    """A ``Progress`` that shows nothing (where no bar was given)."""
    return contextlib.nullcontext()


@dataclass
class Hooks:
    """How a search reports while it runs: ``log`` a line; ``progress(total, what)`` a context
    manager whose value has ``advance()``; ``write(files)`` run-dir files as soon as they are
    made ({path: text or JSON-able dict}, nothing lost if a later step fails); ``final_run`` a
    context around the final race (the run's profiler trace); ``is_main``: process 0, which
    writes the profile store."""
    log: Log = lambda line: None
    progress: Optional[Progress] = None
    write: Callable[[Mapping[str, str | dict]], None] = lambda files: None
    final_run: Optional[Callable[[], ContextManager]] = None
    is_main: bool = True


@dataclass
class Analyzed:
    """The analysis pass's result on one mesh (``pipeline.analyze``)."""
    analysis: Analysis
    program: Optional[TrainingProgram]   # None for an HLO module
    seconds: float


@dataclass
class OnMesh:
    """What an algorithm plans from on one logical mesh: its analysis (and the program), the
    mesh, CFP's profiles of it once profiled."""
    analyzed: Analyzed
    mesh: Mesh
    profiles: Optional[Profiles] = None   # None until profiled (CFP's profile.profile_meshes)
    folder: str = ""       # where its files go in a run dir: "" or, one of several meshes, "mesh_4x2/"

    @property
    def shape(self) -> list[int]:
        return list(self.analyzed.analysis.mesh_shape)

    def files(self) -> dict[str, str]:
        """Its analysis's run-dir files (``parallel_blocks.txt``, ...), by path."""
        return {self.folder + name: text for name, text in self.analyzed.analysis.files().items()}

    def plan_of(self, assignment: Sequence[int], name: str, stored: frozenset = frozenset(),
                across: Optional[str] = None) -> Plan:
        """The plan giving ParallelBlock ``i`` its plan ``assignment[i]`` on this mesh, in the
        models' plan format under ``name`` (its layouts in ``constraints``: ``plan.json``, which
        ``mode=train mode.plan=`` runs; ``stored``: inputs kept split between steps, ``across``:
        the mesh axis between processes, ``apply.plan_json``)."""
        from launcher.sharding.apply import plan_json  # noqa: PLC0415 - JAX: the command line imports this module

        return plan_json(self.analyzed.analysis, assignment, name, stored, across)

    def runner(self, assignment: Sequence[int], *, name: str, seed: int = 0) -> PlanRunner:
        """That plan's program compiled on this mesh, to race as ``name`` (``Planned.runner``)."""
        from launcher.sharding.search.measure import plan_runner  # noqa: PLC0415 - JAX, likewise

        return plan_runner(self.analyzed.analysis, self.analyzed.program, dict(enumerate(assignment)), self.mesh,
                           seed=seed, name=name)


@dataclass(frozen=True)
class Duel:
    """An algorithm's own race of the plan it kept alone against the plan nearest a baseline,
    before the final race (CFP's shortlist duel): the kept plan's time over that plan's, round by
    round, the rounds, and that plan's source ("nearest dp_tp")."""
    ratio: float
    rounds: int
    against: str


@dataclass(frozen=True)
class Behind:
    """Why a plan ran behind the fastest baseline in the final race: ``short``, in a user's words
    under the table (at most about 200 characters: the parameter and the two layouts, not block
    numbers: JAX's MNIST had 762 characters of "block 0 (head op 0): input [0][0][0] is [-, 0] in
    fsdp, ..."); ``detail``, the whole account, for the search's log."""
    short: str
    detail: str


@dataclass
class Planned:
    """One algorithm's plan for a program: the mesh it is on, its layouts, the runner that races
    it, and what the algorithm predicted and reports."""
    algorithm: str                 # the algorithm's name (mode.algorithm)
    row: str                       # its row in the race and the comparison (its algorithm's row)
    on: OnMesh                     # the mesh it is on: its analysis and the program
    plan: Plan                     # its layouts (constraints), plan.json
    runner: PlanRunner             # its program compiled on that mesh (OnMesh.runner)
    source: str                    # which plan the algorithm kept, in words (search optimum, ILP...)
    predicted_step_time_s: Optional[float]
    predicted_memory_bytes: Optional[float]
    meshes: list[dict] = field(default_factory=list)     # per mesh planned on: its optimum, or why none
    fields: dict = field(default_factory=dict)           # its own result.json fields (beside the race's)
    baseline_fields: dict = field(default_factory=dict)  # its own, where it races as a baseline
    files: dict = field(default_factory=dict)            # its own run-dir files
    # The algorithm's own objects, which only it and its callers read (CFP's shortlist, the ILP's solution).
    details: object = None
    # What the orchestration asks where the plan trails a baseline (sharding/behind.py), never read
    # from the fields above: one plan per ParallelBlock where the plan is one (None: it lays out
    # the contractions of a block apart), the state kept split between steps, why the algorithm
    # kept it over the plan nearest a baseline (in its words), whether it measured plans before
    # the race (a search does; a cost model alone does not), and its own duel, if it ran one.
    assignment: Optional[list[int]] = None
    state_stored_split: bool = False
    kept_because: str = ""
    measured_before_race: bool = True
    duel: Optional[Duel] = None

    @property
    def mesh_shape(self) -> list[int]:
        return list(self.on.shape)


class Algorithm:
    """A sharding algorithm. Subclasses set ``name`` (registered under it) and define ``plan``;
    the other class attributes have defaults from the name. Its own options are settings it
    reads from ``settings`` by name beside the ``SearchOptions`` every algorithm takes:
    ``option_defaults`` (each with its default: for an algorithm of the package a mode option,
    ``mode.<name>``), or ``option_names`` (without one); any of them also
    ``mode.algorithm_options.<name>``, and ``autoshard(<name>=...)``. An algorithm keeps them in
    its own options class (the ILP's ``IlpOptions``)."""

    name: ClassVar[str] = ""          # mode.algorithm=<name>, autoshard(algorithm=<name>)
    row: ClassVar[str] = ""           # its plan's row in the race (default: its name)
    title: ClassVar[str] = ""         # its plan in words: "CFP's plan"
    heading: ClassVar[str] = ""       # its plan as the comparison table's title begins: "CFP plan"
    description: ClassVar[str] = ""   # what it is, in a few words, for the message naming the choices
    color: ClassVar[str] = "tab:green"  # its bars in comparison.png (matplotlib's colour names)
    source: ClassVar[str] = ""        # result.json's answer.source where its plan is the answer
    # On a 2-D mesh, analyse only plans that split two roles (search/meshes.py); False: every plan.
    two_axis_only: ClassVar[bool] = True
    option_defaults: ClassVar[Mapping[str, object]] = {}   # its own options, with their defaults
    option_names: ClassVar[tuple[str, ...]] = ()   # every option of its own (default: option_defaults')
    is_default: ClassVar[bool] = False   # the algorithm a search runs unless told (mode.algorithm, autoshard)
    _registry: ClassVar[dict[str, type["Algorithm"]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.name:
            cls.row = cls.row or cls.name
            cls.title = cls.title or f"{cls.name}'s plan"
            cls.heading = cls.heading or cls.title[:1].upper() + cls.title[1:]
            cls.source = cls.source or cls.name
            cls.option_names = cls.option_names or tuple(cls.option_defaults)
            Algorithm._registry[cls.name] = cls

    def __init__(self, options: SearchOptions, settings: Mapping[str, object] = {}) -> None:  # noqa: B006 - read only
        """``options``: the run's ``SearchOptions`` (the profile's in ``options.profile``; its
        baselines refused here where they are neither built-in plans nor an algorithm's row);
        ``settings``: the mode's config or autoshard's keywords, for ``option_names``."""
        check_baselines(options.baselines)
        self.options, self.settings = options, settings

    def setting(self, name: str) -> object:
        """Its own option ``name``: as set, else its default (``option_defaults``; None if none)."""
        return self.settings.get(name, self.option_defaults.get(name))

    def plan(self, on: Sequence[OnMesh], hooks: Hooks) -> Planned:
        """The plan for ``on`` (an ``OnMesh`` per logical mesh, analysed; the program is each
        one's ``analyzed.program``), on one of them."""
        raise NotImplementedError

    def behind(self, planned: Planned, baseline: str, ratio: float) -> Optional[Behind]:
        """Why its plan ``planned`` ran ``ratio`` times ``baseline`` in the final race, asked
        only where that is over ``sharding.behind.BEHIND``; None (the default): the search's own
        account, from what ``planned`` says of itself (``Planned.assignment``, ``kept_because``,
        ``duel``...: the blocks where it differs from the plan nearest that baseline, and why)."""
        return None

    # -- the registry --------------------------------------------------------------------------
    @staticmethod
    def named(name: str, module: Optional[str] = None, option: str = "mode.algorithm") -> type["Algorithm"]:
        """The algorithm registered as ``name``, ``module`` imported first (one defined outside
        the package); UserError naming the choices (``option``: how the caller set it)."""
        registry = algorithms(module)
        if name not in registry:
            where = f" (mode.algorithm_module={module} defines none by that name)" if module else ""
            choices = [f"{a.name} ({a.description})" if a.description else a.name for _, a in sorted(registry.items())]
            listed = " or ".join([", ".join(choices[:-1]), choices[-1]] if len(choices) > 1 else choices)
            raise UserError(f"{option}={name!r}: choose {listed}{where}")
        return registry[name]

    @staticmethod
    def of_row(row: str) -> Optional[type["Algorithm"]]:
        """The algorithm whose plan races as ``row`` (a name in ``mode.baselines``), if any."""
        return next((a for a in algorithms().values() if a.row == row), None)

    @staticmethod
    def default() -> type["Algorithm"]:
        """The algorithm a search runs unless told (the one whose class says ``is_default``); a result
        written before results named their algorithm is its."""
        return next(a for a in algorithms().values() if a.is_default)

    @staticmethod
    def package_options() -> dict[str, object]:
        """The package's own algorithms' options with their defaults (``option_defaults``), by
        name: keys of mode=search (beside ``mode.algorithm_options``, which takes any
        algorithm's), and of the answers ``autoshard`` keeps in the profile store."""
        return {name: default for a in algorithms().values() if a.__module__.startswith(f"{__package__}.")
                for name, default in a.option_defaults.items()}


def algorithms(module: Optional[str] = None) -> dict[str, type[Algorithm]]:
    """Every registered algorithm by name: this package's modules, and ``module`` (importable
    from the working directory or PYTHONPATH)."""
    from launcher.sharding import algorithms as package  # noqa: PLC0415 - this module is the package's

    import_all(package, module, "mode.algorithm_module", cwd=True)
    return dict(Algorithm._registry)


def builtin_baselines(baselines: Sequence[str]) -> tuple[str, ...]:
    """Of ``baselines`` (``SearchOptions.baselines``), the built-in plans (and the user's own layout)."""
    return tuple(b for b in baselines if Algorithm.of_row(b) is None)


def algorithm_baselines(baselines: Sequence[str]) -> tuple[str, ...]:
    """Of ``baselines``, other algorithms' plans, by their row (alpa_ilp: the ILP's)."""
    return tuple(b for b in baselines if Algorithm.of_row(b) is not None)


def check_baselines(baselines: Sequence[str]) -> None:
    """UserError naming a baseline that is neither a built-in plan, the user's own layout nor an
    algorithm's row (``mode.baselines``)."""
    others = [b for b in builtin_baselines(baselines) if b not in (*BASELINES, USER_BASELINE)]
    if others:  # the other built-in plans are models/plans.py's, which imports JAX: only then
        from launcher.models.plans import BUILTINS  # noqa: PLC0415  JAX: the CLI imports this module

        rows = [a.row for a in algorithms().values()]
        for name in others:
            if name not in BUILTINS:
                raise UserError(f"mode.baselines: {name!r} is not a built-in plan nor an algorithm's; "
                                f"choose from {', '.join([*BUILTINS, *rows])}")


def plan_title(row: str) -> str:
    """A plan of the final race in words: "CFP's plan", "dp_tp's plan", ..."""
    algorithm = Algorithm.of_row(row)
    return algorithm.title if algorithm is not None else f"{row}'s plan"


def plan_heading(row: str) -> str:
    """A plan as the comparison table's title begins: its algorithm's ``heading`` ("CFP plan"),
    or, for a row no imported algorithm has (a built-in plan, or one of ``mode.algorithm_module``'s
    read back by ``xlaunch``), its title capitalised as a class's default heading is."""
    algorithm = Algorithm.of_row(row)
    if algorithm is not None:
        return algorithm.heading
    title = plan_title(row)
    return title[:1].upper() + title[1:]
