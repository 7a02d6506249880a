"""Device visibility, set before JAX is imported.

Accelerator runtimes read these variables once, when they start; JAX's own guess (one device per
local rank) breaks when a scheduler hands out devices 2-3, or when ROCm shows more devices than
were granted, so every task states its devices explicitly.
"""

from __future__ import annotations

import os
import sys

from launcher.runtime.ranks import RankInfo

_VISIBILITY_VARS = {
    "cuda": ("CUDA_VISIBLE_DEVICES",),
    # ROCR_ narrows what the ROCm runtime enumerates; HIP_ renumbers within that. On LUMI each
    # GCD is its own device, so one task per GCD sees exactly one.
    "rocm": ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"),
}


def local_devices(gpus_per_node: int, tasks_per_node: int, local_rank: int) -> list[int]:
    per_task = max(gpus_per_node // max(tasks_per_node, 1), 1)
    return list(range(local_rank * per_task, (local_rank + 1) * per_task))


def set_visibility(accelerator: str, cluster, rank: RankInfo, env=os.environ) -> dict[str, str]:
    """Sets the variables for this rank; returns what it set (for the rank's log)."""
    if env is os.environ and "jax" in sys.modules:
        raise RuntimeError("device visibility must be set before jax is imported")
    out: dict[str, str] = {}
    if accelerator == "cpu":
        out["JAX_PLATFORMS"] = "cpu"
    elif accelerator in _VISIBILITY_VARS:
        ids = local_devices(cluster.gpus_per_node, cluster.tasks_per_node, rank.local_rank)
        if accelerator == "rocm":
            # HIP numbers the devices ROCR leaves visible from 0.
            out["ROCR_VISIBLE_DEVICES"] = ",".join(map(str, ids))
            out["HIP_VISIBLE_DEVICES"] = ",".join(map(str, range(len(ids))))
        else:
            out["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, ids))
    env.update(out)
    return out


def jax_local_device_ids(accelerator: str, cluster) -> list[int] | None:
    """The ids jax.distributed should claim once visibility is narrowed (None: let the backend say)."""
    if accelerator in _VISIBILITY_VARS:
        return list(range(max(cluster.gpus_per_node // max(cluster.tasks_per_node, 1), 1)))
    return None
