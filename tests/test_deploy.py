"""The deploy path for real: playbooks/deploy.yml against the front-end of scripts/frontend.

Slurm and its PBS wrappers, SSH with a pinned host key, images built on the front-end by
rootless Podman and by Charliecloud, jobs that complete, fail, run out of time or are
cancelled.  The module's fixture starts the front-end through the project's own script
and stops it again if it started it.
"""
import concurrent.futures
import json
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import time
import uuid

import pytest
from conftest import ROOT
from deploying import QUICK, USER_REQUEST, copy_model, ok, plan_json, user_project

from modak_lib.models import Configuration
from modak_lib.results import ResultsStore, parse_fom_lines

pytestmark = pytest.mark.slow


@pytest.fixture
def deploy(tmp_path, frontend, fitted_model):
    # a work directory of its own: runs of earlier test sessions cannot answer for this one
    work = f"modak-test-{uuid.uuid4().hex[:8]}"
    store = tmp_path / "results.sqlite"
    # the session's fitted model (a copy: this test's records may refit it), and no refit
    # after each run unless the test is about the closed loop (modak_refit=True)
    copy_model(fitted_model, tmp_path)

    def run(playbook="deploy.yml", env=None, request=QUICK, inputs=None, **extra):
        # the quick blueprint runs MODAK's reference script: name its folder explicitly
        files = [str(ROOT / "workloads")] if request == QUICK else []
        variables = {"modak_request": str(request), "modak_work_dir": work,
                     "modak_job_files": files,
                     "modak_plan_dir": str(tmp_path / "plans"),
                     "modak_results_dir": str(tmp_path / "results"),
                     "modak_inputs": inputs or {}, "modak_job_timeout": 600,
                     "modak_job_poll": 3, "modak_refit": False, **extra}
        vars_file = tmp_path / f"vars-{uuid.uuid4().hex[:6]}.json"
        vars_file.write_text(json.dumps(variables))
        full_env = dict(os.environ, MODAK_RESULTS=str(store), ANSIBLE_NOCOLOR="1",
                        MODAK_MODEL=str(tmp_path / "model.joblib"),
                        ANSIBLE_FORCE_COLOR="0", **(env or {}))
        proc = subprocess.run(["ansible-playbook", f"playbooks/{playbook}", "-e",
                               f"@{vars_file}"], cwd=ROOT, env=full_env, capture_output=True,
                              text=True, timeout=1800)
        proc.recap = _recap(proc.stdout)
        return proc

    run.store = ResultsStore(store)
    run.tmp = tmp_path
    run.work = pathlib.Path("/home/hpcuser") / work  # the front-end user's run directories
    yield run
    # (each test's run directories went on filling the front-end user's home, 2 MB a test)
    shutil.rmtree(run.work, ignore_errors=True)


def _recap(out: str) -> dict:
    m = re.search(r"frontend\s+:\s+(.*)", out.split("PLAY RECAP")[-1])
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(1))} if m else {}


def _task(out: str, name: str) -> str:
    """The first result line ('ok', 'changed', 'skipping', 'fatal') of a task."""
    block = out.split(f"{name}]")[1] if f"{name}]" in out else ""
    m = re.search(r"^(ok|changed|skipping|fatal|FAILED)", block.split("TASK [")[0], re.M)
    return m.group(1) if m else ""


def test_slurm_podman_end_to_end_then_nothing_twice(deploy):
    first = deploy()
    ok(first)
    assert re.search(r"job \d+ COMPLETED \(exit code 0\)", first.stdout)
    assert _task(first.stdout, "Submit the job (once per run)") == "changed"
    # the wait reports the scheduler's state and the time since submission at every poll
    polls = re.findall(r"^\[frontend\] job (\d+) ([A-Z_]+).*, (\d+):(\d\d):(\d\d) since "
                       r"submission$", first.stdout, re.M)
    assert polls and polls[-1][1] == "COMPLETED" and "RETRYING" not in first.stdout
    assert len({p[0] for p in polls}) == 1
    rows = deploy.store.rows()
    # 3 warm-up steps of the script and its 20 (the runtime counts every optimizer step)
    assert len(rows) == 1 and rows[0]["source"] == "deploy" and rows[0]["steps"] == 23
    assert rows[0]["image"] == "pytorch-2.13.0-cpu" and rows[0]["s_per_step"] > 0
    # the run leased its image before looking for it and gave the lease back when its job
    # ended: the listing (playbooks/images.yml) has the image, used just now
    plan = json.loads(next((deploy.tmp / "plans").glob("*/plan.json")).read_text())
    ref, safe = plan["image"]["reference"], re.sub(r"[^A-Za-z0-9_.-]", "_",
                                                   plan["image"]["reference"])
    used = pathlib.Path("/home/hpcuser/modak-images/.used")
    assert (used / f"{safe}.last").stat().st_mtime > time.time() - 600
    assert not (used / safe / plan["run_id"]).exists()
    listing = subprocess.run(["ansible-playbook", "-i", "inventories/local",
                              "playbooks/images.yml"], cwd=ROOT, capture_output=True,
                             text=True, timeout=300)
    ok(listing)
    assert re.search(r'"%s \(podman, [\d.]+ GB\): last used 0\.0 days ago' % re.escape(ref),
                     listing.stdout), listing.stdout[-3000:]

    # two more deploys of the run at once: nothing submitted, recorded or fetched twice
    # (one of them without a wheelhouse: an image that exists needs none)
    no_wheels = deploy.tmp / "no-wheels"
    no_wheels.mkdir()
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        twins = list(pool.map(lambda extra: deploy(**extra),
                              [{}, {"modak_wheelhouse": str(no_wheels)}]))
    for second in twins:
        ok(second)
        assert second.recap["changed"] == 0, second.stdout[-3000:]
        assert _task(second.stdout, "Look for the image (built once per recipe hash)") == "ok"
        assert _task(second.stdout, "Build it, or attach to its build running now") == "skipping"
        assert _task(second.stdout, "Submit the job (once per run)") == "ok"
    assert len(deploy.store.rows()) == 1  # the run is recorded once
    out = next((deploy.tmp / "results").glob("*/mnist-quick.out"))
    assert "COMPLETED" in out.read_text() or '"modak": "job"' in out.read_text()
    assert not list(out.parent.glob(".fetch-*"))  # no play's fetch folder is left

    # the job's output is lost (as when the disk was full before its first line): the
    # result is gone, so a plain re-run submits the run again, once
    (lost,) = deploy.work.glob("*/mnist-quick.out")
    lost.write_text("")
    again = deploy()
    ok(again)
    m = re.search(r"job (\d+) of run \S+ completed without any output .*submitted again as "
                  r"job (\d+)", " ".join(again.stdout.split()) + " ".join(again.stderr.split()))
    assert m and m.group(1) == polls[0][0] != m.group(2), again.stdout[-3000:] + again.stderr
    assert re.search(r"job %s COMPLETED \(exit code 0\)" % m.group(2), again.stdout)
    assert len(deploy.store.rows()) == 2  # the new job's figures
    ok(deploy())
    assert len(deploy.store.rows()) == 2  # and not a third time

    third = deploy(modak_new_run=True)  # asked for: a new job, same image
    ok(third)
    assert _task(third.stdout, "Submit the job (once per run)") == "changed"
    assert _task(third.stdout, "Look for the image (built once per recipe hash)") == "ok"
    assert len(deploy.store.rows()) == 3


