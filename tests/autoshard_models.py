"""Models written without xlaunch in mind, and their training steps, for the auto-sharding tests
(``tests/test_autoshard.py``): a Flax NNX transformer block stack, an Equinox MLP, a Flax Linen
MLP, and a step with nothing to shard. Each ``make_*`` is a factory as ``mode=search
mode.step=tests.autoshard_models:make_flax_step`` takes: it returns the step function and its
example arguments (or a ``launcher.sharding.user.api.Step`` saying more)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from launcher.sharding.user.api import Step
from launcher.sharding.user.api import AutoPlan

# Small enough to search in seconds on 4 CPU devices, with choices to make: the batch (8), the
# MLP width (32) and the vocabulary (64) divide 4 ways, the model width (12) and heads (3) do not.
FLAX = dict(vocab=64, width=12, heads=3, ffn=32, layers=2, seq=8, batch=8, lr=1e-2)


def make_flax_step(**overrides):
    """A Flax NNX transformer (embedding, pre-norm attention + MLP blocks, a head), its adam
    state and one batch: ``train_step(state, batch) -> (state, loss)`` on the state of
    ``nnx.split((model, optimizer))``, as the Flax docs write a step for ``jax.jit``."""
    from flax import nnx  # noqa: PLC0415  the frameworks extra: absent where the oldest JAX runs the core tests

    c = {**FLAX, **overrides}

    class Block(nnx.Module):
        def __init__(self, rngs):
            self.ln1 = nnx.LayerNorm(c["width"], rngs=rngs)
            self.attn = nnx.MultiHeadAttention(num_heads=c["heads"], in_features=c["width"], decode=False, rngs=rngs)
            self.ln2 = nnx.LayerNorm(c["width"], rngs=rngs)
            self.up = nnx.Linear(c["width"], c["ffn"], rngs=rngs)
            self.down = nnx.Linear(c["ffn"], c["width"], rngs=rngs)

        def __call__(self, x):
            x = x + self.attn(self.ln1(x))
            return x + self.down(nnx.gelu(self.up(self.ln2(x))))

    class Transformer(nnx.Module):
        def __init__(self, rngs):
            self.embed = nnx.Embed(c["vocab"], c["width"], rngs=rngs)
            self.blocks = nnx.List([Block(rngs) for _ in range(c["layers"])])
            self.head = nnx.Linear(c["width"], c["vocab"], rngs=rngs)

        def __call__(self, tokens):
            x = self.embed(tokens)
            for block in self.blocks:
                x = block(x)
            return self.head(x)

    model = Transformer(nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(c["lr"]), wrt=nnx.Param)
    graphdef, state = nnx.split((model, optimizer))

    def train_step(state, batch):
        model, optimizer = nnx.merge(graphdef, state)

        def loss_fn(model):
            logits = model(batch["tokens"])
            return optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"]).mean()

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        return nnx.state((model, optimizer)), loss

    tokens = jax.random.randint(jax.random.key(1), (c["batch"], c["seq"] + 1), 0, c["vocab"])
    batch = {"tokens": tokens[:, :-1], "labels": tokens[:, 1:]}
    return train_step, (state, batch)


def make_equinox_step():
    """An Equinox MLP regressing a teacher, its adam state and a batch: ``step(model, opt_state,
    x, y) -> (model, opt_state, loss)``, the model passed whole (its activation functions are
    leaves too), x and y the data."""
    import equinox as eqx  # noqa: PLC0415  the frameworks extra: absent where the oldest JAX runs the core tests

    model = eqx.nn.MLP(16, 8, 32, 2, key=jax.random.key(0))
    optimizer = optax.adam(1e-2)
    opt_state = optimizer.init(eqx.filter(model, eqx.is_array))

    def step(model, opt_state, x, y):
        def loss_fn(model):
            return jnp.mean((jax.vmap(model)(x) - y) ** 2)

        loss, grads = eqx.filter_value_and_grad(loss_fn)(model)
        updates, opt_state = optimizer.update(grads, opt_state, eqx.filter(model, eqx.is_array))
        return eqx.apply_updates(model, updates), opt_state, loss

    x = jax.random.normal(jax.random.key(1), (16, 16))
    y = jnp.tanh(x @ jax.random.normal(jax.random.key(2), (16, 8)))
    return Step(step, (model, opt_state, x, y), data_argnums=(2, 3))


def make_linen_step():
    """A Flax Linen MLP's step on its variables and adam state: ``step(params, opt_state, batch)``."""
    import flax.linen as nn  # noqa: PLC0415  the frameworks extra: absent where the oldest JAX runs the core tests

    class MLP(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.Dense(8)(nn.relu(nn.Dense(32)(x)))

    model, optimizer = MLP(), optax.sgd(0.1)
    x = np.ones((16, 16), np.float32)
    params = model.init(jax.random.key(0), x)
    opt_state = optimizer.init(params)

    def step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(lambda p: jnp.mean((model.apply(p, batch["x"]) - batch["y"]) ** 2))(params)
        updates, opt_state = optimizer.update(grads, opt_state)
        return optax.apply_updates(params, updates), opt_state, loss

    return step, (params, opt_state, {"x": x, "y": np.zeros((16, 8), np.float32)})


def make_elementwise_step():
    """A step with no contraction: nothing for a search to decide."""
    def step(w, x):
        return w - 0.1 * jnp.mean(jnp.tanh(w * x)), jnp.sum(x)

    return step, (jnp.ones((8, 8)), jnp.ones((8, 8)))


def make_step_turning_its_state_to_bf16():
    """A step that cannot be searched: it returns its weights as bfloat16, taken as float32."""
    def to_half(w, x):
        loss, g = jax.value_and_grad(lambda w: jnp.mean((x @ w) ** 2))(w)
        return (w - 0.1 * g).astype(jnp.bfloat16), loss

    return to_half, (jnp.ones((16, 8)), jnp.ones((32, 16)))


def train_under_plan(plan: str, steps: int = 5) -> dict:
    """``mode=run mode.target=tests.autoshard_models:train_under_plan mode.kwargs.plan=...``: the
    Flax model trained ``steps`` steps under a saved plan, on every process of the job."""

    loaded = AutoPlan.load(plan)
    step, (state, batch) = make_flax_step()
    applied = loaded.apply(step, donate_argnums=(0,))
    state, batch = loaded.place(state, batch)
    losses = []
    for _ in range(steps):
        state, loss = applied(state, batch)
        losses.append(float(loss))
    return {"losses": losses, "processes": jax.process_count(),
            "global_state": all(not x.is_fully_addressable for x in jax.tree.leaves(state))}
