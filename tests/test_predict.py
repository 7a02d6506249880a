"""Plans for nodes one does not have (issue 64): the link model, the collectives read from XLA's
partitioned programs and priced on the links they cross, the prediction command for a LUMI and a
TPU-pod config, its plan trained by mode=train, and the link model measured by mode=check.

The prediction runs in the launcher's own process on virtual CPU devices, as on a login node; the
check that it matches measurement (the same plans run on 2 x 4, 4 x 2 and 8 x 1 processes) is a
bench (``bench/bench_predict.py``), not a test: it times things.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from launcher.errors import UserError
from launcher.models.train import memory_stats
from launcher.sharding.measuring.calibrate import chain_bytes
from launcher.sharding.predict import collectives, links, price, work
from launcher.sharding.predict.measure_links import LINK_SIZES
from tests.launch import read_result, run_cli

LUMI = links.load("lumi")


# --- the link model -------------------------------------------------------------------------------

def test_shipped_link_models_load_with_their_sources():
    assert {"lumi", "tpu-v5e", "h100"} <= set(links.shipped())
    for name in ("lumi", "tpu-v5e", "h100"):
        m = links.load(name)
        assert m.devices_per_node >= 4 and m.memory_bytes > 1e9 and m.flops("float32") > 1e12
        assert m.within.bytes_per_s > m.across.bytes_per_s   # the fast link is the fast one
        assert m.source and all(isinstance(v, str) and v for v in m.source.values())
        assert 1e11 < m.memory_bytes_per_s < math.inf and "memory_bandwidth" in m.source


def test_a_collective_within_a_node_follows_the_ring_formula():
    n, b = 8, 2**20
    within = LUMI.within
    got = LUMI.seconds("all-reduce", list(range(n)), b)
    want = 2 * (n - 1) / n * b / within.bytes_per_s + 2 * math.ceil(math.log2(n)) * within.latency_s
    assert got == pytest.approx(want)
    got = LUMI.seconds("all-gather", list(range(n)), b)
    assert got == pytest.approx((n - 1) / n * b / within.bytes_per_s + 3 * within.latency_s)
    assert LUMI.seconds("all-reduce", [0], b) == 0.0


def test_which_mesh_axes_cross_nodes():
    assert LUMI.crossing([128, 8]) == [0]            # the inner 8 stay on a node
    assert LUMI.crossing([8, 128]) == [0, 1]         # 128 devices span 16 nodes
    assert LUMI.crossing([128, 4, 2]) == [0]
    assert LUMI.crossing([8]) == []
    tpu = links.load("tpu-v5e")
    assert tpu.crossing([64, 4]) == []               # one 256-chip slice: ICI everywhere
    assert tpu.crossing([2, 256]) == [0]             # two slices: DCN between them


def test_crossing_nodes_costs_more_and_a_flat_model_more_still():
    b = 64 * 2**20
    inside = LUMI.seconds("all-reduce", list(range(8)), b)
    two_nodes = LUMI.seconds("all-reduce", list(range(16)), b)
    flat = dataclasses.replace(LUMI, hierarchical=False).seconds("all-reduce", list(range(16)), b)
    assert inside < two_nodes < flat
    # a group of one device per node moves everything over the slow link
    spread = LUMI.seconds("all-reduce", [0, 8], b)
    assert spread == pytest.approx(b / LUMI.across.bytes_per_s + 2 * LUMI.across.latency_s)


def test_a_collectives_own_figures_replace_the_links():
    d = json.loads(json.dumps({"name": "x", "device": {"name": "d", "memory_gb": 1, "matmul_tflops": {"float32": 1}},
                               "devices_per_node": 2, "within": {"latency_us": 1, "bandwidth_gb_s": 10,
                                                                 "by_collective": {"all-to-all": {"latency_us": 100,
                                                                                                  "bandwidth_gb_s": 1}}},
                               "across": {"latency_us": 2, "bandwidth_gb_s": 1}}))
    m = links.from_dict(d)
    assert m.seconds("all-to-all", [0, 1], 1e9) == pytest.approx(100e-6 + 0.5)
    assert m.seconds("all-gather", [0, 1], 1e9) == pytest.approx(1e-6 + 0.05)
    again = links.from_dict(__import__("yaml").safe_load(m.to_yaml()))
    assert again.seconds("all-to-all", [0, 1], 1e9) == pytest.approx(m.seconds("all-to-all", [0, 1], 1e9))


def test_a_measured_group_size_is_read_off_its_points_not_its_line(tmp_path):
    # gloo's ring all-reduce among 8: one float a twentieth of 4 KiB, flat from there to 64 KiB
    points = [[4, 900.0], [4096, 18000.0], [65536, 19000.0], [2**20, 40000.0]]
    d = {"name": "x", "device": {"name": "d", "memory_gb": 1, "matmul_tflops": {"float32": 1}},
         "devices_per_node": 1, "hierarchical": False,
         "within": {"latency_us": 1, "bandwidth_gb_s": 10},
         "across": {"latency_us": 3000, "bandwidth_gb_s": 0.5, "by_group_size": {8: {"all-reduce": {
             "latency_us": 3000, "bandwidth_gb_s": 0.5, "measured": points}}}}}
    m = links.from_dict(d)
    eight = list(range(8))
    assert m.seconds("all-reduce", eight, 4) == pytest.approx(900e-6)        # a scalar: its own point
    assert m.seconds("all-reduce", eight, 2) == pytest.approx(900e-6)        # less: nothing costs less
    assert m.seconds("all-reduce", eight, 2050) == pytest.approx((900 + (18000 - 900) * 2046 / 4092) * 1e-6)
    assert m.seconds("all-reduce", eight, 16384) == pytest.approx((18000 + 1000 * 12288 / 61440) * 1e-6)
    line = links._flat("all-reduce", 8, m.across.of("all-reduce", 8))
    assert m.seconds("all-reduce", eight, 2**21) == pytest.approx(40000e-6 + 2**20 / line.bytes_per_s)
    # a group size with no points, or another collective: the line, as before
    assert m.seconds("all-reduce", [0, 1, 2, 3], 4) == pytest.approx(links._flat(
        "all-reduce", 4, m.across.of("all-reduce", 4)).seconds(4))
    assert m.seconds("all-gather", eight, 4) == pytest.approx(links._flat("all-gather", 8, m.across).seconds(4))
    # written and read back, the points stay
    again = links.from_dict(__import__("yaml").safe_load(m.to_yaml()))
    assert again.across.measured == m.across.measured
    assert again.seconds("all-reduce", eight, 2050) == pytest.approx(m.seconds("all-reduce", eight, 2050))
    d["across"]["by_group_size"][8]["all-reduce"]["measured"] = [[0, 1.0]]
    bad = tmp_path / "bad.yaml"
    bad.write_text(__import__("yaml").safe_dump(d))
    with pytest.raises(UserError, match=r"across.by_group_size.8.all-reduce.measured: \[bytes, us\] pairs"):
        links.load(str(bad))


def test_a_calibration_chain_holds_the_bytes_it_says():
    assert chain_bytes("all-reduce", 8, 4) == 4               # one float, not one per device
    assert chain_bytes("all-gather", 8, 4) == 32              # the gathered end holds one per device
    assert chain_bytes("all-to-all", 4, 4096) == 4096
    assert chain_bytes("reduce-scatter", 3, 4096) == 4 * 1023  # a multiple of the group


def test_a_measured_line_turns_back_into_the_links_figures():
    line = links._flat("reduce-scatter", 4, links.Link(5e-6, 2e9))
    assert links.from_line("reduce-scatter", 4, line) == pytest.approx((5e-6, 2e9))


def test_bad_link_models_are_refused_with_what_to_do(tmp_path):
    with pytest.raises(UserError, match="no such link model; give one of h100, lumi, tpu-v5e"):
        links.load("nope")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\ndevice: {name: d, memory_gb: 1, matmul_tflops: {float32: 1}}\ndevices_per_node: 8\n"
                   "within: {latency_us: 1, bandwidth_gb_s: 0}\nacross: {latency_us: 1, bandwidth_gb_s: 1}\n")
    with pytest.raises(UserError, match="bandwidth_gb_s more than 0"):
        links.load(str(bad))
    bad.write_text("name: bad\n")
    with pytest.raises(UserError, match="not a link model: KeyError"):
        links.load(str(bad))


# --- the collectives of a partitioned program -----------------------------------------------------

def _compiled(fn, *args, shardings):
    return jax.jit(fn, in_shardings=shardings).lower(*args).compile()


def test_collectives_are_read_with_their_groups_bytes_and_trip_counts():
    mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("a", "b"))

    def step(w, x):
        def body(c, wi):
            return jnp.tanh(c @ wi), None
        y, _ = jax.lax.scan(body, x, w)
        return y.sum()

    grad = jax.grad(step)
    c = _compiled(grad, jnp.ones((3, 64, 64)), jnp.ones((16, 64)),
                  shardings=(NamedSharding(mesh, P(None, None, "b")), NamedSharding(mesh, P("a", None))))
    found = collectives.collectives(c.as_text(), 8)
    assert found, "a program split over two axes communicates"
    assert {x.count for x in found} >= {3}            # the scanned body's, once per layer
    for x in found:
        assert x.nbytes > 0
        flat = sorted(d for g in x.groups for d in g)
        assert flat == list(range(8)) or x.kind == "collective-permute"
    # over the batch axis "a" (devices 0, 2, 4, 6 apart by 2): split across "nodes" of 2 devices,
    # not within nodes of 8
    assert any(sorted(g) == [0, 2, 4, 6] for x in found for g in x.groups)
    one_node = collectives.comm_seconds(found, dataclasses.replace(LUMI, domain_devices=8))
    four_nodes = collectives.comm_seconds(found, dataclasses.replace(LUMI, domain_devices=2))
    assert four_nodes > one_node > 0
    # the same, with each partition's domain given as a process map would give it
    assert collectives.comm_seconds(found, LUMI, [d // 2 for d in range(8)]) == pytest.approx(four_nodes)
    assert collectives.from_json(json.loads(json.dumps(collectives.to_json(found)))) == found


def test_every_spelling_of_replica_groups_is_read():
    """XLA writes groups three ways; the newest names a mesh's axes over device ids."""
    assert collectives._groups("replica_groups={{0,1},{2,3}}, to_apply=%add", 4) == ((0, 1), (2, 3))
    assert collectives._groups("replica_groups=[2,4]<=[4,2]T(1,0), x", 8) == ((0, 2, 4, 6), (1, 3, 5, 7))
    assert collectives._groups("replica_groups={}, x", 4) == ((0, 1, 2, 3),)
    named = ("replica_groups=mesh['axis_0'=2,'axis_1'=1,'axis_2'=4], device_ids=([4,2]T(1,0)) {'axis_0'}, "
             "use_global_device_ids=true")
    # ids [0, 2, 4, 6, 1, 3, 5, 7] as a 2 x 1 x 4 mesh, grouped along axis_0: pairs
    assert collectives._groups(named, 8) == ((0, 1), (2, 3), (4, 5), (6, 7))
    assert collectives._groups("replica_groups=mesh['a'=2,'b'=4] {'b'}, x", 8) == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert collectives._groups("replica_groups=mesh['a'=2,'b'=4] {'a','b'}, x", 8) == (tuple(range(8)),)


