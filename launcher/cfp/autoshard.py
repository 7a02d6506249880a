"""Deprecated: ``from launcher.cfp.autoshard import autoshard`` (an earlier release's import) is
``from launcher import autoshard``. This module copies nothing: every name is
``launcher.sharding.user.api``'s, handed out with a DeprecationWarning (``launcher/_deprecated.py``)."""

from launcher._deprecated import forward

__getattr__ = forward(__name__)
