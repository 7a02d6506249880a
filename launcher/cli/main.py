"""``python -m launcher`` / ``xlaunch``: compose the config, validate it, submit, wait.

Everything about the run comes from the Hydra config tree in ``conf/``; see ``--help`` (its
text is ``hydra.help`` in ``conf/config.yaml``). ``xlaunch status|logs|cancel|runs|sweep`` follow
and stop jobs submitted earlier (``launcher/cli/commands.py``). A ``-m`` sweep is checked whole before
its first job (``launcher/cli/sweep/preflight.py``, Hydra's callback), goes on past a failed point,
and ends with its table (``launcher/cli/sweep/``); each point returns its objective's value, which
Hydra's optimizing sweepers (``hydra/sweeper=optuna``) optimize.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import sys
from pathlib import Path

import hydra
import yaml
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException
from omegaconf import DictConfig
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from launcher.cli import commands, schema, sweep
from launcher.cli.jobs import JOB_FILE
from launcher.cli.submit import JobFailed, JobInterrupted, launch, summarize
from launcher.cli.sweep import points, preflight
from launcher.errors import BAD_INPUT
from launcher.figures import formatted

# The config groups travel inside the package (launcher/conf; in the repository a link to conf/).
CONF_DIR = str(schema.CONF_DIR)


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")
def app(cfg: DictConfig) -> float | None:
    """One run (or one point of a ``-m`` sweep): checked, submitted, waited on, its answer printed.
    Returns its objective's value (``launcher.objective``: a headline figure of its mode), which
    Hydra's optimizing sweepers (hydra/sweeper=optuna) optimize; None without a result."""
    hydra_cfg = HydraConfig.get()
    sweeping = hydra_cfg.mode == RunMode.MULTIRUN
    if not sweeping:  # a sweep's failed points are handed to its sweeper (see main)
        _restore_full_error()  # composition is over: the job's own errors are reported as Hydra does
    run_dir = Path(hydra_cfg.runtime.output_dir)
    signal.signal(signal.SIGTERM, _interrupt)  # `timeout`, `kill`: stop the job like Ctrl-C does
    try:
        # A config saved by an earlier run (--config-dir <run>/.hydra) has no defaults list, so
        # the schemas are applied here too (a reproduced run is checked like a composed one),
        # and keys added with `+` that no schema has are refused.
        cfg = schema.typed(cfg)
        schema.validate(cfg)
        result = launch(cfg, run_dir)
    except BAD_INPUT as e:
        print(f"error: {e}", file=sys.stderr)
        if sweeping:
            if not (run_dir / JOB_FILE).exists():  # refused before submission: the table says why
                points.record_failure(run_dir, str(e))
            raise PointFailed(str(e)) from None
        sys.exit(2)
    except JobFailed as e:
        print(f"job failed: {e}", file=sys.stderr)
        if sweeping:
            # Ctrl-C ends the sweep, not only its point; a failed point is the sweeper's to weigh.
            raise KeyboardInterrupt if isinstance(e, JobInterrupted) else PointFailed(str(e)) from None
        sys.exit(1)
    if result is None:
        return None
    summarize(result, run_dir)
    objective = schema.objective_of(cfg)
    value = objective.value(result) if objective is not None else None
    if value is None and sweeping and objective is not None and not _grid(hydra_cfg):
        message = f"the result has no {objective.name} for hydra/sweeper to optimize (launcher.objective.figure)"
        print(f"error: {message}", file=sys.stderr)
        raise PointFailed(message)
    return value


class PointFailed(Exception):
    """A point of a sweep failed (its message printed already): its sweeper sees a failed job,
    Hydra's grid sweeper goes on with the other points, and the sweep ends with status 1."""


def _grid(hydra_cfg: DictConfig) -> bool:
    """Whether the sweeper is Hydra's own grid (it optimizes nothing)."""
    return str(hydra_cfg.sweeper.get("_target_", "")).endswith(".BasicSweeper")


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def main() -> None:
    if sys.argv[1:2] and sys.argv[1] in commands.COMMANDS:  # never a Hydra override (key=value)
        sys.exit(commands.main(sys.argv[1:]))
    schema.register()
    sys.argv[1:] = _saved_run_as_primary(sys.argv[1:])
    # Hydra prints a composition error over several lines and exits 1; with HYDRA_FULL_ERROR set
    # it raises instead, and the error becomes one line and exit status 2, as all bad input does.
    # (Unset again once a single run's job starts: see app. A sweep keeps it, so that a failed
    # point reaches here as itself, not as Hydra's traceback.)
    user_full_error = _FULL_ERROR in os.environ
    os.environ[_FULL_ERROR] = "1"
    # Hydra imports its sweeper plugins as it starts; Optuna's storage brings alembic, which logs
    # a line for each plugin of its own through the logging Hydra sets up: not the user's concern.
    logging.getLogger("alembic").setLevel(logging.WARNING)
    preflight.current = None
    failed = False
    try:
        app()
    except (PointFailed, KeyboardInterrupt):
        if preflight.current is None:
            raise
        failed = True  # each failure was printed as it happened; the table shows them all
    except preflight.Refused as e:  # the sweep's own checks, before its first job
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except preflight.Crashed as e:
        raise e.__cause__ from None
    except Exception as e:  # noqa: BLE001 - only composition errors are translated
        message = None if user_full_error else composition_error(e, sys.argv[1:])
        if message is None:
            raise
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)
    finally:
        if not user_full_error:
            os.environ.pop(_FULL_ERROR, None)
        if preflight.current is not None:
            _sweep_table(preflight.current.dir)
    if failed:
        sys.exit(1)


