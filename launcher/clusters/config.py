"""The keys every cluster backend has (each backend adds its own in its module's ``Config``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Dict, List, Optional

from omegaconf import MISSING, DictConfig


class Accelerator(str, Enum):
    """How a task's devices are made visible before JAX is imported."""

    cpu = "cpu"  # cluster.cpu_devices_per_task virtual CPU devices per task
    cuda = "cuda"  # CUDA_VISIBLE_DEVICES per local rank
    rocm = "rocm"  # ROCR_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES per local rank
    tpu = "tpu"  # the TPU runtime owns its chips



@dataclass
class ClusterConfig:
    """What every cluster backend has. Each backend's own keys are in its subclass, ``Config`` in
    ``launcher/clusters/<backend>.py`` (local, slurm, mpi, tpu, ray), beside its code and its checks."""

    name: str = MISSING
    # Which backend (launcher/clusters/<backend>.py) starts the tasks; a backend defined outside
    # the package names its module, imported first.
    backend: str = MISSING
    module: Optional[str] = None
    accelerator: Accelerator = Accelerator.cpu
    nodes: int = 1
    tasks_per_node: int = 2
    cpu_devices_per_task: int = 4
    gpus_per_node: int = 0
    timeout_min: int = 60
    # How often a job that times out or is preempted may be requeued (SLURM only: submitit's
    # max_num_timeout, and every requeue counts; launcher/runtime/requeue.py).
    max_requeues: int = 3
    env: Dict[str, str] = field(default_factory=dict)
    setup: List[str] = field(default_factory=list)

    @classmethod
    def check(cls, cfg: DictConfig) -> None:
        """The backend's own checks of the whole config (``cfg.cluster`` is this class's)."""
