"""What a sharding algorithm provides, and the registry of them (as ``runtime/ranks.py``
registers environments: by subclassing).

An algorithm plans a program on the logical meshes the orchestration analysed
(``pipeline.run_search``): it returns one ``Planned``, a plan on one mesh with what it
predicted. Everything else is the orchestration's, the same for every algorithm: the analysis,
the race beside the baselines (and beside other algorithms' plans named in ``mode.baselines``
by their ``row``), the answer, the result fields and the files. Adding an algorithm is one
module defining a subclass (outside the package: ``mode.algorithm_module``, or imported before
``autoshard``), docs/architecture.md.

This module imports no JAX: the command line checks ``mode.algorithm`` with it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar, ContextManager, Mapping, Optional, Sequence

from launcher.errors import UserError
from launcher.plugins import import_all

if TYPE_CHECKING:  # it imports JAX: the command line imports this module
    from launcher.models.plans import Plan

Log = Callable[[str], None]
Progress = Callable[[int, str], ContextManager]


@dataclass
class Hooks:
    """How a search reports while it runs: ``log`` a line; ``progress(total, what)`` a context
    manager whose value has ``advance()``; ``write(files)`` run-dir files as soon as they are
    made ({path: text or JSON-able dict}, nothing lost if a later step fails); ``final_run`` a
    context around the final race (the run's profiler trace); ``is_main``: process 0, which
    writes the profile store."""
    log: Log = lambda line: None
    progress: Optional[Progress] = None
    write: Callable[[Mapping[str, Any]], None] = lambda files: None
    final_run: Optional[Callable[[], ContextManager]] = None
    is_main: bool = True


@dataclass
class Planned:
    """One algorithm's plan for a program: the mesh it is on, its layouts, the runner that races
    it, and what the algorithm predicted and reports."""
    algorithm: str                 # the algorithm's name (mode.algorithm)
    row: str                       # its row in the race and the comparison (cfp, alpa_ilp)
    on: Any                        # pipeline.OnMesh: the mesh, its analysis and the program
    plan: Plan                     # its layouts (constraints), plan.json
    runner: Any                    # search.measure's runner of the plan on its mesh
    source: str                    # which plan the algorithm kept, in words (search optimum, ILP...)
    predicted_step_time_s: Optional[float]
    predicted_memory_bytes: Optional[float]
    meshes: list[dict] = field(default_factory=list)     # per mesh planned on: its optimum, or why none
    fields: dict = field(default_factory=dict)           # its own result.json fields (beside the race's)
    baseline_fields: dict = field(default_factory=dict)  # its own, where it races as a baseline
    files: dict = field(default_factory=dict)            # its own run-dir files
    details: Any = None            # the algorithm's own objects (CFP's shortlist, the ILP's solution)

    @property
    def mesh_shape(self) -> list[int]:
        return list(self.on.shape)


class Algorithm:
    """A sharding algorithm. Subclasses set ``name`` (registered under it) and define ``plan``;
    the other class attributes have defaults from the name. ``option_names`` are the settings of
    its own it reads from ``settings`` (``mode.algorithm_options.<name>``, or a mode option such
    as the ILP's ``mode.ilp_time_limit_s``; ``autoshard(<name>=...)``) beside ``SearchOptions``'."""

    name: ClassVar[str] = ""          # mode.algorithm=<name>, autoshard(algorithm=<name>)
    row: ClassVar[str] = ""           # its plan's row in the race (default: its name)
    title: ClassVar[str] = ""         # its plan in words: "CFP's plan"
    heading: ClassVar[str] = ""       # its plan as the comparison table's title begins: "CFP plan"
    description: ClassVar[str] = ""   # what it is, in a few words, for the message naming the choices
    color: ClassVar[str] = "tab:green"  # its bars in comparison.png (matplotlib's colour names)
    source: ClassVar[str] = ""        # result.json's answer.source where its plan is the answer
    # On a 2-D mesh, analyse only plans that split two roles (search/meshes.py); False: every plan.
    two_axis_only: ClassVar[bool] = True
    option_names: ClassVar[tuple[str, ...]] = ()
    _registry: ClassVar[dict[str, type["Algorithm"]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.name:
            cls.row = cls.row or cls.name
            cls.title = cls.title or f"{cls.name}'s plan"
            cls.heading = cls.heading or cls.title[:1].upper() + cls.title[1:]
            cls.source = cls.source or cls.name
            Algorithm._registry[cls.name] = cls

    def __init__(self, options: Any, settings: Mapping[str, Any] = {}) -> None:  # noqa: B006 - read only
        """``options``: the run's ``SearchOptions`` (the profile's in ``options.profile``);
        ``settings``: the mode's config or autoshard's keywords, for ``option_names``."""
        self.options, self.settings = options, settings

    def plan(self, on: Sequence[Any], hooks: Hooks) -> Planned:
        """The plan for ``on`` (``pipeline.OnMesh`` per logical mesh, analysed; the program is
        each one's ``analyzed.program``), on one of them."""
        raise NotImplementedError

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


def algorithms(module: Optional[str] = None) -> dict[str, type[Algorithm]]:
    """Every registered algorithm by name: this package's modules, and ``module`` (importable
    from the working directory or PYTHONPATH)."""
    from launcher.sharding import algorithms as package  # noqa: PLC0415 - this module is the package's

    import_all(package, module, "mode.algorithm_module", cwd=True)
    return dict(Algorithm._registry)


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
