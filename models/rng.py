"""Counter-based random numbers for parameter initialisation and synthetic data.

``jax.random`` (Threefry) costs about a second of XLA compile time per draw on a small CPU, so
a tiny model's sharded initialisation compiled slower than its training step. Initial weights
and synthetic tokens need well-mixed noise, not cryptographic strength: here element i of
stream j is a 32-bit integer hash (Wellons' lowbias32, applied twice) of (i, j, key). A value
depends only on its index, so every device computes exactly its own shard of the same array
under any sharding, and a draw is a handful of elementwise ops that compile in milliseconds.
"""

from __future__ import annotations

import math
from typing import Sequence

import jax
import jax.numpy as jnp

_GOLDEN = 0x9E3779B9  # 2^32 / golden ratio: spreads consecutive stream numbers apart


def _mix(x: jax.Array) -> jax.Array:
    """lowbias32: a bijection on uint32 with strong avalanche."""
    x = x ^ (x >> 16)
    x = x * jnp.uint32(0x7FEB352D)
    x = x ^ (x >> 15)
    x = x * jnp.uint32(0x846CA68B)
    return x ^ (x >> 16)


def _seed(key: jax.Array, stream: int) -> jax.Array:
    data = jax.random.key_data(key).reshape(-1).astype(jnp.uint32)
    s = jnp.uint32(0)
    for word in data:  # 2 words for Threefry keys
        s = _mix(s ^ word)
    return _mix(s + jnp.uint32((stream * _GOLDEN) % 2**32))


def bits(key: jax.Array, shape: Sequence[int], stream: int = 0) -> jax.Array:
    """uint32 random bits of ``shape``: stream ``stream`` of ``key``."""
    n = math.prod(shape)
    if n >= 2**32:
        raise ValueError(f"rng.bits: {n} elements exceed the 32-bit counter; draw in pieces")
    seed = _seed(key, stream)
    index = jax.lax.iota(jnp.uint32, n).reshape(tuple(shape))
    return _mix(_mix(index ^ seed) + seed)


def uniform(key: jax.Array, shape: Sequence[int], stream: int = 0) -> jax.Array:
    """float32 in [0, 1) with 24 random bits."""
    return (bits(key, shape, stream) >> 8).astype(jnp.float32) * (1.0 / 2**24)


def normal(key: jax.Array, shape: Sequence[int], stream: int = 0) -> jax.Array:
    """float32 standard normal (Box-Muller over two independent streams)."""
    u1 = 1.0 - uniform(key, shape, 2 * stream)  # (0, 1]: log stays finite
    u2 = uniform(key, shape, 2 * stream + 1)
    return jnp.sqrt(-2.0 * jnp.log(u1)) * jnp.cos(2.0 * jnp.pi * u2)
