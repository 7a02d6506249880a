"""Where a run's scalars go: one experiment tracker per run, ``launcher.tracker``.

- ``tensorboard`` (the default): event files in the run dir (tensorboardX, which needs no
  TensorFlow); a restarted or requeued attempt purges what earlier attempts wrote from its first
  step on (TensorBoard's purge step), so a resumed curve continues instead of doubling back.
- ``wandb``: a Weights & Biases run, its files under ``<run dir>/wandb/``; online where W&B has
  a key (``WANDB_API_KEY``, ``wandb login``), else offline (``wandb sync`` uploads it later;
  ``WANDB_MODE`` says otherwise). ``WANDB_PROJECT`` names the project (default ``xlaunch``).
- ``mlflow``: an MLflow run in ``MLFLOW_TRACKING_URI``'s store, default the run dir's own file
  store (``<run dir>/mlruns``, a folder: no database to run; ``mlflow ui --backend-store-uri
  <run dir>/mlruns`` shows it).
  ``MLFLOW_EXPERIMENT_NAME`` names the experiment (default ``xlaunch``).
- ``none``: no tracker (the last values still reach result.json).

W&B and MLflow keep **one run across restarts**: the run's id is written to
``<run dir>/tracker.json`` when it opens, and a later attempt (a restart, a requeue) opens that
run again, its steps going on where they stopped. Steps an attempt runs again (from a checkpoint
older than the last step logged) are not logged twice: W&B drops a step below its last itself;
for MLflow the tracker reads the run's last step of each metric once, when it opens. W&B's
writer keeps a run's last 32 KiB in memory until the run finishes, so a flush (mode=train's, at
each checkpoint) finishes the run and resumes it: what a checkpoint covers survives a kill. The run's
parameters are the resolved config (flattened, ``model.num_layers``) and the code's git commit
(``code_commit``, recorded at submission).

Each tracker is a class registered by its ``name`` (subclassing is registering, as JAX's
clusters are); only rank 0's process opens one (``scalars.py`` decides), and its library is
imported only when the run first writes a scalar.
"""

from __future__ import annotations

import abc
import json
import os
import time
import uuid
from pathlib import Path
from typing import Any, Callable, ClassVar, Mapping, Optional

TRACKER_FILE = "tracker.json"


