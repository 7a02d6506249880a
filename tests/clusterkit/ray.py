"""A real Ray cluster on this machine, for tests: a head and a second worker node.

Both are ``ray start --block`` processes, children of this one, each a Ray node of its own (two
"nodes", as the tests' SLURM has two slurmd) with 2 CPUs and a small object store, the head's
port chosen free. Stopped by SIGTERM to those two processes (which drains and ends every Ray
process they started), never by ``ray stop``, which would end every Ray cluster on the machine.
If a node does not come up, ``start`` raises with its output; it never skips.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from launcher.clusters.base import free_port

NODE_OPTIONS = ["--num-cpus=2", "--object-store-memory=200000000", "--block"]
# The ports Ray binds by default unless told otherwise (GCS, Ray Client, dashboard, its agent's
# http); each node here is told its agent's port, so two nodes on one machine never share it.
RAY_DEFAULT_PORTS = {6379, 10001, 8265, 52365}


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _distinct_ports(count: int, taken: set[int] = frozenset()) -> list[int]:
    # Distinct free ports, none of them one Ray takes by default for a part we do not name: a
    # GCS port the kernel handed out once equalled the dashboard agent's fixed 52365 and the head
    # refused to start ("port ... used by other components").
    ports: list[int] = []
    while len(ports) < count:
        port = free_port()
        if port not in ports and port not in taken and port not in RAY_DEFAULT_PORTS:
            ports.append(port)
    return ports


class LocalRay:
    """``LocalRay().start()``; then ``address`` (host:port of the head); ``stop()``."""

    def __init__(self, nodes: int = 2):
        self.nodes = nodes
        self.port, self.client_port = _distinct_ports(2)
        self.address = f"127.0.0.1:{self.port}"
        self.client_address = f"ray://127.0.0.1:{self.client_port}"  # Ray Client, as KubeRay users reach a head
        self.logs = Path(tempfile.mkdtemp(prefix="xlaunch-ray-"))
        self.procs: list[subprocess.Popen] = []
        self.agent_ports: list[int] = []

    @property
    def env(self) -> dict[str, str]:
        # No usage reporting (there is no network), and the tasks' python finds this checkout.
        return {"RAY_USAGE_STATS_ENABLED": "0"}

    def _ray(self, *args: str, name: str) -> subprocess.Popen:
        log = open(self.logs / f"{name}.log", "w")  # noqa: SIM115 - the process holds it
        ray = Path(sys.executable).with_name("ray")
        agent_port, = _distinct_ports(1, taken={self.port, self.client_port, *self.agent_ports})
        self.agent_ports.append(agent_port)
        proc = subprocess.Popen([str(ray), "start", *args, f"--dashboard-agent-listen-port={agent_port}", *NODE_OPTIONS], stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, **self.env}, start_new_session=True)
        self.procs.append(proc)
        return proc

    def start(self, timeout: float = 90) -> "LocalRay":
        self._ray("--head", f"--port={self.port}", f"--ray-client-server-port={self.client_port}",
                  "--include-dashboard=false", name="head")
        deadline = time.monotonic() + timeout
        while not _port_open(self.port) and time.monotonic() < deadline and self.procs[0].poll() is None:
            time.sleep(0.2)  # the head's GCS answers: the other nodes may join now
        for i in range(1, self.nodes):
            self._ray(f"--address={self.address}", name=f"node{i}")
        self._wait_for(self.nodes, timeout)
        return self

    def alive_nodes(self) -> list[dict]:
        try:
            out = subprocess.run([sys.executable, "-m", "launcher.clusters.ray", "probe", self.address],
                                 capture_output=True, text=True, timeout=60, env={**os.environ, **self.env})
        except subprocess.TimeoutExpired:
            return []
        return json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 and out.stdout.strip() else []

    def _wait_for(self, count: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while len(self.alive_nodes()) < count:
            dead = [p for p in self.procs if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                logs = "\n".join(f"--- {p.name} ---\n{p.read_text()[-2000:]}" for p in sorted(self.logs.glob("*.log")))
                self.stop()
                raise RuntimeError(f"the test Ray cluster did not reach {count} node(s)\n{logs}")
            time.sleep(1)

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
