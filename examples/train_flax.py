"""Train a small MLP with Flax (NNX) and optax, sharded over every device there is.

As examples/train_jax.py, with a framework: the layers say how their weights are split over
the mesh (``nnx.with_partitioning``), the model is made inside ``jit`` straight into those
shardings, and the batch is split over the mesh's "data" axis. Written for one machine,

    python examples/train_flax.py --steps 20

it runs unchanged on every process of a multi-host job:

    python -m launcher mode=run mode.script=examples/train_flax.py cluster=slurm cluster.nodes=2
"""

import argparse
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P


class MLP(nnx.Module):
    def __init__(self, width: int, hidden: int, rngs: nnx.Rngs):
        init = nnx.initializers.lecun_normal()
        # Megatron's split: the first layer's columns and the second's rows over "model".
        self.up = nnx.Linear(width, hidden, kernel_init=nnx.with_partitioning(init, (None, "model")),
                             use_bias=False, rngs=rngs)
        self.down = nnx.Linear(hidden, width, kernel_init=nnx.with_partitioning(init, ("model", None)),
                               use_bias=False, rngs=rngs)

    def __call__(self, x):
        return self.down(nnx.relu(self.up(x)))


def main(argv=None):
    parser = argparse.ArgumentParser(description="Train a small MLP with Flax, data and tensor parallel.")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=64, help="global batch, over all processes")
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--lr", type=float, default=0.01)
    args = parser.parse_args(argv)

    devices = jax.devices()  # every process's devices
    model_axis = 2 if len(devices) % 2 == 0 else 1
    mesh = Mesh(np.array(devices).reshape(-1, model_axis), ("data", "model"))
    if jax.process_index() == 0:
        print(f"{jax.process_count()} process(es), {len(devices)} devices, mesh {dict(mesh.shape)}")

    @nnx.jit
    def create():  # inside jit, each variable is made straight into the sharding it is annotated with
        model = MLP(args.width, args.hidden, rngs=nnx.Rngs(0))
        return model, nnx.Optimizer(model, optax.adam(args.lr), wrt=nnx.Param)

    @partial(jax.jit, out_shardings=NamedSharding(mesh, P("data", None, None)))
    def batch(step):
        x = jax.random.normal(jax.random.fold_in(jax.random.key(1), step), (args.batch, args.width))
        teacher = jax.random.normal(jax.random.key(2), (args.width, args.width)) / np.sqrt(args.width)
        return jnp.stack([x, jnp.tanh(x @ teacher)], axis=1)

    @nnx.jit
    def train_step(model, optimizer, xy):
        def loss_fn(model):
            return jnp.mean((model(xy[:, 0]) - xy[:, 1]) ** 2)

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        return loss

    with jax.set_mesh(mesh):  # the mesh the annotations name
        model, optimizer = create()
        for step in range(args.steps):
            loss = train_step(model, optimizer, batch(step))
            loss = float(loss)  # every process waits for its step: CPU collectives can hang if one runs ahead
            if jax.process_index() == 0:
                print(f"step {step} loss {loss:.7g}")

if __name__ == "__main__":
    main()
