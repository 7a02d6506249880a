"""Pieces the four models share: parameter specs, embeddings, norms, attention, MLPs, rotary
embeddings, and the forward-pass FLOP counts of each.

Parameters are plain nested dicts. Each layer has a ``*_spec`` function that describes its
parameters once (shape, logical axes, initialiser), so a model's ``init`` and ``param_axes``
come from the same description and cannot drift apart. Forward functions take that dict and
activations shaped (batch, seq, ...); weights keep separate head dimensions, e.g. (embed, heads,
head_dim), so a plan can split heads without reshapes.

FLOP counts are for one forward pass and count matrix multiplications only (2 per
multiply-add); T = batch * seq tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp

from . import rng
from .sharding import constrain

Params = dict[str, Any]
INIT_STD = 0.02  # GPT-2 / BERT / LLaMA all initialise weights from N(0, 0.02^2)


@dataclass(frozen=True)
class ParamSpec:
    """One parameter: its shape, a logical axis name per dimension, and how to initialise it."""

    shape: tuple[int, ...]
    axes: tuple[Optional[str], ...]
    init: str = "normal"  # "normal" (N(0, std^2)), "zeros" or "ones"
    std: float = INIT_STD

    def initialize(self, key: jax.Array, stream: int = 0) -> jax.Array:
        """This parameter's initial value: stream ``stream`` of ``key``."""
        if self.init == "normal":
            return self.std * rng.normal(key, self.shape, stream)
        if self.init == "zeros":
            return jnp.zeros(self.shape, jnp.float32)
        if self.init == "ones":
            return jnp.ones(self.shape, jnp.float32)
        raise ValueError(f"unknown initialiser {self.init!r}")


def is_spec(x: Any) -> bool:
    return isinstance(x, ParamSpec)


def init_params(specs: Any, key: jax.Array) -> Any:
    """Every parameter of ``specs`` from ``key``, each from its own stream (its position in the
    tree's sorted order). ``models.rng`` values depend only on their index, so a sharded
    initialisation computes the same parameters as a single device."""
    leaves, treedef = jax.tree.flatten(specs, is_leaf=is_spec)
    return jax.tree.unflatten(treedef, [s.initialize(key, i) for i, s in enumerate(leaves)])


def axes_of(specs: Any) -> Any:
    return jax.tree.map(lambda s: s.axes, specs, is_leaf=is_spec)


# ---------------------------------------------------------------------------------------------
# Layers, unrolled or scanned (model.scan_layers)


def stacked(layers: list, scan: bool, period: int = 1) -> Any:
    """A model's ``layers`` parameter specs: the list itself, or with ``scan`` the layers
    stacked on a leading ``layers`` axis, as production trainers store them for ``lax.scan``
    (MaxText, Levanter, Flax's ``nn.scan``): ``period`` stacks, the k-th holding layers k,
    k + period, ... (MoE's alternating MoE and dense layers stack as pairs). The ``layers`` axis
    has no rule in any plan: it is never split."""
    if not scan:
        return layers
    groups = [layers[k::period] for k in range(period)]
    return [jax.tree.map(lambda *specs: ParamSpec((len(specs), *specs[0].shape), ("layers", *specs[0].axes),
                                                  specs[0].init, specs[0].std), *group, is_leaf=is_spec)
            for group in groups]


def run_layers(layers: Any, x: jax.Array, layer: Callable[[Any, jax.Array, Any], tuple[jax.Array, Any]],
               scan: bool, aux: Optional[jax.Array] = None) -> tuple[jax.Array, Any]:
    """``x`` through ``layers`` (``stacked``'s), ``layer(p, x, aux) -> (x, aux)`` each, ``aux`` the
    running auxiliary loss (None where the model has none: unrolled, the traced program is then
    the one written out by hand); with ``scan`` by ``jax.lax.scan`` over the stacks (one
    iteration: a layer of each). Returns ``x`` and ``aux``."""
    if not scan:
        for p in layers:
            x, aux = layer(p, x, aux)
        return x, aux

    def body(carry: tuple[jax.Array, Any], ps: tuple) -> tuple[tuple[jax.Array, Any], None]:
        x, total = carry
        for p in ps:
            x, total = layer(p, x, total)
        return (x, total), None

    (x, aux), _ = jax.lax.scan(body, (x, aux), tuple(layers))
    return x, aux


