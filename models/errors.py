"""The models' one exception type for bad input."""


class ModelError(ValueError):
    """A model, a plan or a training setting that cannot work as given; the message says which
    field and how to fix it. The launcher reports it as bad input (its message, no traceback),
    like its own ``launcher.errors.UserError``."""