def test_a_tuple_collective_costs_per_operand_where_the_link_model_says_so():
    c = collectives.Collective("all-reduce", 3000.0, ((0, 1, 2, 3),), 1, "ar", (1000.0, 1000.0, 1000.0))
    whole = c.seconds(LUMI)
    by_operand = c.seconds(dataclasses.replace(LUMI, operands_one_by_one=True))
    assert by_operand == pytest.approx(3 * LUMI.seconds("all-reduce", [0, 1, 2, 3], 1000.0))
    assert by_operand > whole == pytest.approx(LUMI.seconds("all-reduce", [0, 1, 2, 3], 3000.0))


def test_a_replicated_program_has_nothing_to_price():
    mesh = Mesh(np.array(jax.devices()), ("a",))
    c = _compiled(lambda x: (x * 2).sum(), jnp.ones((8, 8)), shardings=(NamedSharding(mesh, P()),))
    assert collectives.comm_seconds(collectives.collectives(c.as_text(), 8), LUMI) == 0.0


# --- the one model of a step: work, collectives, memory --------------------------------------------

def _scan(length: int):
    def f(x, w):
        def body(c, _):
            return jnp.tanh(c @ w), None
        return jax.lax.scan(body, x, None, length=length)[0]
    return jax.jit(f).lower(jnp.ones((128, 128)), jnp.ones((128, 128))).compile()


