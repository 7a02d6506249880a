"""Reading an HLO module from disk and finding out what it needs to run.

Accepted: HLO text (``*before_optimizations*`` dumps, ``jit(f).lower(...).as_text(dialect="hlo")``,
hand-written modules, with or without the ``HloModule`` line) and serialized protos
(``--xla_dump_hlo_as_proto`` writes an ``HloProto`` wrapping the ``HloModuleProto``; a bare
``HloModuleProto`` and an ``HloSnapshot`` are accepted too).

What a module needs is read from the module itself: replica and partition counts from its
header, or else the device count its sharding annotations imply (GSPMD ``sharding={...}`` and
Shardy meshes), or else the participant count its collectives imply (``collective_needs``,
``participants``), and which partitioner its annotations were written for. Its instructions are
read by ``launcher/hlo/text.py`` (the reader the CFP analysis uses too) from XLA's canonical
print of the module, after XLA's parser accepted it.
"""

from __future__ import annotations

import glob
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from launcher.errors import UserError
from launcher.hlo import _xla
from launcher.hlo import text as hlo_text
from launcher.hlo.text import hlo_type, numpy_dtype


@dataclass(frozen=True)
class ElidedConstant:
    """A ``constant({...})`` whose values the printer left out (XLA elides large constants)."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    start: int  # offset of "{...}" in the text
    end: int


@dataclass(frozen=True)
class Parameter:
    name: str  # the entry parameter's name, with [i] per tuple level for a flattened tuple leaf
    shape: tuple[int, ...]
    dtype: np.dtype

    def describe(self) -> str:
        return f"{self.name}: {hlo_type(self.dtype, self.shape)}"


@dataclass(frozen=True)
class HloProgram:
    path: Path
    name: str
    proto: bytes  # serialized HloModuleProto, elided constants filled
    text: str  # XLA's canonical print of the module, for inspection and logs
    replica_count: int | None  # from the header
    num_partitions: int | None  # from the header
    annotated_devices: int  # devices the sharding annotations refer to (0: none)
    partitioner: str  # "shardy", "gspmd" or "none": what the annotations were written for
    scheduled: bool  # the header says is_scheduled=true: XLA's passes have already run on it
    parameters: list[Parameter]
    # The header's input_output_alias: outputs reuse (donated) parameters' buffers, so a run
    # consumes its arguments (a training step that donates its state).
    aliases_inputs: bool
    results: list[tuple[tuple[int, ...], np.dtype]]
    elided_constants: list[ElidedConstant] = field(default_factory=list)
    collectives: list[CollectiveNeed] = field(default_factory=list)  # what its collectives need

    @property
    def use_shardy(self) -> bool:
        # A module with only GSPMD annotations must not go through Shardy: Shardy imports GSPMD
        # shardings only when some op carries them, so annotated parameters alone (as in
        # spmd_8_devices.hlo) would silently compile replicated.
        return self.partitioner == "shardy"


# --- finding files -----------------------------------------------------------------------------

def expand(spec: str | Sequence[str] | None) -> list[Path]:
    """Files named by ``mode.hlo_file``: one path, a glob, or a list of either, in order."""
    if spec is None or spec == "" or (not isinstance(spec, str) and len(spec) == 0):
        raise UserError("mode.hlo_file is not set: give the module to replay, e.g. "
                        "mode.hlo_file=dump/module_0001.jit_step.before_optimizations.txt")
    patterns = [spec] if isinstance(spec, str) else list(spec)
    paths: list[Path] = []
    for pattern in patterns:
        pattern = str(pattern)
        if glob.has_magic(pattern):
            matches = sorted(glob.glob(pattern))
            if not matches:
                raise UserError(f"mode.hlo_file: no file matches {pattern!r}")
            paths += [Path(m) for m in matches if Path(m).is_file()]
        else:
            path = Path(pattern)
            if not path.is_file():
                where = f" (relative to {Path.cwd()})" if not path.is_absolute() else ""
                raise UserError(f"mode.hlo_file: {pattern}{where} does not exist or is not a file")
            paths.append(path)
    return paths


# --- loading ---------------------------------------------------------------------------------

FillConstant = Callable[[ElidedConstant, int], "str | None"]  # (constant, its index) -> literal text


def load(path: str | Path, fill_constant: FillConstant | None = None) -> HloProgram:
    """Reads and parses one module; ``fill_constant`` supplies the values of elided constants
    (returning None leaves one as the parser fills it)."""
    path = Path(path)
    data = path.read_bytes()
    if not data.strip():
        raise UserError(f"{path}: the file is empty")
    text = _as_text(data)
    elided: list[ElidedConstant] = []
    if text is None:
        try:
            module = _xla.parse_proto(_unwrap_proto(data, path))
        except _xla.HloParseError as e:
            raise UserError(f"{path}: not a valid serialized HLO module: {e}") from None
    else:
        elided = find_elided_constants(text)
        filled = _fill(text, elided, fill_constant) if fill_constant else text
        module = _parse(filled, text, path)
    proto = _xla.module_proto(module)
    canonical = _xla.module_text(module)
    header = canonical.split("\n", 1)[0]
    params, results = _xla.program_signature(proto)
    names = entry_parameter_names(canonical)
    return HloProgram(
        path=path,
        name=module.name,
        proto=proto,
        text=canonical,
        replica_count=_header_int(header, "replica_count"),
        num_partitions=_header_int(header, "num_partitions"),
        annotated_devices=annotated_devices(canonical),
        partitioner=partitioner(canonical),
        scheduled="is_scheduled=true" in header,
        aliases_inputs="input_output_alias=" in header,
        parameters=[Parameter(names.get(p[0], f"parameter({p[0]})") + "".join(f"[{i}]" for i in p[1:]), shape, dtype)
                    for p, shape, dtype in params],
        results=[(shape, dtype) for _, shape, dtype in results],
        elided_constants=elided,
        collectives=collective_needs(canonical),
    )


def _as_text(data: bytes) -> str | None:
    """The file's text if it is text; None for a binary proto (protos carry control bytes)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if re.search(r"[\x00-\x08\x0b\x0c\x0e-\x1f]", text):
        return None
    return text


