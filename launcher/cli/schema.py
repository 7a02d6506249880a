"""Structured-config schema: what every config group may contain, checked at composition.

Hydra merges each YAML option of a group into these dataclasses, so a misspelt key, a string
where an int belongs or an unknown enum value fails before anything is submitted. Checks that
a type cannot express (a positive count, a port in range) live in ``validate``.

Cluster, mode and model schemas live next to their code (``launcher/clusters/<backend>.py:
Config``, one per backend over ``ClusterConfig``; each mode's ``Config`` in the table
``launcher.modes.MODES``; ``models/configs.py: SCHEMAS``), each with its checks (``Config.check``).
A mode option of conf/mode names the mode that runs it in ``code`` (a preset, cfp, names
search's), as a cluster option names its backend. They are registered
(``register``) at the root of Hydra's config repository as ``schema_<group>_<name>``, not in
their groups: Hydra offers every entry of a group as an option (``--help``, and the error for a
misspelt ``mode=serch``), and a schema is not one. Each YAML option starts with
``defaults: [/schema_<group>_<name>@_here_, _self_]``.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Dict, List, Optional

import yaml
from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from launcher import figures, jaxcompat
from launcher.clusters.config import Accelerator, ClusterConfig
from launcher.modes.checks import Job
from launcher.clusters.base import Cluster, backends
from launcher.errors import UserError
from launcher.runtime.status import HEARTBEAT_S
from launcher.runtime.watch import check_size
from launcher.models.configs import SCHEMAS, check as check_model
from launcher.modes import MODES, find


class Runtime(str, Enum):
    none = "none"
    singularity = "singularity"
    docker = "docker"
    podman = "podman"


@dataclass
class ContainerConfig:
    runtime: Runtime = MISSING
    image: str = ""
    executable: Optional[str] = None  # singularity/apptainer/docker/podman binary; default: runtime name
    python: str = "python3"
    binds: List[str] = field(default_factory=list)  # "host[:container[:opts]]"
    setup: List[str] = field(default_factory=list)  # shell lines run inside, before python
    venv: Optional[str] = None  # a venv inside the container, activated after setup
    env: Dict[str, str] = field(default_factory=dict)
    options: List[str] = field(default_factory=list)  # extra exec/run options


@dataclass
class ObjectiveConfig:
    """What a sweep ranks its points by, and Hydra's sweepers (hydra/sweeper=optuna) optimize:
    one of the mode's headline figures (launcher/figures.py)."""

    # "": the mode's own (check: bandwidth; train, search, cfp: step_time; hlo_replay:
    # replay_time; profile: profile_time); mode=run: a number its program returns or logs.
    figure: str = ""
    # null: the figure's own direction (bandwidth: higher is better); true or false to say it.
    lower_is_better: Optional[bool] = None


@dataclass
class StragglerConfig:
    """A slow rank named (launcher/runtime/straggler.py): a rank whose host-side work per step
    stays above ``factor`` times the median rank's for ``steps`` steps in a row is named, once, on
    the console; xlaunch status, result.json and TensorBoard keep every rank's scores."""

    factor: float = 1.2
    steps: int = 10


