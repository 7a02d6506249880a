"""A ``-m`` sweep checked whole before its first job is submitted, and recorded in its sweep dir.

Hydra calls ``SweepCheck.on_multirun_start`` (a callback: ``hydra.callbacks`` in conf/config.yaml)
once the sweep's config is composed and before its sweeper starts. For Hydra's own grid sweeper
every point is composed as its launcher will compose it, checked as a single run is (the
schemas, each mode's checks, the objective), and given the run dir it will have; a sweeper that
picks its points as it goes (``hydra/sweeper=optuna``) has its search space parsed with the
plugin's own parser, and each value it may pick composed and checked alike. Bad input is one
line and exit status 2, nothing submitted: a point refused, points whose run dirs share no root
(each must lie inside ``hydra.sweep.dir``, and no two in one), a search space Optuna cannot
parse, an objective no point's mode reports, an optimizing sweeper asked not to wait.

What passes is written to ``sweep.json`` in the sweep dir (the sweeper, the points known ahead
with their overrides and run dirs, the objective, the launcher's host and pid), which the table
(``launcher/cli/sweep/points.py``) reads, in this process at the sweep's end and from any shell with
``xlaunch sweep``. For Optuna the objective's direction becomes ``hydra.sweeper.direction``
unless the command line set it (then the two must agree).
"""

from __future__ import annotations

import copy
import itertools
import json
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from launcher.cli import schema
from launcher.errors import BAD_INPUT, UserError
from launcher.figures import Objective

RECORD = "sweep.json"  # in the sweep dir: what launcher/cli/sweep/points.py reads

# A sweeper that picks its points as it runs: how many of the values it may pick are composed
# and checked before the first job (each value of a choice, both ends of a range).
_PROBES = 64


@dataclass
class Sweep:
    """A sweep as planned: where, by which sweeper, its points where they are known ahead."""

    dir: Path
    sweeper: str  # "basic", "optuna" or the sweeper's class
    points: list[dict] = field(default_factory=list)  # {"num", "overrides", "run_dir"}
    searched: list[str] = field(default_factory=list)  # an optimizer's search-space keys
    objective: Optional[Objective] = None
    trials: Optional[int] = None
    wait: bool = True

    def record(self) -> dict:
        objective = ({"figure": self.objective.name, "lower_is_better": self.objective.lower_is_better}
                     if self.objective else None)
        return {"sweeper": self.sweeper, "points": self.points, "searched": self.searched, "trials": self.trials,
                "objective": objective, "wait": self.wait, "host": socket.gethostname(), "pid": os.getpid(),
                "started": time.time()}


# The sweep this process runs (set by the callback; launcher/cli/main.py prints its table at the end).
current: Optional[Sweep] = None


class Refused(BaseException):
    """Bad input found before a sweep's first job (launcher/cli/main.py prints it: one line, exit 2).
    Not an Exception: Hydra turns a callback's Exception into a warning, and the sweep would go on."""


class Crashed(BaseException):
    """The check itself failed (its cause is the error); launcher/cli/main.py raises the cause."""


