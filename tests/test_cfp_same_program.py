"""A unit's profile reused on another mesh where it compiles to the same per-device program
(issue 64, point 1: ``StoreKeys.program``, ``CandidateLoop.same_program``).

Two meshes of the same 8 devices, [2, 4] then [2, 2, 2]: a combination splitting a tensor over
[2, 4]'s second axis and one splitting it over [2, 2, 2]'s last two put the same pieces on the
same devices. The second mesh's profile must reuse those entries instead of timing them, and
every pair it reuses must compile to the same program (checked here by compiling both)."""

from __future__ import annotations

import re

import jax
import pytest

from launcher.models.gpt import GPT
from launcher.sharding.analysis.core import analyze
from launcher.sharding.apply import make_mesh
from launcher.sharding.measuring.store import ProfileStore
from launcher.sharding.options import ProfileOptions
from launcher.sharding.profile.profiler import Profiler
from launcher.sharding.model_program import training_program
from tests.test_cfp_search import SMALL_GPT

pytestmark = pytest.mark.core

OPTIONS = ProfileOptions(repeats=2, warmup=1, overlap_compile=False, quick_compile=False)


def program_text(compiled) -> str:
    """A compiled program's computations without what names where it was traced from: the module's
    name and the file, function and stack-frame tables before its computations, and each
    instruction's metadata (the columns of a ``with_sharding_constraint`` differ between the two
    meshes' traces)."""
    lines = compiled.as_text().splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith(("%", "ENTRY")))
    return re.sub(r", metadata=\{[^}]*\}", "", "\n".join(lines[first:]))


@pytest.mark.slow
def test_a_program_measured_on_one_mesh_is_reused_on_another_not_timed_again(tmp_path):
    p = training_program(GPT(**{**SMALL_GPT, "num_layers": 1}))
    store, said = ProfileStore(tmp_path / "store"), []
    profilers = {}
    for shape in ([2, 4], [2, 2, 2]):
        a = analyze(p.step, p.args, shape)
        profilers[tuple(shape)] = Profiler(a, make_mesh(shape, jax.devices()[:8]), store, OPTIONS, log=said.append)
    first = profilers[(2, 4)].run()
    assert first.same_program == 0 and first.measured == first.profiled_configs
    second_profiler = profilers[(2, 2, 2)]
    second = second_profiler.run()

    # Some of [2, 2, 2]'s combinations were [2, 4]'s programs: reused, not measured.
    assert second.same_program > 0, said
    assert second.reused == second.same_program and second.measured == second.profiled_configs - second.same_program
    assert f"{second.same_program} of them as the same per-device program measured on another mesh" in "\n".join(said)

    # Each reused entry is [2, 4]'s, and names it; [2, 4]'s program and [2, 2, 2]'s are one.
    loop, other = second_profiler.loop, profilers[(2, 4)].loop
    by_program = {}
    for u, c in other.candidates():
        by_program[repr(other.program_key(u, c))] = (u, c)
    reused = [(kind, c, e) for kind, combos in second.table.items() for c, e in combos.items()
              if e.get("same_program_as")]
    assert len(reused) == second.same_program
    for kind, c, entry in reused:
        assert entry["same_program_as"] == [2, 4]
        u = loop.first[kind]
        u0, c0 = by_program[repr(loop.program_key(u, c))]
        assert entry["time_s"] == first.table[u0.kind][c0]["time_s"]
        assert program_text(loop.prepare(u, c)[0]) == program_text(other.prepare(u0, c0)[0]), (kind, c, c0)

    # The combinations not reused differ from every [2, 4] program in what the devices hold.
    for kind, combos in second.table.items():
        for c, entry in combos.items():
            if not entry.get("same_program_as"):
                u = loop.first[kind]
                assert repr(loop.program_key(u, c)) not in by_program
