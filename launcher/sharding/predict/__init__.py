"""Plans for the job you will run, predicted before its allocation is spent (docs/predict.md).

- ``links.py``: the link model, a file a user reads and edits (``conf/links/*.yaml``): the
  device's matmul rate and memory, the fast link within a node (or TPU slice) and the slow one
  between them; from it, the ``CommModel`` of any logical mesh over any number of nodes.
- ``collectives.py``: the collectives XLA's partitioned program runs, read from its text, each
  priced on the link it crosses (how a plan measured on one host is predicted on several).
- ``work.py``: what one device computes in a step of the compiled program (dot FLOPs, bytes
  read and written, a scanned body counted per iteration);
- ``price.py``: the one model of a plan's step: its work at the device's rates, its collectives
  on their links, its memory as XLA analyses it; every race shows it beside the measured time,
  and ``job_links`` measures (once, into the profile store) the link model of the job's devices;
Its use for N nodes not there, ``mode=search mode.predict=true``, is ``launcher/sharding/ahead/``
(above the orchestration, which prices its races with this package).
"""