def test_a_build_without_wheels_stops_before_it_saying_how_to_get_them(deploy):
    """An image to build whose recipe installs from a wheelhouse, and no wheels on the
    controller: the deploy stops before the build context is made, saying which command
    fills it, and submits nothing."""
    empty = deploy.tmp / "no-wheels"
    empty.mkdir()
    target = {"scheduler": "slurm", "container_runtime": "podman", "partitions": ["debug"],
              "frontend": {"host": "127.0.0.1", "port": 2222, "user": "hpcuser",
                           "work_dir": "modak-runs"},
              "image_dir": f"{deploy.work.name}/images"}  # (no image built there)
    proc = deploy(modak_wheelhouse=str(empty), modak_target=target)
    assert proc.returncode != 0
    said = " ".join(proc.stdout.split())
    assert f"{empty} on this controller holds no wheels: fill it with `modak wheelhouse " \
        f"--image pytorch-2.13.0-cpu --dir {empty}`" in said, proc.stdout[-3000:]
    assert _task(proc.stdout, "Look for the image (built once per recipe hash)") == "changed"
    assert _task(proc.stdout, "Create the build context") == ""  # not reached
    assert not (deploy.work / "images").exists()
    assert "Submit the job" not in proc.stdout
    assert not deploy.store.path.exists() or deploy.store.rows() == []


def test_a_build_is_given_the_wheels_its_image_installs_not_the_whole_wheelhouse(deploy):
    """A wheelhouse that serves other images too: the build context receives the wheels of
    the image's own distributions and what they require, not the others. (The wheels here
    are stand-ins that pip refuses: the build fails at its install, and says so.)"""
    house = deploy.tmp / "shared-wheels"
    wheels = {"torch-2.13.0": ("filelock",), "numpy-2.4.6": (), "filelock-4.3.2": (),
              "tensorflow_cpu-2.21.0": ("numpy",), "transformers-5.25.0": ("filelock",)}
    for name, requires in wheels.items():
        _stand_in_wheel(house, name, requires)
    target = {"scheduler": "slurm", "container_runtime": "podman", "partitions": ["debug"],
              "frontend": {"host": "127.0.0.1", "port": 2222, "user": "hpcuser",
                           "work_dir": "modak-runs"},
              "image_dir": f"{deploy.work.name}/images"}  # (no image built there)
    proc = deploy(modak_wheelhouse=str(house), modak_target=target)
    assert proc.returncode != 0  # (pip refuses the stand-ins)
    assert _task(proc.stdout, "Copy the wheels the image installs") == "changed"
    assert _task(proc.stdout, "Copy the wheelhouse") == "skipping"
    (context,) = [p for p in (deploy.work / "images").glob("build-*") if p.is_dir()]
    assert sorted(p.name for p in (context / "wheels").iterdir()) == [
        "filelock-4.3.2-py3-none-any.whl", "numpy-2.4.6-py3-none-any.whl",
        "torch-2.13.0-py3-none-any.whl"]
    assert "Submit the job" not in proc.stdout


def _stand_in_wheel(directory, name, requires):
    """A wheel file with a name and metadata but no WHEEL file: read as a wheel by the
    plan, refused by pip."""
    import zipfile
    directory.mkdir(parents=True, exist_ok=True)
    dist, version = name.split("-")
    with zipfile.ZipFile(directory / f"{name}-py3-none-any.whl", "w") as z:
        z.writestr(f"{dist}/__init__.py", "")
        z.writestr(f"{dist}-{version}.dist-info/METADATA", f"Name: {dist}\nVersion: {version}\n"
                   + "".join(f"Requires-Dist: {r}\n" for r in requires))


def test_pbs_wrappers_run_the_pbs_script(deploy):
    proc = deploy(env={"MODAK_SCHEDULER": "pbs"}, inputs={"job_name": "mnist-pbs"})
    ok(proc)
    plans = list((deploy.tmp / "plans").glob("*/job.sh"))
    assert len(plans) == 1 and "#PBS -l nodes=1:ppn=" in plans[0].read_text()
    assert re.search(r"job \d+ COMPLETED", proc.stdout)
    assert len(deploy.store.rows()) == 1


def test_charliecloud_builds_and_runs(deploy):
    proc = deploy(env={"MODAK_RUNTIME": "charliecloud"}, inputs={"job_name": "mnist-ch"})
    ok(proc)
    plan = json.loads(next((deploy.tmp / "plans").glob("*/plan.json")).read_text())
    assert plan["runtime"] == "charliecloud"
    assert "ch-run " in next((deploy.tmp / "plans").glob("*/job.sh")).read_text()
    assert re.search(r"job \d+ COMPLETED", proc.stdout)
    # the listing has its size, from Charliecloud's storage (its own list has none)
    listing = subprocess.run(["ansible-playbook", "-i", "inventories/local",
                              "playbooks/images.yml"], cwd=ROOT, capture_output=True,
                             text=True, timeout=300, env={**os.environ,
                                                          "MODAK_RUNTIME": "charliecloud"})
    ok(listing)
    ref = plan["image"]["reference"]
    assert re.search(r'"%s \(charliecloud, [\d.]+ [GM]B\): last used 0\.0 days ago'
                     % re.escape(ref), listing.stdout), listing.stdout[-3000:]


def test_a_failing_job_ends_the_playbook_with_its_state_and_logs(deploy):
    proc = deploy(inputs={"job_name": "mnist-fails", "data": "/nonexistent"})
    assert proc.returncode != 0
    assert re.search(r"job \d+ of run \S+ ended FAILED \(exit code 1\)", proc.stdout)
    # the script's own error, in the failure's one line (not only in its output)
    assert re.search(r"ended FAILED \(exit code 1\)[^\n]*; the script failed: "
                     r"FileNotFoundError: [^\n]*nonexistent[^\n]*; a deploy of the same "
                     r"request finds this run as it ended: [^\n]*-e modak_new_run=true \(to opera "
                     r"deploy: MODAK_NEW_RUN=1 in its environment\); its output is in",
                     proc.stdout), proc.stdout[-3000:]
    out = next((deploy.tmp / "results").glob("*/mnist-fails.out")).read_text()
    assert "FileNotFoundError" in out  # the log came back
    (row,) = deploy.store.rows()  # the failure is kept, blamed on no knob (the script's own)
    assert row["status"] == "failed" and row["failed_knob"] is None
    assert "nonexistent" in row["error"] and row["s_per_step"] is None


def _as_frontend_user(command):
    """A shell command as the front-end's user (its rootless Podman), from /tmp."""
    return subprocess.run(["runuser", "-u", "hpcuser", "--", "sh", "-c", f"cd /tmp && {command}"],
                          capture_output=True, text=True)


def _containers_left(job_id, wait_s=20):
    """What still runs of Slurm job ``job_id`` once it had ``wait_s`` to stop: the front-end
    user's containers labelled with it, and any training process of the 100 000-step jobs of
    these tests (no other test runs them)."""
    fmt = '{{index .Labels "modak.job"}}'
    for _ in range(int(wait_s)):
        proc = _as_frontend_user(f"podman ps -a --format '{fmt}'")
        assert proc.returncode == 0, proc.stderr
        left = [x for x in proc.stdout.split() if x.endswith(f".{job_id}")]
        left += subprocess.run(["pgrep", "-a", "-u", "hpcuser", "-f", "--steps 100000"],
                               capture_output=True, text=True).stdout.splitlines()
        if not left:
            return left
        time.sleep(1)
    return left


