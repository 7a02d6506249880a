"""The launcher's side of ``mode=search mode.predict=true`` (no JAX here: the CLI imports it):
which link model, and the prediction (``job.py``) run in a process of its own."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from omegaconf import OmegaConf

from launcher.errors import UserError
from launcher.sharding.predict.links import shipped

if TYPE_CHECKING:
    from omegaconf import DictConfig

# The link model a cluster config predicts with when mode.links is not given.
DEFAULT_LINKS = {"lumi": "lumi", "tpu": "tpu-v5e"}
ERROR_FILE = "predict_error.txt"   # the child's bad input, one line, for the launcher to raise


def links_name(cfg: DictConfig) -> str:
    given = cfg.mode.get("links")
    if given:
        return str(given)
    name = DEFAULT_LINKS.get(str(cfg.cluster.name)) or DEFAULT_LINKS.get(str(cfg.cluster.get("backend")))
    if name is None:
        raise UserError(f"mode.predict=true on cluster={cfg.cluster.name}: no link model by default; give "
                        f"mode.links=<{'|'.join(shipped())}> or the path of one measured with mode=check "
                        "mode.measure_links=true")
    return name


def run_prediction(cfg: DictConfig, run_dir: Path) -> None:
    """``predict_job`` in a process of its own (JAX's virtual device count is fixed once a
    process starts JAX, and a ``-m`` sweep over ``cluster.nodes`` predicts for several counts
    in one launcher process): its progress and table on this terminal; its bad input raised here
    as UserError, one line; any other failure as RuntimeError naming its log."""
    config = run_dir / "predict_config.yaml"
    config.write_text(OmegaConf.to_yaml(cfg, resolve=True))
    (run_dir / ERROR_FILE).unlink(missing_ok=True)
    rc = subprocess.run([sys.executable, "-m", "launcher.sharding.ahead.job", str(run_dir)]).returncode
    if (run_dir / ERROR_FILE).is_file():
        raise UserError((run_dir / ERROR_FILE).read_text().strip())
    if rc != 0:
        raise RuntimeError(f"the prediction failed (exit status {rc}); see above and {run_dir / 'predict.log'}")
