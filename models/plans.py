"""Sharding plans: how parameters, optimizer state, activations and inputs are laid out.

A plan is a named device mesh plus three rule sets mapping logical axis names (see
``models/sharding.py``) to mesh axes: ``params`` (the optimizer state follows its parameter),
``activations`` (applied by ``constrain`` inside the model) and ``inputs`` (the batch). Built-in
plans come from ``builtin(name)``; any plan, including one written by the search, round-trips
through JSON:

    {
      "name": "dp_tp",
      "mesh_axes": [["data", null], ["model", 2]],
      "rules": {
        "params":      {"heads": "model", "mlp": "model", "vocab": "model"},
        "activations": {"batch": "data", "heads": "model", "mlp": "model", "vocab": "model"},
        "inputs":      {"batch": "data"}
      },
      "constraints": {}
    }

``mesh_axes`` is ordered (outermost first); a size of null takes whatever the device count
leaves. The devices are taken ordered by process (then id), so the outermost axis is the one
that crosses processes (hosts), unless ``"across"`` names another (``arranged``). A rule maps to a mesh axis name, a list of them, or null. ``constraints`` is reserved
for the CFP search (operator id -> PartitionSpec-like list, see ``launcher/sharding/apply.py``);
plans carry it unchanged and the launcher applies it through ``models.train``'s step transform.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from .errors import ModelError
from .jax_versions import auto_mesh
from .sharding import Rules, mesh_axes_of, spec_for
from .step import init_state, make_optimizer

RULE_KINDS = ("params", "activations", "inputs")
_KEYS = {"name", "mesh_axes", "rules", "constraints", "across"}


def arranged(devices: Sequence[Any], shape: Sequence[int], across: Optional[int] = None) -> np.ndarray:
    """``devices`` as an array of ``shape``: ordered by process (then id), the processes changing
    along axis ``across`` (default 0): a multi-host job's data axis across hosts, its other axes
    within them (MaxText's dcn and ici axes). ``across`` sized a multiple of the process count."""
    ordered = sorted(devices, key=lambda d: (getattr(d, "process_index", 0), d.id))
    k = across or 0
    rest = [s for i, s in enumerate(shape) if i != k]
    grid = np.asarray(ordered, dtype=object).reshape((shape[k], *rest))
    return np.moveaxis(grid, 0, k)


@dataclass(frozen=True)
class Shardings:
    """NamedSharding pytrees for one model on one mesh."""

    params: Any
    state: Any  # {"params": ..., "opt_state": ...}, shaped like step.init_state's output
    batch: Any
    mesh: Mesh


@dataclass(frozen=True)
class Plan:
    name: str
    mesh_axes: tuple[tuple[str, Optional[int]], ...]
    rules: Mapping[str, Rules]
    constraints: Mapping[str, Any] = field(default_factory=dict)
    across: Optional[str] = None   # the mesh axis the processes change along (None: the outermost)

    def __post_init__(self) -> None:
        where = f"plan {self.name!r}"
        names = [a for a, _ in self.mesh_axes]
        if not names or len(set(names)) != len(names):
            raise ModelError(f"{where}: mesh_axes {list(self.mesh_axes)} must name at least one axis, each once")
        if sum(size is None for _, size in self.mesh_axes) > 1:
            raise ModelError(f"{where}: at most one mesh axis may have size null (the rest of the devices)")
        for axis, size in self.mesh_axes:
            if size is not None and (not isinstance(size, int) or size < 1):
                raise ModelError(f"{where}: mesh axis {axis!r} has size {size!r}; use a positive integer or null")
        unknown = set(self.rules) - set(RULE_KINDS)
        if unknown:
            raise ModelError(f"{where}: unknown rule set(s) {sorted(unknown)}; use {list(RULE_KINDS)}")
        for kind, rules in self.rules.items():
            for logical, rule in rules.items():
                for axis in mesh_axes_of(rule):
                    if axis not in names:
                        raise ModelError(f"{where}: {kind} rule {logical!r} -> {axis!r} names a mesh axis that is "
                                        f"not in mesh_axes {names}")

    def rules_for(self, kind: str) -> Rules:
        return self.rules.get(kind, {})

    # --- mesh -------------------------------------------------------------------------------

    def axis_sizes(self, num_devices: int) -> dict[str, int]:
        fixed = math.prod(size for _, size in self.mesh_axes if size is not None)
        if num_devices % fixed:
            given = ", ".join(f"{a!r}={s}" for a, s in self.mesh_axes if s is not None)
            raise ModelError(f"plan {self.name!r}: mesh axes {given} need a device count divisible by {fixed}, "
                            f"but there are {num_devices} devices; change the axis sizes (mode.mesh_axes) "
                            "or the number of devices")
        sizes = {a: (s if s is not None else num_devices // fixed) for a, s in self.mesh_axes}
        if math.prod(sizes.values()) != num_devices:
            raise ModelError(f"plan {self.name!r}: mesh {sizes} has {math.prod(sizes.values())} devices, "
                            f"but there are {num_devices}; give one axis size null to absorb the rest")
        return sizes

    def mesh(self, devices: Sequence[jax.Device]) -> Mesh:
        """The plan's mesh over ``devices`` (ordered by process, ``arranged``: the outermost axis,
        or ``across``, crossing processes).

        Auto axes (``jax_versions.auto_mesh``) rather than ``jax.make_mesh``'s Explicit default, so XLA
        propagates shardings between the points the plan pins.
        """
        sizes = self.axis_sizes(len(devices))
        across = list(sizes).index(self.across) if self.across in sizes else None
        return auto_mesh(arranged(devices, tuple(sizes.values()), across), tuple(sizes))

    def with_axis_sizes(self, **sizes: int) -> "Plan":
        """The same plan with some mesh axes resized, e.g. ``builtin("dp_tp").with_axis_sizes(model=4)``."""
        names = [a for a, _ in self.mesh_axes]
        unknown = set(sizes) - set(names)
        if unknown:
            raise ModelError(f"plan {self.name!r} has mesh axes {names}; cannot size {sorted(unknown)}")
        return replace(self, mesh_axes=tuple((a, sizes.get(a, s)) for a, s in self.mesh_axes))

    # --- shardings --------------------------------------------------------------------------

    def param_shardings(self, model: Any, mesh: Mesh, param_shapes: Any = None) -> Any:
        shapes = param_shapes if param_shapes is not None else jax.eval_shape(model.init, jax.random.key(0))
        rules = self.rules_for("params")
        self._check_applies(model, rules)
        return self._tree_shardings("parameter", model.param_axes(), shapes, rules, mesh)

    def batch_shardings(self, model: Any, mesh: Mesh, batch_shapes: Any = None) -> Any:
        shapes = batch_shapes if batch_shapes is not None else jax.eval_shape(model.make_batch, jax.random.key(0))
        return self._tree_shardings("input", model.batch_axes(), shapes, self.rules_for("inputs"), mesh)

    def _tree_shardings(self, kind: str, axes_tree: Any, shapes: Any, rules: Rules, mesh: Mesh) -> Any:
        """A NamedSharding per leaf of ``shapes``, from its logical axes; errors name the leaf."""

        def one(path: Any, axes: Any, shape: Any) -> NamedSharding:
            what = f"plan {self.name!r}: {kind} {_path_str(path)} {tuple(shape.shape)}"
            _check_rank(what, axes, shape.shape)
            return NamedSharding(mesh, spec_for(axes, rules, mesh, shape.shape, what))

        return jax.tree_util.tree_map_with_path(one, axes_tree, shapes, is_leaf=_is_axes)

    def shardings(self, model: Any, mesh: Mesh, optimizer: Any = None) -> Shardings:
        """Shardings of parameters, training state and batch; raises ModelError if the plan does
        not fit (a split dimension not divisible by its mesh axes)."""
        optimizer = optimizer if optimizer is not None else make_optimizer(1e-3)
        state_shapes = jax.eval_shape(lambda k: init_state(model, optimizer, k), jax.random.key(0))
        params = self.param_shardings(model, mesh, state_shapes["params"])
        replicated = NamedSharding(mesh, PartitionSpec())
        param_def = jax.tree.structure(state_shapes["params"])

        # Optimizer moments are trees shaped like the parameters and take their layout; the
        # rest (step counters) is replicated.
        def follow(sub: Any) -> Any:
            return params if _structure_or_none(sub) == param_def else replicated

        opt = jax.tree.map(follow, state_shapes["opt_state"],
                           is_leaf=lambda x: _structure_or_none(x) == param_def)
        batch = self.batch_shardings(model, mesh)
        return Shardings(params=params, state={"params": params, "opt_state": opt}, batch=batch, mesh=mesh)

    def _check_applies(self, model: Any, rules: Rules) -> None:
        """A plan that shards parameters along axes the model does not have is a mistake (e.g.
        ``ep`` on a dense model), not a silent data-parallel run."""
        sharded = {name for name, rule in rules.items() if mesh_axes_of(rule)}
        if not sharded:
            return
        present = {a for axes in jax.tree.leaves(model.param_axes(), is_leaf=_is_axes) if axes for a in axes}
        if not sharded & present:
            fitting = [name for name, plan in BUILTINS.items() if plan._applies_to(present)]
            raise ModelError(f"plan {self.name!r} shards parameters along {sorted(sharded)}, but model "
                            f"{type(model).__name__} has no parameter with those axes (it has {sorted(present - {None})}); "
                            f"use a plan that applies to it: {', '.join(fitting)}")

    def _applies_to(self, present: set) -> bool:
        """Whether a model whose parameters have the logical axes ``present`` has any this plan
        splits (or the plan splits none, as dp does)."""
        sharded = {name for name, rule in self.rules_for("params").items() if mesh_axes_of(rule)}
        return not sharded or bool(sharded & present)

    def check_divides(self, num_devices: int, dims: Mapping[str, tuple[str, int]]) -> None:
        """Before anything runs (no devices, no model built): the mesh over ``num_devices`` splits
        each named dimension evenly. ``dims`` maps a logical axis to (the config key that sets
        it, its size), e.g. ``{"batch": ("model.batch_size", 8)}``; raises ModelError naming the key."""
        sizes = self.axis_sizes(num_devices)
        for logical, (key, size) in dims.items():
            axes = {a for kind in RULE_KINDS for a in mesh_axes_of(self.rules_for(kind).get(logical))}
            ways = math.prod(sizes[a] for a in axes)
            if size % ways:
                over = " x ".join(f"{a!r} (size {sizes[a]})" for a in sorted(axes))
                raise ModelError(f"{key}={size} cannot be split over mesh axis {over} of plan {self.name} on "
                                 f"{num_devices} devices: make it a multiple of {ways}, or choose another plan or "
                                 "device count")

    # --- JSON -------------------------------------------------------------------------------

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "mesh_axes": [[a, s] for a, s in self.mesh_axes],
            "rules": {k: {n: (list(r) if isinstance(r, (list, tuple)) else r) for n, r in self.rules_for(k).items()}
                      for k in RULE_KINDS},
            "constraints": dict(self.constraints),
            **({"across": self.across} if self.across is not None else {}),
        }

    def to_json(self, path: str | Path | None = None) -> str:
        text = json.dumps(self.to_dict(), indent=2) + "\n"
        if path is not None:
            Path(path).write_text(text)
        return text

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], source: str = "plan") -> "Plan":
        if not isinstance(d, Mapping):
            raise ModelError(f"{source}: a plan is a JSON object with keys {sorted(_KEYS)}")
        unknown, missing = set(d) - _KEYS, {"name", "mesh_axes", "rules"} - set(d)
        if d.get("format") == "xlaunch-autoshard-plan":   # launcher/sharding/user/api.py's FORMAT
            raise ModelError(f"{source}: a plan for a user's step (autoshard's, or mode=search mode.step=...'s), not "
                            "for a built-in model: apply it in that program (launcher.AutoPlan.load(path), its run "
                            "dir too); mode=train trains the built-in models")
        if unknown or missing:
            raise ModelError(f"{source}: unknown keys {sorted(unknown)} / missing keys {sorted(missing)}; "
                            f"a plan has {sorted(_KEYS)}")
        axes = d["mesh_axes"]
        if not isinstance(axes, list) or not all(isinstance(a, list) and len(a) == 2 and isinstance(a[0], str)
                                                 for a in axes):
            raise ModelError(f"{source}: mesh_axes must be a list of [name, size or null] pairs, got {axes!r}")
        rules = d["rules"]
        if not isinstance(rules, Mapping) or not all(isinstance(r, Mapping) for r in rules.values()):
            raise ModelError(f"{source}: rules must map {list(RULE_KINDS)} to objects of logical axis -> mesh axis")
        for kind, rs in rules.items():
            for name, rule in rs.items():
                if not (rule is None or isinstance(rule, str)
                        or (isinstance(rule, list) and all(isinstance(a, str) for a in rule))):
                    raise ModelError(f"{source}: rule {kind}.{name} = {rule!r}; use a mesh axis name, a list of "
                                    "them, or null")
        return cls(name=str(d["name"]), mesh_axes=tuple((a, s) for a, s in axes),
                   rules={k: dict(v) for k, v in rules.items()}, constraints=dict(d.get("constraints") or {}),
                   across=d.get("across"))

    @classmethod
    def from_json(cls, path: str | Path) -> "Plan":
        p = Path(path)
        if not p.is_file():
            raise ModelError(f"plan file {str(p)!r} does not exist; give a built-in plan ({', '.join(BUILTINS)}) "
                            "or the path of a plan JSON file")
        try:
            d = json.loads(p.read_text())
        except json.JSONDecodeError as e:
            raise ModelError(f"plan file {str(p)!r} is not valid JSON: {e}") from None
        return cls.from_dict(d, source=f"plan file {str(p)!r}")


