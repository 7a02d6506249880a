"""mode=cfp: analysis, profile and search in order (CFP's whole pipeline): ``mode=search``'s code
with lighter defaults (``conf/mode/cfp.yaml``); the embedded default's main job.
"""

from __future__ import annotations

from dataclasses import dataclass

from launcher.modes.search import Config as SearchConfig
from launcher.modes.search import run  # noqa: F401  (mode=cfp runs mode=search's code)


@dataclass
class Config(SearchConfig):
    name: str = "cfp"
