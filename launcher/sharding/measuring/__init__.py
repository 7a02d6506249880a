"""Measuring on the mesh, shared by both algorithms and the passes: how a program is timed
(``timing.py``, ``quiet.py``), the store measurements are kept in (``store.py``), and the
collective cost model (``costmodel.py``) calibrated on the mesh (``calibrate.py``) that the ILP
prices with and CFP's profile prices resharding with. It imports nothing of ``profile/``,
``search/`` or ``ilp/``, which all build on it (map: ``launcher/sharding/__init__.py``).

The package imports none of its modules: ``store.py`` and ``costmodel.py`` use no JAX."""