@dataclass
class LauncherConfig:
    dry_run: bool = False
    wait: bool = True
    init_timeout_s: int = 60  # a rank that has not joined by then fails the job
    heartbeat_timeout_s: int = 30  # jax.distributed's own peer-loss detection
    peer_timeout_s: float = 15.0  # our watchdog: a silent rank is declared dead after this
    # A job none of whose ranks progressed (a step, a profiled combination, launcher.context()
    # .step(), a line in its log) for this long is hung: every rank writes its threads' stacks
    # into its log, the launcher says where each was, and the job ends. Long enough for the
    # longest compile of a real job.
    hang_timeout_s: float = 1800.0
    # Once every rank has said it is done (the result written), how long their processes have to
    # exit before the waiting launcher ends the job: a process stuck while exiting (tearing down
    # its collectives, say) would hold the job, and on a scheduler its nodes, to the time limit.
    exit_timeout_s: float = 60.0
    # A job whose rank fails (exits non-zero, is killed, its node is lost) or that hangs is
    # started again this many times at most, in the same run dir (launcher.context().restart one
    # higher), resuming from its checkpoints; by the waiting launcher, on every backend.
    max_restarts: int = 0
    poll_interval_s: float = 0.5
    # Without a terminal (nohup, CI, a batch step) the waiting launcher prints a plain progress
    # line this often while the job's progress changes, and 5 times less often while it does not.
    progress_every_s: float = 30.0
    coordinator_port: int = 0  # 0: chosen at submission, per job (launcher.cli.submit.coordinator_port)
    xla_dump: bool = False
    # JAX's persistent compilation cache, on for every job where the JAX in use keeps CPU
    # executables safely (launcher/jaxcompat.py): null, the run dir's jax_cache/ (a requeued or
    # restarted job, or a rerun in the same run dir, compiles nothing again); a path, shared by
    # the runs naming it; "off": no cache. A JAX_COMPILATION_CACHE_DIR the tasks inherit counts
    # as a path.
    compile_cache_dir: Optional[str] = None
    # Each rank writes a jax.profiler trace of its measured steps (mode=train, hlo_replay, the
    # final run of search) to <run dir>/traces/rank<N>/ (launcher/runtime/trace.py).
    trace: bool = False
    log_level: str = "INFO"
    # Where the run's scalars go (launcher/runtime/trackers.py): tensorboard (event files in the
    # run dir), wandb, mlflow (their extras), none. A restarted or requeued job goes on with the
    # same run.
    tracker: str = "tensorboard"
    # Run once another job has ended well: its run dir (or its job id). The job is submitted now
    # and waits in the scheduler's queue (SLURM: sbatch --dependency=afterok:<id>); if that job
    # fails, this one ends without running, with its reason. With mode=train mode.plan=<that run
    # dir>, a search then the training as one submission (docs/long-jobs.md).
    after: Optional[str] = None
    straggler: StragglerConfig = field(default_factory=StragglerConfig)
    # Before the program starts, every rank checks its node: one all-reduce over every device
    # and a second of matmul (launcher/runtime/preflight.py). A node that fails, or whose matmul
    # runs below preflight_min times the other nodes' median, is named in one line; the job stops, or
    # (launcher.max_restarts) restarts without it where the backend can (SLURM's --exclude).
    # null: on for a job of more than one node.
    preflight: Optional[bool] = None
    preflight_min: float = 0.6
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    # Test-only fault injection, to prove that failures end the job quickly:
    # "crash:<rank>" raises in that rank after joining, "abort:<rank>" kills it with SIGABRT
    # (no Python cleanup, like a segfault), "hang:<rank>" never joins, "slow:<node>" has that
    # node's preflight matmul do eight times the work it reports (launcher/runtime/preflight.py).
    fault: str = ""


@dataclass
class Config:
    cluster: ClusterConfig = MISSING
    container: ContainerConfig = MISSING
    model: Any = MISSING
    mode: Any = MISSING
    launcher: LauncherConfig = field(default_factory=LauncherConfig)
    seed: int = 0


def cluster_schemas(module: Optional[str] = None) -> Dict[str, type]:
    """Each backend's cluster schema (its class's ``config``: ``Config`` in
    ``launcher/clusters/<backend>.py``, or in ``module`` for a backend outside the package), by backend."""
    return {name: cls.config for name, cls in backends(module).items()}


def mode_schemas() -> Dict[str, type]:
    """Each mode's schema (its ``Config``), by mode: ``launcher.modes.MODES``."""
    return {name: mode.config for name, mode in MODES.items()}


def mode_schema_of(mode: Any) -> type:
    """The schema of a mode config: its mode's (``launcher.modes.find``); UserError for none. A
    config saved before modes had a ``code`` (a run dir's .hydra/config.yaml) is the option its
    name names (mode=cfp's: search's)."""
    if not mode.get("code") and mode.get("name") in mode_codes():
        mode = {**mode, "code": mode_codes()[mode["name"]]}
    return find(mode).config


def objective_of(cfg: DictConfig) -> Optional[figures.Objective]:
    """The run's objective (``launcher.objective``: a headline figure of its mode, launcher/figures.py);
    None where its mode has none by default and none is named. UserError for a figure the mode
    does not report."""
    mode = cfg.mode
    code = mode.get("code") or mode_codes().get(mode.get("name"), mode.get("name"))
    return figures.objective(find({"code": code}).figures, mode.get("name"), cfg.launcher.get("objective") or {})