def _parse(text: str, original: str, path: Path):
    try:
        return _xla.parse_text(text)
    except _xla.HloParseError as e:
        message = str(e)
    if text is not original:
        # Filling constants shifts columns: locate the error in the file as written.
        try:
            _xla.parse_text(original)
        except _xla.HloParseError as e:
            message = str(e)
    raise UserError(parse_error_message(path, message)) from None


_LOCATION = re.compile(r"was parsing (\d+):(\d+): error: (.*?)\n(.*?)\n( *\^)", re.S)


def parse_error_message(path: Path, message: str) -> str:
    """``file.hlo:12:7: <what>``, then the offending line and a caret, from the parser's message."""
    found = _LOCATION.search(message)
    if not found:
        return f"{path}: cannot parse as HLO: {message.strip()}"
    line, col, what, source, caret = found.groups()
    hint = ""
    if "as a single HloInstruction" in message:
        hint = " (this does not look like an HLO module: expected an 'HloModule <name>' header or computations)"
    return f"{path}:{line}:{col}: {what.strip()}{hint}\n  {source}\n  {caret}"


def _unwrap_proto(data: bytes, path: Path, depth: int = 0) -> bytes:
    """The HloModuleProto inside ``data``: itself, or field 1 of an HloProto / HloSnapshot."""
    fields = _top_level_fields(data, path)
    name = fields.get(1)
    if 2 in fields and 3 in fields and isinstance(name, bytes) and _as_text(name) is not None:
        return data  # an HloModuleProto: a printable name, entry name and computations
    if depth < 2 and isinstance(name, bytes):
        return _unwrap_proto(name, path, depth + 1)
    raise UserError(f"{path}: not HLO text and not a serialized HloModuleProto, HloProto or HloSnapshot")


def _top_level_fields(data: bytes, path: Path) -> dict[int, bytes | int]:
    """First value of each top-level field of a protobuf message (wire format only, no schema)."""
    def varint(pos: int) -> tuple[int, int]:
        value = shift = 0
        while True:
            if pos >= len(data):
                raise IndexError
            b = data[pos]
            value |= (b & 0x7F) << shift
            pos, shift = pos + 1, shift + 7
            if not b & 0x80:
                return value, pos

    fields: dict[int, bytes | int] = {}
    pos = 0
    try:
        while pos < len(data):
            key, pos = varint(pos)
            number, wire = key >> 3, key & 7
            if wire == 0:
                value, pos = varint(pos)
            elif wire == 2:
                size, pos = varint(pos)
                value, pos = data[pos:pos + size], pos + size
                if pos > len(data):
                    raise IndexError
            elif wire in (1, 5):
                size = 8 if wire == 1 else 4
                value, pos = data[pos:pos + size], pos + size
            else:
                raise IndexError
            fields.setdefault(number, value)
    except IndexError:
        raise UserError(f"{path}: not HLO text and not a readable protobuf (truncated or another format)") from None
    return fields


