"""bench/bench_accelerator.py, the command a lent GPU host runs: its whole sequence on this
machine's CPU (``--cpu``, tiny sizes), the budget that keeps what was measured, the wheels a host
without network needs, and its refusal where there is no GPU."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.launch import REPO

BENCH = REPO / "bench" / "bench_accelerator.py"


def bench(*args: str, timeout: float = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCH), *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


@pytest.mark.heavy  # the whole GPU sequence on CPU (minutes); its stages each have a default test
def test_the_cpu_sequence_takes_every_figure_the_gpu_run_takes(tmp_path):
    out = tmp_path / "accelerator-cpu.json"
    proc = bench("--cpu", "--out", str(out), "--work", str(tmp_path / "work"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    got = json.loads(out.read_text())
    assert got["mode"] == "cpu" and got["failed"] == [] and got["date"]
    stages = got["stages"]
    assert list(stages) == ["versions", "peak", "check", "train", "trace", "replay", "cfp"]
    assert stages["versions"]["jax"] and stages["versions"]["platform"] == "cpu"
    assert stages["peak"]["tflops"] > 0 and stages["peak"]["n"] == 1024 and len(stages["peak"]["times_s"]) == 10
    assert stages["check"]["psum_ok"] is True and stages["check"]["platform"] == "cpu"
    assert set(stages["train"]) == {"gpt", "llama2", "moe"}
    for name, row in stages["train"].items():
        assert row["preset"] == f"{name}-tiny" and row["layers"] == 2
        assert row["step_time_s"] > 0 and row["tflops"] > 0
        assert row["tflops_over_peak"] == pytest.approx(row["tflops"] / stages["peak"]["tflops"])
        assert row["losses"][1] < row["losses"][0]  # it trained
    # The slowest model against the peak is traced; the CPU backend's trace has no device op line.
    trace = stages["trace"]
    assert trace["model"] == min(stages["train"], key=lambda n: stages["train"][n]["tflops_over_peak"])
    assert trace["device_ops"] is None and "CPU backend" in trace["why"]
    replay = stages["replay"]
    assert replay["model"] == "gpt-tiny" and replay["native_step_time_s"] == stages["train"]["gpt"]["step_time_s"]
    assert replay["before_optimizations"]["over_native"] > 0
    assert replay["before_optimizations"]["hlo_file"].endswith("jit_step.before_optimizations.txt")
    after = replay["after_optimizations"]
    # The CPU backend cannot compile an optimized module again (replay says why); a GPU may.
    assert "over_native" in after or "cannot compile" in after["refused"]
    (row,) = stages["cfp"]["rows"]
    assert row["model"] == "gpt-tiny" and row["cfp_over_best_paired"] > 0 and row["aa_floor"] >= 0
    assert row["predicted_over_measured"] > 0 and row["kept"]["mesh_shape"] == [8]


def test_a_run_out_of_budget_records_each_stage_as_skipped(tmp_path):
    out = tmp_path / "r.json"
    proc = bench("--cpu", "--budget-s", "0", "--only", "check", "replay", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    stages = json.loads(out.read_text())["stages"]
    assert stages == {"check": {"skipped": "the budget ran out"}, "replay": {"skipped": "the budget ran out"}}


def test_without_a_gpu_it_says_so_and_points_at_the_cpu_sequence(tmp_path):
    path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if not (Path(p) / "nvidia-smi").exists())
    assert shutil.which("nvidia-smi", path=path) is None
    proc = bench("--out", str(tmp_path / "r.json"), env={"PATH": path})
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines()[-1] == ("no NVIDIA GPU here (nvidia-smi not found): run with --cpu for "
                                                     "the CPU sequence")
    assert not (tmp_path / "r.json").exists()


def test_the_wheels_a_host_without_network_needs_install_for_its_python(tmp_path):
    proc = bench("--wheels", str(tmp_path / "whl"), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    wheels = sorted(p.name for p in (tmp_path / "whl").glob("*.whl"))
    names = {w.split("-")[0].lower() for w in wheels}
    assert names == {"hydra_core", "omegaconf", "antlr4_python3_runtime", "submitit", "highspy"}
    # Compiled ones are for the GPU images' CPython 3.12 on x86-64; the rest pure Python.
    for w in wheels:
        tags = w.removesuffix(".whl").split("-")[-3:]
        assert tags[:2] == ["py3", "none"] and tags[2] == "any" or (tags[0] == "cp312" and "x86_64" in tags[2]), w
    # antlr4 4.9.3 (what omegaconf 2.3 needs) is source only on PyPI: built here as pure Python.
    antlr = next((tmp_path / "whl").glob("antlr4*.whl"))
    assert "4.9.3" in antlr.name and any(n.endswith("METADATA") for n in zipfile.ZipFile(antlr).namelist())
