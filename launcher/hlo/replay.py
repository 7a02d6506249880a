"""Replaying an HLO module: compile it for this job's devices, run it, time it, gather outputs.

A Python counterpart of XLA's multihost_hlo_runner. Every process of the job calls ``replay``
with the same files and options: each compiles the module for the same global device
assignment, makes its own devices' argument shards, and joins the execution; outputs are
gathered so that process 0 can write them. Who the processes are (task id, count,
coordinator) comes from ``jax.distributed``, never from replay options.

A module is replayed with the element types it was written with: 64-bit ones (``f64``, ``s64``,
``u64``, ``c128``, as a JAX program dumped with ``jax_enable_x64`` has) would be narrowed to 32
bits on their way to the devices, JAX's default, so arrays of them are made (and gathered) with
64-bit types enabled for that moment only (``_wide``): the job's other programs keep JAX's
defaults.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from launcher import jaxcompat
from launcher.errors import UserError
from launcher.hlo import _xla
from launcher.hlo.arguments import Arguments, constant_filler
from launcher.hlo.module import HloProgram, Parameter, load, participants
from launcher.hlo.options import ArgumentMode, ReplayOptions
from launcher.hlo.text import dtype_name
from launcher.runtime import hosts

_log = logging.getLogger("launcher.hlo")


@dataclass
class ReplayResult:
    path: Path
    module: str
    num_replicas: int
    num_partitions: int
    partitioner: str
    elided_constants: int
    load_time_s: float  # read, fill constants, parse, convert to StableHLO
    compile_time_s: float
    flops: float | None = None  # XLA's cost analysis of the compiled module, per device
    parameters: list[Parameter] = field(default_factory=list)
    parameter_shardings: list[jax.sharding.Sharding] = field(default_factory=list)  # as compiled
    execution_times_s: list[float] = field(default_factory=list)
    outputs: list[jax.Array] = field(default_factory=list)  # the last repeat's, global arrays
    outputs_file: Path | None = None

    def summary(self) -> dict[str, Any]:
        """The JSON-ready fields result.json reports."""
        out = {
            "hlo_file": str(self.path),
            "module": self.module,
            "num_replicas": self.num_replicas,
            "num_partitions": self.num_partitions,
            "partitioner": self.partitioner,
            "elided_constants": self.elided_constants,
            "load_time_s": self.load_time_s,
            "compile_time_s": self.compile_time_s,
            "flops": self.flops,
            "execution_times_s": self.execution_times_s,
            "parameters": [{"name": p.name, "shape": list(p.shape), "dtype": dtype_name(p.dtype),
                            "shard_shape": list(s.shard_shape(p.shape))}
                           for p, s in zip(self.parameters, self.parameter_shardings, strict=True)],
            "outputs": [{"shape": list(o.shape), "dtype": dtype_name(o.dtype)} for o in self.outputs],
        }
        if self.outputs_file is not None:
            out["outputs_file"] = str(self.outputs_file)
        return out


def replay(paths: Sequence[str | Path], options: ReplayOptions = ReplayOptions(),
           devices: Sequence[jax.Device] | None = None, log: logging.Logger | None = None) -> list[ReplayResult]:
    """Replays each module in turn; see ``replay_file``."""
    paths = [Path(p) for p in paths]
    results = []
    for path in paths:
        file_options = options
        if options.output_file is not None and len(paths) > 1:
            # One .npz per module: out.npz -> out.<module file stem>.npz
            out = Path(options.output_file)
            file_options = replace(options, output_file=out.with_name(f"{out.stem}.{path.stem}{out.suffix}"))
        results.append(replay_file(path, file_options, devices, log))
    return results


def replay_file(path: str | Path, options: ReplayOptions = ReplayOptions(),
                devices: Sequence[jax.Device] | None = None, log: logging.Logger | None = None) -> ReplayResult:
    """Compiles one module for ``devices`` (default: every global device), runs it
    ``options.num_repeats`` times and writes its outputs if asked.

    Every process of a multi-process job must call this with the same arguments.
    """
    replay = Replay(path, options, devices, log)
    if options.run:
        for _ in range(options.num_repeats):
            replay.execute()
        if options.output_file is not None:
            replay.write_outputs(Path(options.output_file))
    return replay.result


class Replay:
    """One module made ready to run on this job's devices: loaded, compiled, arguments checked.

    ``replay_file`` is the usual way in; the object serves callers that interleave executions
    with other work (the benchmark times replay and the original program side by side).
    """

    def __init__(self, path: str | Path, options: ReplayOptions = ReplayOptions(),
                 devices: Sequence[jax.Device] | None = None, log: logging.Logger | None = None):
        self.options, self.log = options, log or _log
        path = Path(path)
        t0 = time.perf_counter()
        if not path.is_file():
            raise UserError(f"mode.hlo_file: {path} does not exist or is not a file")
        program = load(path, constant_filler(options.argument_mode, options.seed))
        _log_constants(self.log, program, options.argument_mode)
        replicas, partitions = replicas_and_partitions(program, options, self.log)
        assignment = device_assignment(program, replicas, partitions, devices)
        try:
            stablehlo = _xla.to_stablehlo(program.proto)
        except _xla.CompileError as e:  # releases before 0.7 convert fused (optimized) modules badly
            raise UserError(compile_error_message(program, str(e), options, assignment.flat[0].platform)) from None
        load_s = time.perf_counter() - t0
        self.log.info("%s: module %s, %d parameters, num_replicas=%d num_partitions=%d, partitioner %s, "
                      "loaded in %.3f s", path, program.name, len(program.parameters), replicas, partitions,
                      program.partitioner, load_s)

        # Arguments are checked before compiling, so a bad arguments file fails fast.
        self._source = Arguments(options.argument_mode, program.parameters, options.seed,
                                 options.arguments_file) if options.run else None
        overrides = _xla.parse_xla_flags(options.xla_flags)
        if options.backend_only:
            _check_backend_only(program, partitions)
            overrides["xla_disable_all_hlo_passes"] = True
        t1 = time.perf_counter()
        try:
            self._executable = _xla.compile(stablehlo, assignment, program.results, use_shardy=program.use_shardy,
                                            overrides=overrides)
        except _xla.CompileError as e:
            raise UserError(compile_error_message(program, str(e), options, assignment.flat[0].platform)) from None
        compile_s = time.perf_counter() - t1
        self.log.info("%s: compiled in %.3f s", path.name, compile_s)
        self._logical_ids = {d: i for i, d in enumerate(assignment.flat)}
        self._arguments: list[jax.Array] | None = None
        # A module whose outputs alias its parameters consumes its arguments: each run gets a
        # device copy of the ones made first (making them again on the host costs minutes on a
        # training step of billions of values; a copy on the device, milliseconds).
        self._keep_arguments = program.aliases_inputs
        self._kept: list[jax.Array] | None = None
        self.result = ReplayResult(
            path=path, module=program.name, num_replicas=replicas, num_partitions=partitions,
            partitioner=program.partitioner, elided_constants=len(program.elided_constants), load_time_s=load_s,
            compile_time_s=compile_s, flops=self._executable.flops(), parameters=program.parameters,
            parameter_shardings=self._executable.parameter_shardings(len(program.parameters)))

    def execute(self) -> float:
        """Runs the module once; returns (and records) the seconds from launch to outputs ready."""
        if self._source is None:
            raise ValueError("this replay was made with run=False: it compiles only")
        if self._arguments is None or any(a.is_deleted() for a in self._arguments):
            self._arguments = self._fresh_arguments()  # untimed
        start = time.perf_counter()
        outputs = self._executable.execute(self._arguments)
        jax.block_until_ready(outputs)
        seconds = time.perf_counter() - start
        self.result.outputs = outputs
        self.result.execution_times_s.append(seconds)
        # The runner's profile line, one per repeat.
        self.log.info("%s: execution time for repeat %d/%d: %.6f s", self.result.path.name,
                      len(self.result.execution_times_s), self.options.num_repeats, seconds)
        return seconds

    def _fresh_arguments(self) -> list[jax.Array]:
        """The arguments for the next run: made (first run, or the arguments were donated and no
        copy is kept), or a device copy of the ones kept."""
        if self._kept is not None:
            return _copies(self._kept)
        made = make_arguments(self._source, self.result.parameter_shardings, self._logical_ids)
        if not self._keep_arguments or self.options.num_repeats < 2:
            return made
        try:
            copies = _copies(made)
        except _xla.DeviceError as e:  # no room for a second set: make them each time
            if "RESOURCE_EXHAUSTED" not in str(e):
                raise
            self._keep_arguments = False
            self.log.info("%s: no device memory for a copy of the arguments the module consumes: they are made "
                          "again before each run", self.result.path.name)
            return made
        self._kept = made
        return copies

    def write_outputs(self, path: Path) -> None:
        """Gathers the last run's outputs (every process must call this) and has process 0 write them."""
        values = fetch(self.result.outputs)
        if jax.process_index() == 0:
            self.result.outputs_file = write_outputs(path, values)
            self.log.info("%s: wrote %d outputs to %s", self.result.path.name, len(values), path)