# --- inspecting ------------------------------------------------------------------------------

def _header_int(header: str, key: str) -> int | None:
    found = re.search(rf"\b{key}=(\d+)", header)
    return int(found.group(1)) if found else None


def partitioner(text: str) -> str:
    if "xla.sdy." in text:
        return "shardy"
    if re.search(r"\bsharding=\{", text):
        return "gspmd"
    return "none"


def annotated_devices(text: str) -> int:
    """How many devices the module's sharding annotations address (0 when it has none).

    GSPMD tiles ``devices=[a,b,...]`` span a*b*... devices (replication dims included), a
    ``maximal device=n`` needs n+1; a Shardy mesh spans the product of its axis sizes or its
    listed ``device_ids``.
    """
    count = 0
    for dims in re.findall(r"devices=\[([\d,]+)\]", text):
        count = max(count, math.prod(int(d) for d in dims.split(",")))
    for device in re.findall(r"maximal device=(\d+)", text):
        count = max(count, int(device) + 1)
    for axes, ids in re.findall(r"#sdy\.mesh<\[([^\]]*)\](?:,\s*device_ids=\[([\d,\s]*)\])?", text):
        sizes = [int(s) for s in re.findall(r"=\s*(\d+)", axes)]
        if ids.strip():
            count = max(count, max(int(i) for i in ids.split(",")) + 1)
        elif sizes:
            count = max(count, math.prod(sizes))
    return count


def entry_parameter_names(canonical: str) -> dict[int, str]:
    """Parameter number -> instruction name in the ENTRY computation of XLA's canonical print."""
    module = hlo_text.read(canonical)
    return {int(p.operands[0]): p.name for p in module.parameters(module.entry)}


# --- participants: what the collectives need ------------------------------------------------------

@dataclass(frozen=True)
class CollectiveNeed:
    """The participant count one collective implies.

    ``unit``: what its ids count, by XLA's CollectiveOpGroupMode: "replicas", "partitions" or
    "devices" (replicas x partitions). ``exact``: its groups cover every participant, so the
    count must be exactly this (XLA's verifier insists on it); otherwise (collective-permute
    pairs) it is the least count whose ids exist.
    """

    instruction: str  # "all-gather %ag"
    unit: str
    count: int
    exact: bool
    why: str  # "cross-replica, replica_groups={{0,1,2,3}}"

    def describe(self) -> str:
        return f"{self.instruction} ({self.why}): {self.count} {self.unit}"


_WITH_GLOBAL_IDS = {"all-reduce", "all-reduce-start", "all-gather", "all-gather-start", "reduce-scatter"}
_GROUPED = _WITH_GLOBAL_IDS | {"all-to-all", "ragged-all-to-all", "collective-broadcast"}
_PERMUTES = {"collective-permute", "collective-permute-start"}
_GROUPS = re.compile(r"(?:^|[,\s])replica_groups=(\{(?:\s*\{[\d,\s]*\}\s*,?)*\s*\}"  # {{0,1},{2,3}} or {}
                     r"|\[\d+,\d+\]<=\[[\d,]*\](?:T\([\d,]*\))?)")  # iota: [2,4]<=[8], [4,2]<=[2,4]T(1,0)
_PAIRS = re.compile(r"(?:^|[,\s])source_target_pairs=\{((?:\s*\{[\d,\s]*\}\s*,?)*)\}")


def _group_mode(opcode: str, attributes: str) -> str:
    """XLA's CollectiveOpGroupMode: no channel_id -> cross-replica; a channel_id on an op without
    use_global_device_ids (all-to-all, collective-permute, collective-broadcast) -> cross-partition;
    on one with it (all-reduce, all-gather, reduce-scatter): false -> cross-replica-and-partition,
    true -> flattened ids."""
    if not re.search(r"(?:^|[,\s])channel_id=\d+", attributes):
        return "cross-replica"
    if opcode not in _WITH_GLOBAL_IDS:
        return "cross-partition"
    return "flattened ids" if re.search(r"use_global_device_ids=true", attributes) else "cross-replica-and-partition"


# Which count a collective's ids number, by group mode; with empty groups, which count its one group spans.
_IDS_COUNT = {"cross-replica": "replicas", "cross-partition": "partitions",
              "cross-replica-and-partition": "replicas", "flattened ids": "devices"}
_ALL_COUNT = {"cross-replica": "replicas", "cross-partition": "partitions",
              "cross-replica-and-partition": "devices", "flattened ids": "devices"}


