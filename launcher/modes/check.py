"""mode=check: is the job wired up? Every process reports itself, a psum over all global devices
is verified, and an all-gather bandwidth figure is measured (``launcher/modes/runs/check.py``)."""

from __future__ import annotations

from dataclasses import dataclass

from launcher.figures import Figure, Figures, devices, mib, seconds
from launcher.errors import UserError
from launcher.modes.base import ModeConfig


@dataclass
class Config(ModeConfig):
    name: str = "check"
    code: str = "check"
    allgather_mb: float = 4.0  # per-device payload of the bandwidth test
    repeats: int = 5
    # Measure the link model a prediction reads (mode=search mode.predict=true mode.links=<file>):
    # each collective within a node (over a process's devices) and across nodes (one device of
    # each process), written to the run dir's links.yaml (docs/predict.md). Run it with a process
    # per node, or per device as on LUMI, on two nodes at least.
    measure_links: bool = False
    # Timed runs of each collective at each size for measure_links: its figures are their mean,
    # so more runs, a steadier figure (12: about a minute on 2 processes x 4 CPU devices here).
    link_repeats: int = 12

    @classmethod
    def check(cls, mode, job) -> None:
        """Before submission (``launcher.cli.schema.validate``); ``job``: ``launcher.modes.checks.Job``."""
        if mode.get("link_repeats", 12) < 2:
            raise UserError(f"mode.link_repeats={mode.link_repeats}: must be at least 2 (the runs whose mean a "
                            "link's figures are; e.g. mode.link_repeats=12)")
        if mode.allgather_mb <= 0:
            raise UserError(f"mode.allgather_mb={mode.allgather_mb}: must be more than 0 (e.g. mode.allgather_mb=1)")


# --- what a run of it says (launcher/cli/console.py; a sweep's table: figures) ------------------------

figures = Figures((Figure("bandwidth", "bandwidth", "GB/s", False, lambda r: r["allgather_gbps"]),))


def answer(r: dict) -> str:
    hosts = r.get("hosts") or []
    psum = "ok" if r.get("psum_ok") else f"WRONG ({r.get('psum_value')}, expected {r.get('psum_expected')})"
    return "\n".join([
        f"check: {devices(r)} on {len(hosts)} host(s) ({', '.join(hosts)}): psum {psum}",
        f"all-gather of {mib(r.get('allgather_bytes_per_device', 0))} per device: "
        f"{r.get('allgather_gbps', 0.0):.3g} GB/s bus bandwidth (median {seconds(r.get('allgather_time_s', 0.0))})",
    ])


def line(r: dict) -> str:
    psum = "psum ok" if r.get("psum_ok") else "psum WRONG"
    return f"{r.get('global_devices')} devices, {psum}, all-gather {r.get('allgather_gbps', 0.0):.3g} GB/s"
