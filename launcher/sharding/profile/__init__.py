"""CFP's profile pass: every plan combination of every unique segment, compiled, timed and stored
(map: ``launcher/sharding/__init__.py``; the pass itself: ``profiler.py``, ``Profiler`` and ``Profiles``).
The package imports none of its modules. It builds on ``measuring/`` (the store, the timing, and
the collective cost model it prices resharding with, which the ILP prices with too)."""
