"""Sharding searches: how to lay a training step out over a mesh, and the proof, measured.

Every algorithm is a module of ``algorithms/`` (a ``base.Algorithm`` subclass, registered by
subclassing): CFP's profiling search (``algorithms/cfp/``, after "Profiling-based
Intra-operator Parallelism Generation by Preserving Communication-Free Structures", on stock
JAX) and the Alpa-style ILP (``algorithms/ilp.py``). Each plans a program on the logical meshes
analysed; one orchestration, ``pipeline.run_search``, which names no algorithm, analyses, has the
algorithm plan, races the plan beside the baselines and answers (``comparison.py``), for
mode=search, ``autoshard`` and the benches alike. CFP's three passes stay callable one by one
(``pipeline.analyze -> Analyzed``, CFP's ``profile.profile -> Profiled``, ``Cfp.search -> Planned``),
each taking its options object (``options.py``) and ``log``/``progress`` callbacks.

    algorithms/            base.py: the public algorithm API (what an algorithm is given and
                           returns: OnMesh, Planned, Hooks), the registry; ilp.py (the ILP, its
                           IlpOptions)
      cfp/                 CFP behind that API: algorithm.py (Cfp: its passes 2 and 3, the
                           shortlist and duel), profile.py (pass 2: profile, profile_meshes,
                           profiles.json, mode=profile's communication study)
    pipeline.py            the analysis, on one mesh or every mesh of mode.mesh_shape; run_search
    ahead/                 mode=search mode.predict=true: plans for N nodes not there (command.py,
                           the CLI's side; job.py, the prediction), above pipeline and predict/
    comparison.py          the race compared, once: the paired ratio, the verdict, Comparison
    behind.py              where a plan ran behind the fastest baseline: which blocks, why (asked of
                           Planned: its assignment, its duel, why its algorithm kept it)
    options.py             ProfileOptions, SearchOptions: every option, its one default
    results.py             the result.json fields of each pass, and the plan files (for the modes)
    program.py             shared: the training step CFP works on (TrainingProgram), from a model
    user/                  ... or from any function a user jits (user/step.py: what is read from it,
                           its baselines, StepProgram; user/reading.py: state, batch and loss as
                           users write them; user/api.py: autoshard -> AutoPlan: apply,
                           shardings, save/load, and mode=search mode.step's factory; the names
                           users import from ``launcher``; user/console.py: what autoshard shows,
                           quiet by default: a bar and the table, the details in a log file)
    autoshard.py           deprecated: an earlier release's import path of user/api.py (a shim)
    apply.py               shared: block plans -> layouts on a real mesh (Layouts), the mesh, the
                           constrained whole step, and the step transforms models.train takes
    report.py              the race's comparison table and chart (any algorithm's plan beside the baselines)

    measuring/             shared by every pass and both algorithms: measuring on the mesh
      timing.py            how a program is timed (the profile, the races, the calibration)
      quiet.py             retaking measurements the hypervisor interrupted
      store.py             the on-disk profile store (shared by runs, safe to kill)
      keys.py              the store keys of what depends on the mesh alone (devices, collective model)
      costmodel.py         latency + bytes / bandwidth per collective and mesh axes; resharding
      calibrate.py         that model measured on the mesh, once, into the store (the ILP prices
                           with it; CFP's profile prices resharding with it)

    analysis/              pass 1: what can be split, and how
      core.py              Analysis, analyze (a traced step), analyze_graph (an HLO module)
      graph.py             the jaxpr walk: the step as a flat operator graph (shared by every pass)
      hlo_text.py          the same graph from an HLO text module (read by launcher/hlo/text.py)
      contractions.py      tensor contractions and their dimension roles
      strategies.py        parallel strategies of a contraction on the mesh (Alpa's notation)
      propagation.py       how a partition propagates through each primitive without communication
      blocks.py            ParallelBlocks
      references.py        built-in plans' layouts in the space: the blocks offer them; nearest plans
      segments.py          unique segments by template matching over the block sequence

    profile/               pass 2: every plan combination of each unique segment, measured
      profiler.py          Profiler (runs the parts below in order) -> Profiles
      units.py             what is profiled: segments, or parts of them, and their combinations
      candidates.py        the candidate loop: compile, time, store each combination
      budget.py            a memory budget no plan can meet, refused as soon as that is known;
                           the segments' sum a first filter (UNITS_OVER_STEP)
      boundaries.py        tensors crossing between units; the resharding pairs they need
      keys.py              profile-store keys (PROFILE_VERSION)
      programs.py          programs timed besides segments: resharding, all-reduce latency,
                           the whole step's overhead program; gradient all-reduces per unit
      segment_program.py   a segment alone as a program, with synthetic inputs

    search/                pass 3's parts (algorithms/cfp/ runs them; its shortlist and duel are
                           algorithms/cfp/shortlist.py), and the race every plan runs
      dp.py                dynamic programming over the segment sequence; the shortlist
      meshes.py            the logical meshes of mode.mesh_shape=auto; for_each_mesh, the loop
                           every pass that works mesh by mesh goes through
      nearest.py           the plan nearest each built-in plan
      fit.py               plans within a memory budget as XLA allocates the whole step under them
      measure.py           the runners of whole steps: models.train's Trainer (Runner), a user's
                           step's (StepRunner), the baselines'; which one, the program says
      race.py              the race every plan runs: interleaved rounds, Cut, agreed, same_program
      studies.py           mode=profile's communication study, the mesh's all-reduce bandwidth
      comm.py              collectives of a compiled program (volume by kind)

    ilp/                   the comparison: Alpa's intra-operator ILP on the same program and mesh
                           (mode.algorithm=ilp, the alpa_ilp baseline; algorithms/ilp.py)
      operators.py         Alpa's graph: a node per contraction, the other operators following one
      formulate.py         node costs, edge costs, liveness memory rows
      solve.py             HiGHS (highspy) with Alpa's linearisation and the memory budget
      plan.py              the steps in order; the solution as block plans or per-contraction layouts

Folders build on one another without loops (``.ci/import_cycles.py``, each loose module here a
node of its own, no edge exempt): analysis/, then measuring/, profile/, search/, ilp/,
algorithms/, pipeline.py, user/, ahead/. Nothing here imports JAX at module level
except the modules that need it to do their work (users import the API from the package:
``from launcher import autoshard``, looked up when first used).
"""
