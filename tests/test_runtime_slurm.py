"""The runtime in the tasks of a real Slurm step (the local front-end's ``srun``): these take
the front-end, so they run in its worker, never beside a deploy test's job or its outage."""
import os
import subprocess
import sys

from conftest import ROOT, need
from test_runtime import KNOBS, SCRIPTS

from modak_lib.results import parse_fom_lines


def test_the_tasks_of_an_srun_step_are_one_run(frontend, tmp_path):
    """A Slurm step's tasks each run the runtime (MODAK's job script starts a multi-node
    job's ranks with srun): one record, rank 0's, where each task printed its own; a trial's
    time cap ends both tasks (rank 1 stops at rank 0's word, not its own clock)."""
    need("torch")
    full = {k: v for k, v in os.environ.items() if k not in KNOBS}
    full.update(PYTHONPATH=str(ROOT), TMPDIR=str(tmp_path))
    cmd = ["srun", "-n", "2", "-N", "1", sys.executable, "-m", "modak_runtime", "--",
           str(SCRIPTS / "mlp.py")]
    for steps, env in (("40", {}), ("100000", {"MODAK_MAX_SECONDS": "8"})):
        proc = subprocess.run(cmd + [steps], capture_output=True, text=True, timeout=300,
                              cwd=ROOT, env={**full, **env})
        recs = parse_fom_lines(proc.stdout)
        assert proc.returncode == 0 and len(recs) == 1, proc.stderr[-2000:]
        assert recs[0]["effect"]["ranks"] == 2 and recs[0]["effect"]["launcher"] == "srun"
        assert recs[0]["status"] == ("ok" if not env else "capped")
    assert recs[0]["effect"]["stopped_by"] == "MODAK_MAX_SECONDS"
    assert not list(tmp_path.glob("modak-ranks-*"))


def test_a_script_written_for_torchrun_runs_as_the_tasks_of_an_srun_step(frontend, tmp_path):
    """MODAK starts a multi-node job's ranks with the scheduler's launcher, one runtime each:
    each rank of an srun step gets torchrun's variables from the runtime (rank, place on its
    node, and where the ranks meet: srun's node and a port from the job's number), so that a
    script written for torchrun forms its process group and trains as one run."""
    need("torch")
    full = {k: v for k, v in os.environ.items()
            if k not in KNOBS and k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}
    full.update(PYTHONPATH=str(ROOT), TMPDIR=str(tmp_path))
    proc = subprocess.run(["srun", "-n", "2", "-N", "1", sys.executable, "-m", "modak_runtime",
                           "--", str(SCRIPTS / "torchrun_ddp.py"), "20"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT, env=full)
    recs = parse_fom_lines(proc.stdout)
    assert proc.returncode == 0 and len(recs) == 1, proc.stderr[-2000:]
    (rec,) = recs
    assert rec["status"] == "ok" and rec["metrics"]["steps"] == 20, rec
    assert rec["effect"]["ranks"] == 2 and rec["effect"]["launcher"] == "srun"
    assert rec["effect"]["torchrun_variables"] == \
        "RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT"
    assert proc.stdout.count("final loss") == 1  # (rank 0's line: the ranks knew their place)
