"""Agreement between the job's processes: every exchange of values between hosts goes through
here (compiled executables travel through ``compile_share.py``).

Each is a collective program of its own (``jax.experimental.multihost_utils``), except on JAX
releases whose CPU collectives let one program's messages cross into the next: there a late
device's message crosses whatever fences it (``jaxcompat.exchange_client``), so the values go
through the coordination service's key-value store instead. With one process each is the identity.
"""

from __future__ import annotations

import itertools
import pickle
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

from launcher import jaxcompat

_KV_TIMEOUT_MS = 600_000
_kv_count = itertools.count()


def _kv_all(client: Any, value: Any, only: int | None = None) -> list[Any]:
    """Every process's ``value`` (or only process ``only``'s), through the key-value store; every
    process calls it the same number of times, so the keys match."""
    key = f"xlaunch-exchange-{next(_kv_count)}"
    me = jax.process_index()
    if only is None or only == me:
        client.key_value_set_bytes(f"{key}/{me}", pickle.dumps(value))
    ranks = range(jax.process_count()) if only is None else [only]
    return [pickle.loads(client.blocking_key_value_get_bytes(f"{key}/{r}", _KV_TIMEOUT_MS)) for r in ranks]


def _multi_process() -> bool:
    return jax.process_count() > 1


def gather(x: np.ndarray) -> np.ndarray:
    """Every process's ``x`` stacked along a new first axis (on every process)."""
    if not _multi_process():
        return np.asarray(x)[None]
    client = jaxcompat.exchange_client()
    if client is not None:
        return np.stack(_kv_all(client, np.asarray(x)))
    return np.asarray(multihost_utils.process_allgather(np.asarray(x)))


def fetch(x: Any) -> np.ndarray:
    """The whole of a global ``jax.Array`` (shards on every process) as one host array, everywhere."""
    if not _multi_process():
        return np.asarray(x)
    client = jaxcompat.exchange_client()
    if client is not None:
        whole = np.empty(x.shape, dtype=x.dtype)
        for shards in _kv_all(client, [(s.index, np.asarray(s.data)) for s in x.addressable_shards]):
            for index, data in shards:
                whole[index] = data
        return whole
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def broadcast(x: Any) -> Any:
    """Process 0's ``x`` (a numpy array or a pytree of them) on every process."""
    if not _multi_process():
        return x
    client = jaxcompat.exchange_client()
    if client is not None:
        return _kv_all(client, x, only=0)[0]
    return multihost_utils.broadcast_one_to_all(x)


def barrier(name: str) -> None:
    """Returns once every process has reached the barrier ``name``."""
    if not _multi_process():
        return
    client = jaxcompat.exchange_client()
    if client is not None:
        jaxcompat.settle_programs()  # the coordination service's barrier
        return
    multihost_utils.sync_global_devices(name)