def test_a_scanned_bodys_work_counts_once_per_iteration():
    """XLA's own cost analysis counts a while body once; the model counts it per iteration."""
    ten, twenty = work.work(_scan(10).as_text()), work.work(_scan(20).as_text())
    assert ten.flops == {"float32": 10 * 2 * 128**3} and twenty.flops == {"float32": 20 * 2 * 128**3}
    # each iteration reads the carry and the weights and writes the carry: 3 x 64 KiB at least
    assert ten.nbytes >= 10 * 3 * 128 * 128 * 4
    assert twenty.nbytes - ten.nbytes == pytest.approx(ten.nbytes - work.work(_scan(0).as_text()).nbytes, rel=0.01)
    assert ten.seconds({"float32": 1e9}, 1e9) == pytest.approx(ten.flops["float32"] / 1e9 + ten.nbytes / 1e9)


def test_a_scan_over_stacked_layers_moves_each_layers_slice_not_the_stack():
    """A scanned body reads its layer's slice of the stacked weights and writes its slot of the
    stacked outputs in place: bytes grow with the layers, not with their square."""
    def stacked(layers: int):
        def f(x, ws):
            def body(c, w):
                y = jnp.tanh(c @ w)
                return y, y
            return jax.lax.scan(body, x, ws)
        return jax.jit(f).lower(jnp.ones((64, 64)), jnp.ones((layers, 64, 64))).compile()

    ten, forty = work.work(stacked(10).as_text()), work.work(stacked(40).as_text())
    layer = 64 * 64 * 4
    assert forty.nbytes / ten.nbytes == pytest.approx(4, rel=0.15)   # the whole stack per layer: 16
    assert ten.nbytes < 10 * 12 * layer   # each layer: its weights, the carry and its slot, a few times over


