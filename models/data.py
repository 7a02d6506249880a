"""Synthetic token data with a signal a model can learn.

Every sequence walks the tokens 1..W (W = min(V-1, 64)) with a fixed stride, t[i+1] = t[i] +
STRIDE (mod W), from a random start, and a fraction of positions is replaced by random tokens
from the whole vocabulary (token 0 is reserved: BERT uses it as [MASK]). As in text, a few
tokens are common and most are rare, and a token is predictable from its neighbour most of
the time: a model first learns which tokens occur (the loss falls from ln V towards ln W
within a few steps), then the stride rule, but never reaches zero. Everything derives from
the key given, so the same key gives the same batch on any number of devices or processes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from . import rng

STRIDE = 7
WALK = 64  # the walk visits tokens 1..WALK; the rest of the vocabulary appears only as noise
NOISE = 0.1  # fraction of positions replaced by a random token
MASK_TOKEN = 0


def token_stream(uniforms: jax.Array, vocab: int, noise: float = NOISE) -> jax.Array:
    """(batch, length) int32 tokens following the stride rule, with noise.

    ``uniforms`` is (3, batch, length) U[0, 1) draws: the start, whether to replace, and the
    replacement.
    """
    walk = min(vocab - 1, WALK)
    start = jnp.floor(uniforms[0, :, :1] * walk).astype(jnp.int32)
    clean = (start + STRIDE * jnp.arange(uniforms.shape[-1])[None, :]) % walk + 1
    random = 1 + jnp.floor(uniforms[2] * (vocab - 1)).astype(jnp.int32)
    return jnp.where(uniforms[1] < noise, random, clean).astype(jnp.int32)


def next_token_batch(key: jax.Array, batch: int, seq: int, vocab: int) -> dict[str, jax.Array]:
    """Causal LM data: predict token i+1 from tokens 0..i."""
    stream = token_stream(rng.uniform(key, (3, batch, seq + 1)), vocab)
    return {"tokens": stream[:, :-1], "targets": stream[:, 1:]}


def masked_lm_batch(key: jax.Array, batch: int, seq: int, vocab: int, mask_prob: float) -> dict[str, jax.Array]:
    """Masked LM data: ``mask_prob`` of the positions become MASK_TOKEN and are predicted
    (``weights`` is 1 there); position 0 is always masked so no row is empty."""
    u = rng.uniform(key, (4, batch, seq))
    targets = token_stream(u[:3], vocab)
    masked = (u[3] < mask_prob).at[:, 0].set(True)
    tokens = jnp.where(masked, MASK_TOKEN, targets)
    return {"tokens": tokens, "targets": targets, "weights": masked.astype(jnp.float32)}