def mode_codes() -> Dict[str, str]:
    """Each mode option of conf/mode (cfp, search, ...) and the mode that runs it (its ``code``)."""
    out = {}
    for path in sorted((CONF_DIR / "mode").glob("*.yaml")):
        out[path.stem] = (yaml.safe_load(path.read_text()) or {}).get("code") or path.stem
    return out


def schema_name(group: str, option: str) -> str:
    """Where a group's schema is registered: a config at the root of Hydra's repository, named
    ``schema_<group>_<option>``, which a YAML option pulls in with
    ``defaults: [/schema_<group>_<option>@_here_, _self_]``."""
    return f"schema_{group}_{option}"


def register() -> None:
    """Registers the schemas with Hydra's ConfigStore.

    Schemas are *not* stored in the groups they type (``mode/check_schema`` would be an option of
    ``mode``, offered by ``--help`` and by the error for a misspelt ``mode=``): each is a config at
    the repository's root (``schema_mode_check``, ``schema_cluster_slurm``...), which Hydra lists
    in no group, and each YAML option merges its schema in with
    ``defaults: [/schema_<group>_<name>@_here_, _self_]`` (``@_here_``: into the option's own
    package). So overrides are still typed and checked by Hydra, against the selected option's
    own schema (a SLURM key on cluster=local is refused).
    """
    cs = ConfigStore.instance()
    cs.store(name="base_config", node=Config)
    for backend, schema in cluster_schemas().items():
        cs.store(name=schema_name("cluster", backend), node=schema)
    for name, schema in mode_schemas().items():
        cs.store(name=schema_name("mode", name), node=schema)
    for name, schema in SCHEMAS.items():
        cs.store(name=schema_name("model", name), node=schema)


# conf/ at the repository's top, reached through the link launcher/conf so that an installed
# package carries it (pyproject.toml: package-data).
CONF_DIR = Path(__file__).resolve().parents[1] / "conf"


# --- the composed config against its schemas --------------------------------------------------

def job_of(cfg: DictConfig) -> Job:
    c = cfg.cluster
    devices = None
    if c.accelerator == Accelerator.cpu:
        devices = c.nodes * c.tasks_per_node * c.cpu_devices_per_task
    elif c.accelerator in (Accelerator.cuda, Accelerator.rocm) and c.gpus_per_node > 0:
        devices = c.nodes * c.gpus_per_node
    backend = Cluster.of(c)
    return Job(devices=devices, files_here=backend.shares_filesystem, model=cfg.model,
               same_python=backend.runs_this_python and cfg.container.runtime == Runtime.none,
               after=str(cfg.launcher.get("after") or ""))


def typed(cfg: DictConfig) -> DictConfig:
    """``cfg`` merged into its schemas: ``Config``, the backend's cluster ``Config`` and the mode's.

    Hydra already typed a composed config through the defaults lists; this also types a config
    saved by an earlier run (``--config-dir <run>/.hydra``, which has no defaults list) and refuses
    what Hydra lets through: keys added with ``+`` (``+foo=1``, ``+cluster.partition=x`` on
    cluster=local). Raises UserError naming the key.
    """
    raw = OmegaConf.to_container(cfg, resolve=False)
    for key in raw:
        if key not in _fields(Config):
            raise UserError(f"{key}: not a key of the config (its keys: {', '.join(_fields(Config))}); remove "
                            f"+{key}=..., or put it under the group it belongs to (e.g. +mode.{key}=...)")
    cluster, mode = raw.get("cluster") or {}, raw.get("mode") or {}
    cluster_schema, mode_schema = Cluster.of(cluster).config, mode_schema_of(mode)
    for group, schema, value in (("cluster", cluster_schema, cluster), ("mode", mode_schema, mode),
                                 ("launcher", LauncherConfig, raw.get("launcher") or {}),
                                 ("container", ContainerConfig, raw.get("container") or {})):
        for key in value:
            if key not in _fields(schema):
                raise UserError(unknown_key_message(f"{group}.{key}", cluster.get("name"), mode.get("name")))
    base = OmegaConf.structured(Config(cluster=cluster_schema(), mode=mode_schema()))
    try:
        return OmegaConf.merge(base, raw)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", "") or "config"
        raise UserError(f"{key}: {str(e).splitlines()[0]}") from None