def _sweep_table(sweep_dir: Path) -> None:
    """The sweep's table, chart and CSV (launcher/cli/sweep/), and what an optimizing sweeper found."""
    points.mark_ended(sweep_dir)
    text, view = sweep.report(sweep_dir)
    print("\n" + text, flush=True)
    found = sweep_dir / "optimization_results.yaml"  # hydra/sweeper=optuna's answer, if this sweep's
    if found.is_file() and view.objective is not None and found.stat().st_mtime >= view.record.get("started", 0):
        best = yaml.safe_load(found.read_text()) or {}
        params = " ".join(f"{k}={v}" for k, v in (best.get("best_params") or {}).items())
        value = best.get("best_value")
        shown = formatted(view.objective.figure, float(value)) if isinstance(value, (int, float)) else value
        print(f"{view.record.get('sweeper', 'the sweeper')}'s best: {params or '(no parameter)'}: "
              f"{view.objective.name} {shown} ({found})", flush=True)


_FULL_ERROR = "HYDRA_FULL_ERROR"


def _restore_full_error() -> None:
    if os.environ.get(_FULL_ERROR) == "1" and not _user_full_error:
        os.environ.pop(_FULL_ERROR, None)


_user_full_error = _FULL_ERROR in os.environ


def composition_error(e: BaseException, argv: list[str]) -> str | None:
    """One line for an error Hydra raised while composing the config (None: not one of those)."""
    if isinstance(e, MissingConfigException):
        first = str(e).splitlines()[0].replace("In 'config': ", "")
        m = re.search(r"Could not find '([^']+)/([^']+)'", first)
        options = sorted(e.options or [])
        if m and options:
            plugin = " (Hydra's Optuna sweeper: pip install 'xlaunch[sweep]')" if m.group(1) == "hydra/sweeper" else ""
            return f"{m.group(1)}={m.group(2)}: {first}; choose one of {', '.join(options)}{plugin}"
        return first
    if isinstance(e, OverrideParseException):
        return str(e).splitlines()[0]
    if isinstance(e, ConfigCompositionException):
        cause = e.__cause__
        m = re.match(r"Could not override '([^']+)'", str(e))
        if m and isinstance(cause, (ConfigKeyError, ConfigAttributeError)):
            return schema.unknown_key_message(m.group(1), _selected("cluster", argv), _selected("mode", argv))
        m = re.match(r"Error merging override (\S+)", str(e))
        if m and isinstance(cause, OmegaConfBaseException):
            return f"{m.group(1)}: {str(cause).splitlines()[0]}"
        return " ".join(str(e).split())
    if isinstance(e, OmegaConfBaseException):
        key = getattr(e, "full_key", "")
        return f"{key}: {str(e).splitlines()[0]}" if key else str(e).splitlines()[0]
    return None


def _selected(group: str, argv: list[str]) -> str:
    """The option of ``group`` the command line selects (the last ``group=option``), else the default."""
    chosen = [a.split("=", 1)[1] for a in argv if a.startswith(f"{group}=")]
    if chosen:
        return chosen[-1]

    for entry in yaml.safe_load((Path(CONF_DIR) / "config.yaml").read_text()).get("defaults", []):
        if isinstance(entry, dict) and group in entry:
            return entry[group]
    return ""


def _saved_run_as_primary(argv: list[str]) -> list[str]:
    """``--config-dir <run>/.hydra --config-name config`` reproduces a run.

    Hydra searches an extra --config-dir after the app's own conf/, whose config.yaml would then
    win over the run's saved one. A run's .hydra folder holds the whole resolved config, so it
    becomes the primary config path instead.
    """
    out = list(argv)
    for i, arg in enumerate(out):
        flag, eq, value = arg.partition("=")
        if flag in ("--config-dir", "-cd"):
            path = value if eq else (out[i + 1] if i + 1 < len(out) else "")
            d = Path(path)
            if (d / "hydra.yaml").exists() and (d / "config.yaml").exists():
                if eq:
                    out[i] = f"--config-path={d.resolve()}"
                else:
                    out[i], out[i + 1] = "--config-path", str(d.resolve())
            break
    return out


if __name__ == "__main__":
    main()
