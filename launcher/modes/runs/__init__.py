"""What each mode runs: ``run(ctx) -> dict`` (``launcher/runtime/context.py: TaskContext``), one
module per mode, named in the mode's entry of ``launcher.modes.MODES`` (``"<module>:run"``).

These modules import JAX and the libraries (``launcher/sharding/``, ``launcher/hlo/``, ``models/``) at
their top: only a task imports them, through ``Mode.load``, once its devices are set and JAX is
initialised. What the CLI needs of a mode, its ``Config`` and its checks, is in
``launcher/modes/<name>.py`` and imports no JAX.
"""
