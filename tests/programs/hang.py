"""A program whose rank 1 never enters the all-reduce its peers wait in (tests/test_hang.py).

Three steps agree; then rank 1 waits on something of its own (a loader that never returns, in
real programs) while every other rank enters the next all-gather."""

import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

import launcher

ctx = launcher.context()
for step in range(3):
    total = multihost_utils.process_allgather(jnp.ones(2) * step)
    print("step", step, float(np.asarray(total).sum()), flush=True)
    ctx.step()
if jax.process_index() == 1:
    time.sleep(3600)  # the loader that never returns
total = multihost_utils.process_allgather(jnp.ones(2))  # where the others wait
print("never reached", total, file=sys.stderr)
