"""mode=check's run: every process reports itself, a psum over all global devices is verified,
and an all-gather bandwidth figure is measured. The options: ``launcher/modes/check.py``."""

from __future__ import annotations

import socket
import statistics
import time

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from launcher.jaxcompat import shard_map
from launcher.runtime import hosts
from launcher.runtime.status import read_statuses
from launcher.runtime.context import TaskContext


def run(ctx: TaskContext) -> dict:
    cfg = ctx.mode_cfg
    n = jax.device_count()
    mesh = Mesh(np.array(jax.devices()), ("d",))
    shard = NamedSharding(mesh, P("d"))

    me = {"process_id": ctx.rank.process_id, "host": socket.gethostname(),
          "local_devices": [str(d) for d in jax.local_devices()]}
    ctx.log.info("process %d on %s: local devices %s", me["process_id"], me["host"], me["local_devices"])
    # Every process's identity, gathered to all: proves the processes really talk to each other.
    ids = hosts.gather(np.array([ctx.rank.process_id, jax.local_device_count()]))
    processes = [{"process_id": int(p), "local_devices": int(c)} for p, c in np.asarray(ids).reshape(-1, 2)]

    # psum of each device's global index over all devices: n(n-1)/2 on every device.
    x = jax.make_array_from_callback((n,), shard, lambda idx: np.arange(n, dtype=np.float32)[idx])
    total = jax.jit(shard_map(lambda v: jax.lax.psum(v, "d"), mesh=mesh, in_specs=P("d"),
                              out_specs=P("d")))(x)
    got = hosts.fetch(total)
    expected = n * (n - 1) / 2
    psum_ok = bool(np.allclose(got, expected))
    ctx.log.info("psum over %d devices: %s (expected %s) -> %s", n, got[:4], expected, psum_ok)

    # All-gather bandwidth: each device contributes allgather_mb, every device ends with all of it.
    per_dev = max(int(cfg.allgather_mb * 2**20 / 4), 1)
    y = jax.make_array_from_callback((n * per_dev,), shard,
                                     lambda idx: np.ones(per_dev, np.float32))
    gather = jax.jit(shard_map(lambda v: jax.lax.all_gather(v, "d", tiled=True), mesh=mesh,
                               in_specs=P("d"), out_specs=P("d")))
    gather(y).block_until_ready()
    times = []
    for _ in range(cfg.repeats):
        t = time.perf_counter()
        gather(y).block_until_ready()
        times.append(time.perf_counter() - t)
    median = statistics.median(times)
    # Bus bandwidth as NCCL-tests defines it for all-gather: bytes received per device / time.
    bytes_moved = (n - 1) * per_dev * 4
    gbps = bytes_moved / median / 1e9
    ctx.log.info("all-gather %.1f MB/device: median %.4f s -> %.3f GB/s", cfg.allgather_mb, median, gbps)
    # Hosts come from the rank status files: every rank wrote its own before joining.
    host_of = {r: st.host for r, (st, _) in read_statuses(ctx.run_dir).items()}
    for p in processes:
        p["host"] = host_of.get(p["process_id"], "?")
    links = {}
    if cfg.get("measure_links"):
        from launcher.sharding.predict.measure_links import measure_links  # noqa: PLC0415 - only when asked

        model = measure_links(repeats=ctx.mode_cfg.link_repeats, name=f"{ctx.cfg.cluster.name}-measured")
        ctx.write_text("links.yaml", model.to_yaml())
        ctx.log.info("link model measured: %s (written to %s)", model.describe(), ctx.path("links.yaml"))
        links = {"links_file": str(ctx.path("links.yaml")), "links_described": model.describe()}
    return {
        **links,
        "processes": processes,
        "hosts": sorted(set(host_of.values())),
        "psum_ok": psum_ok,
        "psum_value": float(got[0]),
        "psum_expected": expected,
        "allgather_gbps": gbps,
        "allgather_time_s": median,
        "allgather_bytes_per_device": per_dev * 4,
    }