def test_a_plan_is_priced_as_its_work_plus_its_collectives_on_their_links():
    mesh = Mesh(np.array(jax.devices()), ("a",))
    c = _compiled(jax.grad(lambda w, x: jnp.tanh(x @ w).sum()), jnp.ones((64, 64)), jnp.ones((32, 64)),
                  shardings=(NamedSharding(mesh, P()), NamedSharding(mesh, P("a", None))))
    lumi = dataclasses.replace(LUMI, domain_devices=2)
    p = price.price(c, lumi)
    found = collectives.collectives(c.as_text(), 8)
    assert p.comm_s == pytest.approx(collectives.comm_seconds(found, lumi)) and p.comm_s > 0
    assert p.compute_s == pytest.approx(work.work(c.as_text()).seconds(lumi.flops_per_s, lumi.memory_bytes_per_s))
    assert p.step_s == pytest.approx(p.compute_s + p.comm_s)
    assert p.memory_bytes == memory_stats(c)["peak_bytes"] > 0   # XLA's analysis, as every run reports it
    # one process here: every partition in domain 0, so the gradient's all-reduce stays within
    assert price.process_domains(c) == [0] * 8
    assert price.price(c, lumi, price.process_domains(c)).comm_s < p.comm_s
    # a link model file counts domains of domain_devices over the devices numbered process by process
    assert price.node_domains(c, lumi) == [d // 2 for d in range(8)]


def test_the_models_scores_are_kendalls_tau_the_best_and_the_mean_error():
    s = price.scores([1.0, 2.0, 3.0], [1.1, 1.8, 3.3])
    assert s["kendall_tau"] == 1.0 and s["predicted_best_over_measured_best"] == 1.0
    assert s["mean_abs_error"] == pytest.approx((0.1 / 1.1 + 0.2 / 1.8 + 0.3 / 3.3) / 3)
    s = price.scores([2.0, 1.0, 3.0], [1.0, 2.0, 3.0])
    assert s["kendall_tau"] == pytest.approx(1 / 3) and s["predicted_best_over_measured_best"] == 2.0


# --- the command ----------------------------------------------------------------------------------

def _table_rows(text: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip("│").split("│")] for line in text.splitlines() if line.startswith("│")]


