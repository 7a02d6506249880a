"""CFP's search pass: dynamic programming over the profiled segments, then the shortlist and the
searched plan measured on the whole step beside the baselines (map: ``launcher/sharding/__init__.py``).

Its modules are imported by name and this file imports none of them: ``meshes.py`` stays light
(no JAX), since the mode schemas, which the CLI imports, use it; ``dp.py`` reaches the profiler
and JAX.
"""
