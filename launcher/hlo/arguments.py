"""The data a replayed module runs on: its arguments and its elided constants.

Argument modes (``mode.argument_mode``), after the XLA runner's ``--hlo_argument_mode``:

- ``random``: seeded pseudo-random values; floats uniform in [-1, 1), integers in [0, 16)
  (small, so that integer parameters used as indices or trip counts stay sensible), booleans
  fair coins.
- ``zeros``: zeros.
- ``device_id``: every element of a device's argument buffers is that device's logical id
  (replica * num_partitions + partition), as the runner's ``use_device_id_as_input``.
- ``uninitialized``: host buffers allocated and not filled (``np.empty``): no time spent making
  data, values unspecified, for timing runs on large modules.
- ``file``: one array per parameter, in order, from an ``.npz`` (``np.savez(path, *arrays)``).

Random values are a pure function of (seed, parameter, element's position in the global array),
so each process makes only its own devices' shards, and the global array is the same whatever
the number of processes or the sharding.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

import ml_dtypes
import numpy as np

from launcher.errors import UserError
from launcher.hlo.module import ElidedConstant, FillConstant, Parameter
from launcher.hlo.options import ArgumentMode
from launcher.hlo.text import hlo_type


# Constants draw from their own streams, so filling them never changes the arguments' values.
_CONSTANT_STREAM = 1 << 32

Index = tuple[slice, ...]


# --- values ------------------------------------------------------------------------------------

def _is_integer(dtype: np.dtype) -> bool:
    return dtype.kind in "iu" or dtype.name in ("int4", "uint4", "int2", "uint2")


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a bijection on uint64 that scatters neighbouring inputs."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def _flat_positions(shape: tuple[int, ...], index: Index) -> np.ndarray:
    """Row-major positions, in the global array of ``shape``, of the elements of ``index``."""
    positions = np.zeros((), np.uint64)
    for k, (s, n) in enumerate(zip(index, shape, strict=True)):
        axis = np.arange(*s.indices(n), dtype=np.uint64) * np.uint64(math.prod(shape[k + 1:]))
        positions = positions[..., None] + axis
    return positions


def random_bits(seed: int, stream: int, shape: tuple[int, ...], index: Index | None = None) -> np.ndarray:
    """64 random bits per element of the ``index`` block of a global array named by (seed, stream)."""
    index = tuple(slice(None) for _ in shape) if index is None else index
    key = _mix(np.uint64((seed * 0x9E3779B1 + stream) % 2**64))
    with np.errstate(over="ignore"):
        return _mix(_flat_positions(shape, index) + key)


def random_values(seed: int, stream: int, shape: tuple[int, ...], index: Index | None,
                  dtype: np.dtype) -> np.ndarray:
    """The ``index`` block of the global pseudo-random array of ``dtype`` named by (seed, stream)."""
    bits = random_bits(seed, stream, shape, index)
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return (bits >> np.uint64(63)).astype(np.bool_)
    if _is_integer(dtype):
        high = min(16, int(ml_dtypes.iinfo(dtype).max) + 1)
        return (bits % np.uint64(high)).astype(dtype)
    if dtype.kind == "c":
        real = (bits >> np.uint64(40)).astype(np.float64) * 2.0**-23 - 1.0
        imag = (_mix(bits) >> np.uint64(40)).astype(np.float64) * 2.0**-23 - 1.0
        return (real + 1j * imag).astype(dtype)
    return ((bits >> np.uint64(40)).astype(np.float64) * 2.0**-23 - 1.0).astype(dtype)


# --- arguments ---------------------------------------------------------------------------------

class Arguments:
    """Makes the shard of each parameter that one device holds."""

    def __init__(self, mode: ArgumentMode | str, parameters: Sequence[Parameter], seed: int = 0,
                 arguments_file: str | Path | None = None):
        self.mode = ArgumentMode(mode)
        self.seed = seed
        self.parameters = list(parameters)
        self._arrays: list[np.ndarray] | None = None
        if self.mode is ArgumentMode.file:
            if not arguments_file:
                raise UserError("mode.argument_mode=file needs mode.arguments_file=<file.npz> "
                                "(one array per parameter, in order: np.savez(path, *arrays))")
            self._arrays = load_arguments_file(Path(arguments_file), self.parameters)
        elif arguments_file:
            raise UserError(f"mode.arguments_file is set but mode.argument_mode={self.mode.value}: "
                            "set mode.argument_mode=file to use the file, or drop mode.arguments_file")

    def shard(self, i: int, index: Index, logical_device: int) -> np.ndarray:
        p = self.parameters[i]
        if self.mode is ArgumentMode.random:
            return random_values(self.seed, i, p.shape, index, p.dtype)
        if self.mode is ArgumentMode.file:
            return np.array(self._arrays[i][index])  # a copy; keeps 0-d arrays 0-d
        block = tuple(len(range(*s.indices(n))) for s, n in zip(index, p.shape, strict=True))
        if self.mode is ArgumentMode.zeros:
            return np.zeros(block, p.dtype)
        if self.mode is ArgumentMode.device_id:
            return np.full(block, logical_device, p.dtype)
        return np.empty(block, p.dtype)

    @property
    def depends_on_device(self) -> bool:
        return self.mode is ArgumentMode.device_id


def load_arguments_file(path: Path, parameters: Sequence[Parameter]) -> list[np.ndarray]:
    if not path.is_file():
        raise UserError(f"mode.arguments_file: {path} does not exist")
    try:
        with np.load(path, allow_pickle=False) as npz:
            names = list(npz.files)
            arrays = [npz[n] for n in names]
    except (OSError, ValueError) as e:
        raise UserError(f"mode.arguments_file: {path} is not a readable .npz ({e})") from None
    if len(arrays) != len(parameters):
        wanted = ", ".join(p.describe() for p in parameters) or "none"
        raise UserError(f"mode.arguments_file: {path} holds {len(arrays)} arrays but the module has "
                        f"{len(parameters)} parameters ({wanted}): give one array per parameter, in order")
    out = []
    for i, (name, array, p) in enumerate(zip(names, arrays, parameters, strict=True)):
        if array.dtype != p.dtype and array.dtype.kind == "V" and array.dtype.itemsize == p.dtype.itemsize:
            array = array.view(p.dtype)  # np.savez stores bfloat16 and friends as raw bytes
        if array.shape != p.shape or array.dtype != p.dtype:
            raise UserError(f"mode.arguments_file: {path} entry {name!r} is {hlo_type(array.dtype, array.shape)}, "
                            f"but parameter {i} ({p.describe()}) needs {hlo_type(p.dtype, p.shape)}")
        out.append(array)
    return out


# --- elided constants ----------------------------------------------------------------------------

def constant_filler(mode: ArgumentMode | str, seed: int = 0) -> FillConstant | None:
    """Values for ``constant({...})``: zeros under ``zeros``, left as the parser fills them under
    ``uninitialized`` (their values are unspecified there anyway), seeded random otherwise.

    Random constant values sit on a grid (floats k/64 in [-1, 1), integers 0..15) so that each
    value has a short exact spelling: the text is made by table lookup, not by printing
    millions of numbers, and every float type from bfloat16 up holds the values exactly.
    """
    mode = ArgumentMode(mode)
    if mode is ArgumentMode.uninitialized:
        return None

    def fill(constant: ElidedConstant, i: int) -> str:
        table, zero = _tokens(constant.dtype)
        count = math.prod(constant.shape)
        if mode is ArgumentMode.zeros:
            codes = np.full(count, zero)
        else:
            bits = random_bits(seed, _CONSTANT_STREAM + i, (count,))
            codes = (bits % np.uint64(len(table))).astype(np.intp)
        return nested_literal(table[codes].tolist(), constant.shape)

    return fill


def _tokens(dtype: np.dtype) -> tuple[np.ndarray, int]:
    """The spellings a filled constant of ``dtype`` draws from, and the index of zero."""
    if dtype == np.bool_:
        words = ["false", "true"]
    elif _is_integer(dtype):
        words = [str(k) for k in range(min(16, int(ml_dtypes.iinfo(dtype).max) + 1))]
    else:
        words = [repr((k - 64) / 64) for k in range(128)]
        if dtype.kind == "c":
            words = [f"({w}, 0)" for w in words]
        return np.array(words, dtype=object), 64
    return np.array(words, dtype=object), 0


def nested_literal(tokens: list[str], shape: tuple[int, ...]) -> str:
    """An HLO text literal from row-major element spellings: one brace level per dimension."""
    if not shape:
        return tokens[0]
    for n in reversed(shape):
        tokens = ["{" + ",".join(tokens[i:i + n]) + "}" for i in range(0, len(tokens), n)]
    return tokens[0]
