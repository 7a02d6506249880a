"""Training programs shaped as users write them, for the auto-sharding tests and
``bench/bench_autoshard.py``: nothing in them knows xlaunch. Each ``make_*`` returns a
``launcher.sharding.user.api.Step`` (the step function, its example arguments, and where the program
has one, its own layout as ``in_shardings``) and is a ``mode.step`` factory too.

- ``make_scanned_lm``: a decoder LM as production JAX trainers write it (MaxText, Levanter):
  every layer's parameters stacked on a leading layer axis and run by ``jax.lax.scan`` (with
  ``jax.checkpoint`` around the layer where ``remat``), optax AdamW, a
  ``(params, opt_state, batch) -> (params, opt_state, loss)`` step, and a hand-written FSDP x
  tensor-parallel layout of its own; ``fori=True``: the loop a ``jax.lax.fori_loop`` indexing the
  stacked weights instead.
- ``make_nnx_fsdp``: Flax's NNX FSDP toy (``examples/nnx_toy_examples/10_fsdp_and_optimizer.py``):
  an optimizer object holding the model's own ``Param`` variables, an ``nnx.jit`` step updating
  both in place and returning the loss, parameters laid out by their sharding metadata (its own
  FSDP layout), float64 NumPy data.
- ``make_nnx_scanned_mlp``: Flax NNX's scan over layers: blocks made by ``nnx.vmap``, run by
  ``nnx.scan``, an ``nnx.Optimizer``, an ``nnx.jit`` step returning the loss.
- ``make_nnx_cnn``: Flax NNX's MNIST tutorial: a CNN with BatchNorm, Dropout (its ``Rngs`` in
  the model) and pooling (``avg_pool``, or ``pool="max"``), an ``nnx.Optimizer``, an
  ``nnx.MultiMetric`` the step updates in place, ``train_step(model, optimizer, metrics, batch)``
  returning nothing.
- ``make_linen_lm``: a Flax Linen transformer LM as Flax's lm1b example writes its step:
  ``train_step(state, batch) -> (state, metrics)``, a ``TrainState``, metrics holding the loss and
  the accuracy; ``scan=True``: its blocks run by ``nn.scan``.
- ``make_equinox_mlp``: an Equinox MLP passed whole (its activation functions are leaves too).
- ``make_numpy_mlp``: JAX's SPMD MNIST example's habit: parameters made with NumPy (float64),
  a plain ``(params, batch) -> (params, loss)`` step; ``returns="params"``: as the example
  itself, the new list of ``(w, b)`` alone, the list laid out on a mesh of its own
  (``jax.make_mesh``: Explicit axes where JAX has them) by ``jax.device_put``.
- ``make_own_mesh_adam``: plain JAX with its state already on its own (data, model) mesh
  (``device_put`` parameters, Adam's state from ``jax.jit(tx.init)``: single-device arrays) and a
  dropout key as a fourth argument the step never returns (typed ``jax.random.key``, or
  ``key="old"``: a ``uint32[2]`` ``PRNGKey``) folded with the optimizer's step count.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from launcher.sharding.user.api import Step

SCANNED_LM = dict(layers=4, vocab=256, width=64, heads=4, ffn=256, seq=32, batch=16, lr=1e-3, remat=False,
                  unrolled=False, fori=False)


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
        elif c["fori"]:  # a fori_loop indexing the stacked weights (a static trip count: a scan)
            x = jax.lax.fori_loop(0, L, lambda i, x: body(x, jax.tree.map(lambda w: w[i], params["layers"]))[0], x)
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


def make_nnx_fsdp(width: int = 32, batch: int = 32, lr: float = 0.01, returns_objects: bool = False) -> Step:
    """The Flax NNX FSDP toy (module doc); returns the ``nnx.jit`` step and its arguments.
    ``returns_objects``: the step returns ``(model, optimizer, loss)``, which ``nnx.jit`` allows
    and a loop rebinds (``model, optimizer, loss = train_step(model, optimizer, x, y)``)."""
    from flax import nnx  # noqa: PLC0415  the frameworks extra: absent where the oldest JAX runs the core tests

    mesh = Mesh(np.array(jax.devices()).reshape(2, -1), ("data", "model"))

    class MLP(nnx.Module):
        def __init__(self, din, dmid, dout, rngs):
            init = nnx.initializers.lecun_normal()
            self.w1 = nnx.Param(init(rngs.params(), (din, dmid)), out_sharding=(None, "model"))
            self.b1 = nnx.Param(jnp.zeros((dmid,)), out_sharding=("model",))
            self.w2 = nnx.Param(init(rngs.params(), (dmid, dout)), out_sharding=("model", None))

        def __call__(self, x):
            return nnx.relu(x @ self.w1 + self.b1) @ self.w2

    class SGDState(nnx.Variable):
        pass

    class SGD(nnx.Pytree):
        def __init__(self, params, lr, decay=0.9):
            self.lr, self.decay = lr, decay
            self.params = nnx.data(params)
            self.momentum = nnx.data(jax.tree.map(lambda v: SGDState(jnp.zeros_like(v[...]), **v.get_metadata()),
                                                  self.params, is_leaf=lambda x: isinstance(x, nnx.Variable)))

        def update(self, grads):
            def update_fn(p, m, g):
                m[...] = self.decay * m[...] + (1 - self.decay) * g[...]
                p[...] -= self.lr * m[...]
            jax.tree.map(update_fn, self.params, self.momentum, grads, is_leaf=lambda x: isinstance(x, nnx.Variable))

    @nnx.jit
    def create():
        model = MLP(1, width, 1, nnx.Rngs(0))
        return model, SGD(nnx.variables(model, nnx.Param), lr)

    with jax.set_mesh(mesh):
        model, optimizer = create()

    @nnx.jit
    def train_step(model, optimizer, x, y):
        def loss_fn(model):
            return jnp.mean((y - model(x)) ** 2)
        loss, grad = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(grad)
        return (model, optimizer, loss) if returns_objects else loss

    rng = np.random.default_rng(0)
    x = np.linspace(-2, 2, batch)[:, None]                       # float64, as the example's data
    y = 0.8 * x**2 + 0.1 + rng.normal(0, 0.1, size=x.shape)
    return Step(train_step, (model, optimizer, x, y), data_argnums=(2, 3))


def make_nnx_scanned_mlp(width: int = 32, layers: int = 3, batch: int = 32, lr: float = 1e-2) -> Step:
    """Flax NNX's scan-over-layers pattern (its guide "Transforms: scan over layers"): blocks made by
    ``nnx.vmap`` (parameters stacked on a leading layer axis), run by ``nnx.scan``, trained by an
    ``nnx.Optimizer`` in an ``nnx.jit`` step that returns the loss."""
    from flax import nnx  # noqa: PLC0415  the frameworks extra: absent where the oldest JAX runs the core tests

    class Block(nnx.Module):
        def __init__(self, rngs):
            self.norm = nnx.LayerNorm(width, rngs=rngs)
            self.up, self.down = nnx.Linear(width, 4 * width, rngs=rngs), nnx.Linear(4 * width, width, rngs=rngs)

        def __call__(self, x):
            return x + self.down(nnx.gelu(self.up(self.norm(x))))

    @nnx.split_rngs(splits=layers)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def stacked(rngs):
        return Block(rngs)

    class Model(nnx.Module):
        def __init__(self, rngs):
            self.inp, self.blocks, self.out = nnx.Linear(16, width, rngs=rngs), stacked(rngs), nnx.Linear(width, 4, rngs=rngs)

        def __call__(self, x):
            @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
            def run(x, block):
                return block(x)
            return self.out(run(self.inp(x), self.blocks))

    model = Model(nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(lr), wrt=nnx.Param)

    @nnx.jit
    def train_step(model, optimizer, x, y):
        loss, grads = nnx.value_and_grad(lambda m: jnp.mean((m(x) - y) ** 2))(model)
        optimizer.update(model, grads)
        return loss

    x = jax.random.normal(jax.random.key(1), (batch, 16))
    return Step(train_step, (model, optimizer, x, jnp.tanh(x[:, :4])), data_argnums=(2, 3))


def make_nnx_cnn(pool: str = "avg", batch: int = 32, lr: float = 5e-3) -> Step:
    """The module doc's ``make_nnx_cnn``."""
    from functools import partial  # noqa: PLC0415

    from flax import nnx  # noqa: PLC0415  the frameworks extra: absent where the oldest JAX runs the core tests

    class CNN(nnx.Module):
        def __init__(self, *, rngs):
            self.conv1 = nnx.Conv(1, 8, kernel_size=(3, 3), rngs=rngs)
            self.batch_norm1 = nnx.BatchNorm(8, rngs=rngs)
            self.dropout1 = nnx.Dropout(rate=0.025, rngs=rngs)
            self.linear1 = nnx.Linear(8 * 7 * 7, 32, rngs=rngs)
            self.dropout2 = nnx.Dropout(rate=0.025, rngs=rngs)
            self.linear2 = nnx.Linear(32, 10, rngs=rngs)
            self.pool = partial(nnx.avg_pool if pool == "avg" else nnx.max_pool, window_shape=(2, 2), strides=(2, 2))

        def __call__(self, x):
            x = self.pool(self.pool(nnx.relu(self.batch_norm1(self.dropout1(self.conv1(x))))))
            x = nnx.relu(self.dropout2(self.linear1(x.reshape(x.shape[0], -1))))
            return self.linear2(x)

    model = CNN(rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adamw(lr, 0.9), wrt=nnx.Param)
    metrics = nnx.MultiMetric(accuracy=nnx.metrics.Accuracy(), loss=nnx.metrics.Average("loss"))

    def loss_fn(model, batch):
        logits = model(batch["image"])
        return optax.softmax_cross_entropy_with_integer_labels(logits=logits, labels=batch["label"]).mean(), logits

    @nnx.jit
    def train_step(model, optimizer, metrics, batch):
        (loss, logits), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model, batch)
        metrics.update(loss=loss, logits=logits, labels=batch["label"])
        optimizer.update(model, grads)

    rng = np.random.default_rng(0)
    data = {"image": rng.random((batch, 28, 28, 1), dtype=np.float32), "label": rng.integers(0, 10, batch, dtype=np.int32)}
    return Step(train_step, (model, optimizer, metrics, data))


