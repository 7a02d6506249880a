"""``python -m launcher`` / ``xlaunch``: compose the config, validate it, submit, wait.

Everything about the run comes from the Hydra config tree in ``conf/``; see ``--help``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from launcher import schema
from launcher.errors import UserError

CONF_DIR = str(Path(__file__).resolve().parent.parent / "conf")


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")
def app(cfg: DictConfig) -> dict | None:
    from launcher.submit import JobFailed, launch, summarize

    # A config saved by an earlier run (--config-dir <run>/.hydra) has no defaults list, so
    # the schema is applied here too: a reproduced run is checked like a composed one.
    cfg = OmegaConf.merge(OmegaConf.structured(schema.Config), cfg)
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        schema.validate(cfg)
        result = launch(cfg, run_dir)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except JobFailed as e:
        print(f"job failed: {e}", file=sys.stderr)
        sys.exit(1)
    if result is not None:
        summarize(result, run_dir)
    return result


def main() -> None:
    schema.register()
    app()


if __name__ == "__main__":
    main()
