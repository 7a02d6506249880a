"""What the passes and the race may be asked to do: one frozen dataclass per pass, passed whole.

    options = SearchOptions(profile=ProfileOptions(store_dir="store", memory_budget_gb=8),
                            baselines=("dp", "dp_tp"))
    profiled = cfp_profile.profile(analyzed, mesh, options.profile)   # algorithms/cfp/profile.py
    searched = pipeline.run_search(model, Cfp(options))      # launcher/sharding/algorithms/

An algorithm's options of its own are its class's, beside its module (the ILP's ``IlpOptions``,
``algorithms/ilp.py``), made from the settings the algorithm is given (``Algorithm.option_defaults``).

As Alpa passes its ``AutoShardingOption``. Each option has its one default here, and the comment
beside it says what it does and why the default is what it is. The modes' configs
(``launcher/modes/cfp_config.py``) take their defaults from these classes and build them with
``of(mode config)`` (the fields are named alike); a benchmark or a Python caller builds them
directly. Bad values are refused when an object is made (``UserError``, naming the mode option
that sets it), so the mode checks them before submission by making them.

No JAX here: the mode schemas import it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Mapping, Optional, TypeVar

from launcher.errors import UserError

T = TypeVar("T", bound="Options")
BASELINES = ("dp", "tp", "fsdp", "dp_tp", "ep")  # the built-in plans (models/plans.py) a search races by default
# A user's step (launcher/sharding/user/step.py) laid out as the user's own code lays it out (the
# in_shardings given with it): raced, and its nearest plan measured, like a built-in plan.
USER_BASELINE = "user"


class Options:
    """Options of a pass or of an algorithm: a frozen dataclass, made from a mode's config by ``of``."""

    @classmethod
    def of(cls: type[T], config: Mapping[str, Any], **given: Any) -> T:
        """The options from a mode's config, where each is the key of its name; ``given`` are
        the ones the config does not hold (or holds under another name). A field that is itself
        options (``SearchOptions.profile``) is made from the same config."""
        values = {}
        for f in dataclasses.fields(cls):
            if f.name in given:
                continue
            if isinstance(f.default, Options):
                values[f.name] = type(f.default).of(config)
            elif f.name in config:
                value = config[f.name]
                values[f.name] = tuple(value) if isinstance(value, Sequence) and not isinstance(value, str) else value
            else:
                raise KeyError(f"{cls.__name__}.of: the config has no {f.name!r}; give {f.name}=...")
        return cls(**values, **given)