def replicas_and_partitions(program: HloProgram, options: ReplayOptions,
                            log: logging.Logger | None = None) -> tuple[int, int]:
    """Options first, then the module header, then (partitions) the sharding annotations, then
    the participant count the collectives imply (``launcher.hlo.module.participants``), else 1.

    Refused where the collectives disagree on the count or need more participants than the
    counts given: a module never runs on fewer participants than its collectives address.
    """
    replicas = partitions = None
    if options.num_replicas:
        replicas = (options.num_replicas, f"mode.num_replicas={options.num_replicas}")
    elif program.replica_count:
        replicas = (program.replica_count, f"the module header's replica_count={program.replica_count}")
    if options.num_partitions:
        partitions = (options.num_partitions, f"mode.num_partitions={options.num_partitions}")
    elif program.num_partitions:
        partitions = (program.num_partitions, f"the module header's num_partitions={program.num_partitions}")
    elif program.annotated_devices:
        partitions = (program.annotated_devices,
                      f"its sharding annotations ({program.annotated_devices} devices)")
    counts = participants(program, replicas, partitions)
    for line in counts.inferred:
        (log or _log).info(line)
    return counts.replicas, counts.partitions


def device_assignment(program: HloProgram, replicas: int, partitions: int,
                      devices: Sequence[jax.Device] | None) -> np.ndarray:
    devices = list(jax.devices() if devices is None else devices)
    if replicas > 1 and partitions > 1 and program.partitioner != "none":
        # jaxlib 0.10 aborts the process (a failed CHECK, not an exception) when an executable
        # has partitioned values inside several replicas.
        raise UserError(f"{program.path.name}: num_replicas={replicas} x num_partitions={partitions} with a sharded "
                        "module cannot run: JAX executables cannot hold values partitioned within several "
                        "replicas; set mode.num_replicas=1 or mode.num_partitions=1")
    needed = replicas * partitions
    if needed > len(devices):
        if replicas == 1:
            what = f"num_partitions={partitions}"
        elif partitions == 1:
            what = f"num_replicas={replicas}"
        else:
            what = f"num_replicas={replicas} x num_partitions={partitions}"
        hint = ("raise cluster.tasks_per_node or cluster.cpu_devices_per_task" if devices[0].platform == "cpu"
                else "raise cluster.nodes or cluster.gpus_per_node")
        raise UserError(f"{program.path.name} needs {needed} devices ({what}), this job has {len(devices)}: {hint}")
    assignment = np.empty((replicas, partitions), dtype=object)
    assignment.flat[:] = devices[:needed]
    return assignment


