"""A ``-m`` sweep at a glance: one table of its points, ``sweep.csv`` and ``sweep.png``.

- ``preflight.py``: Hydra's callback, which checks the whole sweep before its first job and
  records it in ``sweep.json`` (grid points, an optimizer's search space, the objective);
- ``points.py``: the sweep read back from its sweep dir, each point's state and figures;
- ``table.py``: the table (bounded to a screen) and ``sweep.csv``; ``chart.py``: ``sweep.png``.

``report`` is what the launcher prints when a sweep ends (``launcher/cli/main.py``) and what
``xlaunch sweep`` prints at any time (``launcher/cli/commands.py``). Nothing here imports JAX.
"""

from __future__ import annotations

import os
from pathlib import Path

from launcher.cli.sweep import chart, points, table


def report(sweep_dir: Path) -> tuple[str, points.SweepView]:
    """The sweep's table as text, with ``sweep.csv`` and ``sweep.png`` (re)written beside it
    where the sweep dir can be written; and the sweep as read."""
    view = points.read(sweep_dir)
    csv_path, drawn = view.dir / table.CSV, ""
    # Written whole or not at all (to a name of this process's, then renamed): the sweeping
    # process and an `xlaunch sweep` elsewhere may write them at once.
    part = f".{os.getpid()}.part"
    try:
        csv_part = csv_path.with_name(csv_path.name + part)
        csv_part.write_text(table.csv_text(view))
        csv_part.replace(csv_path)
        png = view.dir / chart.CHART
        path, what = chart.draw(view, png.with_name(png.stem + part + png.suffix))
        if path is not None:
            path.replace(png)
        drawn = f"chart: {png} ({what})" if path else what
    except OSError as e:  # a sweep dir read from elsewhere (read-only): the table alone
        csv_path, drawn = None, f"no sweep.csv or sweep.png: {view.dir} cannot be written ({e.strerror or e})"
    return table.text(view, csv_path, drawn), view


__all__ = ["report"]