def test_a_job_over_its_wall_time_ends_timeout(deploy):
    proc = deploy(inputs={"job_name": "mnist-slow", "steps": "100000", "wall_time": "00:01:00"})
    assert proc.returncode != 0
    m = re.search(r"job (\d+) of run \S+ ended TIMEOUT", proc.stdout)
    assert m, proc.stdout[-3000:]
    out = next((deploy.tmp / "results").glob("*/mnist-slow.out")).read_text()
    assert "DUE TO TIME LIMIT" in out
    # the container (outside the job's processes) was stopped with the job
    assert _containers_left(m.group(1)) == []


def test_a_cancelled_job_ends_cancelled(deploy):
    inputs = {"job_name": "mnist-cancel", "steps": "100000"}
    # cancelling a request never deployed cancels nothing and writes nothing on the front-end
    never = deploy("cancel.yml", inputs=inputs)
    ok(never)
    assert re.search(r"run \S+ was never submitted: nothing to cancel", never.stdout), \
        never.stdout[-3000:]
    assert not deploy.work.exists()
    # a wait that runs out says the job goes on and how to wait again, and submits nothing
    started = deploy(inputs=inputs, modak_job_timeout=8)
    assert started.returncode != 0
    assert re.search(r"job \d+ is still (RUNNING|PENDING) after waiting 8 s; it keeps running: "
                     r"run the same command again", started.stdout), started.stdout[-3000:]
    # its record lost (as when the front-end's disk filled at the submission), the run's
    # job is still found by its run id and cancelled, and the cancel writes its record again:
    # the deploy below reads it, finds the job ended and submits nothing
    (record,) = deploy.work.glob("*/.modak-job.json")
    submitted = json.loads(record.read_text())["job_id"]
    record.unlink()
    cancel = deploy("cancel.yml", inputs=inputs)
    ok(cancel)
    m = re.search(r"job (\d+) is CANCELLED", cancel.stdout)
    assert m and m.group(1) == submitted, cancel.stdout[-3000:]
    assert _containers_left(m.group(1)) == []
    proc = deploy(inputs=inputs)
    assert proc.returncode != 0
    assert re.search(r"ended CANCELLED", proc.stdout), proc.stdout[-3000:]
    assert next((deploy.tmp / "results").glob("*/mnist-cancel.out")).exists()