def make_linen_lm(vocab: int = 64, width: int = 32, heads: int = 4, layers: int = 2, seq: int = 16,
                  batch: int = 16, lr: float = 1e-3, scan: bool = False) -> Step:
    """A Linen decoder LM stepped as lm1b's ``train_step(state, batch) -> (state, metrics)``;
    ``scan``: its blocks run by ``nn.scan`` (parameters stacked on a leading layer axis)."""
    import flax.linen as nn  # noqa: PLC0415  the frameworks extra: absent where the oldest JAX runs the core tests
    from flax.training import train_state  # noqa: PLC0415  likewise

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x):
            h = nn.LayerNorm()(x)
            x = x + nn.SelfAttention(num_heads=heads, deterministic=True)(h, mask=nn.make_causal_mask(x[..., 0]))
            h = nn.LayerNorm()(x)
            return x + nn.Dense(width)(nn.gelu(nn.Dense(4 * width)(h)))

    class ScannedBlock(nn.Module):  # nn.scan's carry protocol: (carry, x) -> (carry, y)
        @nn.compact
        def __call__(self, x, _):
            return Block()(x), None

    class LM(nn.Module):
        @nn.compact
        def __call__(self, tokens):
            x = nn.Embed(vocab, width)(tokens)
            if scan:
                x, _ = nn.scan(ScannedBlock, variable_axes={"params": 0}, split_rngs={"params": True},
                               length=layers)()(x, None)
            for _ in range(0 if scan else layers):
                x = Block()(x)
            return nn.Dense(vocab)(nn.LayerNorm()(x))

    model = LM()
    tokens = jax.random.randint(jax.random.key(1), (batch, seq + 1), 0, vocab)
    data = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:]}
    state = train_state.TrainState.create(apply_fn=model.apply, params=model.init(jax.random.key(0), data["inputs"]),
                                          tx=optax.adamw(lr))

    def train_step(state, batch):
        def loss_fn(params):
            logits = state.apply_fn(params, batch["inputs"])
            loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"]).mean()
            return loss, logits
        (loss, logits), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
        metrics = {"loss": loss, "accuracy": jnp.mean(jnp.argmax(logits, -1) == batch["targets"])}
        return state.apply_gradients(grads=grads), metrics

    return Step(train_step, (state, data))