def unknown_key_message(key: str, cluster: Optional[str], mode: Optional[str]) -> str:
    """One line for a key the selected option's schema does not have: what it is, and the fix."""
    group, _, name = key.partition(".")
    name = name.split(".")[0]
    if group == "cluster":
        backends = cluster_backends()
        backend = backends.get(cluster or "")
        schemas = cluster_schemas()
        own = _fields(schemas[backend]) if backend in schemas else []
        others = [b for b, s in sorted(schemas.items()) if name in _fields(s) and b != backend]
        where = f"cluster={cluster} (backend {backend})" if backend else f"cluster={cluster}"
        if others:
            options = [c for c, b in sorted(backends.items()) if b in others]
            return (f"{key}: {where} has no such key; it is an option of backend {' and '.join(others)} "
                    f"(cluster={'|'.join(options)}): select such a cluster or drop the key")
        return f"{key}: {where} has no such key (its keys: {', '.join(own)})"
    if group == "mode":
        schema = mode_schemas().get(mode_codes().get(mode or "", mode or ""))
        own = f" (its options: {', '.join(k for k in _fields(schema) if k not in ('name', 'code'))})" if schema else ""
        return f"{key}: mode={mode} has no such option{own}"
    schema = {"launcher": LauncherConfig, "container": ContainerConfig}.get(group)
    own = f" (its keys: {', '.join(_fields(schema))})" if schema else ""
    return f"{key}: no such key{own}"


def cluster_backends() -> Dict[str, str]:
    """Each cluster option of conf/cluster (local, lumi, ...) and its backend."""
    out = {}
    for path in sorted((CONF_DIR / "cluster").glob("*.yaml")):
        backend = (yaml.safe_load(path.read_text()) or {}).get("backend")
        if backend:
            out[path.stem] = backend
    return out


def _fields(schema: type) -> List[str]:
    return [f.name for f in dataclasses.fields(schema)]


def validate(cfg: DictConfig) -> None:
    """Checks a type cannot express, before anything is submitted: the common ones here, the
    cluster backend's (``launcher/clusters/<backend>.py: Config.check``), the model's
    (``models/configs.py``) and the mode's (its ``Config.check``, ``launcher.modes.MODES``: input
    files, plans, mesh shapes). Raises UserError (ModelError for the model) naming the key and
    the fix."""
    c, lc = cfg.cluster, cfg.launcher
    positive = {
        "cluster.nodes": c.nodes,
        "cluster.tasks_per_node": c.tasks_per_node,
        "cluster.timeout_min": c.timeout_min,
        "launcher.init_timeout_s": lc.init_timeout_s,
        "launcher.heartbeat_timeout_s": lc.heartbeat_timeout_s,
    }
    if c.accelerator == Accelerator.cpu:
        positive["cluster.cpu_devices_per_task"] = c.cpu_devices_per_task
    for key, value in positive.items():
        if value < 1:
            raise UserError(f"{key}={value}: must be at least 1 (e.g. {key}=1)")
    if c.gpus_per_node < 0:
        raise UserError(f"cluster.gpus_per_node={c.gpus_per_node}: must be 0 or more")
    if c.accelerator in (Accelerator.cuda, Accelerator.rocm):
        if c.gpus_per_node < c.tasks_per_node or c.gpus_per_node % c.tasks_per_node:
            raise UserError(
                f"cluster.gpus_per_node={c.gpus_per_node} cannot be split evenly over "
                f"cluster.tasks_per_node={c.tasks_per_node}: make gpus_per_node a multiple of tasks_per_node"
            )
    _validate_launcher(lc)
    too_many = check_size(c.nodes * c.tasks_per_node, lc.peer_timeout_s)
    if too_many:
        raise UserError(too_many)
    if job_of(cfg).files_here:
        _check_writable("launcher.compile_cache_dir", lc.compile_cache_dir)
    if lc.fault:
        kind, _, at = lc.fault.partition(":")
        if not ((kind in ("crash", "abort", "hang") and at.isdigit()) or (kind == "slow" and at)):
            raise UserError(f"launcher.fault={lc.fault!r}: expected 'crash:<rank>', 'abort:<rank>', 'hang:<rank>' "
                            "or 'slow:<node>'")
    if cfg.container.runtime != Runtime.none and not cfg.container.image:
        raise UserError(f"container={cfg.container.runtime.value} needs an image: add container.image=<image>")
    Cluster.of(c).config.check(cfg)
    # The model's own fields (models/configs.py: check): a built-in model that cannot be built
    # is refused here, not after queueing. (How it fits the devices is the mode's check.)

    check_model(cfg.model)
    _validate_mode_counts(cfg.mode)
    mode_schema_of(cfg.mode).check(cfg.mode, job_of(cfg))
    objective_of(cfg)  # a figure the mode does not report is refused now
    if job_of(cfg).same_python:
        # The tasks run this very python: its JAX is theirs, so an old one is refused now, not
        # after queueing. (In a container, on TPU workers, each task checks its own at start.)
        jaxcompat.check_version()
        # So is a tracker whose library it lacks (elsewhere the task says so in its log).
        from launcher.runtime.trackers import Tracker  # noqa: PLC0415  the schema module stays light

        missing = Tracker.named(cfg.launcher.tracker).missing()
        if missing:
            raise UserError(f"launcher.tracker={cfg.launcher.tracker}: {missing}; or choose another tracker "
                            f"({', '.join(sorted(Tracker.trackers))})")