def test_autotune_searches_then_runs_the_job_with_its_choice_once(deploy):
    """autotune.yml: the budgeted search whatever the model says (this workload it knows),
    round 1 the candidates and stock for 8 steps, round 2 the better half and stock for 16
    (and where a choice rests on one round, one more runs stock again at its last steps, to
    confirm it); every trial through the job path into the store; then the job, uncapped,
    with the search's choice; run again, nothing runs twice."""
    # (the budget is 4x a 250-step job's time: the trials of a 1000-step one, a short job)
    settings = dict(inputs={"job_name": "mnist-tune", "steps": "250"}, modak_autotune_k=2,
                    modak_autotune_steps=8, modak_autotune_rounds=2, modak_autotune_budget=4.0,
                    modak_refit=True)
    proc = deploy("autotune.yml", **settings)
    ok(proc)
    found = re.search(r"chose (.+?) after (\d+) trials? in (\d+) rounds?, ([\d.]+) s of a "
                      r"([\d.]+) s budget", proc.stdout)
    assert found, proc.stdout[-3000:]
    assert re.search(r"job \d+ COMPLETED \(exit code 0\)", proc.stdout), proc.stdout[-3000:]
    trials, rounds = int(found.group(2)), int(found.group(3))
    # the model is refitted once, by the job's record, not after each trial (the search
    # decides on what the trials measured)
    models = re.findall(r"; model: ([^\"]*)", proc.stdout)
    assert len(models) == trials + 1, models
    assert models.count("not refitted (a trial: the job after the search refits)") == trials
    assert models[-1].startswith(("refitted, ", "kept ")), models
    rows = deploy.store.rows()
    tried = [r for r in rows if r["source"] == "autotune"]
    (job,) = [r for r in rows if r["source"] != "autotune"]
    assert len(tried) == trials
    # short trials: the runtime stopped the script after 8 (then 16) steps; the job ran whole
    assert all(r["status"] == "capped" and r["steps"] in (8, 16) for r in tried)
    # (3 warm-up steps of the script and its 250: the runtime counts every optimizer step)
    assert job["status"] == "ok" and job["steps"] == 253
    stock = [r for r in tried if r["compiler"] == "off" and r["allocator"] == "glibc"
             and r["precision"] == "fp32" and r["threads"] == r["cores"]]
    assert len(stock) == rounds  # stock runs in every round
    # each trial is stored with the search round it ran in: the model compares the runs of
    # one round, as the search did, though all ran within minutes; stock's second trial
    # (to confirm a choice) is a run of its own, in a round of its own, at its last steps
    confirm = [r for r in tried if r["steps"] != 8 * 2 ** (r["repeat"] - 1)]
    assert all(r in stock and r["repeat"] == rounds and r["steps"] == 4 * 2 ** (rounds - 1)
               for r in confirm) and len(confirm) <= 1, \
        [(r["steps"], r["repeat"]) for r in tried]
    rounds -= len(confirm)
    if rounds == 2:  # the better half of round 1's other candidates went on (at least one)
        assert {r["steps"] for r in stock} == {8, 16}
        first, second = (sum(r["steps"] == n and r not in stock for r in tried) for n in (8, 16))
        assert 1 <= second <= max(1, first // 2)
    # the job ran the search's choice
    plans = [json.loads(p.read_text()) for p in (deploy.tmp / "plans").glob("*/plan.json")]
    (final,) = [p for p in plans if p["decided_by"] == "autotune" and
                "MODAK_MAX_STEPS" not in p["environment"]]
    chosen = Configuration(**final["chosen"])
    assert not any(p["search"] for p in plans)  # the deploy alone would not have searched
    assert (job["compiler"], job["allocator"], job["precision"], job["threads"]) == (
        chosen.compiler or "off", chosen.allocator, chosen.precision, chosen.threads)
    assert found.group(1).startswith(chosen.label())
    # the front-end holds the runs that were submitted, the trials' and the job's, each with
    # its job's record; not the plan the search replaced (staged, it was never submitted)
    ran = {p["run_name"] for p in plans if p["decided_by"] == "autotune"}
    assert len(ran) == trials + 1
    on_frontend = {d.name for d in deploy.work.iterdir() if d.is_dir()}
    assert on_frontend == ran, on_frontend ^ ran
    assert all((deploy.work / d / ".modak-job.json").is_file() for d in on_frontend)
    again = deploy("autotune.yml", **settings)
    ok(again)
    assert deploy.store.count() == len(rows)
    assert _task(again.stdout, "Submit the job (once per run)") == "ok", again.stdout[-3000:]


def test_a_users_script_outside_the_repository_on_slurm_and_podman(deploy):
    request = user_project(deploy.tmp)
    proc = deploy(request=request, modak_infra=str(ROOT / "examples/infra/local-frontend.yaml"))
    ok(proc)
    assert re.search(r"job \d+ COMPLETED \(exit code 0\)", proc.stdout)
    # the plan found every import of the script among what the image installs from the
    # real wheelhouse (modak_lib.imports), and said nothing
    assert "would not have" not in proc.stdout and "holds no wheel" not in proc.stdout
    plan = json.loads(next((deploy.tmp / "plans").glob("*/plan.json")).read_text())
    assert plan["app_files"] == ["train.py"]  # the script, not its neighbours
    assert "-m modak_runtime -- train.py --steps 12" in next(
        (deploy.tmp / "plans").glob("*/job.sh")).read_text()
    (row,) = deploy.store.rows()
    assert row["status"] == "ok" and row["steps"] == 12 and row["workload"] == "train"
    assert row["fingerprint"].startswith("fp-") and row["flops_per_step"] > 0
    assert row["workload_key"] == plan["environment"]["MODAK_WORKLOAD_KEY"]
    raw = json.loads(row["raw"])
    assert raw["effect"]["trained_modules"] == "TinyLM"  # the runtime found the user's model
    assert "in effect: " in proc.stdout and "applied: " in proc.stdout
    # the summary says where on the front-end the run's files are (only its output came back)
    where = re.search(r"run directory on \S+: (/\S+) \(what the script wrote", proc.stdout)
    assert where and pathlib.Path(where.group(1)).parent == deploy.work
    assert (pathlib.Path(where.group(1)) / "train.py").is_file()

    # a second plan for the same request knows the workload and uses the measurement
    env = {"MODAK_RESULTS": str(deploy.store.path), "MODAK_MODEL": str(deploy.tmp / "model.joblib")}
    again = plan_json(request, env, "--infra", str(ROOT / "examples/infra/local-frontend.yaml"))
    assert again["decided_by"] == "model"
    (ran,) = [c for c in again["candidates"] if c["configuration"] == plan["chosen"]]
    assert ran["prediction"]["source"] == "measured median of 1 run(s)"
    assert abs(ran["prediction"]["seconds"] - row["s_per_step"]) < 1e-9
    # the others are predicted on the level this run measured
    assert all("measured" in c["prediction"]["source"] for c in again["candidates"]
               if c["prediction"])


def ddp_request(tmp_path, nodes, per_node):
    """A user's data-parallel script written for torchrun, on ``nodes`` nodes with
    ``per_node`` ranks each, as a request of its own."""
    proj = tmp_path / "someone" / f"ddp-{nodes}x{per_node}"
    proj.mkdir(parents=True)
    (proj / "train.py").write_text((ROOT / "tests/user_scripts/torchrun_ddp.py").read_text())
    job = json.loads(json.dumps(USER_REQUEST))["job"]
    job["job_options"].update(job_name="user-ddp", node_count=nodes,
                              process_count_per_node=per_node, core_count=nodes * per_node)
    job["application"]["arguments"] = "16"
    del job["target"]  # (the front-end's infrastructure file is the target)
    job["optimisation"]["app_type-ai_training"] = {
        "config": {"ai_framework": "pytorch"}, "ai_framework-pytorch": {"version": "2.13"}}
    (proj / "request.json").write_text(json.dumps({"job": job}))
    return proj / "request.json"


def test_a_script_reads_its_data_where_the_cluster_has_it(deploy):
    """The data a user's script reads lies on the cluster's file system, named by the
    script's own argument: the job's container (Podman) has it at that path, read-only, and
    so does a Charliecloud one (its image has the directory; writable as the login may).  A
    dataset that the front-end has not stops the deploy before anything is staged."""
    torch = pytest.importorskip("torch")
    shared = pathlib.Path("/var/tmp") / f"modak-test-data-{uuid.uuid4().hex[:8]}"
    data, weights = shared / "sensors", shared / "weights"
    data.mkdir(parents=True)
    weights.mkdir()
    try:
        gen = torch.Generator().manual_seed(0)
        torch.save(torch.randn(64, 8, generator=gen), data / "x.pt")
        torch.save(torch.randint(0, 3, (64,), generator=gen), data / "y.pt")
        torch.save(torch.zeros(3, 8), weights / "w.pt")
        for path in (shared, data, weights):  # (the front-end's user reads it; root owns it)
            path.chmod(0o755)
        proj = deploy.tmp / "someone" / "data-project"
        proj.mkdir(parents=True)
        (proj / "train.py").write_text((ROOT / "tests/user_scripts/shared_data.py").read_text())
        job = json.loads(json.dumps(USER_REQUEST))["job"]
        del job["target"]  # (the front-end's infrastructure file is the target)
        # (and its starting weights from another directory: application.data_paths)
        job["application"]["arguments"] = f"--data {data} --steps 8 --init {weights}"
        job["application"]["data_paths"] = [str(weights)]
        ai = job["optimisation"]["app_type-ai_training"]
        ai["ai_framework-pytorch"]["compile"] = False
        ai["data"] = {"location": str(data)}
        (proj / "request.json").write_text(json.dumps({"job": job}))
        infra = str(ROOT / "examples/infra/local-frontend.yaml")
        proc = deploy(request=proj / "request.json", modak_infra=infra)
        ok(proc)
        (row,) = deploy.store.rows()
        assert row["status"] == "ok" and row["steps"] == 8
        out = "".join(p.read_text() for p in (deploy.tmp / "results").glob("*/*.out"))
        assert "the data: not writable (Read-only file system)" in out
        assert f"started from the weights in {weights}" in out
        assert "trained 8 steps on 64 samples" in out
        assert not (data / "written-by-the-job").exists()
        job_sh = next((deploy.tmp / "plans").glob("*/job.sh")).read_text()
        assert f"--volume {weights}:{weights}:ro" in job_sh and f"[ ! -e {weights} ]" in job_sh
        del job["application"]["data_paths"]
        job["application"]["arguments"] = f"--data {data} --steps 8"

        ai["data"] = {"location": str(shared / "elsewhere")}
        (proj / "request.json").write_text(json.dumps({"job": job}))
        proc = deploy(request=proj / "request.json", modak_infra=infra)
        assert proc.returncode != 0, proc.stdout
        assert (f"request.json: application.dataset: {shared}/elsewhere is not on the "
                "front-end frontend (the job reads it at that path") in proc.stdout
        assert "Submit the job" not in proc.stdout and len(deploy.store.rows()) == 1
        (shared / "private").mkdir(mode=0o700)  # (root's: the front-end's login cannot read it)
        ai["data"] = {"location": str(data)}
        job["application"]["data_paths"] = [str(weights), str(shared / "private")]
        (proj / "request.json").write_text(json.dumps({"job": job}))
        proc = deploy(request=proj / "request.json", modak_infra=infra)
        assert proc.returncode != 0
        assert (f"application.data_paths: {shared}/private is on the front-end frontend, but "
                "its login cannot read it") in " ".join(proc.stdout.split())
        del job["application"]["data_paths"]

        # Charliecloud: its image has the dataset's directory to bind onto; the data is
        # writable only as the login's own permissions allow (root's here: not)
        charliecloud = {"MODAK_RUNTIME": "charliecloud"}  # (the inventory's target)
        ai["data"] = {"location": str(data)}
        (proj / "request.json").write_text(json.dumps({"job": job}))
        proc = deploy(request=proj / "request.json", modak_infra=infra, env=charliecloud)
        ok(proc)
        rows = deploy.store.rows()
        assert len(rows) == 2 and rows[-1]["status"] == "ok" and rows[-1]["steps"] == 8
        plan = json.loads(max((deploy.tmp / "plans").glob("*/plan.json"),
                              key=lambda p: p.stat().st_mtime).read_text())
        assert plan["runtime"] == "charliecloud" and plan["dataset"] == str(data)
        out = "".join(p.read_text() for p in (deploy.tmp / "results").glob("*/*.out"))
        assert "the data: not writable (Permission denied)" in out
        assert out.count("trained 8 steps on 64 samples") == 2
        assert not (data / "written-by-the-job").exists()
        ai["data"] = {"location": str(data / "x.pt")}  # (a file: ch-run binds directories)
        (proj / "request.json").write_text(json.dumps({"job": job}))
        proc = deploy(request=proj / "request.json", modak_infra=infra, env=charliecloud)
        assert proc.returncode != 0
        assert (f"application.dataset: {data}/x.pt is a file on the front-end frontend: a "
                "charliecloud container has its data as a directory") in " ".join(
                    proc.stdout.split())
        assert len(deploy.store.rows()) == 2
    finally:
        shutil.rmtree(shared, ignore_errors=True)
        # (the image made for this test's own dataset path: no later run has it)
        for plan_file in (deploy.tmp / "plans").glob("*/plan.json"):
            plan = json.loads(plan_file.read_text())
            if plan["runtime"] == "charliecloud" and plan["dataset"]:
                _as_frontend_user(f"ch-image delete {plan['image']['reference']}")


def test_a_data_parallel_script_on_one_node_and_on_several(deploy):
    """A script written for torchrun, through the real job path on Slurm and Podman: on one
    node the job script starts its ranks with torchrun; on several, srun starts each rank in
    a container of its own, and what srun sets for each reaches it, so that the runtime gives
    it torchrun's variables.  (The front-end has one node: the two-node job's script runs
    with its two ranks there, each in its own container, as srun starts them on two.)"""
    infra = str(ROOT / "examples/infra/local-frontend.yaml")
    one_node = ddp_request(deploy.tmp, 1, 2)
    proc = deploy(request=one_node, modak_infra=infra)
    ok(proc)
    (row,) = deploy.store.rows()
    effect = json.loads(row["raw"])["effect"]
    assert row["status"] == "ok" and row["steps"] == 16
    assert (effect["ranks"], effect["launcher"]) == (2, "torchrun")
    assert (row["ranks"], row["launcher"]) == (2, "torchrun")
    where = pathlib.Path(re.search(r"run directory on \S+: (/\S+) \(", proc.stdout).group(1))

    env = dict(os.environ, MODAK_RESULTS=str(deploy.store.path),
               MODAK_MODEL=str(deploy.tmp / "model.joblib"))
    # the job planned again: the configuration it ran is answered by its run of two ranks,
    # and the model, of single processes, predicts none of the others
    again = subprocess.run(["modak", "plan", str(one_node), "--infra", infra, "--json"],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    plan = json.loads(again.stdout)
    predicted = [c["prediction"] for c in plan["candidates"] if c.get("prediction")]
    assert [(p["measured"], p["seconds"]) for p in predicted] == [
        (True, pytest.approx(row["s_per_step"]))]
    assert any("a model of 2 training ranks" in n for n in plan["notes"])
    two_nodes = ddp_request(deploy.tmp, 2, 1)
    # the front-end's infrastructure file says it has one node: a two-node job is refused
    refused = subprocess.run(["modak", "plan", str(two_nodes), "--infra", infra], cwd=ROOT,
                             env=env, capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2 and refused.stderr.strip().endswith(
        "job.node_count: 2 nodes exceed the target's nodes 1"), refused.stderr
    # as a target that does not say how many nodes it has
    unsaid = pathlib.Path(infra).read_text().replace("\nnodes: 1\n", "\n")
    assert "nodes:" not in unsaid
    infra = deploy.tmp / "local-frontend-nodes-unsaid.yaml"
    infra.write_text(unsaid)
    pbs_infra = deploy.tmp / "local-frontend-pbs.yaml"
    pbs_infra.write_text(unsaid.replace("scheduler: slurm", "scheduler: pbs"))
    # (scheduler: infrastructure file, its launch line, the directives for two nodes and for
    # the one node there is, how the job is submitted and waited for)
    cases = {
        "slurm": (str(infra), r"^srun podman run .* --env 'SLURM_\*' ",
                  "#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n",
                  "#SBATCH --nodes=1\n#SBATCH --ntasks-per-node=2\n",
                  "sbatch --wait --output=two-nodes.out two-nodes.sh"),
        # Torque's qsub and mpiexec over Slurm here (mpiexec takes -n, not -np); the job
        # script says where the ranks meet
        "pbs": (str(pbs_infra), r"^mpirun -n 2 podman run .* --env 'OMPI_\*' .* --env "
                r"'SLURM_\*' --env MASTER_ADDR --env MASTER_PORT ",
                "#PBS -l nodes=2:ppn=1\n", "#PBS -l nodes=1:ppn=2\n",
                "qsub -o two-nodes.out -j oe two-nodes.sh"),
    }
    for scheduler, (infra_file, launch, two, one, submit) in cases.items():
        out = deploy.tmp / f"two-nodes-{scheduler}"
        planned = subprocess.run(["modak", "plan", str(two_nodes), "--infra", infra_file,
                                  "--out", str(out)], cwd=ROOT, env=env, capture_output=True,
                                 text=True, timeout=300)
        assert planned.returncode == 0, planned.stderr
        script = (out / "job.sh").read_text()
        assert two in script and re.search(
            launch + r".* python3 -m modak_runtime -- train\.py 16 &$", script, re.M), script
        # its two ranks on the one node there is
        (where / "two-nodes.sh").write_text(script.replace(two, one))
        (where / "two-nodes.out").unlink(missing_ok=True)
        shutil.chown(where / "two-nodes.sh", "hpcuser")
        ran = _as_frontend_user(f"cd {where} && {submit}")
        assert ran.returncode == 0, ran.stderr
        for _ in range(300):  # (qsub does not wait)
            output = (where / "two-nodes.out").read_text() \
                if (where / "two-nodes.out").exists() else ""
            if '"modak": "job",' in output:
                break
            time.sleep(1)
        assert '"exit_code": 0,' in output, output[-3000:]
        (rec,) = parse_fom_lines(output)
        assert rec["status"] == "ok" and rec["metrics"]["steps"] == 16, rec
        assert (rec["effect"]["ranks"], rec["effect"]["launcher"]) == (2, "srun")
        # (under PBS, the job script's MASTER_ADDR and MASTER_PORT)
        assert rec["effect"]["torchrun_variables"] == "RANK WORLD_SIZE LOCAL_RANK " + (
            "LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT" if scheduler == "slurm"
            else "LOCAL_WORLD_SIZE")
        assert output.count("final loss") == 1  # (rank 0's: each rank knew its place)

    # deployed as it is, the two-node job is held by Slurm for good (its partition has one
    # node: PartitionConfig): the wait does not go on to its timeout, the job is cancelled
    started = time.time()
    proc = deploy(request=two_nodes, modak_infra=str(infra), modak_job_timeout=300)
    assert proc.returncode != 0 and time.time() - started < 120
    # (Slurm says one or the other, as its checks meet the job)
    stuck = re.search(r"job (\d+) cannot start as it is: the scheduler holds it pending for "
                      r"Partition(?:Config|NodeLimit) \(its partition, account or QOS cannot "
                      r"give what it asks for: nodes, [^)]*\); MODAK cancelled it", proc.stdout)
    assert stuck and '"state": "CANCELLED"' in proc.stdout, proc.stdout[-3000:]
    left = subprocess.run(["squeue", "-h", "-j", stuck.group(1), "-o", "%T"],
                          capture_output=True, text=True)
    assert left.stdout.strip() in ("", "CANCELLED"), left.stdout
    # and every run of this test gave its image's lease back, the cancelled one too (its
    # wait failed, with the job ended)
    leases = pathlib.Path("/home/hpcuser/modak-images/.used").glob("*/*")
    assert not [p for p in leases if str(deploy.work) in p.read_text()]


# ---------------------------------------------------------------------------
# image builds: progress, and one build per image even when the controller is interrupted
BUILD_PLAY = """
- hosts: frontend
  gather_facts: false
  tasks:
    - ansible.builtin.file: {path: "%(dir)s", state: directory, mode: "0750"}
    - ansible.builtin.copy:
        dest: "%(dir)s/Containerfile"
        mode: "0640"
        content: |
          FROM localhost/debian:bookworm
          RUN echo %(tag)s >/first && sleep %(first)s
          RUN echo %(tag)s > /tag && sleep 4
    - modak.modak.modak_image:
        runtime: podman
        image: "localhost/modak-test/build:%(tag)s"
        recipe: "%(dir)s/Containerfile"
        context: "%(dir)s"
        log_dir: "%(dir)s"
        poll: 2
"""


def test_an_interrupted_build_goes_on_and_the_next_run_attaches_to_it(frontend, tmp_path):
    tag = "t" + uuid.uuid4().hex[:8]
    build_dir = f"/home/hpcuser/modak-test-build-{tag}"
    play = tmp_path / "build.yml"
    # (every step its own, not in the builder's cache: a first step cached by an earlier
    # run whose image was not removed made the build end before the second run attached)
    play.write_text(BUILD_PLAY % {"dir": build_dir, "tag": tag, "first": 25})
    argv = ["ansible-playbook", "-i", "inventories/local", str(play)]
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")
    first = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True,
                             start_new_session=True)
    for line in first.stdout:  # a user's Ctrl-C once the build shows progress
        if re.match(r"\[frontend\] building localhost/modak-test/build:\S+, 0:00:\d\d: STEP",
                    line):
            break
    os.killpg(first.pid, 9)
    first.wait()
    second = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=300)
    ok(second)
    lines = re.findall(r"^\[frontend\] building \S+, (\d+):(\d\d):(\d\d): (.*)$",
                       second.stdout, re.M)
    # it attached to the running build (its clock did not start again at 0)
    assert lines and int(lines[0][2]) + 60 * int(lines[0][1]) >= 2, second.stdout
    assert re.search(r"^\[frontend\] built localhost/modak-test/build:%s in " % tag,
                     second.stdout, re.M), second.stdout
    log = (pathlib.Path(build_dir) / f"build-localhost_modak-test_build_{tag}.log").read_text()
    assert log.count("$ podman build") == 1  # one build, not two
    _as_frontend_user(f"podman image rm -f localhost/modak-test/build:{tag}; rm -rf {build_dir}")


def test_the_images_playbook_prunes_an_image_no_run_holds(frontend, tmp_path):
    """A Podman image built by modak_image, leased by a run: the prune keeps it while the
    lease is held, and removes it from Podman's store once the lease is given back."""
    tag = "t" + uuid.uuid4().hex[:8]
    build_dir = f"/home/hpcuser/modak-test-prune-{tag}"
    image = f"localhost/modak-test/build:{tag}"
    play = tmp_path / "build.yml"
    play.write_text(BUILD_PLAY % {"dir": build_dir, "tag": tag, "first": 0})
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")

    def run(*argv):
        proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=300)
        ok(proc)
        return proc.stdout

    def lease(state):
        run("ansible", "frontend", "-i", "inventories/local", "-m", "modak.modak.modak_images",
            "-a", json.dumps({"log_dir": build_dir, "state": state, "image": image,
                              "run": "r-test", "run_dir": f"{build_dir}/job-r-test"}))

    prune = ["ansible-playbook", "-i", "inventories/local", "playbooks/images.yml", "-e",
             f"modak_image_dir={build_dir}", "-e", "modak_prune=true", "-e",
             "modak_unused_days=0"]
    try:
        run("ansible-playbook", "-i", "inventories/local", str(play))
        lease("leased")
        kept = run(*prune)
        assert re.search(r'"%s \(podman, [\d.]+ [kMG]?B\): last used 0\.0 days ago; held by '
                         r'%s/job-r-test: kept: in use by 1 run\(s\)"' % (re.escape(image),
                                                                       build_dir), kept), kept
        assert _as_frontend_user(f"podman image exists {image}").returncode == 0
        lease("released")
        # a failed build of a MODAK recipe leaves its layers, untagged, as a killed one does;
        # so does a failed build of the user's own, without MODAK's label
        for label in (f"LABEL org.modak.variant={tag}\n", ""):
            _as_frontend_user(f"mkdir -p {build_dir}/failed && printf 'FROM localhost/debian:"
                              f"bookworm\\n{label}RUN echo {tag} >/x\\nRUN false\\n' > "
                              f"{build_dir}/failed/Containerfile && podman build --layers=true "
                              f"-f {build_dir}/failed/Containerfile {build_dir}/failed")
        layers = f"podman images -a -q --filter label=org.modak.variant={tag}"
        assert _as_frontend_user(layers).stdout.split()  # (the label's layers are there)
        users = _as_frontend_user("podman images -a -q --filter dangling=true").stdout.split()
        gone = run(*prune)
        assert re.search(r'"%s \(podman, [\d.]+ [kMG]?B\): last used 0\.0 days ago: removed: '
                         r'unused for 0\.0 days"' % re.escape(image), gone), gone
        assert _as_frontend_user(f"podman image exists {image}").returncode == 1
        # the builder's cache: the MODAK build's layers went, the user's own stayed
        assert '"builder cache: ran podman image prune --force --filter ' \
            'label=org.modak.variant' in gone, gone
        assert _as_frontend_user(layers).stdout.split() == []
        left = _as_frontend_user("podman images -a -q --filter dangling=true").stdout.split()
        assert left and set(left) <= set(users)
        assert "no MODAK images in" in run(*prune[:-4])  # (listed only)
    finally:
        _as_frontend_user(f"podman image rm -f {image}; rm -rf {build_dir}; podman image "
                          f"prune --force --filter dangling=true >/dev/null")


