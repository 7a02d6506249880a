"""Executors whose job is a bash script run on this machine (mpirun, gcloud): shared mechanics.

The script's process id is the job id, as for submitit's local jobs, and the job object polls
that process the way submitit's LocalJob polls its controller. The script text is made by
``_make_submission_file_text`` alone, so what a dry run prints is what runs.
"""

from __future__ import annotations

import signal
import subprocess
import typing as tp
import uuid
from pathlib import Path

from submitit.core import core, utils
from submitit.local.local import LocalJob


class ScriptJob(LocalJob):
    """A job whose state is its script's process; cancelling sends SIGTERM to the script."""

    def cancel(self, check: bool = True) -> None:  # noqa: ARG002 - submitit's signature
        # Not SIGINT, submitit's local choice: a launcher started in the background by a
        # non-interactive shell (`nohup python -m launcher ... &`) hands its children SIGINT
        # ignored, and bash cannot trap a signal ignored on entry, so the script would go on.
        if self._process is not None:
            self._process.send_signal(signal.SIGTERM)


class ScriptExecutor(core.PicklingExecutor):
    """Subclasses give ``defaults`` (their parameters and default values),
    ``_make_submission_file_text``, ``_num_tasks`` and ``_check_available``."""

    job_class: tp.Type[ScriptJob] = ScriptJob
    defaults: tp.ClassVar[tp.Dict[str, tp.Any]] = {}

    def __init__(self, folder: tp.Union[str, Path], max_num_timeout: int = 3, max_pickle_size_gb: float = 1.0):
        super().__init__(folder, max_num_timeout=max_num_timeout, max_pickle_size_gb=max_pickle_size_gb)
        self.parameters = {k: (list(v) if isinstance(v, list) else v) for k, v in self.defaults.items()}

    @classmethod
    def _valid_parameters(cls) -> tp.Set[str]:
        return set(cls.defaults)

    def _internal_update_parameters(self, **kwargs: tp.Any) -> None:
        unknown = sorted(set(kwargs) - self._valid_parameters())
        if unknown:
            raise ValueError(f"{type(self).__name__}: unknown parameter(s) {unknown}; "
                             f"valid: {sorted(self._valid_parameters())}")
        super()._internal_update_parameters(**kwargs)

    def _check_available(self) -> None:
        """Raises UserError when the script's tools are missing here."""

    def _submit_command(self, command: str) -> ScriptJob:
        self._check_available()
        folder = utils.JobPaths.get_first_id_independent_folder(self.folder)
        folder.mkdir(parents=True, exist_ok=True)
        text = self._make_submission_file_text(command, uid="")
        tmp = uuid.uuid4().hex
        out, err = folder / f".{tmp}.out", folder / f".{tmp}.err"
        with out.open("w") as fout, err.open("w") as ferr:
            # The text is passed whole (no file for bash to open later); a session of its own lets
            # the job outlive the launcher (launcher.wait=false) and the terminal it came from.
            process = subprocess.Popen(["bash", "-c", text, "xlaunch-job"], stdout=fout, stderr=ferr,
                                       start_new_session=True)
        job = self.job_class(folder=self.folder, job_id=str(process.pid), process=process,
                             tasks=list(range(self._num_tasks())))
        job.paths.folder.mkdir(parents=True, exist_ok=True)
        job.paths.submission_file.write_text(text)
        for tmp_path, path in zip((out, err), self._script_logs(job), strict=True):
            tmp_path.rename(path)
        return job

    def _script_logs(self, job: ScriptJob) -> tp.Tuple[Path, Path]:
        """Where the script's own stdout and stderr go: task 0's submitit logs (what mpirun
        prints is the ranks' output)."""
        return job.paths.stdout, job.paths.stderr

    def _make_submission_command(self, submission_file_path: Path) -> tp.List[str]:
        return ["bash", str(submission_file_path)]

    @staticmethod
    def _get_job_id_from_submission_command(string: tp.Union[bytes, str]) -> str:
        raise NotImplementedError("the job id is the process id of the script")
