"""Plain-JAX models behind one protocol (``base.Model``), and how to train and shard them.

Installed as ``launcher.models`` (pyproject.toml says why); it imports nothing else of the
launcher, only itself, relatively.

    configs.py   the Hydra schemas of the ``model`` group (no JAX import)
    base.py      the protocol every mode relies on; the shared language-model base class
    layers.py    parameter specs, embeddings, norms, attention, MLPs, rotary embeddings
    gpt.py, bert.py, llama2.py, moe.py   one model each
    cfp_workloads.py   the CFP paper's workloads: layer stacks with no embedding or head
    data.py      synthetic tokens with a learnable signal; rng.py, the random numbers behind it
    sharding.py  logical axis names -> mesh axes; ``constrain`` for activations
    plans.py     sharding plans (dp, tp, fsdp, dp_tp, ep, or JSON files)
    step.py      optimizer, state, the train step and each step's data key
    train.py     the trainer (compile once, run and time steps) of mode=train and the CFP search
    errors.py    ModelError, the one exception for bad input

This package must stay importable without JAX: the CLI imports ``launcher.models.configs``.
"""