@dataclass(frozen=True)
class ProfileOptions(Options):
    """The profile pass (``algorithms/cfp/profile.py: profile``): every plan combination of each unique segment,
    measured on the devices and kept in the profile store."""

    # Where measurements are kept, shared by runs: an entry is reused by every later run that
    # needs it, and a killed run resumes from what it stored.
    store_dir: str = "outputs/cfp_profiles"
    # Timed runs per candidate (the median counts). Cheap beside compiling it, and plans of a
    # small model differ by less than one run's noise.
    repeats: int = 10
    warmup: int = 1  # untimed runs before them
    # Every timed run after each device rewrote a buffer larger than its cache, as
    # triton.testing.do_bench does (measuring/timing.py). Off: on CPU devices it made segment
    # profiles over-predict the whole step as much as warm ones under-predict it
    # (bench/bench_cfp_additivity.py).
    cold_caches: bool = False
    max_segment_space: int = 128  # templates with more combinations are profiled in parts
    # Of each unit's combinations, profile the ones a rough cost model ranks first (compiling is
    # nearly all a cold search's time, and most of a layer's combinations are far from its best;
    # profile/estimate.py), and those of the plans nearest the baselines. 0: every combination,
    # as CFP's artifact.
    profile_top_k: int = 8
    # Measure every resharding between segments the search may use (CFP's artifact), instead of
    # pricing them with the mesh's calibrated all-gathers and all-to-alls (the ILP's cost model,
    # measured once per mesh and machine for every model: a few dozen programs, where the pairs
    # are hundreds). They are priced where the store holds the calibration, or the pairs would
    # take more programs than calibrating does; else measured.
    measure_resharding: bool = False
    memory_budget_gb: float = 0.0  # per device; 0: unlimited. The search's plans must fit it too
    # A combination no plan within memory_budget_gb can hold (its compiled memory plus the least
    # the other segments need, where known) is not timed (a later run with a larger budget times
    # it; profile/candidates.py).
    skip_over_budget: bool = True
    # A combination whose first 2 timed runs are all over this many times the fastest of its
    # segment timed so far is timed no further (its time, a bound, is stored as such; a later
    # run with a larger ratio or 0 times it in full). 0: time every combination in full.
    early_stop_ratio: float = 1.5
    # Time a segment's combinations in rounds, each once a round beside its overhead program, so
    # the machine's drift falls on all alike (it picked a unit's truly fastest combination in 65%
    # of units where one after another picked 60%; bench/bench_profile_timing.py). False: each
    # timed in full in turn, as CFP's artifact does.
    interleave: bool = True
    # Compile the next candidate while timing this one. None: yes on accelerators, no on CPU
    # devices, where the compiler and the timed program would share (and skew) the same cores.
    overlap_compile: Optional[bool] = None
    # Compile the profiled programs with XLA:CPU's quicker code generation: its LLVM IR emitters
    # (not its MLIR fusion emitters) and LLVM at O1 (profile/candidates.py: QUICK_CPU_COMPILE;
    # each where the jaxlib has it and XLA_FLAGS does not set it). On the profile's own programs
    # they compiled 1.7-1.9x faster in wall time, their kernels ran within 2% of the defaults'
    # (medians), and the combination they timed fastest was as close to the defaults' fastest as
    # timing the defaults' own executables again gets (worst regrets 1.00-1.15, the A/A's
    # 1.02-1.15; bench/bench_profile_compile.py, docs/benchmarks.md).
    # The shortlist, the race and the step the plan trains with compile under XLA's defaults.
    # None: yes on one process's CPU devices (a notebook's search: its cold Linen LM search took
    # 91 s against 147 s), no on accelerators (their options are not these) and in a job of
    # several processes (the default job's profile took 112-143 s against 124-147 s, most of it
    # not compiling, and in 2 of 7 runs CFP's own plan ended over 1.02x the best baseline, as in
    # none of 8 before: docs/autoshard.md).
    quick_compile: Optional[bool] = None

    def __post_init__(self) -> None:
        if self.early_stop_ratio < 0:
            raise UserError(f"mode.early_stop_ratio={self.early_stop_ratio}: must be 0 (off) or more (e.g. 1.5)")
        if self.profile_top_k < 0:
            raise UserError(f"mode.profile_top_k={self.profile_top_k}: must be 0 (every combination) or more (e.g. 8)")

    @classmethod
    def exhaustive(cls, **given: Any) -> "ProfileOptions":
        """CFP's artifact's profile: every combination, timed in full, every resharding measured
        (no top-k, no early stop; no budget unless ``given``), with ``given``'s other options."""
        return cls(**{"profile_top_k": 0, "early_stop_ratio": 0.0, "measure_resharding": True, **given})

    @property
    def memory_budget_bytes(self) -> Optional[float]:
        """The budget per device in bytes; None where there is none."""
        return self.memory_budget_gb * 2**30 if self.memory_budget_gb > 0 else None