# ---------------------------------------------------------------------------------------------
# Embeddings and norms


def embed(table: jax.Array, tokens: jax.Array, dtype: Any) -> jax.Array:
    x = jnp.take(table, tokens, axis=0).astype(dtype)
    return constrain(x, ("batch", "seq", "embed"))


def layer_norm_spec(hidden: int) -> Params:
    return {"scale": ParamSpec((hidden,), ("embed",), "ones"), "bias": ParamSpec((hidden,), ("embed",), "zeros")}


def layer_norm(p: Params, x: jax.Array, eps: float = 1e-5) -> jax.Array:
    # Statistics in float32 whatever the compute dtype: bf16 variance loses too many bits.
    x32 = x.astype(jnp.float32)
    mean = x32.mean(-1, keepdims=True)
    var = jnp.square(x32 - mean).mean(-1, keepdims=True)
    y = (x32 - mean) * jax.lax.rsqrt(var + eps) * p["scale"] + p["bias"]
    return y.astype(x.dtype)


def rms_norm_spec(hidden: int) -> Params:
    return {"scale": ParamSpec((hidden,), ("embed",), "ones")}


def rms_norm(p: Params, x: jax.Array, eps: float = 1e-5) -> jax.Array:
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.square(x32).mean(-1, keepdims=True) + eps) * p["scale"]
    return y.astype(x.dtype)


# ---------------------------------------------------------------------------------------------
# Attention


def attention_spec(hidden: int, heads: int, bias: bool, out_std: float = INIT_STD) -> Params:
    d = hidden // heads
    p = {
        "wq": ParamSpec((hidden, heads, d), ("embed", "heads", "kv")),
        "wk": ParamSpec((hidden, heads, d), ("embed", "heads", "kv")),
        "wv": ParamSpec((hidden, heads, d), ("embed", "heads", "kv")),
        "wo": ParamSpec((heads, d, hidden), ("heads", "kv", "embed"), std=out_std),
    }
    if bias:
        p.update({
            "bq": ParamSpec((heads, d), ("heads", "kv"), "zeros"),
            "bk": ParamSpec((heads, d), ("heads", "kv"), "zeros"),
            "bv": ParamSpec((heads, d), ("heads", "kv"), "zeros"),
            "bo": ParamSpec((hidden,), ("embed",), "zeros"),
        })
    return p