def _copies(arrays: Sequence[jax.Array]) -> list[jax.Array]:
    """Device copies, same shardings (``jnp.array(copy=True)`` stays on the devices)."""
    out = [jnp.array(a, copy=True) for a in arrays]
    jax.block_until_ready(out)
    return out


def make_arguments(source: Arguments, shardings: Sequence[jax.sharding.Sharding],
                   logical_ids: dict[jax.Device, int]) -> list[jax.Array]:
    """One global jax.Array per parameter, each process making only its own devices' shards."""
    arrays = []
    with _wide(p.dtype for p in source.parameters):
        for i, (parameter, sharding) in enumerate(zip(source.parameters, shardings, strict=True)):
            made: dict[tuple, np.ndarray] = {}  # replicated shards are made once per process
            shards = []
            for device, index in sharding.addressable_devices_indices_map(parameter.shape).items():
                key = tuple((s.start, s.stop, s.step) for s in index)
                if source.depends_on_device or key not in made:
                    made[key] = source.shard(i, index, logical_ids[device])
                shards.append(jax.device_put(made[key], device))
            arrays.append(_xla.make_array(parameter.shape, sharding, shards, parameter.dtype))
    jax.block_until_ready(arrays)
    return arrays


_WIDE = frozenset(np.dtype(t) for t in (np.float64, np.int64, np.uint64, np.complex128))


