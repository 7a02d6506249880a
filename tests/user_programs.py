"""Training programs shaped as users write them, for the auto-sharding tests and
``bench/bench_autoshard.py``: nothing in them knows xlaunch. Each ``make_*`` returns a
``launcher.cfp.autoshard.Step`` (the step function, its example arguments, and where the program
has one, its own layout as ``in_shardings``) and is a ``mode.step`` factory too.

- ``make_scanned_lm``: a decoder LM as production JAX trainers write it (MaxText, Levanter):
  every layer's parameters stacked on a leading layer axis and run by ``jax.lax.scan`` (with
  ``jax.checkpoint`` around the layer where ``remat``), optax AdamW, a
  ``(params, opt_state, batch) -> (params, opt_state, loss)`` step, and a hand-written FSDP x
  tensor-parallel layout of its own.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from launcher.cfp.autoshard import Step

SCANNED_LM = dict(layers=4, vocab=256, width=64, heads=4, ffn=256, seq=32, batch=16, lr=1e-3, remat=False,
                  unrolled=False)


def _rms_norm(x, scale):
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * scale


def scanned_lm(**overrides):
    """(params, loss_fn, optimizer, batch, config) of the scanned decoder LM."""
    c = {**SCANNED_LM, **overrides}
    L, D, F, V, H = c["layers"], c["width"], c["ffn"], c["vocab"], c["heads"]
    keys = iter(jax.random.split(jax.random.key(0), 8))

    def init(shape, fan_in):
        return jax.random.normal(next(keys), shape, jnp.float32) / np.sqrt(fan_in)

    params = {
        "embed": init((V, D), 1.0) * 0.02,
        "layers": {"ln1": jnp.ones((L, D)), "wqkv": init((L, D, 3 * D), D), "wo": init((L, D, D), D),
                   "ln2": jnp.ones((L, D)), "w_in": init((L, D, F), D), "w_out": init((L, F, D), F)},
        "ln_f": jnp.ones((D,)),
        "head": init((D, V), D),
    }

    def layer(x, p):
        b, s, _ = x.shape
        q, k, v = jnp.split(_rms_norm(x, p["ln1"]) @ p["wqkv"], 3, axis=-1)
        q, k, v = (t.reshape(b, s, H, D // H) for t in (q, k, v))
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(D // H)
        causal = jnp.tril(jnp.ones((s, s), bool))
        probs = jax.nn.softmax(jnp.where(causal, scores, -1e9), axis=-1)
        x = x + jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(b, s, D) @ p["wo"]
        x = x + jax.nn.gelu(_rms_norm(x, p["ln2"]) @ p["w_in"]) @ p["w_out"]
        return x, None

    body = jax.checkpoint(layer) if c["remat"] else layer

    def loss_fn(params, batch):
        x = params["embed"][batch["tokens"]]
        if c["unrolled"]:  # the same model, its layers a Python loop (the search decides each)
            for i in range(L):
                x, _ = body(x, jax.tree.map(lambda w, i=i: w[i], params["layers"]))
        else:
            x, _ = jax.lax.scan(body, x, params["layers"])
        logits = _rms_norm(x, params["ln_f"]) @ params["head"]
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"]).mean()

    tokens = jax.random.randint(jax.random.key(1), (c["batch"], c["seq"] + 1), 0, V)
    batch = {"tokens": tokens[:, :-1], "targets": tokens[:, 1:]}
    return params, loss_fn, optax.adamw(c["lr"]), batch, c


def make_scanned_lm(**overrides) -> Step:
    params, loss_fn, optimizer, batch, _ = scanned_lm(**overrides)

    def train_step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    opt_state = optimizer.init(params)
    return Step(train_step, (params, opt_state, batch), in_shardings=fsdp_tp_layout(params, opt_state, batch))


def fsdp_tp_layout(params, opt_state, batch, model: int = 2):
    """The program's own layout, as its authors would write it: a (data, model) mesh, every
    stacked weight split over ``data`` (FSDP) and ``model`` (Megatron's columns then rows), the
    layer axis whole, the optimizer's moments as their parameters, the batch over ``data``."""
    devices = np.array(jax.devices())
    mesh = Mesh(devices.reshape(-1, model), ("data", "model"))
    specs = {"embed": P("model", "data"), "ln_f": P(), "head": P("data", "model"),
             "layers": {"ln1": P(), "ln2": P(), "wqkv": P(None, "data", "model"), "wo": P(None, "model", "data"),
                        "w_in": P(None, "data", "model"), "w_out": P(None, "model", "data")}}
    params_sh = jax.tree.map(lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda x: isinstance(x, P))

    def like_params(tree):
        # optax's state holds trees shaped as the parameters (mu, nu) and scalars (the count).
        if jax.tree.structure(tree) == jax.tree.structure(params):
            return params_sh
        return jax.tree.map(lambda _: NamedSharding(mesh, P()), tree)

    opt_sh = tuple(type(s)(*[like_params(f) for f in s]) if hasattr(s, "_fields") else like_params(s)
                   for s in opt_state)
    batch_sh = jax.tree.map(lambda _: NamedSharding(mesh, P("data")), batch)
    return params_sh, opt_sh, batch_sh