# ---------------------------------------------------------------------------------------------
# Built-in plans

_TP = {"heads": "model", "mlp": "model", "vocab": "model"}

BUILTINS: dict[str, Plan] = {
    # Data parallel: every device holds all parameters and a slice of the batch.
    "dp": Plan("dp", (("data", None),), {
        "params": {}, "activations": {"batch": "data"}, "inputs": {"batch": "data"}}),
    # Megatron tensor parallel: attention heads, MLP columns and the vocabulary split over all
    # devices; every device sees the whole batch.
    "tp": Plan("tp", (("model", None),), {
        "params": dict(_TP), "activations": dict(_TP), "inputs": {}}),
    # ZeRO-3 / FSDP: the batch split as in dp, and every parameter (with its optimizer state)
    # split along its embedding dimension; XLA gathers each weight where it is used.
    "fsdp": Plan("fsdp", (("data", None),), {
        "params": {"embed": "data"}, "activations": {"batch": "data"}, "inputs": {"batch": "data"}}),
    # 2-D: data parallel across "data", tensor parallel within "model" (size 2 unless resized).
    "dp_tp": Plan("dp_tp", (("data", None), ("model", 2)), {
        "params": dict(_TP), "activations": {"batch": "data", **_TP}, "inputs": {"batch": "data"}}),
    # GShard expert parallel: experts split over the devices that also split the batch; the
    # dispatched (expert, group, slot, embed) tensor moves between them by all-to-all.
    "ep": Plan("ep", (("data", None),), {
        "params": {"expert": "data"}, "activations": {"batch": "data", "expert": "data"},
        "inputs": {"batch": "data"}}),
}