class SweepCheck(Callback):
    """Hydra's callback (conf/config.yaml: ``hydra.callbacks.sweep``)."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        global current
        current = None
        try:
            sweep = plan(config)
        except BAD_INPUT as e:
            raise Refused(str(e)) from None
        except Exception as e:  # a fault of its own: loud, not Hydra's warning and a sweep unchecked
            raise Crashed(f"{type(e).__name__}: {e}") from e
        sweep.dir.mkdir(parents=True, exist_ok=True)
        (sweep.dir / RECORD).write_text(json.dumps(sweep.record(), indent=1) + "\n")
        current = sweep


def plan(config: DictConfig) -> Sweep:
    """The sweep ``config`` (the multirun's master config) asks for, checked; UserError (one line)
    for bad input."""
    target = str(config.hydra.sweeper.get("_target_", ""))
    kind = "basic" if target.endswith(".BasicSweeper") else "optuna" if "optuna" in target.lower() else target
    sweep = Sweep(dir=Path(str(config.hydra.sweep.dir)).absolute(), sweeper=kind,
                  wait=bool(OmegaConf.select(config, "launcher.wait", default=True)))
    overrides = _unresolved(config.hydra.overrides.task)
    if kind == "basic":
        params = _params(config)
        try:
            parsed = OverridesParser.create(config_loader=_loader()).parse_overrides(params + overrides)
            grid = BasicSweeper.split_arguments(parsed, None)[0]
        except HydraException as e:  # a sweep a grid cannot hold: interval(...)
            raise UserError(f"{_first_line(e)}: Hydra's grid sweeper takes lists (a,b,c), choice(...) and "
                            "range(...); to search an interval use hydra/sweeper=optuna") from None
        sweep.points = [{"num": i, "overrides": list(p)} for i, p in enumerate(grid)]
        configs = [_point(config, p["overrides"], p["num"]) for p in sweep.points]
    elif kind == "optuna":
        probes, sweep.searched = _optuna_space(config, overrides)
        sweep.trials = int(config.hydra.sweeper.get("n_trials") or 0)
        configs = [_point(config, p, i) for i, p in enumerate(probes)]
    else:  # a sweeper xlaunch does not know: its points are found as they run
        return sweep
    _same_root(sweep, configs)
    for p, (_, run_dir) in zip(sweep.points, configs, strict=False):
        p["run_dir"] = str(run_dir)
    sweep.objective = _objective(sweep, configs)
    if kind == "optuna":
        _optuna_direction(config, sweep)
    return sweep


def _unresolved(overrides: Any) -> list[str]:
    """Override strings as given: ``launcher.fault=crash:${hydra:job.num}`` is the point's to
    resolve, not the sweep's (as Hydra reads them: unresolved)."""
    return [str(o) for o in OmegaConf.to_container(overrides, resolve=False)]


def _params(config: DictConfig) -> list[str]:
    """``hydra.sweeper.params`` as overrides (``key=value``), unresolved."""
    params = config.hydra.sweeper.get("params")
    items = OmegaConf.to_container(params, resolve=False).items() if params else ()
    return [f"{k}={v}" for k, v in items]


def _loader() -> Any:
    return GlobalHydra.instance().config_loader()


def _point(config: DictConfig, overrides: list[str], num: int) -> tuple[DictConfig, Path]:
    """One point's job config, checked as a single run's is, and its run dir."""
    sweep_config = _loader().load_sweep_config(config, list(overrides))
    with open_dict(sweep_config):
        sweep_config.hydra.job.id = num
        sweep_config.hydra.job.num = num
    before = HydraConfig.instance().cfg
    HydraConfig.instance().set_config(sweep_config)  # what the job's own ${hydra:...} reads
    try:
        run_dir = Path(str(sweep_config.hydra.sweep.dir)) / str(sweep_config.hydra.sweep.subdir)
        job = copy.deepcopy(sweep_config)
        with read_write(job), open_dict(job):
            del job["hydra"]
        try:
            job = schema.typed(job)
            schema.validate(job)
        except BAD_INPUT as e:
            raise UserError(f"point #{num} ({' '.join(overrides) or 'no overrides'}): {e}") from None
    finally:
        if before is not None:
            HydraConfig.instance().cfg = before
    return job, Path(os.path.abspath(run_dir))  # as Hydra names it


def _same_root(sweep: Sweep, configs: list[tuple[DictConfig, Path]]) -> None:
    """Every point's run dir inside the sweep dir, no two alike: the sweep's table, sweep.csv
    and sweep.png need one root to find them all."""
    seen: dict[Path, int] = {}
    for num, (_, run_dir) in enumerate(configs):
        where = run_dir
        if sweep.dir not in where.parents:
            raise UserError(f"point #{num} would run in {where}, outside the sweep dir {sweep.dir}: a sweep's points "
                            "share one root; keep hydra.sweep.dir the same for every point (not made of what the "
                            "sweep varies) and hydra.sweep.subdir a relative path inside it")
        if where in seen:
            raise UserError(f"points #{seen[where]} and #{num} would both run in {where}: hydra.sweep.subdir must "
                            "tell the points apart (the default, ${hydra.job.num}-${mode.name}-${cluster.name}, does)")
        seen[where] = num


def _objective(sweep: Sweep, configs: list[tuple[DictConfig, Path]]) -> Optional[Objective]:
    """The objective the points share (each point's was checked with it); None where their modes
    differ and none was named, or their mode has none. An optimizer needs one."""
    found = {}
    for job, _ in configs:
        objective = schema.objective_of(job)
        found[(objective.name, objective.lower_is_better) if objective else None] = objective
    objective = next(iter(found.values())) if len(found) == 1 else None
    if objective is not None or sweep.sweeper == "basic":
        return objective
    raise UserError(_needs_objective(sweep, configs[0][0], found))


def _needs_objective(sweep: Sweep, job: DictConfig, found: dict) -> str:
    if None in found:
        return (f"hydra/sweeper={sweep.sweeper} optimizes one figure, and mode={job.mode.name} has none of its own: "
                "name one with launcher.objective.figure=<figure> (and launcher.objective.lower_is_better)")
    return (f"hydra/sweeper={sweep.sweeper} optimizes one figure, but the search reaches modes whose figures differ "
            f"({', '.join(sorted(o.describe() for o in found.values()))}): name one with "
            "launcher.objective.figure=<figure>")


# --- Optuna ------------------------------------------------------------------------------------

def _optuna_space(config: DictConfig, overrides: list[str]) -> tuple[list[list[str]], list[str]]:
    """The points to check before an Optuna search (its first pick of every key, then each
    other value a key may take, the rest at their first), and the searched keys, parsed as the
    plugin parses them (``hydra.sweeper.params`` and the command line's sweep overrides)."""
    from hydra_plugins.hydra_optuna_sweeper._impl import (  # noqa: PLC0415  the optuna extra: only for its sweeps
        create_params_from_overrides,
    )

    if not bool(OmegaConf.select(config, "launcher.wait", default=True)) or \
            bool(OmegaConf.select(config, "launcher.dry_run", default=False)):
        raise UserError("hydra/sweeper=optuna picks each point from the figures of the points before it: it needs "
                        "every job's result (launcher.wait=true, launcher.dry_run=false)")
    params = _params(config)
    try:
        space, fixed = create_params_from_overrides(params + overrides)
    except Exception as e:  # noqa: BLE001 - the grammar's, the plugin's and optuna's own errors: all bad input
        raise UserError(f"hydra.sweeper.params: Optuna's search space cannot be parsed ({_first_line(e)}); "
                        "give each key choice(a,b,...), range(start,stop,step) or interval(low,high), "
                        "e.g. hydra.sweeper.params.model.batch_size='choice(8,16)'") from None
    if not space:
        raise UserError("hydra/sweeper=optuna has nothing to search: give keys to search with "
                        "hydra.sweeper.params.<key>='choice(a,b)' (or 'interval(low,high)'), or key=a,b on the "
                        "command line")
    values = {key: _values(d) for key, d in space.items()}
    first = {key: v[0] for key, v in values.items()}
    base = [f"{k}={v}" for k, v in fixed.items()]
    probes = [base + [f"{k}={v}" for k, v in first.items()]]
    for key, options in values.items():
        for v in options[1:]:
            probes.append(base + [f"{k}={v if k == key else first[k]}" for k in first])
    return list(itertools.islice(probes, _PROBES)), list(space)


def _values(distribution: Any) -> list[Any]:
    """The values an Optuna distribution may take, as far as checking goes: every choice, or both
    ends of a range."""
    if hasattr(distribution, "choices"):
        return list(distribution.choices)
    return [distribution.low, distribution.high]


def _optuna_direction(config: DictConfig, sweep: Sweep) -> None:
    """``hydra.sweeper.direction`` from the objective, unless the command line gave it."""
    wanted = sweep.objective.direction
    given = [o.split("=", 1)[1] for o in _unresolved(config.hydra.overrides.hydra)
             if o.split("=", 1)[0].lstrip("+~") == "hydra.sweeper.direction"]
    if given:
        if given[-1] != wanted:
            raise UserError(f"hydra.sweeper.direction={given[-1]}, but the objective is {sweep.objective.describe()}: "
                            f"drop hydra.sweeper.direction (xlaunch sets {wanted}), or say what you want with "
                            "launcher.objective.lower_is_better")
        return
    with read_write(config.hydra.sweeper), open_dict(config.hydra.sweeper):
        config.hydra.sweeper.direction = wanted


def _first_line(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    return text.splitlines()[0]
