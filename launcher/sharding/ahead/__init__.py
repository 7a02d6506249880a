"""``mode=search mode.predict=true``: plans for N nodes you do not have, ranked by predicted step
time, on a login node or a laptop (docs/predict.md).

- ``command.py``: the launcher's side (no JAX: the CLI imports it): which link model, and the
  prediction run in a process of its own;
- ``job.py``: that process: every baseline and the search's plan for the N nodes' devices,
  analysed as the search analyses them (``pipeline.analyze``), each priced by the one model of
  a step (``launcher/sharding/predict/``, which the race uses too), the best written as a plan.

It sits above ``pipeline.py`` and ``predict/``, which import nothing of it.
"""
