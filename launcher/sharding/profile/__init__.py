"""CFP's profile pass: every plan combination of every unique segment, compiled, timed and stored
(map: ``launcher/sharding/__init__.py``; the pass itself: ``profiler.py``, ``Profiler`` and ``Profiles``).
The package imports none of its modules: the ILP's calibration (``ilp/calibrate.py``) uses its
store, keys and timing, and the profiler prices resharding with that calibration."""
