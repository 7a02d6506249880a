"""Train, save, and resume where the last run stopped, with launcher.context() (README: "Saving and resuming").

    python examples/resume.py --steps 200                      # by hand: saves into ./checkpoints
    python -m launcher mode=run mode.script=examples/resume.py cluster=slurm cluster.nodes=2
"""

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import launcher


def train(steps: int = 100, lr: float = 0.05, save_every: int = 50, width: int = 16) -> dict:
    ctx = launcher.context()  # rank, run dir, checkpoint dir, restart count, stop requests
    mesh = Mesh(np.array(jax.devices()), ("data",))
    saved = ctx.checkpoint_dir / "latest.npz"
    start, params = 0, {"w": np.zeros(width, np.float32), "b": np.zeros((), np.float32)}
    if saved.exists():  # a restart, or a run in the same run dir: go on from the newest save
        with np.load(saved) as f:
            start, params = int(f["step"]), {"w": f["w"], "b": f["b"]}
        if ctx.is_main:
            print(f"resuming from step {start} (restart {ctx.restart})")
    replicated = NamedSharding(mesh, P())  # every process holds all the parameters
    params = {k: jax.make_array_from_callback(v.shape, replicated, lambda i, v=v: v[i]) for k, v in params.items()}

    def save(step, params):  # the main process writes, whole or not at all
        if ctx.is_main:
            ctx.checkpoint_dir.mkdir(parents=True, exist_ok=True)
            np.savez(ctx.checkpoint_dir / "saving.npz", step=step, **{k: np.asarray(v) for k, v in params.items()})
            (ctx.checkpoint_dir / "saving.npz").replace(saved)

    @jax.jit
    def update(params, step):  # batch number `step`, split over every device of every process
        kx, ky = jax.random.split(jax.random.fold_in(jax.random.key(1), step))
        x = jax.lax.with_sharding_constraint(jax.random.normal(kx, (64, width)), NamedSharding(mesh, P("data")))
        y = x @ jnp.linspace(-1.0, 1.0, width) + 0.5 + 0.1 * jax.random.normal(ky, (64,))
        loss, grads = jax.value_and_grad(lambda p: jnp.mean((x @ p["w"] + p["b"] - y) ** 2))(params)
        return jax.tree.map(lambda p, g: p - lr * g, params, grads), loss

    for step in range(start, steps):
        params, loss = update(params, step)
        if ctx.is_main:
            print(f"step {step} loss {float(loss):.7g}")
        if ctx.should_stop():  # SLURM asked the job to stop: the same answer on every process
            save(step + 1, params)
            return {"stopped_at": step + 1, "restart": ctx.restart}  # the job is requeued, and goes on
        if (step + 1) % save_every == 0 or step + 1 == steps:
            save(step + 1, params)
    return {"steps": steps, "restart": ctx.restart}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Train a linear model, resuming from the newest save.")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--save-every", type=int, default=50)
    print(train(**vars(parser.parse_args())))
