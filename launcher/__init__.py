"""xlaunch: a config-driven launcher for multi-host JAX/XLA work (``python -m launcher``).

For users' own programs (``mode=run``) the package offers one call, ``launcher.context()``
(``launcher/api.py``).
"""

from launcher.api import context

__all__ = ["context"]