def collective_needs(text: str) -> list[CollectiveNeed]:
    """What each collective of the module (in every computation) says about the participant count.

    - explicit ``replica_groups={{0,1},{2,3}}``: exactly highest id + 1 (groups cover every participant);
    - iota ``replica_groups=[G,S]<=[...]`` (with or without ``T(...)``): exactly G*S;
    - empty ``replica_groups={}`` (one group of every participant): exactly the group size where the
      shapes tell it (an all-gather's result over its operand along ``dimensions={d}``, a
      reduce-scatter's operand over its result, a tuple all-to-all's operand count), else nothing;
    - ``source_target_pairs``: at least the highest id + 1.

    The count is of replicas, partitions or devices (replicas x partitions) as the group mode says
    (``_group_mode``): ids of a cross-replica or cross-replica-and-partition collective number
    replicas, of a cross-partition one partitions, flattened ids devices; the one group of empty
    groups spans replicas, partitions, or (cross-replica-and-partition, flattened) devices.
    """
    shapes: dict[str, str] = {}
    needs = []
    for ins in hlo_text.instructions(text):
        name, result, opcode, operands, attributes = ins.name, ins.type, ins.opcode, ins.operands, ins.attributes
        shapes[name] = result
        if opcode not in _GROUPED and opcode not in _PERMUTES:
            continue
        mode = _group_mode(opcode, attributes)
        instruction = f"{opcode} %{name}"
        if opcode in _PERMUTES:
            pairs = _PAIRS.search(attributes)
            ids = [int(i) for i in re.findall(r"\d+", pairs.group(1))] if pairs else []
            if ids:
                unit = "partitions" if mode != "cross-replica" else "replicas"
                needs.append(CollectiveNeed(instruction, unit, max(ids) + 1, False,
                                            f"{mode}, source_target_pairs up to id {max(ids)}"))
            continue
        groups = _GROUPS.search(attributes)
        spelled = groups.group(1) if groups else "{}"
        iota = re.match(r"\[(\d+),(\d+)\]<=", spelled)
        ids = [int(i) for i in re.findall(r"\d+", spelled)] if not iota else []
        short = spelled if len(spelled) <= 40 else spelled[:37] + "..."
        if iota:
            count = int(iota.group(1)) * int(iota.group(2))
            needs.append(CollectiveNeed(instruction, _IDS_COUNT[mode], count, True,
                                        f"{mode}, replica_groups={short}"))
        elif ids:
            needs.append(CollectiveNeed(instruction, _IDS_COUNT[mode], max(ids) + 1, True,
                                        f"{mode}, replica_groups={short}"))
        else:
            size = _group_size_from_shapes(opcode, result, operands, attributes, shapes)
            if size is not None:
                count, how = size
                needs.append(CollectiveNeed(instruction, _ALL_COUNT[mode], count, True,
                                            f"{mode}, replica_groups={{}}, {how}"))
    return needs


def _group_size_from_shapes(opcode: str, result: str, operands: list[str], attributes: str,
                            shapes: dict[str, str]) -> tuple[int, str] | None:
    """The size of a collective's group where its shapes tell it, with how they tell it."""
    if opcode == "all-to-all" and not re.search(r"(?:^|[,\s])dimensions=", attributes):
        return (len(operands), f"{len(operands)} operands") if len(operands) > 1 else None
    if opcode not in ("all-gather", "all-gather-start", "reduce-scatter") or not operands:
        return None
    dimension = re.search(r"(?:^|[,\s])dimensions=\{(\d+)\}", attributes)
    inputs = [dims for _, dims in hlo_text.arrays(shapes.get(operands[0], ""))]
    outputs = [dims for _, dims in hlo_text.arrays(result)]
    if not dimension or not inputs or not outputs:
        return None
    d = int(dimension.group(1))
    before = inputs[0]
    # An async all-gather's result holds its operands, then its results.
    after = outputs[len(operands)] if opcode == "all-gather-start" and len(outputs) == 2 * len(operands) else outputs[0]
    if opcode == "reduce-scatter":
        before, after = after, before
    if d >= min(len(before), len(after)) or before[d] == 0 or after[d] % before[d]:
        return None
    factor = after[d] // before[d]
    verb = "gathers" if opcode != "reduce-scatter" else "scatters"
    return factor, f"{verb} {factor} pieces along dimension {d}"


@dataclass(frozen=True)
class Participants:
    """The replica and partition counts a module runs with, and where they came from."""

    replicas: int
    partitions: int
    inferred: list[str]  # log lines for the counts taken from the collectives


