"""A sweep read back from its sweep dir: each point's overrides, state and headline figures.

The sweep dir holds ``sweep.json`` (``launcher/cli/sweep/preflight.py``: the sweeper, the points
known ahead, the objective, the sweeping process) and one run dir per point that has started,
each with Hydra's ``.hydra/overrides.yaml``. A point's state is its job's, as ``xlaunch status``
reads it (``launcher/cli/jobs.py``), so a sweep submitted with ``launcher.wait=false`` shows its
points queued, running or done from any shell; a point with no run dir yet is ``pending`` while
the sweep runs and ``not run`` once it has ended without it; a point refused before submission
is ``failed`` with the refusal, which ``record_failure`` wrote into its run dir. A sweep dir
from before ``sweep.json`` (or another tool's) is read from its run dirs alone.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import yaml

from launcher.cli import jobs
from launcher.errors import UserError
from launcher.runtime import timing
from launcher.figures import Figure, Figures, Objective, objective
from launcher.modes import MODES
from launcher.cli.schema import mode_codes
from launcher.cli.sweep.preflight import RECORD

FAILURE = "failure.txt"  # in a point's run dir: why it ended before a job was submitted
MULTIRUN = "multirun.yaml"  # Hydra's record of a sweep, in its sweep dir


@dataclass
class Point:
    num: int
    overrides: dict[str, str]  # key -> value, as given
    run_dir: Path
    state: str  # pending | starting | queued | running | requeued | done | failed | cancelled | dry run | not run | unknown
    detail: str = ""  # the failure's first line, the progress of a running job, ...
    result: Optional[dict] = None
    figures: list[Figure] = field(default_factory=list)
    mode: str = ""
    node_hours: Optional[float] = None   # its nodes for the time its allocation was held (timing.cost)

    def value(self, figure: Figure) -> Any:
        return figure.value(self.result) if self.result is not None else None


@dataclass
class SweepView:
    dir: Path
    points: list[Point]
    record: dict  # sweep.json ({} where there is none)
    running: bool  # the sweeping process is still at it
    objective: Optional[Objective]

    @property
    def varying(self) -> list[str]:
        """The keys whose values differ between the points (else the keys swept), in order."""
        keys: list[str] = []
        for p in self.points:
            keys += [k for k in p.overrides if k not in keys]
        differ = [k for k in keys if len({p.overrides.get(k) for p in self.points}) > 1]
        if differ:
            return differ
        searched = self.record.get("searched") or []
        return [k for k in keys if k in searched] or keys

    @property
    def figures(self) -> list[Figure]:
        """Every figure a point has, each once (by name), in the order the modes give them."""
        out: dict[str, Figure] = {}
        for p in self.points:
            for f in p.figures:
                out.setdefault(f.name, f)
        return list(out.values())

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for p in self.points:
            out[p.state] = out.get(p.state, 0) + 1
        return out


def is_sweep_dir(path: Path) -> bool:
    return (path / RECORD).is_file() or (path / MULTIRUN).is_file()


def find_sweep(path: Optional[str]) -> Path:
    """The sweep dir ``path`` names (a point's run dir names its sweep), or the newest sweep under
    ./multirun; UserError (one line) where there is none."""
    if path:
        p = Path(path)
        if not p.is_dir():
            raise UserError(f"{path}: no such directory; give a sweep dir (multirun/<date>/<time>) or none for the "
                            "latest sweep")
        if is_sweep_dir(p):
            return p.resolve()
        if is_sweep_dir(p.parent) and (p / ".hydra").is_dir():
            return p.parent.resolve()
        raise UserError(f"{path}: not a sweep dir (no {RECORD} or {MULTIRUN}); give the sweep dir a -m sweep printed "
                        "(multirun/<date>/<time>, or its hydra.sweep.dir)")
    found = [d for d in Path("multirun").glob("*/*") if d.is_dir() and is_sweep_dir(d)]
    if not found:
        raise UserError(f"no sweep under ./multirun of {Path.cwd()}: give the sweep dir (a -m sweep prints it)")
    return max(found, key=_started).resolve()


def _started(d: Path) -> float:
    for name in (RECORD, MULTIRUN):
        if (d / name).is_file():
            return (d / name).stat().st_mtime
    return 0.0


def read(sweep_dir: Path) -> SweepView:
    """Every point of the sweep in ``sweep_dir``, each with its state and figures."""
    sweep_dir = Path(sweep_dir).resolve()
    try:
        record = json.loads((sweep_dir / RECORD).read_text())
    except (OSError, ValueError):
        record = {}
    running = _still_running(record)
    planned = {int(p["num"]): p for p in record.get("points") or []}
    started = _run_dirs(sweep_dir, planned, since=record.get("started", 0.0) - _SLACK_S)
    points = []
    for num in sorted(set(planned) | set(started)):
        run_dir = started.get(num) or Path(planned[num].get("run_dir") or sweep_dir / str(num))
        overrides = _overrides(run_dir) if num in started else None
        if overrides is None:
            overrides = _split(planned.get(num, {}).get("overrides") or [])
        points.append(_point(num, overrides, run_dir, num in started, running))
    return SweepView(sweep_dir, points, record, running, _objective_of(record, points))


def record_failure(run_dir: Path, message: str) -> None:
    """A point that ended before its job was submitted (bad input found only then): why, for
    its row in the table."""
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    (Path(run_dir) / FAILURE).write_text(message.rstrip("\n") + "\n")


def mark_ended(sweep_dir: Path) -> None:
    """The sweeping process is done: its points that never ran will not."""
    path = Path(sweep_dir) / RECORD
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    record["ended"] = time.time()
    path.write_text(json.dumps(record, indent=1) + "\n")


def _still_running(record: dict) -> bool:
    """Whether the process that runs the sweep has not ended (as far as this host can tell)."""
    if not record or record.get("ended"):
        return False
    if record.get("host") != socket.gethostname():
        return True  # another host's: not known here, so not taken for ended
    try:
        os.kill(int(record["pid"]), 0)
    except (ProcessLookupError, KeyError, ValueError, TypeError):
        return False
    except PermissionError:
        return True
    return True


# A run dir made this long before its sweep's record is an earlier sweep's (in the same sweep dir).
_SLACK_S = 5.0


def _run_dirs(sweep_dir: Path, planned: dict[int, dict], since: float) -> dict[int, Path]:
    """The run dirs Hydra made in the sweep dir, by job number: those sweep.json planned, and any
    other (an optimizer's points) by the number in its .hydra/hydra.yaml, made ``since`` then (an
    earlier sweep's, in the same sweep dir, are not this one's)."""
    out = {num: Path(p["run_dir"]) for num, p in planned.items()
           if p.get("run_dir") and _made_since(Path(p["run_dir"]) / ".hydra", since)}
    known = {Path(p["run_dir"]) for p in planned.values() if p.get("run_dir")}
    for depth in range(1, 4):  # <sweep>/<subdir>/.hydra; a subdir may have a folder or two
        for hydra_dir in sweep_dir.glob("/".join(["*"] * depth) + "/.hydra"):
            if hydra_dir.parent in known or not _made_since(hydra_dir, since):
                continue
            try:
                job = yaml.load((hydra_dir / "hydra.yaml").read_text(), Loader=_LOADER)["hydra"]["job"]
                out.setdefault(int(job["num"]), hydra_dir.parent)
            except (OSError, KeyError, TypeError, ValueError, yaml.YAMLError):
                continue
    return out


def _made_since(hydra_dir: Path, since: float) -> bool:
    """Whether Hydra wrote this job's record (it does as the job starts) since ``since``."""
    try:
        return (hydra_dir / "hydra.yaml").stat().st_mtime >= since
    except OSError:
        return False


_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's where there is one: hydra.yaml is long


def _overrides(run_dir: Path) -> Optional[dict[str, str]]:
    try:
        listed = yaml.safe_load((run_dir / ".hydra" / "overrides.yaml").read_text()) or []
    except (OSError, yaml.YAMLError):
        return None
    return _split(listed)


def _split(overrides: list[str]) -> dict[str, str]:
    out = {}
    for o in overrides:
        key, _, value = str(o).partition("=")
        out[key.lstrip("+~")] = value
    return out


def _point(num: int, overrides: dict[str, str], run_dir: Path, started: bool, running: bool) -> Point:
    point = Point(num, overrides, run_dir, "pending" if running else "not run")
    if not started:
        return point
    if (run_dir / FAILURE).is_file():
        point.state, point.detail = "failed", _first_line((run_dir / FAILURE).read_text())
    elif (run_dir / jobs.JOB_FILE).is_file():
        _job_state(point)
    elif (run_dir / "submission.txt").is_file() or (run_dir / "submission.sh").is_file():
        point.state = "dry run"
    else:
        point.state = "starting" if running else "not run"
    point.mode = _mode_of(point)
    point.figures = _figures_of(point.mode).of(point.result)
    return point


def _job_state(point: Point) -> None:
    try:
        run = jobs.open_run(point.run_dir)
        st = jobs.job_state(run)
    except UserError as e:
        point.state, point.detail = "unknown", _first_line(str(e))
        return
    point.state = st.state
    spent = timing.summary(run.path, ended=st.finished)
    if spent:
        point.node_hours = timing.cost(spent, run.nodes)["node_hours"]
    if st.state == "done":
        point.result = run.result()
    elif st.detail:
        point.detail = _first_line(st.detail)


def _mode_of(point: Point) -> str:
    """The MODES entry the point ran (or will run)."""
    if point.result and point.result.get("mode_code"):
        return str(point.result["mode_code"])
    try:
        mode = yaml.safe_load((point.run_dir / ".hydra" / "config.yaml").read_text())["mode"]
    except (OSError, KeyError, TypeError, yaml.YAMLError):
        return ""
    return str(mode.get("code") or mode_codes().get(mode.get("name"), mode.get("name")))


def _figures_of(mode: str) -> Figures:
    return MODES[mode].figures if mode in MODES else Figures(open=True)


def _objective_of(record: dict, points: list[Point]) -> Optional[Objective]:
    """The sweep's objective (sweep.json's); for a sweep without one, the mode's own where every
    point ran one mode."""
    wanted = record.get("objective")
    modes = {p.mode for p in points if p.mode}
    if len(modes) != 1:
        return None
    figures = _figures_of(modes.pop())
    try:
        if wanted:
            return objective(figures, "", {"figure": wanted["figure"], "lower_is_better": wanted["lower_is_better"]})
        return None if record else objective(figures, "", {})
    except UserError:
        return None


def _first_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[0] if lines else ""
