"""What a replay may be asked to do: the options of XLA's multihost_hlo_runner that make sense
for JAX. Importing this module does not import JAX, so mode schemas can use it."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Sequence

from launcher.errors import UserError


class ArgumentMode(str, Enum):
    """Where a replayed module's arguments come from (see launcher.hlo.arguments)."""

    random = "random"  # seeded pseudo-random values
    zeros = "zeros"
    device_id = "device_id"  # each device's buffers filled with its logical id
    uninitialized = "uninitialized"  # allocated, not filled
    file = "file"  # one array per parameter, in order, from an .npz


@dataclass(frozen=True)
class ReplayOptions:
    run: bool = True  # False: compile only
    argument_mode: ArgumentMode | str = ArgumentMode.random
    arguments_file: str | Path | None = None
    seed: int = 0
    num_repeats: int = 1
    num_replicas: int | None = None  # None: the module's replica_count, else what its collectives need, else 1
    num_partitions: int | None = None  # None: the module's num_partitions, else its annotations, else its collectives
    output_file: str | Path | None = None  # .npz of the last repeat's outputs, written by process 0
    xla_flags: Sequence[str] | str = ()  # "--xla_name=value" compile options for these modules only
    backend_only: bool = False  # compile with all HLO passes disabled (after-optimizations dumps)

    def __post_init__(self):
        try:
            object.__setattr__(self, "argument_mode", ArgumentMode(self.argument_mode))
        except ValueError:
            choices = ", ".join(m.value for m in ArgumentMode)
            raise UserError(f"mode.argument_mode={self.argument_mode!r}: expected one of {choices}") from None
        # One string is read like XLA_FLAGS: flags separated by spaces.
        flags = self.xla_flags.split() if isinstance(self.xla_flags, str) else list(self.xla_flags)
        object.__setattr__(self, "xla_flags", tuple(flags))
        if self.num_repeats < 1 and self.run:
            raise UserError(f"mode.num_repeats={self.num_repeats}: must be at least 1 (or mode.run=false to "
                            "compile only)")
        for key in ("num_replicas", "num_partitions"):
            value = getattr(self, key)
            if value is not None and value < 1:
                raise UserError(f"mode.{key}={value}: must be at least 1, or null to read it from the module")
