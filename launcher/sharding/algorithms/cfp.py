"""CFP's profiling search as an algorithm: its profile pass over every mesh analysed (segment
combinations timed once per repeated segment, into the profile store), then its search pass (the
DP per mesh under the memory budget, the shortlist measured on the whole step). The analysis
before, and the race after, are the orchestration's (``pipeline.run_search``)."""

from __future__ import annotations

from typing import Any, Sequence

from launcher.sharding.algorithms.base import Algorithm, Hooks, Planned


class Cfp(Algorithm):
    name = "cfp"
    title = "CFP's plan"
    heading = "CFP plan"
    description = "CFP's profiling search"
    color = "tab:red"

    def plan(self, on: Sequence[Any], hooks: Hooks) -> Planned:
        from launcher.sharding import pipeline  # noqa: PLC0415 - JAX: the command line imports the registry

        options = self.options
        on = pipeline.profile_meshes(on, options.profile, is_main=hooks.is_main, log=hooks.log,
                                     progress=hooks.progress, baselines=options.baselines)
        hooks.write({o.folder + "profiles.json": o.profiles_json() for o in on})
        return pipeline.cfp_plan(on, options, log=hooks.log, progress=hooks.progress)