def _working_containers():
    """Podman's build (buildah) containers of the front-end user: ID -> creation time."""
    proc = _as_frontend_user("podman ps --all --external --format json")
    assert proc.returncode == 0, proc.stderr
    return {row["Id"]: row["Created"] for row in json.loads(proc.stdout or "[]")
            if any(re.search(r"-working-container(-\d+)?$", n) for n in row.get("Names") or [])}


def test_a_killed_build_is_cleaned_up_and_built_again(frontend, tmp_path):
    tag = "t" + uuid.uuid4().hex[:8]
    build_dir = f"/home/hpcuser/modak-test-build-{tag}"
    play = tmp_path / "build.yml"
    # a step of its own (not in the builder's cache), killed while it runs
    play.write_text(BUILD_PLAY % {"dir": build_dir, "tag": tag, "first": 20})
    argv = ["ansible-playbook", "-i", "inventories/local", str(play)]
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")
    before = set(_working_containers())
    first = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True,
                             start_new_session=True)
    for line in first.stdout:
        if re.match(r"\[frontend\] building \S+, 0:00:\d\d: STEP 2/3", line):
            break
    # the builder dies (OOM killer, an administrator, a reboot): its lock stays behind
    lock = pathlib.Path(build_dir) / ".building" / f"localhost_modak-test_build_{tag}.pid"
    os.killpg(_pid(lock), 9)
    os.killpg(first.pid, 9)
    first.wait()
    left = set(_working_containers()) - before
    assert left, "the killed build left no working container to clean up"
    second = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=300)
    ok(second)
    assert re.search(r"^\[frontend\] a killed build of localhost/modak-test/build:%s was "
                     r"found: removed its lock and [1-9]\d* working container" % tag,
                     second.stdout, re.M), second.stdout
    assert re.search(r"^\[frontend\] built localhost/modak-test/build:%s in " % tag,
                     second.stdout, re.M), second.stdout
    assert not left & set(_working_containers())  # the killed build's are gone
    _as_frontend_user(f"podman image rm -f localhost/modak-test/build:{tag}; rm -rf {build_dir}")


