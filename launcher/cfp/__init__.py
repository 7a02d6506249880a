"""Deprecated: the package's name before ``launcher.sharding``. Only the name its releases
documented stays, ``launcher.cfp.autoshard`` (``autoshard.py``); import from ``launcher``."""
