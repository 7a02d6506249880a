"""Train a small MLP on synthetic data with plain JAX, sharded over every device there is.

The batch is split over the mesh's "data" axis and the hidden layer over its "model" axis:
data and tensor parallel at once. Nothing here knows how it was started. On one machine:

    python examples/train_jax.py --steps 20

and the same file, unchanged, on every process of a multi-host job, where jax.devices() lists
the devices of all processes (two SLURM nodes here):

    python -m launcher mode=run mode.script=examples/train_jax.py cluster=slurm cluster.nodes=2
"""

import argparse
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P


def main(argv=None):
    parser = argparse.ArgumentParser(description="Train a small MLP, data and tensor parallel.")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=64, help="global batch, over all processes")
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args(argv)

    devices = jax.devices()  # every process's devices, in the same order on every process
    model_axis = 2 if len(devices) % 2 == 0 else 1
    mesh = Mesh(np.array(devices).reshape(-1, model_axis), ("data", "model"))
    if jax.process_index() == 0:
        print(f"{jax.process_count()} process(es), {len(devices)} devices, mesh {dict(mesh.shape)}")

    def on_mesh(*spec):
        return NamedSharding(mesh, P(*spec))

    # Parameters and batches are made by jitted functions straight into their shardings: each
    # process computes only its own shards, and all agree because the seeds are the same.
    @partial(jax.jit, out_shardings={"w1": on_mesh(None, "model"), "w2": on_mesh("model", None)})
    def init(key):
        k1, k2 = jax.random.split(key)
        return {"w1": jax.random.normal(k1, (args.width, args.hidden)) / np.sqrt(args.width),
                "w2": jax.random.normal(k2, (args.hidden, args.width)) / np.sqrt(args.hidden)}

    @partial(jax.jit, out_shardings=(on_mesh("data", None), on_mesh("data", None)))
    def batch(step):
        x = jax.random.normal(jax.random.fold_in(jax.random.key(1), step), (args.batch, args.width))
        teacher = jax.random.normal(jax.random.key(2), (args.width, args.width)) / np.sqrt(args.width)
        return x, jnp.tanh(x @ teacher)

    def loss_fn(params, x, y):
        hidden = jax.nn.relu(x @ params["w1"])  # columns split over "model"
        return jnp.mean((hidden @ params["w2"] - y) ** 2)  # rows split over "model": an all-reduce

    @jax.jit
    def train_step(params, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        return jax.tree.map(lambda p, g: p - args.lr * g, params, grads), loss

    params = init(jax.random.key(0))
    for step in range(args.steps):
        params, loss = train_step(params, *batch(step))
        loss = float(loss)  # every process waits for its step: CPU collectives can hang if one runs ahead
        if jax.process_index() == 0:
            print(f"step {step} loss {loss:.7g}")


if __name__ == "__main__":
    main()
