"""CFP ("Profiling-based Intra-operator Parallelism Generation by Preserving Communication-Free
Structures"), a package behind the algorithm interface (``algorithms/base.py``): ``algorithm.py``,
the algorithm (``Cfp``: its profile and search passes over the meshes the orchestration analysed,
its shortlist and duel); ``profile.py``, its profile pass (``profile``, ``profile_meshes``,
``profiles.json``); the search pass's parts in ``launcher/sharding/search/`` (the DP, the nearest
plans, the fit under a budget) and the profiler's in ``launcher/sharding/profile/``.

Importing the package imports no JAX (the command line reads the registry): ``profile.py`` does,
and is imported where a pass runs."""

from launcher.sharding.algorithms.cfp.algorithm import Cfp, CfpOptions, CfpSearched, choose, within_reach

__all__ = ["Cfp", "CfpOptions", "CfpSearched", "choose", "within_reach"]