def make_created_state(x: Any, width: int = 32, tx: Any = None) -> Any:
    """A Linen MLP's ``TrainState`` as Flax's examples make it: ``TrainState.create`` leaves
    ``step=0`` a Python int (a jitted step returns it an int32 array)."""
    import flax.linen as nn  # noqa: PLC0415  the frameworks extra: absent where the oldest JAX runs the core tests
    from flax.training import train_state  # noqa: PLC0415  likewise

    class MLP(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.Dense(10)(nn.relu(nn.Dense(width)(x)))

    model = MLP()
    return train_state.TrainState.create(apply_fn=model.apply, params=model.init(jax.random.key(0), x)["params"],
                                         tx=tx or optax.adam(1e-2))


def make_pjit_guide(depth: int = 64, layers: int = 2, batch: int = 8, features: int = 32) -> tuple:
    """Flax's pjit guide, smaller: its DotReluDot layers pin their activations to the program's
    own 2x4 mesh (``with_sharding_constraint``), ``jax.jit`` with in_shardings and out_shardings,
    a ``TrainState.create`` state laid out on that mesh. Returns (train_step, state, x, mesh)."""
    import flax.linen as nn  # noqa: PLC0415  the frameworks extra: absent where the oldest JAX runs the core tests
    from flax.training import train_state  # noqa: PLC0415  likewise

    mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "model"))   # the guide's: Auto axes

    class Hinted(nn.Module):
        @nn.compact
        def __call__(self, x):
            for i in range(layers):
                y = nn.Dense(depth, use_bias=False)(x)
                y = jax.lax.with_sharding_constraint(jax.nn.relu(y), NamedSharding(mesh, P("data", "model")))
                w2 = self.param(f"W2_{i}", nn.initializers.xavier_normal(), (depth, x.shape[-1]))
                x = jax.lax.with_sharding_constraint(y @ w2, NamedSharding(mesh, P("data", None)))
            return x

    model, x = Hinted(), jnp.ones((batch, features))
    state = train_state.TrainState.create(apply_fn=model.apply, params=model.init(jax.random.key(0), x)["params"],
                                          tx=optax.adam(1e-3))
    state_sharding = jax.tree.map(lambda _: NamedSharding(mesh, P()), state)
    x_sharding = NamedSharding(mesh, P("data", None))

    @functools.partial(jax.jit, in_shardings=(state_sharding, x_sharding), out_shardings=state_sharding)
    def train_step(state, x):
        grads = jax.grad(lambda p: model.apply({"params": p}, x).sum())(state.params)
        return state.apply_gradients(grads=grads)

    return train_step, jax.device_put(state, state_sharding), jax.device_put(x, x_sharding), mesh