class Tracker(abc.ABC):
    """One run of an experiment tracker. ``open`` once, with the first step this attempt writes;
    ``log`` a step's values (``axis``: what the step counts, ``step`` or another, ``attempt``:
    a tracker with one step axis per run keeps the others apart); ``flush``; ``close``."""

    name: ClassVar[str] = ""
    title: ClassVar[str] = ""          # as its makers write it
    extra: ClassVar[str] = ""          # the pip extra installing its library
    module: ClassVar[str] = ""         # the library's import name
    trackers: ClassVar[dict[str, type["Tracker"]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.name:
            Tracker.trackers[cls.name] = cls

    def __init__(self, log_dir: Path, run_dir: Path, attempt: int, params: Mapping[str, Any]) -> None:
        self.log_dir, self.run_dir, self.attempt, self.params = Path(log_dir), Path(run_dir), attempt, dict(params)
        self.purged_from: Optional[int] = None

    @classmethod
    def named(cls, name: str) -> type["Tracker"]:
        from launcher.errors import UserError  # noqa: PLC0415  only for bad input

        if name not in cls.trackers:
            raise UserError(f"launcher.tracker={name}: not a tracker; give one of {', '.join(sorted(cls.trackers))}")
        return cls.trackers[name]

    @classmethod
    def missing(cls) -> Optional[str]:
        """What to install where the library is not importable here (None: it is)."""
        import importlib.util  # noqa: PLC0415

        if not cls.module or importlib.util.find_spec(cls.module) is not None:
            return None
        return f"{cls.module} is not installed (pip install 'xlaunch[{cls.extra}]')"

    @abc.abstractmethod
    def open(self, first_step: int) -> None: ...

    @abc.abstractmethod
    def log(self, step: int, values: Mapping[str, float], axis: str = "step") -> None: ...

    def flush(self) -> None:  # noqa: B027 - a tracker that writes as it goes has nothing to flush
        """Onto disk now: what was logged survives the process being killed."""

    def close(self) -> None:  # noqa: B027 - nor, then, anything to close
        """The run ends (its last values written)."""

    # --- the run's id, kept in the run dir ----------------------------------------------------

    def kept_id(self) -> Optional[str]:
        try:
            return json.loads((self.run_dir / TRACKER_FILE).read_text()).get(self.name)
        except (OSError, ValueError):
            return None

    def keep_id(self, run_id: str) -> None:
        path = self.run_dir / TRACKER_FILE
        try:
            kept = json.loads(path.read_text())
        except (OSError, ValueError):
            kept = {}
        kept[self.name] = run_id
        tmp = path.with_name(f"{path.name}.tmp")
        tmp.write_text(json.dumps(kept, indent=1) + "\n")
        tmp.replace(path)


class NoTracker(Tracker):
    name = "none"

    def open(self, first_step: int) -> None:
        pass

    def log(self, step: int, values: Mapping[str, float], axis: str = "step") -> None:
        pass


class TensorBoard(Tracker):
    name, title, extra, module = "tensorboard", "TensorBoard", "tensorboard", "tensorboardX"
    FLUSH_S = 5   # the writer's own thread flushes this often: a run followed live shows its steps

    def open(self, first_step: int) -> None:
        from tensorboardX import SummaryWriter  # noqa: PLC0415  optional: the tensorboard extra

        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.purged_from = first_step if self.attempt else None
        # A later attempt purges what the earlier ones wrote from its first step on. The suffix
        # keeps two writers of one host in one second (an attempt and its quick restart) apart.
        self._writer = SummaryWriter(logdir=str(self.log_dir), flush_secs=self.FLUSH_S, purge_step=self.purged_from,
                                     filename_suffix=f".attempt{self.attempt}")

    def log(self, step: int, values: Mapping[str, float], axis: str = "step") -> None:
        for tag, v in values.items():
            self._writer.add_scalar(tag, v, step)

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class WandB(Tracker):
    name, title, extra, module = "wandb", "W&B", "wandb", "wandb"

    def open(self, first_step: int) -> None:
        self._id = self.kept_id() or uuid.uuid4().hex[:12]
        self._axes: set[tuple[str, str]] = set()
        self._step: Optional[int] = None   # the last step this process logged
        self._init()
        self.keep_id(self._id)

    def _init(self) -> None:
        import wandb  # noqa: PLC0415  optional: the wandb extra

        mode = os.environ.get("WANDB_MODE") or ("online" if _wandb_has_key(wandb) else "offline")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._run = wandb.init(project=os.environ.get("WANDB_PROJECT", "xlaunch"), id=self._id, resume="allow",
                               name=self.run_dir.name, dir=str(self.log_dir), mode=mode, config=self.params,
                               settings=wandb.Settings(console="off", silent=True))
        for prefix, axis in sorted(self._axes):
            self._run.define_metric(prefix, step_metric=axis)
        self._logged = False

    def log(self, step: int, values: Mapping[str, float], axis: str = "step") -> None:
        self._logged = True
        if axis == "step":
            self._run.log(dict(values), step=step)
            self._step = step if self._step is None else max(step, self._step)
            return
        # Another count than the steps (an attempt's time accounting, once as it ends): W&B's
        # step only rises, and a new one would hide the restart's first steps, so these go into
        # the last step's row, plotted against their own metric, logged beside them.
        for tag in values:
            prefix = tag.rsplit("/", 1)[0] + "/*" if "/" in tag else tag
            if (prefix, axis) not in self._axes:
                self._run.define_metric(prefix, step_metric=axis)
                self._axes.add((prefix, axis))
        self._run.log({**values, axis: step}, step=self._run.step if self._step is None else self._step)

    def flush(self) -> None:
        # W&B's writer holds the run's last 32 KiB block in memory until the run finishes: a
        # process killed outright loses it (a short run's every step). So a flush (mode=train's,
        # at each checkpoint) finishes the run and resumes it, the same id: offline, one more
        # folder of the one run, which ``wandb sync`` joins.
        if self._logged:
            self._run.finish()
            self._init()

    def close(self) -> None:
        self._run.finish()


def _wandb_has_key(wandb: Any) -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return bool(wandb.Api().api_key)
    except Exception:  # noqa: BLE001 - no key, no network, no settings: offline
        return False


class MLflow(Tracker):
    name, title, extra, module = "mlflow", "MLflow", "mlflow", "mlflow"

    def open(self, first_step: int) -> None:
        from mlflow.entities import Metric, Param  # noqa: PLC0415  optional: the mlflow extra
        from mlflow.tracking import MlflowClient  # noqa: PLC0415

        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            # The run dir's own store, a folder, needing no database: MLflow 3 keeps its file
            # store in maintenance and asks for this to use it.
            uri = (self.log_dir / "mlruns").absolute().as_uri()
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self._client = client = MlflowClient(tracking_uri=uri)
        run_id = self.kept_id()
        self._last: dict[str, int] = {}
        if run_id is None:
            name = os.environ.get("MLFLOW_EXPERIMENT_NAME", "xlaunch")
            found = client.get_experiment_by_name(name)
            experiment = found.experiment_id if found is not None else client.create_experiment(name)
            run_id = client.create_run(experiment, run_name=self.run_dir.name).info.run_id
            params = [Param(k, str(v)[:500]) for k, v in self.params.items()]
            for i in range(0, len(params), 100):   # MLflow takes at most 100 a batch
                client.log_batch(run_id, params=params[i:i + 100])
            self.keep_id(run_id)
        else:  # the run again: its last step of each metric, not logged twice
            client.update_run(run_id, status="RUNNING")
            for key in client.get_run(run_id).data.metrics:
                self._last[key] = max(m.step for m in client.get_metric_history(run_id, key))
        self._run_id, self._metric = run_id, Metric

    def log(self, step: int, values: Mapping[str, float], axis: str = "step") -> None:
        now = int(time.time() * 1000)
        fresh = [self._metric(k, float(v), now, step) for k, v in values.items() if step > self._last.get(k, -1)]
        if fresh:
            self._client.log_batch(self._run_id, metrics=fresh)

    def close(self) -> None:
        self._client.set_terminated(self._run_id)


def params_of(config: Any, commit: str = "") -> dict[str, Any]:
    """A run's parameters: the resolved config flattened (``model.num_layers``) and the code's
    commit."""
    out: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, Mapping):
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        else:
            out[prefix] = value if isinstance(value, (int, float, str, bool)) or value is None else str(value)

    walk("", config or {})
    if commit:
        out["code_commit"] = commit
    return out


def tracker_for(name: str, log_dir: Path, run_dir: Path, attempt: int, params: Mapping[str, Any],
                warn: Callable[[str], Any]) -> Optional[Tracker]:
    """The tracker ``name``, or None (said once through ``warn``) where its library is missing."""
    cls = Tracker.named(name)
    missing = cls.missing()
    if missing:
        warn(f"{cls.title} scalars are not written: {missing}")
        return None
    return cls(log_dir, run_dir, attempt, params)