def attention(p: Params, x: jax.Array, *, causal: bool, rope_theta: Optional[float] = None) -> jax.Array:
    """Multi-head self-attention over x: (batch, seq, embed)."""
    dtype = x.dtype
    qkv = []
    for name in ("q", "k", "v"):
        y = jnp.einsum("bse,ehd->bshd", x, p["w" + name].astype(dtype))
        if "b" + name in p:
            y = y + p["b" + name].astype(dtype)
        qkv.append(constrain(y, ("batch", "seq", "heads", "kv")))
    q, k, v = qkv
    if rope_theta is not None:
        q, k = rotary(q, rope_theta), rotary(k, rope_theta)
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32) / math.sqrt(q.shape[-1])
    scores = constrain(scores, ("batch", "heads", "seq", None))
    if causal:
        s = x.shape[1]
        scores = jnp.where(jnp.tril(jnp.ones((s, s), bool)), scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(dtype)
    out = jnp.einsum("bhqk,bkhd->bqhd", probs, v)
    out = constrain(out, ("batch", "seq", "heads", "kv"))
    y = jnp.einsum("bshd,hde->bse", out, p["wo"].astype(dtype))
    if "bo" in p:
        y = y + p["bo"].astype(dtype)
    return constrain(y, ("batch", "seq", "embed"))


def attention_flops(tokens: int, seq: int, hidden: int) -> int:
    """Q, K, V and output projections (4 * 2*T*h^2) plus scores and weighted sum (2 * 2*T*s*h).
    The causal mask does not save work: the full s x s scores are computed and masked."""
    return 8 * tokens * hidden**2 + 4 * tokens * seq * hidden


def rotary(x: jax.Array, theta: float) -> jax.Array:
    """Rotary position embedding (RoFormer) on x: (batch, seq, heads, head_dim).

    Rotates the pair (x[i], x[i + d/2]) by position * theta^(-2i/d), the GPT-NeoX / Hugging Face
    layout of LLaMA's rotation (Meta's code pairs adjacent elements; the two differ by a fixed
    permutation of the head dimension, which training absorbs).
    """
    s, d = x.shape[1], x.shape[-1]
    inv_freq = theta ** (-jnp.arange(0, d // 2, dtype=jnp.float32) * 2 / d)
    angles = jnp.arange(s, dtype=jnp.float32)[:, None] * inv_freq[None, :]  # (seq, d/2)
    cos, sin = jnp.cos(angles)[None, :, None, :], jnp.sin(angles)[None, :, None, :]
    x32 = x.astype(jnp.float32)
    x1, x2 = x32[..., : d // 2], x32[..., d // 2:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


# ---------------------------------------------------------------------------------------------
# Feed-forward blocks


def mlp_spec(hidden: int, ffn: int, bias: bool = True, out_std: float = INIT_STD) -> Params:
    p = {"w_in": ParamSpec((hidden, ffn), ("embed", "mlp")),
         "w_out": ParamSpec((ffn, hidden), ("mlp", "embed"), std=out_std)}
    if bias:
        p.update({"b_in": ParamSpec((ffn,), ("mlp",), "zeros"), "b_out": ParamSpec((hidden,), ("embed",), "zeros")})
    return p


def mlp(p: Params, x: jax.Array) -> jax.Array:
    """GELU MLP: gelu(x W_in + b_in) W_out + b_out."""
    dtype = x.dtype
    h = jnp.einsum("bse,ef->bsf", x, p["w_in"].astype(dtype))
    if "b_in" in p:
        h = h + p["b_in"].astype(dtype)
    h = constrain(jax.nn.gelu(h), ("batch", "seq", "mlp"))
    y = jnp.einsum("bsf,fe->bse", h, p["w_out"].astype(dtype))
    if "b_out" in p:
        y = y + p["b_out"].astype(dtype)
    return constrain(y, ("batch", "seq", "embed"))


def mlp_flops(tokens: int, hidden: int, ffn: int) -> int:
    return 4 * tokens * hidden * ffn


def swiglu_spec(hidden: int, ffn: int, out_std: float = INIT_STD) -> Params:
    return {"w_gate": ParamSpec((hidden, ffn), ("embed", "mlp")),
            "w_up": ParamSpec((hidden, ffn), ("embed", "mlp")),
            "w_down": ParamSpec((ffn, hidden), ("mlp", "embed"), std=out_std)}


def swiglu(p: Params, x: jax.Array) -> jax.Array:
    """LLaMA's feed-forward: (silu(x W_gate) * x W_up) W_down."""
    dtype = x.dtype
    gate = jnp.einsum("bse,ef->bsf", x, p["w_gate"].astype(dtype))
    up = jnp.einsum("bse,ef->bsf", x, p["w_up"].astype(dtype))
    h = constrain(jax.nn.silu(gate) * up, ("batch", "seq", "mlp"))
    y = jnp.einsum("bsf,fe->bse", h, p["w_down"].astype(dtype))
    return constrain(y, ("batch", "seq", "embed"))


def swiglu_flops(tokens: int, hidden: int, ffn: int) -> int:
    return 6 * tokens * hidden * ffn


# ---------------------------------------------------------------------------------------------
# Output head


def logits_from(x: jax.Array, table: jax.Array, *, tied: bool) -> jax.Array:
    """Vocabulary logits from x: (batch, seq, embed); ``table`` is (vocab, embed) when tied to
    the token embedding, else an (embed, vocab) head."""
    w = table.astype(x.dtype)
    y = jnp.einsum("bse,ve->bsv", x, w) if tied else jnp.einsum("bse,ev->bsv", x, w)
    return constrain(y, ("batch", "seq", "vocab"))


def logits_flops(tokens: int, hidden: int, vocab: int) -> int:
    return 2 * tokens * hidden * vocab
