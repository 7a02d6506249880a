"""HLO replay: run a dumped XLA module on this job's devices, without the program that made it.

    from launcher.hlo.options import ReplayOptions
    from launcher.hlo.replay import replay
    results = replay(["module.before_optimizations.txt"], ReplayOptions(num_repeats=5))

- ``options``: ReplayOptions and ArgumentMode (no JAX import: mode schemas use them)
- ``text``: the one reader of HLO text (computations, instructions, types), shared with the CFP analysis
- ``module``: reading a module file and what it needs (devices, partitioner, parameters)
- ``arguments``: argument modes and elided constants
- ``replay``: compile, run, time, gather outputs
- ``_xla``: the jaxlib internals all of the above go through, each looked up (and checked) at import
"""
