"""Auto-shard a Flax NNX model written without xlaunch in mind, then train it under the plan.

The model and its training step are plain Flax: nothing names a mesh, a sharding or a logical
axis. ``autoshard`` searches how to lay the step out over every device JAX sees (CFP: the step's
segments profiled, then searched; ``--algorithm ilp``: the Alpa-style ILP), races the plan it
keeps beside data parallel and FSDP, and hands it back: the plan lays out the state and the
batches and runs the step. Written for one machine,

    python examples/autoshard_flax.py --steps 20
    XLA_FLAGS=--xla_force_host_platform_device_count=8 python examples/autoshard_flax.py --quick

it runs unchanged on every process of a multi-host job (each process searches alike and gets the
same plan; process 0 writes the profile store and plan.json):

    python -m launcher mode=run mode.script=examples/autoshard_flax.py "mode.args=[--quick]"

docs/autoshard.md is the reference.
"""

import argparse

import jax
import numpy as np
import optax
from flax import nnx

from launcher import autoshard


class Block(nnx.Module):
    def __init__(self, width: int, heads: int, rngs: nnx.Rngs):
        self.norm1 = nnx.LayerNorm(width, rngs=rngs)
        self.attention = nnx.MultiHeadAttention(num_heads=heads, in_features=width, decode=False, rngs=rngs)
        self.norm2 = nnx.LayerNorm(width, rngs=rngs)
        self.up = nnx.Linear(width, 4 * width, rngs=rngs)
        self.down = nnx.Linear(4 * width, width, rngs=rngs)

    def __call__(self, x):
        x = x + self.attention(self.norm1(x))
        return x + self.down(nnx.gelu(self.up(self.norm2(x))))


class LanguageModel(nnx.Module):
    def __init__(self, vocab: int, width: int, heads: int, layers: int, rngs: nnx.Rngs):
        self.embed = nnx.Embed(vocab, width, rngs=rngs)
        self.blocks = nnx.List([Block(width, heads, rngs) for _ in range(layers)])
        self.head = nnx.Linear(width, vocab, rngs=rngs)

    def __call__(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def main(argv=None):
    parser = argparse.ArgumentParser(description="Auto-shard a Flax NNX language model, then train it.")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=16, help="global batch, over all processes")
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument("--algorithm", choices=["cfp", "ilp"], default="cfp")
    parser.add_argument("--store", default="outputs/cfp_profiles", help="the profile store, reused by later searches")
    parser.add_argument("--plan", default="plan.json", help="where the plan is saved")
    parser.add_argument("--quick", action="store_true", help="a short search: one logical mesh, few timings")
    args = parser.parse_args(argv)

    model = LanguageModel(args.vocab, args.width, 4, args.layers, nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adamw(3e-3), wrt=nnx.Param)
    graphdef, state = nnx.split((model, optimizer))

    def train_step(state, batch):
        model, optimizer = nnx.merge(graphdef, state)

        def loss_fn(model):
            logits = model(batch["tokens"])
            return optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"]).mean()

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        return nnx.state((model, optimizer)), loss

    def batch(step):  # the same on every process: a global batch the plan splits
        rng = np.random.default_rng(step)
        start = rng.integers(0, args.vocab, (args.batch, 1))
        tokens = (start + np.arange(args.seq + 1)) % args.vocab   # counting sequences: learnable
        return {"tokens": tokens[:, :-1].astype(np.int32), "labels": tokens[:, 1:].astype(np.int32)}

    quick = dict(mesh_shape=[], repeats=2, max_segment_space=6, iterations=2, run_repeats=2, verify_top_k=1,
                 verify_iterations=2, verify_repeats=2, ilp_time_limit_s=30) if args.quick else {}
    plan = autoshard(train_step, state, batch(0), algorithm=args.algorithm, store_dir=args.store, **quick)
    if jax.process_index() == 0:
        print(plan.table())
    plan.save(args.plan)

    step = plan.apply(train_step, donate_argnums=(0,))   # jitted under the plan's layouts
    state, _ = plan.place(state, batch(0))
    for i in range(args.steps):
        state, loss = step(state, batch(i))
        loss = float(loss)  # every process waits for its step: CPU collectives can hang if one runs ahead
        if jax.process_index() == 0:
            print(f"step {i} loss {loss:.7g}")


if __name__ == "__main__":
    main()