def make_equinox_mlp(width: int = 64, depth: int = 2, batch: int = 32, lr: float = 1e-2) -> Step:
    """An Equinox MLP passed whole: ``step(model, opt_state, x, y) -> (model, opt_state, loss)``."""
    import equinox as eqx  # noqa: PLC0415  the frameworks extra: absent where the oldest JAX runs the core tests

    model = eqx.nn.MLP(32, 8, width, depth, key=jax.random.key(0))
    optimizer = optax.adam(lr)
    opt_state = optimizer.init(eqx.filter(model, eqx.is_array))

    def step(model, opt_state, x, y):
        loss, grads = eqx.filter_value_and_grad(lambda m: jnp.mean((jax.vmap(m)(x) - y) ** 2))(model)
        updates, opt_state = optimizer.update(grads, opt_state, eqx.filter(model, eqx.is_array))
        return eqx.apply_updates(model, updates), opt_state, loss

    x = jax.random.normal(jax.random.key(1), (batch, 32))
    y = jnp.tanh(x @ jax.random.normal(jax.random.key(2), (32, 8)))
    return Step(step, (model, opt_state, x, y), data_argnums=(2, 3))


def make_numpy_mlp(sizes: tuple = (64, 128, 10), batch: int = 32, lr: float = 0.1, returns: str = "loss") -> Step:
    """Parameters made with NumPy (float64) as JAX's SPMD MNIST example makes them; SGD by hand."""
    rng = np.random.default_rng(0)
    params = [(0.1 * rng.standard_normal((m, n)), 0.1 * rng.standard_normal(n))
              for m, n in zip(sizes[:-1], sizes[1:], strict=True)]

    def loss_fn(params, batch):
        x, labels = batch
        for w, b in params[:-1]:
            x = jnp.tanh(x @ w + b)
        w, b = params[-1]
        logits = x @ w + b
        return -jnp.mean(jnp.sum(jax.nn.log_softmax(logits) * labels, axis=-1))

    def update(params, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        return [(w - lr * dw, b - lr * db) for (w, b), (dw, db) in zip(params, grads, strict=True)], loss

    def update_only(params, batch):   # the example's own: the new parameters, no loss
        return update(params, batch)[0]

    x = rng.standard_normal((batch, sizes[0]))
    labels = np.eye(sizes[-1])[rng.integers(0, sizes[-1], batch)]
    if returns == "params":
        mesh = own_mesh((jax.device_count(),), ("data",))
        params = jax.device_put(jax.tree.map(np.float32, params), NamedSharding(mesh, P()))
        data = jax.device_put((x.astype(np.float32), labels.astype(np.float32)), NamedSharding(mesh, P("data")))
        return Step(update_only, (params, data))
    return Step(update, (params, (x, labels)))


def own_mesh(shape: tuple, names: tuple) -> Mesh:
    """A program's own mesh as it makes it today: ``jax.make_mesh``, whose axes are Explicit by
    default from JAX 0.7 (a plain ``Mesh`` before)."""
    if hasattr(jax.sharding, "AxisType"):
        return jax.make_mesh(shape, names, axis_types=(jax.sharding.AxisType.Explicit,) * len(shape))
    return Mesh(np.array(jax.devices()).reshape(shape), names)


def make_own_mesh_adam(width: int = 64, batch: int = 16, key: str = "typed") -> Step:
    """The module doc's ``make_own_mesh_adam``: ``train_step(params, opt_state, batch, key) ->
    (params, opt_state, loss)``."""
    mesh = Mesh(np.array(jax.devices()).reshape(2, -1), ("data", "model"))
    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    params = {"w1": jax.random.normal(k1, (32, width)) / np.sqrt(32),
              "w2": jax.random.normal(k2, (width, 8)) / np.sqrt(width)}
    params = jax.device_put(params, {"w1": NamedSharding(mesh, P(None, "model")),
                                     "w2": NamedSharding(mesh, P("model", None))})
    tx = optax.adam(1e-2)
    opt_state = jax.jit(tx.init)(params)
    x = jax.random.normal(k3, (batch, 32))
    batch_ = jax.device_put((x, jnp.tanh(x[:, :8])), NamedSharding(mesh, P("data")))

    def loss_fn(p, x, y, rng):
        h = jax.nn.relu(x @ p["w1"])
        h = h * jax.random.bernoulli(rng, 0.9, h.shape) / 0.9     # dropout
        return jnp.mean((h @ p["w2"] - y) ** 2)

    def train_step(params, opt_state, batch, rng):
        rng = jax.random.fold_in(rng, opt_state[0].count)        # a new mask each step
        loss, grads = jax.value_and_grad(loss_fn)(params, *batch, rng)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    rng = jax.random.key(1) if key == "typed" else jax.random.PRNGKey(1)
    return Step(train_step, (params, opt_state, batch_, rng), data_argnums=(2,))


def train(step, args, n, keep):
    """The user's loop, ``n`` steps: the step returns its new state first (its first ``keep``
    arguments), then the loss; the losses."""
    losses = []
    for _ in range(n):
        out = step(*args)
        args = (*out[:keep], *args[keep:])
        losses.append(float(out[-1]))
    return losses


def train_on_one_device(step, args, n, keep):
    """``train`` with ``step`` under ``eqx.filter_jit`` and the arrays left uncommitted: on the
    default device alone, the losses a plan's are compared with."""
    import equinox as eqx  # noqa: PLC0415  the frameworks extra: absent where the oldest JAX runs the core tests

    return train(eqx.filter_jit(step), args, n, keep)