# ---------------------------------------------------------------------------
# faults of the front-end during the wait: the job goes on, the deploy waits it out
def _pid(path):
    try:
        return int(pathlib.Path(path).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _dead(pid, wait_s=10):
    """Whether process ``pid`` is gone within ``wait_s``."""
    for _ in range(int(wait_s * 4)):
        try:
            os.kill(pid, 0)
        except OSError:
            return True
        time.sleep(0.25)
    return False


def _stop(pid_file):
    pid = _pid(pid_file)
    if pid:
        os.kill(pid, 15)
        _dead(pid)


def test_a_scheduler_outage_and_an_ssh_drop_during_the_wait_end_in_the_real_state(deploy):
    import threading
    state = os.environ.get("MODAK_FRONTEND_STATE", "/var/tmp/modak-frontend")
    result = {}
    # long enough to outlast the faults below, 61 s from its start, on a faster machine too
    # (600 steps took 80 s here on a quiet one), and waited for long enough on a busy one
    # (1500 steps ran past a 600 s wait beside the suite's other worker)
    inputs = {"job_name": "mnist-faults", "steps": "1000"}
    runner = threading.Thread(target=lambda: result.update(
        proc=deploy(inputs=inputs, modak_job_poll=3, modak_job_retries=8,
                    modak_job_timeout=1500)))
    runner.start()
    deadline = time.time() + 300
    while time.time() < deadline:  # the job runs
        out = subprocess.run(["squeue", "-h", "-n", "mnist-faults", "-o", "%T"],
                             capture_output=True, text=True).stdout
        if "RUNNING" in out:
            break
        time.sleep(1)
    else:
        pytest.fail("the job never ran")
    time.sleep(5)
    try:
        # slurmctld away for 40 s: squeue and scontrol fail, the job goes on under slurmd
        _stop("/run/slurm/slurmctld.pid")
        time.sleep(40)
    finally:
        subprocess.run(["/usr/sbin/slurmctld"], check=True)
    time.sleep(6)
    try:
        # the SSH front-end away for 10 s: its listener and every session of the user
        _stop(f"{state}/sshd.pid")
        subprocess.run(["pkill", "-u", "hpcuser", "-x", "sshd"], capture_output=True)
        time.sleep(10)
    finally:
        subprocess.run(["/usr/sbin/sshd", "-f", f"{state}/sshd_config", "-E",
                        f"{state}/sshd.log"], check=True)
    runner.join(1800)
    proc = result["proc"]
    ok(proc)
    assert re.search(r"^\[frontend\] job \d+ UNKNOWN \(squeue: the scheduler did not answer",
                     proc.stdout, re.M), proc.stdout[-4000:]
    assert re.search(r"status query \d/8 failed", proc.stdout + proc.stderr)
    assert re.search(r"job \d+ COMPLETED \(exit code 0\)", proc.stdout)
    assert len(deploy.store.rows()) == 1


def test_twenty_submitters_of_one_run_at_once_submit_one_job(frontend, tmp_path):
    """The module itself, as 20 deploys of the same run would call it at the same moment."""
    work = tmp_path / "run"
    work.mkdir()
    (work / "job.sh").write_text("#!/bin/bash\n#SBATCH --job-name=modak-once\nsleep 120\n")
    run_id = "r" + uuid.uuid4().hex[:11]
    args = (f"workdir={work} script=job.sh scheduler=slurm run_id={run_id} "
            "stdout=job.out state=submitted")
    env = dict(os.environ, ANSIBLE_NOCOLOR="1")
    procs = [subprocess.Popen(["ansible", "localhost", "-c", "local", "-m",
                               "modak.modak.modak_job", "-a", args], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for _ in range(20)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    ids = {m for out in outs for m in re.findall(r'"job_id": "(\d+)"', out)}
    assert len(ids) == 1, ids
    assert sum('"submitted": true' in out for out in outs) == 1
    listed = subprocess.run(["squeue", "-h", "-o", "%i|%k"], capture_output=True, text=True)
    assert sum(f"modak-run={run_id}" in line for line in listed.stdout.splitlines()) <= 1
    # the record lost (as when it could not be written): the job is found by its run id
    (work / ".modak-job.json").unlink()
    again = subprocess.run(["ansible", "localhost", "-c", "local", "-m", "modak.modak.modak_job",
                            "-a", args], cwd=ROOT, env=env, capture_output=True, text=True)
    subprocess.run(["scancel", *ids], capture_output=True)
    assert re.findall(r'"job_id": "(\d+)"', again.stdout) == list(ids), again.stdout
    assert '"submitted": false' in again.stdout


def _job_module(work, sched, run_id, args):
    """The modak_job module run on its own for job.sh in ``work``: its result and its
    warnings (one line)."""
    proc = subprocess.run(
        ["ansible", "localhost", "-c", "local", "-m", "modak.modak.modak_job", "-a",
         f"workdir={work} script=job.sh scheduler={sched} run_id={run_id} stdout=job.out "
         + args], cwd=ROOT, env=dict(os.environ, ANSIBLE_NOCOLOR="1"), capture_output=True,
        text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    return json.loads(proc.stdout.split("=>", 1)[1]), " ".join(proc.stderr.split())


@pytest.mark.parametrize("sched", ["slurm", "pbs", "local"])
def test_a_run_whose_record_was_lost_after_its_job_ended_is_not_submitted_again(
        frontend, tmp_path, sched):
    """The record written at the submission lost (a full disk, a deleted file) after the
    job ended: Slurm no longer lists the job by its run id, PBS lists none by it, a local
    run has no scheduler. The run's real job script printed the job's id first, and the
    work directory holds it (a local run's PID file): the job is adopted, its end read,
    its output kept, and nothing submitted again."""
    from modak_lib.render import render_job_script
    from modak_lib.schedulers import SCHEDULERS

    spec = SCHEDULERS[sched]
    run_id = "r" + uuid.uuid4().hex[:11]
    work = tmp_path / "run"
    work.mkdir()
    (work / "job.sh").write_text(render_job_script(
        directives=[], exports={}, launch="echo trained", source="test", chosen="stock",
        decided_by="test", run_id=run_id, job_id_vars=spec.job_id_vars,
        submit_dir_vars=spec.submit_dir_vars))

    def job():
        return _job_module(work, sched, run_id, "state=ended poll=1 timeout=120")

    first, _ = job()
    assert first["submitted"] and first["state"] == "COMPLETED", first
    output = (work / "job.out").read_text()
    assert "trained" in output
    if sched == "slurm":  # (no longer listed by its run id: found by its output)
        listed = subprocess.run(["squeue", "-h", "-o", "%k"], capture_output=True, text=True)
        assert f"modak-run={run_id}" not in listed.stdout
    (work / ".modak-job.json").unlink()
    again, warned = job()
    assert again["job_id"] == first["job_id"] and not again["submitted"], again
    assert re.search(rf"the record of run {run_id} was lost; its job {first['job_id']}, "
                     rf"found by what it left in \S+, was adopted", warned), warned
    assert again["state"] == "COMPLETED"
    assert (work / "job.out").read_text() == output  # (the job did not run again)
    assert json.loads((work / ".modak-job.json").read_text())["job_id"] == first["job_id"]


def test_a_pbs_run_whose_record_was_lost_while_its_job_was_queued_is_not_submitted_again(
        frontend, tmp_path):
    """Under PBS (here Slurm's Torque wrappers), a job still queued has printed nothing and
    PBS keeps no comment: the job's name, rendered with the run id, finds it in `qstat -f`,
    so a deploy that lost the record adopts the queued job rather than submitting another."""
    from modak_lib.models import JobOptions
    from modak_lib.render import render_job_script
    from modak_lib.schedulers import SCHEDULERS
    from modak_lib.schedulers.base import Resources

    spec = SCHEDULERS["pbs"]
    run_id = "r" + uuid.uuid4().hex[:11]
    work = tmp_path / "run"
    work.mkdir()
    res = Resources(nodes=1, tasks_per_node=1, cpus_per_task=1, gpus_per_node=0,
                    walltime_s=300, memory_gb=None, partition=None, stdout="job.out",
                    stderr=None)
    directives = spec.directives(JobOptions(job_name="lost-queued"), res, run_id=run_id)
    # (held by Slurm under the wrappers, so that it stays queued for the test)
    (work / "job.sh").write_text(render_job_script(
        directives=directives + ["#SBATCH --hold"], exports={}, launch="echo trained",
        source="test", chosen="stock", decided_by="test", run_id=run_id,
        job_id_vars=spec.job_id_vars, submit_dir_vars=spec.submit_dir_vars))

    def submit():
        return _job_module(work, "pbs", run_id, "state=submitted")

    first, _ = submit()
    ids = {first["job_id"]}
    try:
        assert first["submitted"], first
        (work / ".modak-job.json").unlink()
        again, warned = submit()
        ids.add(again["job_id"])
        assert again["job_id"] == first["job_id"] and not again["submitted"], again
        assert re.search(rf"the record of run {run_id} was lost; its job {first['job_id']}, "
                         r"found by its run id, was adopted", warned), warned
        listed = subprocess.run(["qstat", "-f"], capture_output=True, text=True)
        assert listed.stdout.count(f"lost-queued-{run_id}") == 1, listed.stdout
    finally:
        subprocess.run(["qdel", *ids], capture_output=True)


def test_the_frontends_podman_mounts_an_image_rather_than_copying_it(frontend):
    """On its default here (vfs) rootless Podman copied the whole image at each container
    start, 8-16 s for the PyTorch image, a job's and each search trial's: ``scripts/frontend
    up`` puts a new store on native overlay where the kernel has it, as this one does."""
    probe = _as_frontend_user("d=$(mktemp -d) && podman --root $d/root --runroot $d/run "
                              "--storage-driver overlay info >/dev/null; r=$?; rm -rf $d; "
                              "exit $r")
    if probe.returncode != 0 and not os.environ.get("CI"):
        pytest.skip("this kernel has no native overlay for rootless podman: " + probe.stderr[-300:])
    assert probe.returncode == 0, probe.stderr  # (the machine CI runs on has it)
    driver = _as_frontend_user("podman info --format '{{.Store.GraphDriverName}}'")
    assert driver.stdout.strip() == "overlay", (driver.stdout, driver.stderr)
    # a container's root is an overlay mount over the image's layers (on vfs, a copy)
    started = _as_frontend_user("podman run --rm --network none localhost/debian:bookworm "
                                "grep ' / / ' /proc/self/mountinfo")
    assert started.returncode == 0, started.stderr
    assert " - overlay " in started.stdout and "lowerdir=" in started.stdout, started.stdout
    assert "MODAK scripts/frontend" in _as_frontend_user(
        "cat ~/.config/containers/storage.conf").stdout  # (written by scripts/frontend)


def test_a_podman_jobs_container_has_the_nodes_shared_memory(frontend):
    """A DataLoader with worker processes hands its batches over in /dev/shm, 64 MB in a
    Podman container by default: a user's 64-image batches of 224x224 failed in the job
    ("unable to allocate shared memory(shm)") where they ran on the host.  The job script's
    ``podman run`` (the words MODAK renders, run as the job script runs them) gives the
    container half the node's memory there, as the host's tmpfs has: 200 MB are written."""
    from modak_lib.runtimes import RUNTIMES
    from modak_lib.shell import join

    words = RUNTIMES["podman"].launch("localhost/debian:bookworm", {}, 0)
    check = ("sh -c 'dd if=/dev/zero of=/dev/shm/batch bs=1M count=200 2>&1 && "
             "df -k /dev/shm | tail -1'")
    line = f"MODAK_JOB_TAG=shm-test; {join(words)} {check}"
    ran = _as_frontend_user(f"bash -c {shlex.quote(line)}")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "200+0 records out" in ran.stdout, ran.stdout
    size_kb = int(ran.stdout.strip().splitlines()[-1].split()[1])
    half_kb = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2048
    assert abs(size_kb - half_kb) <= half_kb * 0.01, (size_kb, half_kb)


def test_podmans_state_left_by_a_restart_is_reset_by_up(frontend):
    """A restart kills every process but keeps /tmp, where rootless Podman's runroot says all
    is alive: a container recorded as running with no conmon and no pause process left makes
    every podman command of the user fail, until ``scripts/frontend up`` resets it."""
    name = f"modak-stale-{uuid.uuid4().hex[:6]}"
    run = _as_frontend_user(f"podman run -d --name {name} localhost/debian:bookworm sleep 600")
    assert run.returncode == 0, run.stderr
    try:
        fmt = "{{.State.ConmonPid}} {{.State.Pid}}"
        pids = [int(p) for p in _as_frontend_user(
            f"podman inspect --format '{fmt}' {name}").stdout.split()]
        pause = _pid(_as_frontend_user(
            "echo /tmp/podman-run-$(id -u)/libpod/tmp/pause.pid").stdout.strip())
        assert len(pids) == 2 and pause, (pids, pause)
        for pid in (*pids, pause):  # what a restart does to them, and nothing to /tmp
            os.kill(pid, 9)
        assert all(_dead(pid) for pid in (*pids, pause))
        broken = _as_frontend_user("podman ps -a")
        assert broken.returncode != 0 and "system migrate" in broken.stderr, broken.stderr
        up = subprocess.run([str(ROOT / "scripts/frontend"), "up"], capture_output=True,
                            text=True, timeout=300)
        assert up.returncode == 0, up.stderr
        state = _as_frontend_user(f"podman inspect --format '{{{{.State.Status}}}}' {name}")
        assert state.returncode == 0, state.stderr
        assert state.stdout.strip() != "running", state.stdout  # exited, or stopping on its way
        assert "podman system migrate" in up.stderr
        # and up on a healthy podman leaves it be
        again = subprocess.run([str(ROOT / "scripts/frontend"), "up"], capture_output=True,
                               text=True, timeout=300)
        assert again.returncode == 0 and "migrate" not in again.stderr, again.stderr
        gone = _as_frontend_user(f"podman rm -f {name}")
        assert gone.returncode == 0, gone.stderr
    finally:
        _as_frontend_user(f"podman rm -f {name}")
