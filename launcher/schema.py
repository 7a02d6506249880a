"""Structured-config schema: what every config group may contain, checked at composition.

Hydra merges each YAML option of a group into these dataclasses, so a misspelt key, a string
where an int belongs or an unknown enum value fails before anything is submitted. Checks that
a type cannot express (a positive count, a port in range) live in ``validate``.

Mode and model schemas live next to their code (``launcher/modes/<name>.py: Config``,
``models/configs.py: SCHEMAS``) and are registered here as ``<name>_schema``; each YAML option
of those groups starts with ``defaults: [<name>_schema, _self_]``.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig

from launcher import jaxcompat
from launcher.errors import UserError


class Backend(str, Enum):
    """Which submitit executor starts the tasks."""

    local = "local"  # submitit's LocalExecutor: N processes on this host
    slurm = "slurm"  # submitit's SlurmExecutor (slurm, lumi)
    mpi = "mpi"  # ours: mpirun -np N (launcher.clusters.mpi)
    tpu = "tpu"  # ours: gcloud ... tpu-vm ssh --worker=all (launcher.clusters.tpu)


class Accelerator(str, Enum):
    """How a task's devices are made visible before JAX is imported."""

    cpu = "cpu"  # cluster.cpu_devices_per_task virtual CPU devices per task
    cuda = "cuda"  # CUDA_VISIBLE_DEVICES per local rank
    rocm = "rocm"  # ROCR_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES per local rank
    tpu = "tpu"  # the TPU runtime owns its chips


class Runtime(str, Enum):
    none = "none"
    singularity = "singularity"
    docker = "docker"
    podman = "podman"


@dataclass
class ClusterConfig:
    name: str = MISSING
    backend: Backend = MISSING
    accelerator: Accelerator = Accelerator.cpu
    nodes: int = 1
    tasks_per_node: int = 2
    cpu_devices_per_task: int = 4
    gpus_per_node: int = 0
    timeout_min: int = 60
    env: Dict[str, str] = field(default_factory=dict)
    setup: List[str] = field(default_factory=list)
    # SLURM (slurm, lumi)
    partition: Optional[str] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    cpus_per_task: Optional[int] = None
    mem: Optional[str] = None
    mem_per_gpu: Optional[str] = None
    exclusive: bool = False
    cpu_bind: Optional[str] = None
    srun_args: List[str] = field(default_factory=list)
    sbatch_args: Dict[str, str] = field(default_factory=dict)
    # mpirun (mpi-local)
    mpirun: str = "mpirun"
    mpirun_args: List[str] = field(default_factory=list)
    hosts: List[str] = field(default_factory=list)
    # TPU VM pods (tpu)
    tpu_name: Optional[str] = None
    zone: Optional[str] = None
    project: Optional[str] = None
    gcloud: str = "gcloud"
    remote_dir: str = "xlaunch-runs"  # on each worker, relative to its home
    remote_python: str = "python3"  # the workers' interpreter (with jax[tpu], submitit and xlaunch)


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
class LauncherConfig:
    dry_run: bool = False
    wait: bool = True
    init_timeout_s: int = 60  # a rank that has not joined by then fails the job
    heartbeat_timeout_s: int = 30  # jax.distributed's own peer-loss detection
    peer_timeout_s: float = 15.0  # our watchdog: a silent rank is declared dead after this
    poll_interval_s: float = 0.5
    coordinator_port: int = 0  # 0: chosen per job
    xla_dump: bool = False
    log_level: str = "INFO"
    # Test-only fault injection, to prove that failures end the job quickly:
    # "crash:<rank>" raises in that rank after joining, "abort:<rank>" kills it with SIGABRT
    # (no Python cleanup, like a segfault), "hang:<rank>" never joins.
    fault: str = ""


@dataclass
class Config:
    cluster: ClusterConfig = MISSING
    container: ContainerConfig = MISSING
    model: Any = MISSING
    mode: Any = MISSING
    launcher: LauncherConfig = field(default_factory=LauncherConfig)
    seed: int = 0


def mode_modules() -> Dict[str, Any]:
    """Every mode module in launcher/modes, by mode name."""
    import launcher.modes as pkg

    out = {}
    for info in pkgutil.iter_modules(pkg.__path__):
        if not info.name.startswith("_"):
            out[info.name] = importlib.import_module(f"launcher.modes.{info.name}")
    return out


def register() -> None:
    cs = ConfigStore.instance()
    cs.store(name="base_config", node=Config)
    for name, module in mode_modules().items():
        if hasattr(module, "Config"):
            cs.store(group="mode", name=f"{name}_schema", node=module.Config)
    try:
        from models.configs import SCHEMAS
    except ImportError:  # models not installed: user models still work through _target_
        SCHEMAS = {}
    for name, schema in SCHEMAS.items():
        cs.store(group="model", name=f"{name}_schema", node=schema)


def validate(cfg: DictConfig) -> None:
    """Checks a type cannot express. Raises UserError naming the key and the fix."""
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
    if c.backend == Backend.local and c.nodes != 1:
        raise UserError(f"cluster.nodes={c.nodes}: cluster={c.name} runs on this host only; use cluster.nodes=1 "
                        "or a cluster with several nodes (cluster=slurm)")
    if not 0 <= lc.coordinator_port < 65536:
        raise UserError(f"launcher.coordinator_port={lc.coordinator_port}: must be 0 (automatic) or a TCP port")
    if lc.fault:
        kind, _, rank = lc.fault.partition(":")
        if kind not in ("crash", "abort", "hang") or not rank.isdigit():
            raise UserError(f"launcher.fault={lc.fault!r}: expected 'crash:<rank>', 'abort:<rank>' or 'hang:<rank>'")
    if c.backend == Backend.tpu and not c.tpu_name:
        raise UserError("cluster=tpu needs the TPU VM's name: add cluster.tpu_name=<name> (and cluster.zone=<zone>)")
    if cfg.container.runtime != Runtime.none and not cfg.container.image:
        raise UserError(f"container={cfg.container.runtime.value} needs an image: add container.image=<image>")
    if cfg.container.runtime == Runtime.none and c.backend in (Backend.local, Backend.slurm, Backend.mpi):
        # The tasks run this very python: its JAX is theirs, so an old one is refused now, not
        # after queueing. (In a container, on TPU workers, each task checks its own at start.)
        jaxcompat.check_version()
    _validate_mode_counts(cfg.mode)


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
