"""A job whose ranks meet in an all-reduce every step, one rank's host-side work slower
(tests/test_straggler.py): each step every rank prepares its batch on the host (NumPy, in its main
thread, as a data pipeline does), the step's loss is summed over every rank's devices, and the
program tells the launcher nothing but ``launcher.context().log(step, loss=...)``.

    --steps N --work W [--slow-rank R --slow-factor F]

W: element-wise passes over a 256 KiB array a step (R does F times as many). Rank 0 writes when
each step ended into ``<run dir>/step_times.json``."""

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import launcher

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, required=True)
parser.add_argument("--work", type=int, required=True)
parser.add_argument("--slow-rank", type=int, default=-1)
parser.add_argument("--slow-factor", type=float, default=1.0)
args = parser.parse_args()

ctx = launcher.context()
passes = round(args.work * (args.slow_factor if ctx.rank == args.slow_rank else 1.0))
mesh = jax.make_mesh((jax.device_count(),), ("data",))
batch = NamedSharding(mesh, P("data"))


@jax.jit
def step(x):
    return jnp.mean(jnp.tanh(x) ** 2)   # every rank's rows: an all-reduce across the processes


rng = np.random.default_rng(ctx.rank)
ended = []
for i in range(args.steps):
    a = rng.standard_normal(32 * 1024).astype(np.float64)
    for _ in range(passes):   # the host's share of the step: NumPy in the main thread
        a = np.tanh(a) * 1.0001
    local = a[: 8 * jax.local_device_count()].reshape(jax.local_device_count(), 8).astype(np.float32)
    x = jax.make_array_from_process_local_data(batch, local)
    loss = float(step(x))
    ctx.log(i, loss=loss)
    ended.append(time.time())
if ctx.is_main:
    (ctx.run_dir / "step_times.json").write_text(json.dumps(ended))
