"""The front-end's job control (plugins/module_utils/modak_jobctl.py) against stand-in
scheduler commands: what it concludes when the scheduler answers, and when it does not."""
import json
import os
import sys

import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT / "build/collections"))
jobctl = pytest.importorskip("ansible_collections.modak.modak.plugins.module_utils.modak_jobctl")
sys.path.pop(0)

DOWN = "slurm_load_jobs error: Unable to contact slurm controller (connect failure)"


@pytest.fixture
def commands(tmp_path, monkeypatch):
    """commands(name=(exit code, stdout, stderr), ...): stand-ins first on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")

    def define(**answers):
        for name, (code, out, err) in answers.items():
            path = bin_dir / name
            path.write_text(f"#!/bin/sh\nprintf '%s' {json.dumps(out)}\n"
                            f"printf '%s' {json.dumps(err)} >&2\nexit {code}\n")
            path.chmod(0o755)
    return define


def job_output(tmp_path, exit_code=None):
    out = tmp_path / "job.out"
    lines = ["training..."]
    if exit_code is not None:
        lines.append(json.dumps({"modak": "job", "run_id": "r1", "exit_code": exit_code,
                                 "elapsed_s": 1.0}))
    out.write_text("\n".join(lines) + "\n")
    return str(out)


def test_a_slurm_controller_that_does_not_answer_is_not_a_final_state(commands, tmp_path):
    commands(squeue=(1, "", DOWN), sacct=(1, "", "sacct: error: Problem talking to the "
                                                  "database: Connection refused"),
             scontrol=(1, "", DOWN))
    status = jobctl.scheduler("slurm").status(str(tmp_path), "42", job_output(tmp_path))
    assert status.state == "UNKNOWN" and not status.terminal
    assert "did not answer" in status.reason and "still waiting" in status.reason


def test_a_job_slurm_forgot_ends_by_its_own_last_line(commands, tmp_path):
    gone = "slurm_load_jobs error: Invalid job id specified"
    commands(squeue=(1, "", gone), sacct=(1, "", "sacct: error: accounting storage disabled"),
             scontrol=(1, "", gone))
    status = jobctl.scheduler("slurm").status(str(tmp_path), "42", job_output(tmp_path, 0))
    assert (status.state, status.exit_code) == ("COMPLETED", 0)


def test_a_pbs_server_that_does_not_answer_is_not_a_final_state(commands, tmp_path):
    commands(qstat=(1, "", "Communication failure.\nqstat: cannot connect to server pbs"))
    status = jobctl.scheduler("pbs").status(str(tmp_path), "42.pbs", job_output(tmp_path))
    assert status.state == "UNKNOWN" and not status.terminal