@dataclass(frozen=True)
class SearchOptions(Options):
    """The search: the profile every algorithm plans under (its store, its memory budget), and
    the race of the plan kept beside the baselines, which answers (``pipeline.race_plans``).
    CFP's shortlist has options of its own (``algorithms/cfp/algorithm.py``: ``CfpOptions``)."""

    # The profile the search works from: its memory budget bounds the search's plans too.
    profile: ProfileOptions = ProfileOptions()
    # Of several logical meshes, profile only those whose best plan the ILP's calibrated cost
    # model prices within this many times the cheapest mesh's (ilp/gate.py). 0 (the default):
    # profile every mesh. Off because, on the presets over 2 processes x 4 devices, the model
    # priced the mesh CFP then measured fastest up to 1.61x the cheapest one, so a factor safe
    # there leaves out [8] at most, and pricing costs more than profiling it (39-51 s against
    # 14-19 s; bench/bench_mesh_gate.py, docs/cfp.md "The mesh gate").
    mesh_gate: float = 0.0
    # The answer (plan.json): the searched plan only where the final race measured it faster
    # than the fastest baseline by this fraction, round by round, else that baseline's: short
    # rounds cannot tell plans apart within their noise (bench/bench_cfp_search.py's A/A floor,
    # 0.01-0.07 on the tiny models), and there the baseline is the safe one (docs/cfp.md). CFP's
    # shortlist keeps the plan nearest a baseline by the same fraction (``CfpOptions``).
    verify_margin: float = 0.02
    # The plans the searched one races, built-in plans and (alpa_ilp) the Alpa-style ILP's.
    baselines: tuple[str, ...] = BASELINES
    iterations: int = 100  # training steps per round of each whole-model run
    run_repeats: int = 3  # interleaved rounds of the searched plan and the baselines
    # After the first round, a plan whose steps of a round (iterations, verify_iterations) took
    # longer than this runs only as many a round as take about this long, at least 2 (search/
    # race.py, race): the rounds, not the steps within one, are what the pairing works on. 0:
    # every round runs every step (mode=search's default, so mode.iterations means what it says;
    # autoshard's is 0.5: a user's step of 200 ms raced 10 steps a round, 2 s a plan).
    round_seconds: float = 0.0
    # After drop_after rounds, a built-in baseline over drop_slower_than times the fastest one in
    # every round so far runs no more (0: every baseline runs every round). What decides the
    # result is the searched plan over the fastest baseline; rounds spent on a plan twice as slow
    # do not narrow it (search/race.py, Cut).
    drop_after: int = 4
    drop_slower_than: float = 1.25
    seed: int = 0  # of the whole-step runs' parameters and data (a run's top-level seed)
    # Every plan raced is also predicted by one model of its step (predict/price.py: its program's
    # dots and bytes at the device's rates, its collectives on the links they cross), shown
    # beside its measured time, the model's error kept in result.json: what tells a user how far
    # to trust mode.predict's figures for hosts they do not have. The link model: mode.links (a
    # shipped name or a file), else this job's own, measured once (34 s on 2 processes x 4 CPU
    # devices here, alone, 2026-12-08) and kept in the user's cache for every later search on as
    # many processes and devices of that kind ($XLAUNCH_CACHE_DIR, default ~/.cache/xlaunch).
    # false: no prediction.
    price_race: bool = True
    links: Optional[str] = None
    # Timed runs of each collective at each size when this job's link model is measured (their
    # mean counts; mode=check mode.measure_links=true has the same option, 12 by default there).
    # Timing them is most of that measuring: 24 of its 34 s above at 6.
    link_repeats: int = 6

    def __post_init__(self) -> None:
        object.__setattr__(self, "baselines", tuple(self.baselines))
        if not 0 <= self.verify_margin < 1:
            raise UserError(f"mode.verify_margin={self.verify_margin}: must be a fraction from 0 (the fastest "
                            "measured plan wins) to below 1, e.g. 0.02")
        if self.drop_slower_than != 0 and not self.drop_slower_than > 1:
            raise UserError(f"mode.drop_slower_than={self.drop_slower_than}: must be a factor above 1 (a baseline "
                            "that much slower than the fastest in every round stops racing), e.g. 1.25, or 0 to "
                            "race every baseline every round")
        if self.mesh_gate != 0 and not self.mesh_gate >= 1:
            raise UserError(f"mode.mesh_gate={self.mesh_gate}: must be a factor of 1 or more (a mesh whose best "
                            "plan the ILP's cost model predicts that much slower than the best mesh's is not "
                            "profiled), e.g. 1.25, or 0 to profile every mesh")
        if not self.round_seconds >= 0:
            raise UserError(f"mode.round_seconds={self.round_seconds}: must be seconds, 0 or more (0: every round "
                            "runs mode.iterations steps), e.g. 0.5")
        if self.link_repeats < 2:
            raise UserError(f"mode.link_repeats={self.link_repeats}: must be at least 2 (the runs whose mean a "
                            "link's figures are; e.g. mode.link_repeats=6)")
        if self.drop_after < 1:
            raise UserError(f"mode.drop_after={self.drop_after}: must be a number of rounds, at least 1, e.g. 4")
        # Which baselines are neither built-in plans nor an algorithm's is the algorithms'
        # registry's to say: checked as the algorithm is made (algorithms/base.py, check_baselines).

