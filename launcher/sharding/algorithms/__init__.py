"""The sharding algorithms, one module each, registered by subclassing ``base.Algorithm``:
``cfp.py`` (CFP's profiling search) and ``ilp.py`` (the Alpa-style ILP). ``base.py`` says what an
algorithm provides; ``launcher/sharding/pipeline.py``'s ``run_search`` is the one orchestration
every caller (mode=search, ``autoshard``, the benches) runs them through."""
