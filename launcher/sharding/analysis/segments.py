"""Unique segments: repeated runs of ParallelBlocks (the layers) mapped onto templates.

Every block gets a structural signature: the multiset of its forward contractions (with their
roles, shapes and parameters) and its number of plans. The blocks of two identical layers have
equal signatures. The rest is left out because it varies at layer edges without changing the
layer: glue is where blocks meet; backward and optimizer operators pick up neighbours' work (the
first layer computes the position embedding's gradient where later layers compute the previous
layer's output-bias gradient, and gradient clipping's scalar sum of squares runs through every
layer); in a stack of layers with no embedding or head (the CFP paper's workloads,
``models/cfp_workloads.py``) the first layer computes no input gradient, its input being data,
and the last layer's forward operators compute the loss. CFP's own analysis matches layers the
same way, and likewise profiles a template on its first instance. Over the sequence of
signatures:

1. the longest periodic run is found: the period P and start s whose repetition covers the
   most blocks (at least two repeats; ties go to the shorter period, then the earlier start);
2. the repeating unit is cut into layers wherever its first block's signature recurs, so a
   GShard MoE unit (dense layer, MoE layer) becomes two layers with two different templates;
3. layers found in step 2 are also peeled off the run's ends (a fifth MoE layer after two
   MoE/dense units); the blocks before (the embedding) and after (the head) form one segment
   each;
4. every segment maps to the template of its signature sequence (first instance first).

Without a periodic run, layers start wherever the first recurring signature does and the last
block is the head (two layers that differ, like moe-tiny's MoE and dense layer); with no
recurring block at all the whole sequence is one segment.

Layers run by a loop (``lax.scan`` over stacked weights: MaxText, Levanter, Flax's
``nn.scan``/``nnx.scan``) appear once, in the loop's body: the blocks whose head is inside a
loop form their own run, cut into segments the same way, each run ``trips`` times per step (the
scan's length). CFP profiles such a segment once, as it profiles one instance of a template,
and the search counts it ``trips`` times. A template's sub-search space is
the list of its blocks' plan counts; CFP profiles the product of that list once per template
(``segment_space`` sums those products) instead of the product over all blocks of the model
(``exhaustive_space``).
"""

from __future__ import annotations

import hashlib
import itertools
import math
from dataclasses import dataclass, field
from typing import Sequence

from launcher.sharding.analysis.blocks import Block
from launcher.sharding.analysis.graph import Graph


@dataclass
class Segment:
    index: int
    start: int      # first block
    end: int        # one past the last block
    template: int
    trips: int = 1  # how often a step runs it: a loop body's segment, the loop's trip count
    loop: int | None = None  # the loop op whose body it is (None: the step's top level)

    @property
    def blocks(self) -> range:
        return range(self.start, self.end)


@dataclass
class Template:
    id: int
    signature: tuple[str, ...]   # block signatures
    plan_counts: list[int]
    instances: list[int] = field(default_factory=list)  # segment indices

    @property
    def space(self) -> int:
        return math.prod(self.plan_counts)


def block_signature(g: Graph, b: Block) -> str:
    parts = []
    for i in b.ops:
        role = b.roles.get(i)
        if role is None or role in ("bwd", "recompute"):
            continue
        op = g.ops[i]
        outs = ",".join(g.vars[v].type_str for v in op.outputs)
        ins = ",".join(g.vars[v].type_str if v is not None else "lit" for v in op.inputs)
        parts.append(f"{op.prim}|{op.phase}|{role}|{ins}->{outs}|{sorted(op.params.items())}")
    # Sorted: HLO text may print two identical layers' operators in different (equally valid)
    # topological orders.
    parts = sorted(parts) + [f"plans={b.num_plans}"]
    # Plans added for hand-written plans (references.py) are part of what a template profiles;
    # blocks without them keep the signature they had before such plans existed.
    parts += [f"offered={b.plans[k].axes}" for k in sorted(b.references)]
    return hashlib.sha1("\n".join(parts).encode()).hexdigest()[:12]


