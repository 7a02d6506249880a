"""The python command a task runs: the host's interpreter, or one inside a container.

submitit starts every task as ``<python> -u -m submitit.core._submit <folder>``: in an sbatch
script (through a shell), from its local controller (``shlex.split``, no shell) or from our
mpirun/TPU scripts. So the command returned here is shell-quoted words that need no shell to run.

- singularity/apptainer share the host's environment, so the rank variables reach the task
  without help and the command can be spelt out in full: ``singularity exec --bind ... IMAGE
  [bash -c SETUP] python``. It appears verbatim in the sbatch script (and in dry runs).
- docker/podman start from a clean environment. The rank variables (``SLURM_PROCID``,
  ``OMPI_COMM_WORLD_RANK``, ...) exist only once the task has started, and docker cannot forward
  variables by prefix, so an executable wrapper written into the run dir lists them at run time
  and execs ``docker/podman run``; the command is the wrapper's path.

Either way the container sees the run dir, the launcher's source tree, the working directory
and a user's program's code directory (mode=run) at their host paths, so the pickled task, its
logs, its results and the program need no translation.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from launcher.clusters._shell import env_name, one_line, operand
from launcher.errors import UserError

WRAPPER_NAME = "container-python.sh"

# What the task needs from the environment it was started in: the rank (every launcher's
# spelling), submitit's job description, and the JAX/XLA settings. TPU_* covers GKE's TPU pods.
RANK_ENV_PATTERNS = ("SLURM_*", "SLURMD_*", "OMPI_*", "PMIX_*", "SUBMITIT_*", "XLAUNCH_*", "JAX_*", "XLA_*",
                     "TPU_*", "CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")
SOURCE_DIR = Path(__file__).resolve().parents[2]  # the launcher's code, as installed (editable)


def python_command(cfg, run_dir: Path, code_dir: Path | None = None) -> str:
    """The shell-quoted command submitit uses as "python" for this config's tasks (``code_dir``:
    the user's code they run, bound into a container)."""
    runtime = getattr(cfg.container.runtime, "value", cfg.container.runtime)
    if runtime == "none":
        return shlex.quote(sys.executable)
    if runtime == "singularity":
        return shlex.join(singularity_argv(cfg, Path(run_dir), code_dir))
    if runtime in ("docker", "podman"):
        wrapper = Path(run_dir) / WRAPPER_NAME
        wrapper.parent.mkdir(parents=True, exist_ok=True)
        wrapper.write_text(run_wrapper_text(cfg, Path(run_dir), runtime, code_dir))
        wrapper.chmod(0o755)
        return shlex.quote(str(wrapper))
    raise UserError(f"container.runtime={runtime}: unknown (use none, singularity, docker or podman)")


def singularity_argv(cfg, run_dir: Path, code_dir: Path | None = None) -> list[str]:
    c = cfg.container
    exe = operand("container.executable", c.executable or "singularity")
    # SINGULARITYENV_X becomes X inside (apptainer reads the same spelling): no list syntax to
    # split on, unlike --env.
    env = [f"SINGULARITYENV_{env_name('container.env', k)}={one_line(f'container.env.{k}', v)}"
           for k, v in c.env.items()]
    argv = (["env", *env] if env else []) + [exe, "exec"]
    argv += [f"--bind={m}" for m in _mounts(cfg, run_dir, code_dir)]
    argv += [one_line("container.options", o) for o in c.options]
    argv.append(operand("container.image", c.image))
    return argv + _inner_command(cfg)


def run_wrapper_text(cfg, run_dir: Path, runtime: str, code_dir: Path | None = None) -> str:
    """An executable script that runs ``python "$@"`` in a docker/podman container."""
    c = cfg.container
    exe = operand("container.executable", c.executable or runtime)
    image = operand("container.image", c.image)
    patterns = list(RANK_ENV_PATTERNS) + [env_name("cluster.env", k) for k in cfg.cluster.env]
    fixed = [f"--volume={m}" for m in _mounts(cfg, run_dir, code_dir)]
    fixed += [f"--workdir={one_line('working dir', Path.cwd())}"]
    fixed += [f"--env={env_name('container.env', k)}={one_line(f'container.env.{k}', v)}"
              for k, v in c.env.items()]
    fixed += [one_line("container.options", o) for o in c.options]
    user = ' --user="$(id -u):$(id -g)"' if runtime == "docker" else ""
    run = (f"exec {shlex.quote(exe)} run --rm --network=host --ipc=host{user} \\\n"
           f"  {' '.join(shlex.quote(a) for a in fixed)} \\\n"
           f"  \"${{env_args[@]}}\" {shlex.quote(image)} {shlex.join(_inner_command(cfg))} \"$@\"")
    return "\n".join([
        "#!/bin/bash",
        f"# Written by xlaunch for this run: the task's python, run inside {runtime} image {image}.",
        "# Called as: <this file> -u -m submitit.core._submit <folder>. The rank's variables exist",
        "# only now, so they are forwarded here, by name; docker cannot match a prefix itself.",
        "# --network=host: jax.distributed's coordinator and peers are reached at host addresses.",
        "# The task is the container's PID 1, which receives only signals it handles: submitit's",
        "# and Python's handlers cover SIGTERM, SIGUSR2 and SIGINT (and SIGKILL always works).",
        "set -euo pipefail",
        "env_args=()",
        "for name in $(compgen -e); do",
        f"  case \"$name\" in {'|'.join(patterns)}) env_args+=(\"--env=$name\") ;; esac",
        "done",
        run,
        "",
    ])


def _inner_command(cfg) -> list[str]:
    """What runs inside: python, after the in-container setup (e.g. LUMI's ``$WITH_CONDA``,
    which only means something inside the image) and the venv, when there are any."""
    c = cfg.container
    python = operand("container.python", c.python)
    lines = list(c.setup)
    if c.venv:
        lines.append(f"source {shlex.quote(one_line('container.venv', c.venv) + '/bin/activate')}")
    if not lines:
        return [python]
    script = "\n".join(lines + ['exec "$@"'])
    return ["bash", "-c", script, "xlaunch-container", python]


def _mounts(cfg, run_dir: Path, code_dir: Path | None) -> list[str]:
    """Run dir, source tree, working dir and the user's code dir (mode=run) at their host paths
    (a path inside another one is already visible), then container.binds as given."""
    auto: list[Path] = []
    paths = {Path(run_dir).resolve(), SOURCE_DIR, Path.cwd().resolve()} | ({Path(code_dir).resolve()} if code_dir else set())
    for p in sorted(paths, key=lambda p: (len(p.parts), str(p))):
        if not any(p == q or q in p.parents for q in auto):
            auto.append(p)
    out = []
    for p in auto:
        text = one_line("bind path", p)
        if "," in text or ":" in text:
            raise UserError(f"{text}: a path with ',' or ':' cannot be bind-mounted into a container; "
                            "run from (or set hydra.run.dir to) a path without them")
        out.append(f"{text}:{text}")
    return out + [operand("container.binds", b) for b in cfg.container.binds]
