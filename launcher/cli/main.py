"""``python -m launcher`` / ``xlaunch``: compose the config, validate it, submit, wait.

Everything about the run comes from the Hydra config tree in ``conf/``; see ``--help`` (its
text is ``hydra.help`` in ``conf/config.yaml``). ``xlaunch status|logs|cancel|runs`` follow and
stop jobs submitted earlier (``launcher/cli/commands.py``).
"""

from __future__ import annotations

import os
import re
import signal
import sys
from pathlib import Path

import hydra
import yaml
from hydra.core.hydra_config import HydraConfig
from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException
from omegaconf import DictConfig
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from launcher.cli import commands, schema
from launcher.errors import BAD_INPUT
from launcher.cli.submit import JobFailed, launch, summarize

# The config groups travel inside the package (launcher/conf; in the repository a link to conf/).
CONF_DIR = str(schema.CONF_DIR)


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")
def app(cfg: DictConfig) -> dict | None:
    _restore_full_error()  # composition is over: the job's own errors are reported as Hydra does
    run_dir = Path(HydraConfig.get().runtime.output_dir)
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
        sys.exit(2)
    except JobFailed as e:
        print(f"job failed: {e}", file=sys.stderr)
        sys.exit(1)
    if result is not None:
        summarize(result, run_dir)
    return result


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def main() -> None:
    if sys.argv[1:2] and sys.argv[1] in commands.COMMANDS:  # never a Hydra override (key=value)
        sys.exit(commands.main(sys.argv[1:]))
    schema.register()
    sys.argv[1:] = _saved_run_as_primary(sys.argv[1:])
    # Hydra prints a composition error over several lines and exits 1; with HYDRA_FULL_ERROR set
    # it raises instead, and the error becomes one line and exit status 2, as all bad input does.
    # (Unset again once the job starts: see app.)
    if _FULL_ERROR in os.environ:
        app()
        return
    os.environ[_FULL_ERROR] = "1"
    try:
        app()
    except Exception as e:  # noqa: BLE001 - only composition errors are translated
        message = composition_error(e, sys.argv[1:])
        if message is None:
            raise
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)
    finally:
        os.environ.pop(_FULL_ERROR, None)


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
            return f"{m.group(1)}={m.group(2)}: {first}; choose one of {', '.join(options)}"
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
