"""A backend defined outside the package, as a user adds one: this module and one yaml
(tests/toy_conf/cluster/toy.yaml, found through ``hydra.searchpath``). It starts every task as a
background process of one bash script on this host, with the rank numbers as ``XLAUNCH_*``
variables: an executor and a job environment of its own, registered by subclassing."""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass

from launcher.clusters._script import ScriptExecutor
from launcher.clusters.base import Cluster, RankJobEnvironment, free_port
from launcher.clusters.config import ClusterConfig
from launcher.errors import UserError
from launcher.runtime.ranks import ExplicitEnv


@dataclass
class Config(ClusterConfig):
    backend: str = "toy"

    @classmethod
    def check(cls, cfg) -> None:
        if cfg.cluster.nodes != 1:
            raise UserError(f"cluster.nodes={cfg.cluster.nodes}: cluster=toy runs on this host only")


class ToyCluster(Cluster):
    backend = "toy"
    config = Config
    rank_env = ExplicitEnv

    @classmethod
    def choose_coordinator_port(cls, cfg) -> int:
        return free_port()

    def executor(self) -> "ToyExecutor":
        ex = ToyExecutor(self.folder)
        ex.update_parameters(tasks=self.cfg.cluster.tasks_per_node, port=self.coordinator_port,
                             setup=self.setup_lines())
        return ex

    def submission_text(self, executor: "ToyExecutor") -> str:
        return executor._make_submission_file_text("", uid="")


class ToyJobEnvironment(RankJobEnvironment):
    reader = ExplicitEnv
    _env = {"job_id": "SUBMITIT_TOY_JOB_ID"}


class ToyExecutor(ScriptExecutor):
    defaults = {"tasks": 1, "port": 0, "setup": []}

    def _num_tasks(self) -> int:
        return self.parameters["tasks"]

    def _make_submission_file_text(self, command: str, uid: str) -> str:
        p, folder = self.parameters, shlex.quote(str(self.folder))
        task = f"{shlex.quote(sys.executable)} -u -m submitit.core._submit {folder}"
        return "\n".join([
            "#!/bin/bash",
            f"export SUBMITIT_EXECUTOR=toy SUBMITIT_TOY_JOB_ID=$$ XLAUNCH_NUM_PROCESSES={p['tasks']} "
            f"XLAUNCH_COORDINATOR=127.0.0.1:{p['port']}",
            *p["setup"],
            f"for i in $(seq 0 {p['tasks'] - 1}); do",
            f"  XLAUNCH_PROCESS_ID=$i {task} > {folder}/$$_${{i}}_log.out 2> {folder}/$$_${{i}}_log.err &",
            "done",
            "status=0; for job in $(jobs -p); do wait $job || status=1; done; exit $status",
            "",
        ])
