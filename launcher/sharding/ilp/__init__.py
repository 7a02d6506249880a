"""CFP's comparison: Alpa's intra-operator pass, an ILP auto-sharding search, on stock JAX.

CFP reports its plans against Alpa's (up to 1.51x on GPT, 1.31x on LLaMA, 3.43x on MoE). Alpa
cannot be installed any more and JAX has no ``sharding.AUTO``, so its formulation is re-built
here over CFP's own analysis, and its plan runs through CFP's layouts mechanism, so the two
are measured side by side on the same program and mesh (``mode.baselines=[..., alpa_ilp]``,
``mode.algorithm=ilp``, ``bench/bench_cfp_ilp.py``).

    operators.py   Alpa's graph: a node per contraction, the operators between contractions
                   merged into their producer (Alpa's "following"); its strategies
    formulate.py   the ILP's terms: node costs (collectives), edge costs (resharding), the
                   liveness memory rows, priced by the collective cost model calibrated on the
                   mesh (``measuring/costmodel.py``, ``measuring/calibrate.py``: CFP's profile
                   prices resharding with it too)
    solve.py       HiGHS (highspy): Alpa's linearisation, the memory budget, bad input
    plan.py        the steps in order; the solution as a CFP block assignment where it is one,
                   else as per-contraction layouts; ``plan.json`` and the runner
"""

NAME = "alpa_ilp"   # the ILP's plan as a baseline: mode.baselines, the table, the chart, result.json
