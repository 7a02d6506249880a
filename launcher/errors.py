"""The one exception type for bad input: the CLI prints its message and exits non-zero."""


class UserError(Exception):
    """Something the user asked for cannot be done; the message says what and how to fix it."""
