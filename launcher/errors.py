"""Bad input: the CLI prints the message and exits 2, a task logs it without a traceback.

``UserError`` is the launcher's own. The models are a library that does not import the
launcher, so they raise ``models.errors.ModelError`` instead; ``BAD_INPUT`` names both wherever
the launcher tells bad input from a failure.
"""

from launcher.models.errors import ModelError


class UserError(Exception):
    """Something the user asked for cannot be done; the message says what and how to fix it."""


class NoPlanFits(UserError):
    """No sharding plan fits the memory budget (the CFP search's DP, the Alpa-style ILP). Over
    several meshes it leaves that mesh out while another may hold a plan."""


BAD_INPUT = (UserError, ModelError)
