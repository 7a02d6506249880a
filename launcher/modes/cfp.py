"""mode=cfp: analysis, profile and search in order (CFP's whole pipeline).

The same pipeline as ``mode=search``, whose profile step measures whatever the store lacks; the
embedded default's main job.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from launcher.modes.search import Config as SearchConfig
from launcher.modes.search import run as run_search


@dataclass
class Config(SearchConfig):
    name: str = "cfp"


def run(ctx: Any) -> dict:
    return run_search(ctx)
