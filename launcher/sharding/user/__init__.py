"""A user's own training step: how it is read, searched, and the plan applied to it.

    api.py       autoshard -> AutoPlan (apply, place, shardings, save/load); load_step for mode=search
    step.py      the step as a program: what is read from it, its baselines (dp, fsdp, its own layout)
    reading.py   the step's arguments and outputs read as state, batch, loss (Flax NNX, Equinox, plain JAX)
"""