def _validate_launcher(lc: DictConfig) -> None:
    """launcher.*'s own checks (the timeouts, restarts, progress lines, port)."""
    if lc.hang_timeout_s <= HEARTBEAT_S:
        raise UserError(f"launcher.hang_timeout_s={lc.hang_timeout_s}: must be more than the ranks' heartbeat "
                        f"interval ({HEARTBEAT_S:g} s); a real job wants minutes (e.g. launcher.hang_timeout_s=1800)")
    if lc.exit_timeout_s <= 0:
        raise UserError(f"launcher.exit_timeout_s={lc.exit_timeout_s}: must be more than 0 (seconds the ranks have "
                        "to exit once every one is done)")
    from launcher.runtime.trackers import Tracker  # noqa: PLC0415  the schema module stays light

    Tracker.named(lc.tracker)   # a tracker that is none
    if not 0 < lc.preflight_min < 1:
        raise UserError(f"launcher.preflight_min={lc.preflight_min}: must be between 0 and 1 (the share of the "
                        "other nodes' median matmul rate below which a node is left out; e.g. 0.6)")
    if lc.straggler.factor <= 1:
        raise UserError(f"launcher.straggler.factor={lc.straggler.factor}: must be more than 1 (how many times the "
                        "median rank's host work a step makes a rank slow; e.g. 1.2)")
    if lc.straggler.steps < 3:
        raise UserError(f"launcher.straggler.steps={lc.straggler.steps}: must be at least 3 (the steps in a row a "
                        "rank must stay slow before it is named; e.g. 10)")
    if lc.max_restarts < 0:
        raise UserError(f"launcher.max_restarts={lc.max_restarts}: must be 0 (never restart) or more")
    if lc.max_restarts and not lc.wait:
        raise UserError(f"launcher.max_restarts={lc.max_restarts} needs launcher.wait=true: the waiting launcher "
                        "restarts the job (or set launcher.max_restarts=0)")
    if lc.progress_every_s <= 0:
        raise UserError(f"launcher.progress_every_s={lc.progress_every_s}: must be more than 0 (seconds)")
    if not 0 <= lc.coordinator_port < 65536:
        raise UserError(f"launcher.coordinator_port={lc.coordinator_port}: must be 0 (automatic) or a TCP port")


def _check_writable(key: str, where: Optional[str]) -> None:
    """A directory the tasks will write (made here if need be), where they see this machine's files."""
    if not where or where == "off":
        return
    path = Path(where).expanduser()
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".xlaunch-write-check-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise UserError(f"{key}={where}: cannot be written ({e.strerror or e}); give a directory you can write, "
                        f"or {key}=off") from None


# Counts the modes share by name: checked here, before submission, rather than in each task.
_AT_LEAST_ONE = ("steps", "iterations", "run_repeats", "repeats", "verify_top_k", "verify_iterations",
                 "verify_repeats", "max_segment_space")
_NOT_NEGATIVE = ("warmup", "memory_budget_gb")


def _validate_mode_counts(mode: DictConfig) -> None:
    for key in _AT_LEAST_ONE:
        if key in mode and mode[key] < 1:
            raise UserError(f"mode.{key}={mode[key]}: must be at least 1 (e.g. mode.{key}=3)")
    for key in _NOT_NEGATIVE:
        if key in mode and mode[key] < 0:
            raise UserError(f"mode.{key}={mode[key]}: must be 0 or more")