def participants(program: HloProgram, replicas: tuple[int, str] | None,
                 partitions: tuple[int, str] | None) -> Participants:
    """The counts to run with: those given (``(count, where it was given)``), else those the
    collectives imply, else 1; refused (UserError) where the collectives disagree among
    themselves or need more participants than the counts given.

    Ids that number replicas (cross-replica, cross-replica-and-partition) set the replica count,
    ids that number partitions (cross-partition) the partition count; flattened ids (and the one
    group of empty cross-replica-and-partition groups) set replicas x partitions: the replica
    count when partitions are given or set otherwise (else 1), or the partition count when only
    the replica count is given.
    """
    name = program.path.name
    needed = {unit: _needed(name, [n for n in program.collectives if n.unit == unit])
              for unit in ("replicas", "partitions", "devices")}
    inferred = []

    def infer(unit: str) -> int | None:
        need = needed[unit]
        if need is None:
            return None
        inferred.append(f"{name}: num_{unit}={need[0]} from its collectives ({need[1].instruction}: "
                        f"{need[1].why}); nothing else gives the {unit[:-1]} count")
        return need[0]

    r = replicas[0] if replicas else infer("replicas")
    p = partitions[0] if partitions else infer("partitions")
    devices = needed["devices"]
    if devices is not None and (r is None or p is None):
        total, need = devices
        known, unit = (p or 1, "replicas") if r is None else (r, "partitions")
        if total % known == 0 and total > known:
            inferred.append(f"{name}: num_{unit}={total // known} from its collectives ({need.instruction}: "
                            f"{need.why}: {total} devices in all)")
            r, p = (total // known, p or 1) if unit == "replicas" else (r, total // known)
    r, p = r or 1, p or 1
    for unit, have in (("replicas", r), ("partitions", p), ("devices", r * p)):
        need = needed[unit]
        if need is not None and have < need[0]:
            given = {"replicas": replicas, "partitions": partitions}.get(unit)
            source = given[1] if given else (f"num_{unit}={have}" if unit != "devices" else
                                             f"num_replicas={r} x num_partitions={p}")
            raise UserError(f"{name}: its collectives need {need[0]} {_units(unit)} ({need[1].instruction}: "
                            f"{need[1].why}), but {source} gives {have}: {_how(unit, need[0])}")
    return Participants(r, p, inferred)


def _needed(name: str, needs: list[CollectiveNeed]) -> tuple[int, CollectiveNeed] | None:
    """The count ``needs`` (all of one unit) agree on, with the need that sets it."""
    if not needs:
        return None
    exact = [n for n in needs if n.exact]
    widest = max(needs, key=lambda n: n.count)
    counts = {n.count for n in exact}
    if len(counts) > 1 or (exact and widest.count > exact[0].count):
        first = exact[0]
        other = next(n for n in needs if n.count != first.count)
        unit = first.unit
        raise UserError(f"{name}: its collectives disagree on how many {_units(unit)} it runs on "
                        f"({first.describe()}; {other.describe()}): it needs at least {widest.count} {unit}. "
                        f"Set the counts it was written for with mode.num_replicas=<n> and/or "
                        f"mode.num_partitions=<n>")
    chosen = exact[0] if exact else widest
    return chosen.count, chosen


def _units(unit: str) -> str:
    return "devices (replicas x partitions)" if unit == "devices" else unit


def _how(unit: str, count: int) -> str:
    if unit == "devices":
        return f"set mode.num_replicas=<r> and mode.num_partitions=<p> with r x p = {count}"
    return f"set mode.num_{unit}={count}"


# --- elided constants --------------------------------------------------------------------------

_ELIDED = re.compile(r"^\s*(?:ROOT\s+)?%?(\S+)\s*=\s*(\w+)\[([\d,]*)\](?:\{[^}]*\})?\s+constant\((\{\.\.\.\})\)", re.M)


def find_elided_constants(text: str) -> list[ElidedConstant]:
    return [ElidedConstant(name=m.group(1), dtype=numpy_dtype(m.group(2)),
                           shape=tuple(int(d) for d in m.group(3).split(",") if d),
                           start=m.start(4), end=m.end(4))
            for m in _ELIDED.finditer(text)]


def _fill(text: str, constants: list[ElidedConstant], fill_constant: FillConstant) -> str:
    pieces, pos = [], 0
    for i, c in enumerate(constants):
        literal = fill_constant(c, i)
        if literal is not None:
            pieces += [text[pos:c.start], literal]
            pos = c.end
    return "".join(pieces + [text[pos:]]) if pieces else text