def find_segments(signatures: Sequence[str], plan_counts: Sequence[int], loops: Sequence[int | None] | None = None,
                  trips: dict[int, int] | None = None) -> tuple[list[Segment], list[Template]]:
    """Segments and templates of the block sequence. ``loops``: per block, the loop whose body
    holds its head (None at the top level): each run of blocks in one loop is cut on its own;
    ``trips``: each loop's trip count."""
    loops = list(loops) if loops is not None else [None] * len(signatures)
    ids = _intern(signatures)
    cuts = []
    for (loop, run) in itertools.groupby(range(len(ids)), key=loops.__getitem__):
        run = list(run)
        cuts += [(run[0] + c, loop) for c in _layer_cuts(ids[run[0]:run[-1] + 1])[:-1]]
    cuts.append((len(ids), None))
    segments: list[Segment] = []
    templates: list[Template] = []
    by_sig: dict[tuple[str, ...], Template] = {}
    for (a, loop), (b, _) in itertools.pairwise(cuts):
        sig = tuple(signatures[a:b])
        t = by_sig.get(sig)
        if t is None:
            t = Template(len(templates), sig, list(plan_counts[a:b]))
            by_sig[sig] = t
            templates.append(t)
        seg = Segment(len(segments), a, b, t.id, (trips or {}).get(loop, 1) if loop is not None else 1, loop)
        t.instances.append(seg.index)
        segments.append(seg)
    return segments, templates


def _layer_cuts(ids: Sequence[int]) -> list[int]:
    """Block indices where segments start, plus ``len(ids)``."""
    n = len(ids)
    period, start, repeats = _longest_periodic_run(ids)
    if repeats >= 2:
        unit = ids[start:start + period]
        offsets = [i for i in range(period) if unit[i] == unit[0]]
        layers = [tuple(unit[a:b]) for a, b in zip(offsets, offsets[1:] + [period], strict=True)]
        cuts = [start + r * period + i for r in range(repeats) for i in offsets]
        lo, hi = start, start + repeats * period
        # A layer that does not complete the period (an odd MoE layer count) still maps onto
        # its template: peel known layers off the run's two ends.
        grown = True
        while grown:
            grown = False
            for layer in layers:
                if tuple(ids[hi:hi + len(layer)]) == layer and hi + len(layer) < n:
                    cuts.append(hi)
                    hi += len(layer)
                    grown = True
                if lo - len(layer) > 0 and tuple(ids[lo - len(layer):lo]) == layer:
                    lo -= len(layer)
                    cuts.append(lo)
                    grown = True
        cuts += [0, hi]
    else:
        # No periodic run (e.g. one MoE and one dense layer): layers start where the first
        # signature that recurs does; the last block is taken as the head.
        counts: dict[int, int] = {}
        for i in ids:
            counts[i] = counts.get(i, 0) + 1
        first = next((i for i in ids if counts[i] > 1), None)
        cuts = [0]
        if first is not None:
            cuts += [k for k, i in enumerate(ids) if i == first]
            if n - 1 > cuts[-1]:
                cuts.append(n - 1)
    return sorted(set(c for c in cuts if c < n)) + [n]


def _intern(signatures: Sequence[str]) -> list[int]:
    table: dict[str, int] = {}
    return [table.setdefault(s, len(table)) for s in signatures]


def _longest_periodic_run(ids: Sequence[int]) -> tuple[int, int, int]:
    """(period, start, repeats) of the repetition covering the most elements; repeats 0 if none.

    For each period P, runs of i with ids[i] == ids[i + P] of length L give L + P periodic
    elements starting at the run's first i: O(n^2) in C-speed list comparisons at worst."""
    n = len(ids)
    best = (0, 0, 0, 0)  # (coverage, -period, -start, repeats) maximised
    for p in range(1, n // 2 + 1):
        i = 0
        while i + p < n:
            if ids[i] != ids[i + p]:
                i += 1
                continue
            j = i
            while j + p < n and ids[j] == ids[j + p]:
                j += 1
            repeats = (j - i + p) // p
            if repeats >= 2:
                cand = (repeats * p, -p, -i, repeats)
                if cand > best:
                    best = cand
            i = j + 1
    coverage, neg_p, neg_s, repeats = best
    return -neg_p, -neg_s, repeats