@pytest.mark.slow
def test_predict_for_lumi_nodes_ranks_every_plan_and_writes_the_best(tmp_path):
    run = tmp_path / "lumi"
    proc = run_cli("mode=search", "cluster=lumi", "cluster.nodes=2", "model=llama2-tiny", "model.batch_size=16",
                   "mode.predict=true", run_dir=run, timeout=600)
    out = proc.stdout
    assert "HiGHS" not in out + proc.stderr and "submitted" not in proc.stderr   # quiet, and nothing submitted
    r = read_result(run)
    assert r["devices"] == 16 and r["links"] == "lumi" and r["predict"]
    rows = r["ranked"]
    names = {row["plan"] for row in rows}
    assert {"dp", "fsdp", "dp_tp", "search"} <= names
    times = [row["predicted_step_time_s"] for row in rows if "skipped" not in row and row["fits"]]
    assert times == sorted(times) and all(t > 0 for t in times)
    for row in rows:
        if "skipped" in row:
            continue
        assert row["predicted_step_time_s"] == pytest.approx(row["predicted_compute_s"] + row["predicted_comm_s"])
        assert row["memory_per_device_gb"] > 0
        # which axes cross the 2 nodes, by the mesh: all 16 devices on one axis cross, [8, 2]'s first
        assert row["crossing_axes"] == LUMI.crossing(row["mesh_shape"])
    dp = next(row for row in rows if row["plan"] == "dp")
    assert dp["crossing_axes"] == [0] and dp["collectives"]["all-reduce"]["count"] > 0
    fsdp = next(row for row in rows if row["plan"] == "fsdp")
    assert fsdp["state_stored_split"] and fsdp["memory_per_device_gb"] < dp["memory_per_device_gb"]
    # the table on the screen is the ranking
    table = _table_rows(out)
    assert [t[1] for t in table] == [row["plan"] for row in rows]
    assert "axis 0 (2)" in out or "axis 0 (16)" in out
    assert f"best: {r['best']['plan']} on mesh {r['best']['mesh_shape']}" in out
    assert "link model: lumi" in out
    plan = json.loads((run / "plan.json").read_text())
    assert math.prod(n for _, n in plan["mesh"]) == 16 if "mesh" in plan else True
    assert Path(r["best"]["plan_file"]).read_text() == (run / "plan.json").read_text()


@pytest.mark.slow
def test_predict_for_a_tpu_pod_uses_its_chips_and_ici(tmp_path):
    run = tmp_path / "tpu"
    run_cli("mode=search", "cluster=tpu", "cluster.tpu_name=my-v5e-16", "cluster.nodes=4", "model=gpt-tiny",
            "model.batch_size=16", "mode.predict=true", "mode.mesh_shape=[[16],[8,2]]", run_dir=run, timeout=600)
    r = read_result(run)
    assert r["devices"] == 16 and r["devices_per_node"] == 4 and r["links"] == "tpu-v5e"
    assert r["meshes"] == [[16], [8, 2]]
    # one slice: nothing crosses the slow link
    assert all(row["crossing_axes"] == [] for row in r["ranked"])
    assert r["best"] is not None and (run / "plan.json").is_file()


