"""The parts of CFP's search pass, which ``algorithms/cfp/`` runs: dynamic programming over the
profiled segments, the nearest plans, the shortlist measured on the whole step; and the race every
algorithm's plan runs beside the baselines (``race.py``, on ``measure.py``'s runners; map:
``launcher/sharding/__init__.py``).

Its modules are imported by name and this file imports none of them: ``meshes.py`` stays light
(no JAX), since the mode schemas, which the CLI imports, use it; ``dp.py`` reaches the profiler
and JAX.
"""