def _wide(dtypes) -> contextlib.AbstractContextManager:
    """64-bit types enabled where some of ``dtypes`` is 64-bit (module doc), else nothing."""
    return jaxcompat.enable_x64() if any(np.dtype(d) in _WIDE for d in dtypes) else contextlib.nullcontext()


def fetch(outputs: Sequence[jax.Array]) -> list[np.ndarray]:
    """The outputs' global values, on every process.

    With several processes every one of them must call this (it is a collective), including a
    process that holds none of an output's shards.
    """
    if jax.process_count() == 1:
        return [np.asarray(o) for o in outputs]

    values = []
    for o in outputs:
        # Each process contributes the blocks it holds; the sharding says who holds what.
        local = np.zeros(o.shape, o.dtype)
        for shard in o.addressable_shards:
            local[shard.index] = np.asarray(shard.data)
        with _wide([o.dtype]):  # the gather is itself a JAX program over arrays of this type
            pieces = hosts.gather(local)
        full = np.empty(o.shape, o.dtype)
        # Reversed, so that where replicas differ (device_id arguments) the first device's value stays.
        for device, index in reversed(list(o.sharding.devices_indices_map(o.shape).items())):
            full[index] = pieces[device.process_index][index]
        values.append(full)
    return values


def write_outputs(path: Path, values: Sequence[np.ndarray]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez(tmp, *values)
    tmp.replace(path)
    return path


def compile_error_message(program: HloProgram, message: str, options: ReplayOptions, platform: str) -> str:
    xla = message.strip().splitlines()[0] if message.strip() else message
    if "No such compile option" in message:
        return f"mode.xla_flags: {xla}: the flag is not an XLA compile option (check its spelling)"
    # Compiling a module XLA has already fused fails on CPU; how depends on the release: "Fusion
    # must have backend config" (0.10), or the conversion to StableHLO fails (before 0.7).
    if "must have backend config" in message or re.search(r"\sfusion\(", program.text):
        if options.backend_only:
            return (f"mode.backend_only: the {platform} backend cannot compile {program.path.name} as it stands. "
                    f"JAX hands XLA only StableHLO, and converting an optimized module to StableHLO drops the "
                    f"backend_config that its fusions need on {platform} (XLA: {xla}). Replay the module's "
                    f"*before_optimizations* dump without mode.backend_only")
        return (f"{program.path.name} was already optimized for a backend (its fusions carry backend configs), "
                f"and XLA cannot compile such a module again on {platform} (XLA: {xla}). Replay the module's "
                f"*before_optimizations* dump instead")
    hint = ""
    if program.scheduled and not options.backend_only:
        hint = ("\n(the module is already scheduled, so this is an after-optimizations dump: replay the module's "
                "*before_optimizations* dump, or try mode.backend_only=true)")
    return f"{program.path}: XLA could not compile the module: {message.strip()}{hint}"


def _check_backend_only(program: HloProgram, partitions: int) -> None:
    if partitions > 1:
        raise UserError(
            f"mode.backend_only: {program.path.name} has num_partitions={partitions}. With backend_only the module "
            "must already be what each device runs, and a partitioned one holds per-device shapes while JAX "
            "executables take global arrays, so it cannot run this way: replay the module's "
            "*before_optimizations* dump without mode.backend_only")


def _log_constants(log: logging.Logger, program: HloProgram, mode: ArgumentMode) -> None:
    count = len(program.elided_constants)
    if not count:
        return
    how = {ArgumentMode.zeros: "with zeros",
           ArgumentMode.uninitialized: "left as XLA's parser fills them (unspecified values)"}.get(
        mode, "with seeded random values")
    log.warning("%s: %d constants were printed without their values ({...}); filled %s. Dump with "
                "--xla_dump_large_constants or --xla_dump_hlo_as_proto to keep them",
                program.path.name, count, how)