@pytest.mark.slow
def test_a_predicted_plan_trains_with_mode_train(tmp_path):
    """Predicted for this machine's own arrangement (2 processes x 4 devices, a measured-like
    link model written here), the best plan is what mode=train takes."""
    mine = dataclasses.replace(LUMI, name="mine", devices_per_node=4, domain_devices=4)
    f = tmp_path / "mine.yaml"
    f.write_text(mine.to_yaml())
    run = tmp_path / "predict"
    run_cli("mode=search", "model=gpt-tiny", "mode.predict=true", f"mode.links={f}", "mode.mesh_shape=[[8],[4,2]]",
            run_dir=run, timeout=600)
    r = read_result(run)
    assert r["devices"] == 8 and r["nodes"] == 1
    train = tmp_path / "train"
    run_cli("mode=train", "model=gpt-tiny", f"mode.plan={run / 'plan.json'}", "mode.steps=3", run_dir=train,
            timeout=600)
    t = read_result(train)
    assert len(t["losses"]) == 3 and all(math.isfinite(x) for x in t["losses"])


def test_predict_refuses_a_missing_link_model_in_one_line(tmp_path):
    proc = run_cli("mode=search", "model=gpt-tiny", "mode.predict=true", "mode.links=nope", run_dir=tmp_path / "r",
                   check=False, timeout=120)
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "mode.links=nope" in lines[0] and "lumi" in lines[0]


def test_a_search_refuses_a_link_model_that_is_none_before_anything_runs(tmp_path):
    """Without mode.predict, mode.links names the link model the race's predictions use: a name
    or file that is none is refused in one line before submission."""
    proc = run_cli("mode=search", "model=gpt-tiny", "mode.links=nope", run_dir=tmp_path / "r", check=False,
                   timeout=120)
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and len(lines) == 1 and "mode.links=nope" in lines[0]
    assert not (tmp_path / "r" / "logs").exists()


def test_predict_on_a_cluster_without_a_default_link_model_says_which_to_give(tmp_path):
    proc = run_cli("mode=search", "cluster=slurm", "model=gpt-tiny", "mode.predict=true", run_dir=tmp_path / "r",
                   check=False, timeout=120)
    assert proc.returncode == 2 and "give mode.links=<h100|lumi|tpu-v5e>" in proc.stderr


@pytest.mark.slow
def test_mode_check_measures_a_link_model_the_prediction_reads(tmp_path):
    run = tmp_path / "check"
    run_cli("mode=check", "mode.measure_links=true", "mode.link_repeats=3", run_dir=run, timeout=600)
    r = read_result(run)
    m = links.load(r["links_file"])
    assert m.devices_per_node == 4 and m.domain_devices == 4 and not m.hierarchical
    assert set(m.within.by_collective) == set(m.across.by_collective) == {"all-reduce", "all-gather",
                                                                            "reduce-scatter", "all-to-all"}
    assert m.flops("float32") > 0 and m.memory_bytes > 0 and 0 < m.memory_bytes_per_s < math.inf
    assert 0 < m.launch_s < 0.1   # running a program at all: microseconds to milliseconds
    assert "measured" in m.source and "(3 repeats, the mean run" in m.source["measured"]
    # every collective at every group size keeps its points, one float the smallest
    for link, sizes in ((m.within, (2, 4)), (m.across, (2, 4, 8))):
        assert sorted(link.measured) == list(sizes)
        for n in sizes:
            assert set(link.measured[n]) == set(m.within.by_collective)
            assert [b for b, _ in link.measured[n]["all-reduce"]] == [float(b) for b in LINK_SIZES]
            assert all(t >= 0 for _, t in link.measured[n]["all-gather"])


@pytest.mark.slow
def test_a_sweep_predicts_each_node_count_in_a_process_of_its_own(tmp_path):
    """JAX fixes its device count once a process starts it: a -m sweep over cluster.nodes runs
    each prediction in a child process, so both points get their own count."""
    sweep = tmp_path / "sweep"
    run_cli("-m", "mode=search", "cluster=lumi", "cluster.nodes=1,2", "model=gpt-tiny", "model.batch_size=16",
            "mode.predict=true", "mode.mesh_shape=[]", "mode.baselines=[dp]", f"hydra.sweep.dir={sweep}",
            timeout=600)
    found = sorted((read_result(d)["devices"], d.name) for d in sweep.iterdir() if (d / "result.json").is_file())
    assert [n for n, _ in found] == [8, 16], found
