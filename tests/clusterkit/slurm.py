"""A real SLURM on this machine, for tests: two pretend nodes, real accounting.

munged, mariadbd (bound to 127.0.0.1), slurmdbd, slurmctld and one slurmd per pretend node run
as this process's children, in the foreground, with all their state, logs, sockets and a fresh
munge key in one folder; nothing in /etc is touched. Ports are chosen free at start, so two test
sessions on one machine do not meet. Accounting is real so that submitit, which follows jobs
with ``sacct``, sees failures too (without slurmdbd ``sacct`` fails and a job whose tasks died
is waited on forever).

Needs (as root): slurm-wlm slurmctld slurmd slurm-client slurmdbd munge mariadb-server
(.ci/install.sh). If anything is missing or a daemon does not come up, ``start`` raises with
the reason and the daemon's log; it never skips.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from launcher.clusters.base import free_port

DAEMONS = ("munged", "mariadbd", "mariadb-install-db", "slurmdbd", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "srun", "sacct", "sinfo", "squeue", "scontrol", "scancel")


class SlurmStartError(RuntimeError):
    pass


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


class LocalSlurm:
    """``LocalSlurm(folder).start()``; then ``env`` (SLURM_CONF) points clients at it; ``stop()``."""

    def __init__(self, root: Path, nodes: tuple[str, ...] = ("node1", "node2"), cpus_per_node: int = 4):
        self.root = Path(root)
        self.nodes = nodes
        self.cpus_per_node = cpus_per_node
        self.host = socket.gethostname().split(".")[0]
        self.conf = self.root / "slurm.conf"
        self.munge_socket = self.root / "munge" / "munge.socket"
        self.procs: dict[str, subprocess.Popen] = {}

    @property
    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf)}

    def environ(self) -> dict[str, str]:
        return {**os.environ, **self.env}

    # -- start ----------------------------------------------------------------------------------
    def start(self, timeout: float = 60, attempts: int = 3) -> "LocalSlurm":
        for attempt in range(attempts):
            try:
                return self._start_once(timeout)
            except SlurmStartError as e:
                if "already in use" not in str(e) or attempt + 1 == attempts:
                    raise
                # A port taken free was taken again before its daemon bound it (``free_port``'s
                # ports come from the range every outgoing connection's do; once in a README run
                # on 2026-11-30): again, new ports, an empty folder.
                for child in self.root.iterdir():
                    shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
        raise AssertionError("unreachable")

    def _start_once(self, timeout: float) -> "LocalSlurm":
        missing = [b for b in DAEMONS + CLIENTS if shutil.which(b) is None]
        if missing:
            raise SlurmStartError(f"cannot start the test SLURM: {', '.join(missing)} not found; install them with "
                                  ".ci/install.sh (as root)")
        if os.geteuid() != 0:
            raise SlurmStartError("the test SLURM runs its daemons as root (SlurmUser=root); run the tests as root")
        # munged insists that every folder above its socket is searchable by all.
        self.root.mkdir(parents=True, exist_ok=True)
        for p in [self.root, *self.root.parents]:
            if not p.stat().st_mode & 0o001:
                raise SlurmStartError(f"{p} is not searchable by others, which munged refuses; put the SLURM "
                                      "folder elsewhere (e.g. under /tmp)")
        self.ports = {name: free_port() for name in ("ctld", "dbd", "db", *self.nodes)}
        deadline = time.monotonic() + timeout
        try:
            self._start_munge(deadline)
            self._start_mariadb(deadline)
            self._write_conf()
            self._start("slurmdbd", ["slurmdbd", "-D"], self.root / "slurmdbd.log")
            self._wait("slurmdbd", lambda: _port_open(self.ports["dbd"]), deadline, self.root / "slurmdbd.log")
            self._start("slurmctld", ["slurmctld", "-D", "-i"], self.root / "slurmctld.log")
            self._wait("slurmctld", lambda: self._run("scontrol", "ping").returncode == 0 and
                       "UP" in self._run("scontrol", "ping").stdout, deadline, self.root / "slurmctld.log")
            for node in self.nodes:
                self._start(f"slurmd-{node}", ["slurmd", "-D", "-N", node], self.root / f"slurmd-{node}.log")
            self._wait("slurmd", self._nodes_idle, deadline, self.root / f"slurmd-{self.nodes[0]}.log")
        except BaseException:
            self.stop()
            raise
        return self

    def _start_munge(self, deadline: float) -> None:
        d = self.munge_socket.parent
        d.mkdir(mode=0o755, exist_ok=True)
        key = d / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self._start("munged", ["munged", "-F", f"--socket={self.munge_socket}", f"--key-file={key}",
                               f"--pid-file={d / 'munged.pid'}", f"--log-file={d / 'munged.log'}",
                               f"--seed-file={d / 'munged.seed'}"], d / "munged.out")
        self._wait("munged", self.munge_socket.exists, deadline, d / "munged.log")

    def _start_mariadb(self, deadline: float) -> None:
        data = self.root / "db"
        out = subprocess.run(["mariadb-install-db", "--no-defaults", f"--datadir={data}", "--user=root",
                              "--auth-root-authentication-method=normal", "--skip-test-db"],
                             capture_output=True, text=True)
        if out.returncode:
            raise SlurmStartError(f"mariadb-install-db failed:\n{out.stdout}\n{out.stderr}")
        # No grant tables: the only client is slurmdbd, over 127.0.0.1, in a throwaway database.
        self._start("mariadbd", ["mariadbd", "--no-defaults", f"--datadir={data}", "--user=root",
                                 f"--socket={self.root / 'mysql.sock'}", f"--port={self.ports['db']}",
                                 "--bind-address=127.0.0.1", "--skip-grant-tables", "--skip-name-resolve",
                                 "--innodb-buffer-pool-size=32M", f"--pid-file={self.root / 'mysql.pid'}",
                                 f"--log-error={self.root / 'mysql.err'}"], self.root / "mysql.out")
        self._wait("mariadbd", lambda: _port_open(self.ports["db"]), deadline, self.root / "mysql.err")

    def _write_conf(self) -> None:
        r, auth = self.root, f"AuthInfo=socket={self.munge_socket}"
        dbd = self.root / "slurmdbd.conf"  # slurmdbd reads it from SLURM_CONF's folder
        dbd.write_text("\n".join([
            "AuthType=auth/munge", auth, f"DbdHost={self.host}", "DbdAddr=127.0.0.1", f"DbdPort={self.ports['dbd']}",
            "SlurmUser=root", f"PidFile={r / 'slurmdbd.pid'}", f"LogFile={r / 'slurmdbd.log'}",
            "StorageType=accounting_storage/mysql", "StorageHost=127.0.0.1", f"StoragePort={self.ports['db']}",
            "StorageUser=root", "StorageLoc=slurm_acct_db", "",
        ]))
        dbd.chmod(0o600)
        lines = [
            "ClusterName=xlaunch-test",
            f"SlurmctldHost={self.host}(127.0.0.1)",
            f"SlurmctldPort={self.ports['ctld']}",
            "SlurmUser=root", "SlurmdUser=root",
            "AuthType=auth/munge", "CredType=cred/munge", auth,
            # cgroups here are a v1/v2 hybrid: the cgroup plugins do not start.
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
            "MpiDefault=none", "ReturnToService=2", "MailProg=/bin/true",
            # Each pretend node claims more CPUs than the host has.
            "SlurmdParameters=config_overrides",
            "AccountingStorageType=accounting_storage/slurmdbd", "AccountingStorageHost=127.0.0.1",
            f"AccountingStoragePort={self.ports['dbd']}", "JobAcctGatherType=jobacct_gather/none",
            # The munge socket for talking to slurmdbd (AuthInfo covers only the cluster itself).
            f"AccountingStoragePass={self.munge_socket}",
            "JobCompType=jobcomp/none", "KillWait=5", "InactiveLimit=0",
            f"StateSaveLocation={r / 'state'}", f"SlurmctldPidFile={r / 'slurmctld.pid'}",
            f"SlurmctldLogFile={r / 'slurmctld.log'}",
            # Per node: both slurmd share one host, so spool, pid, log and TmpFS are per node name.
            f"SlurmdSpoolDir={r / 'spool-%n'}", f"SlurmdPidFile={r / 'slurmd-%n.pid'}",
            f"SlurmdLogFile={r / 'slurmd-%n.log'}", f"TmpFS={r / 'tmp-%n'}",
        ]
        for node in self.nodes:
            (r / f"tmp-{node}").mkdir(exist_ok=True)
            lines.append(f"NodeName={node} NodeHostname={self.host} NodeAddr=127.0.0.1 Port={self.ports[node]} "
                         f"CPUs={self.cpus_per_node} RealMemory=2000 State=UNKNOWN")
        lines.append("PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
        (r / "state").mkdir(exist_ok=True)
        self.conf.write_text("\n".join(lines) + "\n")

    def _nodes_idle(self) -> bool:
        states = self._run("sinfo", "-h", "-N", "-o", "%t").stdout.split()
        return len(states) == len(self.nodes) and all(s == "idle" for s in states)

    # -- helpers --------------------------------------------------------------------------------
    def _run(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(args, capture_output=True, text=True, env=self.environ(), timeout=30)

    def _start(self, name: str, argv: list[str], out: Path) -> None:
        with open(out, "ab") as f:
            self.procs[name] = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, env=self.environ(),
                                                start_new_session=True)

    def _wait(self, name: str, ready, deadline: float, log: Path) -> None:
        while time.monotonic() < deadline:
            dead = [n for n, p in self.procs.items() if p.poll() is not None]
            if dead:
                raise SlurmStartError(f"{', '.join(dead)} exited while starting the test SLURM\n{self._tail(log)}")
            if ready():
                return
            time.sleep(0.1)
        raise SlurmStartError(f"{name} did not come up in time\n{self._tail(log)}")

    @staticmethod
    def _tail(log: Path, lines: int = 20) -> str:
        try:
            return f"--- {log} ---\n" + "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return f"(no log at {log})"

    # -- stop -----------------------------------------------------------------------------------
    def stop(self) -> None:
        """Ends every job, daemon and leftover process of this SLURM (by PID, never by name)."""
        ctld = self.procs.get("slurmctld")
        if ctld is not None and ctld.poll() is None:
            # Let SLURM end its own jobs first: a job whose result is in can still be finishing.
            self._run("scancel", "--full", "--quiet", "--user=root")
            deadline = time.monotonic() + 15
            while self._run("squeue", "-h", "-o", "%i").stdout.strip() and time.monotonic() < deadline:
                time.sleep(0.2)
        for name in reversed(list(self.procs)):
            p = self.procs[name]
            if p.poll() is None:
                p.terminate()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs.clear()
        # What is left of job steps (slurmstepd can ignore SIGTERM; a batch script or srun whose
        # daemons are gone waits forever) carries this SLURM's SLURM_CONF in its environment.
        for pid in self.job_processes():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def job_processes(self) -> list[int]:
        """PIDs of the live processes of this SLURM's jobs: whatever carries its SLURM_CONF,
        except its daemons (slurmctld's helper slurmscriptd included), this process and this
        process's ancestors."""
        mark = f"SLURM_CONF={self.conf}".encode()
        daemons = {p.pid for p in self.procs.values()}
        spared, pid = set(daemons), os.getpid()
        while pid > 1:  # ourselves and whoever started us may have SLURM_CONF set too
            spared.add(pid)
            pid = _stat(pid)[1] or 0
        ctld = self.procs["slurmctld"].pid if "slurmctld" in self.procs else None
        found = []
        for d in Path("/proc").iterdir():
            if not d.name.isdigit() or int(d.name) in spared:
                continue
            state, parent = _stat(int(d.name))
            if state in (None, "Z") or parent == ctld:
                continue
            try:
                if mark in (d / "environ").read_bytes().split(b"\0"):
                    found.append(int(d.name))
            except OSError:
                continue
        return found


def _stat(pid: int) -> tuple[str | None, int | None]:
    """(state, parent pid) of a process, (None, None) if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return fields[0], int(fields[1])
    except (OSError, ValueError, IndexError):
        return None, None