def builtin(name: str) -> Plan:
    if name not in BUILTINS:
        raise ModelError(f"unknown plan {name!r}; built-in plans are {list(BUILTINS)}, or give a path to a plan JSON file")
    return BUILTINS[name]


def load_plan(spec: str) -> Plan:
    """A built-in plan by name, a plan JSON file by path, or a search's run dir (its plan.json,
    the answer)."""
    if spec in BUILTINS:
        return BUILTINS[spec]
    if Path(spec).is_dir():
        path = Path(spec) / "plan.json"
        if not path.is_file():
            raise ModelError(f"{spec}: the run dir holds no plan.json (a search writes it as it ends: see whether it "
                             f"did with `xlaunch status {spec}`); give a search's run dir or a plan file")
        return Plan.from_json(path)
    if spec.endswith(".json") or "/" in spec:
        return Plan.from_json(spec)
    return builtin(spec)


def _is_axes(x: Any) -> bool:
    return x is None or (isinstance(x, tuple) and all(a is None or isinstance(a, str) for a in x))


def _check_rank(what: str, axes: Any, shape: Sequence[int]) -> None:
    if axes is not None and len(axes) != len(shape):
        raise ModelError(f"{what}: {len(axes)} logical axes {axes} for {len(shape)} dimensions")


def _structure_or_none(x: Any) -> Any:
    try:
        return jax.tree.structure(x)
    except Exception:  # noqa: BLE001 - not a pytree node we can compare
        return None


def _path_str(path: Any) -> str:
    parts = []
    for k in path:
        parts.append(str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))))
    return ".".join(parts)
