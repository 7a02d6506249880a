"""Agreement between the job's processes: every host-to-host exchange goes through here.

Each is a collective program of its own (``jax.experimental.multihost_utils``), so on JAX
releases whose CPU collectives let consecutive programs' messages cross, it is fenced off from
the programs around it (``jaxcompat.settle_programs``). With one process each is the identity.
"""

from __future__ import annotations

from typing import Any, Callable, TypeVar

import numpy as np

from launcher import jaxcompat

T = TypeVar("T")


def _exchange(exchange: Callable[[], T]) -> T:
    """``exchange()`` (a multihost_utils call), fenced off from the programs before and after it."""
    jaxcompat.settle_programs()
    out = exchange()
    jaxcompat.settle_programs()
    return out


def _multi_process() -> bool:
    import jax

    return jax.process_count() > 1


def gather(x: np.ndarray) -> np.ndarray:
    """Every process's ``x`` stacked along a new first axis (on every process)."""
    if not _multi_process():
        return np.asarray(x)[None]
    from jax.experimental import multihost_utils

    return np.asarray(_exchange(lambda: multihost_utils.process_allgather(np.asarray(x))))


def fetch(x: Any) -> np.ndarray:
    """The whole of a global ``jax.Array`` (shards on every process) as one host array, everywhere."""
    if not _multi_process():
        return np.asarray(x)
    from jax.experimental import multihost_utils

    return np.asarray(_exchange(lambda: multihost_utils.process_allgather(x, tiled=True)))


def broadcast(x: Any) -> Any:
    """Process 0's ``x`` (a numpy array or a pytree of them) on every process."""
    if not _multi_process():
        return x
    from jax.experimental import multihost_utils

    return _exchange(lambda: multihost_utils.broadcast_one_to_all(x))


def barrier(name: str) -> None:
    """Returns once every process has reached the barrier ``name``."""
    if not _multi_process():
        return
    from jax.experimental import multihost_utils

    _exchange(lambda: multihost_utils.sync_global_devices(name))
