"""``python -m launcher`` / ``xlaunch``: compose the config, validate it, submit, wait.

Everything about the run comes from the Hydra config tree in ``conf/``; see ``--help``.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from launcher import schema
from launcher.errors import BAD_INPUT

CONF_DIR = str(Path(__file__).resolve().parent.parent / "conf")


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")
def app(cfg: DictConfig) -> dict | None:
    from launcher.submit import JobFailed, launch, summarize

    # A config saved by an earlier run (--config-dir <run>/.hydra) has no defaults list, so
    # the schema is applied here too: a reproduced run is checked like a composed one.
    cfg = OmegaConf.merge(OmegaConf.structured(schema.Config), cfg)
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    signal.signal(signal.SIGTERM, _interrupt)  # `timeout`, `kill`: stop the job like Ctrl-C does
    try:
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
    schema.register()
    sys.argv[1:] = _saved_run_as_primary(sys.argv[1:])
    app()


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
