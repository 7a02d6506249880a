"""CFP: profiling-based intra-operator parallelism search over communication-free structures.

Three passes, after "Profiling-based Intra-operator Parallelism Generation by Preserving
Communication-Free Structures" (built on Alpa's auto-sharding), on stock JAX:

- analysis (``analysis.py``): the training step's operator graph (``graph.py``, ``hlo_text.py``),
  its tensor contractions and their parallel strategies (``contractions.py``, ``strategies.py``),
  ParallelBlocks (``blocks.py``) and the unique segments among them (``segments.py``);
- profile (``profile.py``): every plan combination of each unique segment, compiled and timed as a
  program of that segment alone (``segment_program.py``, ``apply.py``), kept in a store
  (``store.py``);
- search (``search.py``): dynamic programming over the segment sequence under a memory budget,
  then the chosen plan run on the whole step beside the built-in baselines.

Nothing here imports JAX at module level except the modules that need it to do their work.
"""
