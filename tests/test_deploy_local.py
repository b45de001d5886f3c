"""The deploy path through the localhost inventory: no front-end, no Slurm, no container.

The user's own script outside this repository, the budgeted search before its job, and
the knobs a script does not take or breaks under, all on this host (``local`` scheduler).
These take no front-end, so the suite's other worker runs them beside the front-end's."""
import json
import os
import re
import shutil
import subprocess

import pytest
from conftest import ROOT
from deploying import QUICK, USER_REQUEST, copy_model, local_deploy, ok, plan_json, user_project

from modak_lib.models import Configuration
from modak_lib.results import ResultsStore

pytestmark = pytest.mark.slow


@pytest.fixture
def local_model(tmp_path, fitted_model):
    """The local deploys' model: the session's (the first plan's fit is tested by
    tests/test_packaging.py, from the installed package)."""
    copy_model(fitted_model, tmp_path)


@pytest.mark.usefixtures("local_model")
def test_local_scheduler_over_a_local_connection(tmp_path):
    """No root, no Slurm, no container: the localhost inventory still runs the example."""
    if not shutil.which("ansible-playbook"):
        pytest.skip("needs ansible-core: scripts/setup-venv installs it")
    proc, _ = local_deploy(tmp_path, QUICK, modak_inputs={"steps": "5"},
                            modak_job_files=[str(ROOT / "workloads")])
    ok(proc)
    assert re.search(r"job local-\d+ COMPLETED", proc.stdout)
    assert ResultsStore(tmp_path / "store.sqlite").count() == 1


@pytest.mark.parametrize("work_dir,given,run_dir", [
    ("scratch/runs", None, "/home/u/scratch/runs/job-r1"),  # (the target's, under the home)
    ("/lustre/u/runs", None, "/lustre/u/runs/job-r1"),
    ("scratch/runs", "/tmp/w", "/tmp/w/job-r1"),  # (the role variable, when set, wins)
])
def test_the_run_directory_is_under_the_targets_work_dir(tmp_path, work_dir, given, run_dir):
    """The infrastructure file's (or the request's) ``frontend.work_dir`` places the run
    directory on the front-end, unless the play sets ``modak_work_dir``."""
    plan = {"plan": {"run_name": "job-r1", "target": {"frontend": {"work_dir": work_dir},
                                                      "image_dir": "images"}}}
    play = [{"hosts": "localhost", "connection": "local", "gather_facts": False,
             "vars": {"modak_home_dir": "/home/u", "modak_plan": plan,
                      **({"modak_work_dir": given} if given else {})},
             "tasks": [{"ansible.builtin.include_role": {"name": "modak.modak.modak_plan",
                                                         "tasks_from": "locate"}},
                       {"ansible.builtin.debug": {
                           "msg": "dirs={{ modak_run_dir }}|{{ modak_image_dir }}"}}]}]
    (tmp_path / "play.yml").write_text(json.dumps(play))
    proc = subprocess.run(["ansible-playbook", "-i", "localhost,", str(tmp_path / "play.yml")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    ok(proc)
    assert f"dirs={run_dir}|/home/u/images" in proc.stdout, proc.stdout[-2000:]


def test_search_settings_out_of_range_fail_naming_the_deploys_variables(tmp_path):
    """A budget of nothing (``-e modak_autotune_budget=abc``, which Jinja's float filter
    reads as 0.0), one step a trial, no candidate: the search fails before it starts,
    naming each setting with the deploy's variable, and writes no state."""
    state = tmp_path / "search.json"
    play = [{"hosts": "localhost", "connection": "local", "gather_facts": False,
             "tasks": [{"modak.modak.modak_search": {
                 "plan": {}, "state": str(state), "budget_fraction": 0.0, "first_steps": 1,
                 "candidates": 0, "loss_tolerance": 0.05}}]}]
    (tmp_path / "play.yml").write_text(json.dumps(play))
    proc = subprocess.run(["ansible-playbook", "-i", "localhost,", str(tmp_path / "play.yml")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    for said in ("budget_fraction (the deploy's modak_autotune_budget) must be more than 0",
                 "first_steps (the deploy's modak_autotune_steps) must be at least 2",
                 "candidates (the deploy's modak_autotune_k) must be from 1 to 64"):
        assert said in proc.stdout, proc.stdout[-3000:]
    assert "loss_tolerance" not in proc.stdout.split("modak_search: ", 1)[1].split("\n")[0]
    assert not state.exists()


@pytest.mark.usefixtures("local_model")
def test_a_users_script_outside_the_repository_on_the_local_inventory(tmp_path, monkeypatch):
    if not shutil.which("ansible-playbook"):
        pytest.skip("needs ansible-core: scripts/setup-venv installs it")
    # a target never probed: its job measures it first, and the figures are remembered
    monkeypatch.setenv("MODAK_PROBES", str(tmp_path / "probes.json"))
    request = user_project(tmp_path)
    # what the script writes, as its run ends: the request lists some as its outputs
    with (request.parent / "train.py").open("a") as script:
        script.write("\nimport os\nos.makedirs('ckpt', exist_ok=True)\n"
                     "open('ckpt/last.pt', 'wb').write(b'weights')\n"
                     "open('metrics.json', 'w').write('{\"ppl\": 3}')\n"
                     "os.symlink('/etc/hostname', 'ckpt/host')\n")
    req = json.loads(request.read_text())
    req["job"]["application"]["outputs"] = ["ckpt", "metrics.json", "never.txt"]
    request.write_text(json.dumps(req))
    proc, env = local_deploy(tmp_path, request)
    ok(proc)
    assert re.search(r"job local-\d+ COMPLETED", proc.stdout)
    (results,) = (tmp_path / "results").iterdir()
    got = results / "outputs"
    assert (got / "ckpt" / "last.pt").read_bytes() == b"weights"
    assert (got / "metrics.json").read_text() == '{"ppl": 3}'
    assert not (got / "ckpt" / "host").exists()  # (a link: left out, and said)
    assert (f"outputs: 2 file(s) in {results}/outputs/; not written by the job: never.txt; "
            "left out: ckpt/host (a symbolic link)") in proc.stdout, proc.stdout[-3000:]
    assert not list(results.glob(".fetch-*")) and not list(results.parent.glob("*.tgz"))
    (row,) = ResultsStore(tmp_path / "store.sqlite").rows()
    assert row["status"] == "ok" and row["steps"] == 12 and row["fingerprint"].startswith("fp-")
    assert row["image"] == "host"  # no container: it ran in the host's environment
    assert "-m modak_runtime.probe" in next((tmp_path / "plans").glob("*/job.sh")).read_text()
    probes = json.loads((tmp_path / "probes.json").read_text())
    (probe,) = probes.values()
    assert probe["gflops_fp32"] > 1 and probe["bandwidth_gbs"] > 0.5
    assert row["gflops_fp32"] == probe["gflops_fp32"]  # the run is described by them
    run_dir = next((tmp_path / "runs").iterdir())
    assert (run_dir / "train.py").read_text() == (request.parent / "train.py").read_text()
    assert not (run_dir / "notes.txt").exists() and (run_dir / "modak_runtime").is_dir()
    assert not list(run_dir.glob(".modak-outputs-*"))  # (the archive is removed once fetched)
    plan = json.loads(next((tmp_path / "plans").glob("*/plan.json")).read_text())
    again = plan_json(request, env, "--infra", str(ROOT / "examples/infra/local.yaml"),
                       "--out", str(tmp_path / "again"))
    assert again["decided_by"] == "model"
    # known now: the next job does not probe again
    assert "modak_runtime.probe" not in (tmp_path / "again" / "job.sh").read_text()
    (ran,) = [c for c in again["candidates"] if c["configuration"] == plan["chosen"]]
    assert ran["prediction"]["source"] == "measured median of 1 run(s)"
    assert abs(ran["prediction"]["seconds"] - row["s_per_step"]) < 1e-9


@pytest.mark.usefixtures("local_model")
def test_a_script_that_raises_in_stocks_trial_is_not_submitted_as_a_job(tmp_path):
    """A user's script that fails at stock (its package left behind, say) fails its job the
    same way, after its wait in the queue: the deploy stops after the search with the
    script's error and the trial's run, and submits nothing."""
    if not shutil.which("ansible-playbook"):
        pytest.skip("needs ansible-core: scripts/setup-venv installs it")
    request = user_project(tmp_path)
    (request.parent / "train.py").write_text("import torch\nfrom gcn.graph import blocks\n"
                                             "import dgl_left_behind\n")
    doc = json.loads(request.read_text())
    doc["job"]["optimisation"]["enable_autotuning"] = True
    request.write_text(json.dumps(doc))
    proc, _ = local_deploy(tmp_path, request, modak_autotune_k=1, modak_autotune_steps=4,
                            modak_autotune_rounds=1, modak_autotune_budget=1.0)
    assert proc.returncode != 0
    assert re.search(r"the script failed in stock's trial \(No module named 'gcn'\): a job "
                     r"would fail the same way, so none was submitted; the trial's output is "
                     r"that of run r[0-9a-f]{11}; the run's files import 2 modules that the "
                     r"job's Python lacks: 'gcn' \(train.py line 2\), 'dgl_left_behind' "
                     r"\(train.py line 3\); a package the Python the job runs lacks: "
                     r"install it there \(no container runs the job", proc.stdout), \
        proc.stdout[-3000:]
    assert "-e modak_new_run=true" in proc.stdout  # (a plain rerun finds this search as it ended)
    assert "Submit the job, or find it" not in proc.stdout
    rows = ResultsStore(tmp_path / "store.sqlite").rows()
    assert rows and all(r["source"] == "autotune" and r["status"] == "failed" for r in rows)


@pytest.mark.usefixtures("local_model")
def test_a_new_workload_with_autotuning_is_searched_before_its_job_once(tmp_path):
    """The deploy itself runs the budgeted search when the model cannot speak for the
    workload (a new script) and the request enables autotuning: trials through the job
    path (stock among them), then the job with the search's choice; run again, nothing
    runs twice."""
    if not shutil.which("ansible-playbook"):
        pytest.skip("needs ansible-core: scripts/setup-venv installs it")
    request = user_project(tmp_path)
    doc = json.loads(request.read_text())
    doc["job"]["optimisation"]["enable_autotuning"] = True
    request.write_text(json.dumps(doc))
    search = {"modak_autotune_k": 2, "modak_autotune_steps": 4, "modak_autotune_rounds": 1,
              "modak_autotune_budget": 1.0}
    proc, env = local_deploy(tmp_path, request, **search)
    ok(proc)
    # one round, and stock's second trial where the choice is a candidate (to confirm it)
    found = re.search(r"chose (.+?) after (\d+) trials? in ([12]) round", proc.stdout)
    assert found, proc.stdout[-3000:]
    confirmed = int(found.group(3)) - 1
    # and why: how the budget was set (kept in the search's state from its first step) and
    # each candidate's verdict, stock's among them
    assert re.search(r"\"budget \d+ s: 100% of the job's expected \d+ s", proc.stdout), \
        proc.stdout[-3000:]
    assert re.search(r"\"pytorch-2.13.0-cpu compiler=off threads=\d+ alloc=glibc prec=fp32: "
                     r"(stock|chosen)", proc.stdout), proc.stdout[-3000:]
    rows = ResultsStore(tmp_path / "store.sqlite").rows()
    trials = [r for r in rows if r["source"] == "autotune"]
    jobs = [r for r in rows if r["source"] != "autotune"]
    assert len(trials) >= 2 and all(r["steps"] == 4 for r in trials)
    assert any(r["compiler"] == "off" and r["allocator"] == "glibc" and r["precision"] == "fp32"
               and r["threads"] == r["cores"] for r in trials)  # stock was measured
    # each trial keeps its job's clock around the launch, longer than its training: what
    # a later search here takes a trial's cost besides its training from (this first one,
    # in a fresh store, assumed it)
    clocks = [(r["job_s"], json.loads(r["raw"])["metrics"]) for r in trials]
    assert all(job_s and job_s > m["wall_s"] - m["startup_s"] for job_s, m in clocks), clocks
    # and what the deploy spent around its job up to its record (its tasks), which a later
    # search counts in a trial's cost too; a job's row has none
    assert all(r["path_s"] and r["path_s"] > 0 for r in trials), [r["path_s"] for r in trials]
    assert "job path 10 s, assumed: no trial here has measured it yet" in proc.stdout
    (job,) = jobs
    assert job["steps"] == 12 and job["status"] == "ok"  # the whole job, uncapped
    assert job["path_s"] is None
    plans = [json.loads(p.read_text()) for p in (tmp_path / "plans").glob("*/plan.json")]
    (final,) = [p for p in plans if p["decided_by"] == "autotune" and
                "MODAK_MAX_STEPS" not in p["environment"]]
    first = next(p for p in plans if p["search"])
    assert len(first["autotune"]) + confirmed == len(trials)
    # each candidate's trial is capped at its share of the budget, stock's first is not
    state = json.loads(next((tmp_path / "plans").glob("*/search.json")).read_text())
    # stock's trial carried the script's start-up and the runtime's whole clock through the
    # job path (modak_record's measured): the shortest cap a candidate is given is taken
    # from them, and a share is given less the job path's time outside that clock
    assert all(t["startup_s"] > 0 and 0 < t["runtime_s"] < t["wall_s"]
               for t in state["trials"]
               if Configuration(**t["configuration"]) == Configuration(**state["stock"])), \
        state["trials"]
    # each trial ran through tasks of the deploy around its job (planning, staging, the
    # wait, the record), timed on the controller: the budget is spent by both
    ran = [t for t in state["trials"] if not t["skipped"]]
    assert ran and all(t["path_s"] > 0 for t in ran), ran
    assert state["spent_s"] == pytest.approx(sum(t["wall_s"] + t["path_s"] for t in ran))
    tried = [p for p in plans if "MODAK_MAX_STEPS" in p["environment"]]
    assert len(tried) == len(trials)
    # every trial carries its search's id (kept in its state): part of its run, so that a
    # later search's trials are its own, not this one's found again
    assert state["search_id"] and all(p["environment"].get("MODAK_SEARCH") == state["search_id"]
                                      for p in tried), (state["search_id"], tried)
    # only what was submitted went to the front-end: not the first plan, which the search
    # replaced (unless it is the search's choice)
    assert {d.name for d in (tmp_path / "runs").iterdir()} == {
        p["run_name"] for p in tried + [final]}
    stock_caps = []
    for p in tried:
        cap = p["environment"].get("MODAK_MAX_SECONDS")
        if Configuration(**p["chosen"]) == Configuration(**state["stock"]):
            stock_caps.append(cap)
        else:  # (each round re-bases the budget on its stock trial: a noisy one moves it)
            assert 0 < float(cap) <= 1.5 * state["budget_s"], (cap, state["budget_s"])
    # stock's trial in the round is not capped; its second trial, the confirmation (where the
    # choice is a candidate), is capped at what the budget has left
    assert stock_caps.count(None) == 1 and len(stock_caps) == 1 + confirmed, stock_caps
    assert all(0 < float(cap) <= state["budget_s"] for cap in stock_caps if cap is not None), \
        (stock_caps, state["budget_s"])
    assert {k: job[k] for k in ("compiler", "allocator", "precision", "threads")} == {
        "compiler": final["chosen"]["compiler"] or "off",
        "allocator": final["chosen"]["allocator"], "precision": final["chosen"]["precision"],
        "threads": final["chosen"]["threads"]}
    again, _ = local_deploy(tmp_path, request, **search)
    ok(again)
    assert ResultsStore(tmp_path / "store.sqlite").count() == len(rows)


@pytest.mark.usefixtures("local_model")
def test_a_candidate_whose_knob_a_trial_found_not_applicable_is_not_tried(tmp_path):
    """A round's trials run one after the other: when one finds a knob not applicable to
    the script (torch.compile on this LSTM tagger), the round's later candidates with that
    knob are not tried, with the refused trial's reason (before, their plans failed in the
    middle of the deploy, which rescued them as failed trials); the search and the job go
    on."""
    if not shutil.which("ansible-playbook"):
        pytest.skip("needs ansible-core: scripts/setup-venv installs it")
    request = user_project(tmp_path, "lstm_tagger.py")
    doc = json.loads(request.read_text())
    doc["job"]["optimisation"]["enable_autotuning"] = True
    doc["job"]["application"]["arguments"] = "--steps 40"
    request.write_text(json.dumps(doc))
    proc, _ = local_deploy(tmp_path, request, modak_autotune_k=3, modak_autotune_steps=4,
                            modak_autotune_rounds=1, modak_autotune_budget=1.0)
    ok(proc)
    assert re.search(r"compiler=(torch\.compile\S*) \S+ \S+ prec=\w+: not tried: "
                     r"compiler=\1 was not applied to this script in the trial of \S+ "
                     r"compiler=\1 .*Dynamo", proc.stdout), proc.stdout[-3000:]
    assert "is not a candidate of this request" not in proc.stdout
    assert re.search(r"rescued=0", proc.stdout)
    # one round, and stock's second trial where a candidate would be chosen on it (run
    # alone after it, to confirm the choice)
    chose = re.search(r"chose (.+?) after (\d+) trials? in ([12]) round", proc.stdout)
    assert chose and "torch.compile" not in chose.group(1), proc.stdout[-3000:]
    if chose.group(3) == "2":
        assert "its second trial, run to confirm" in proc.stdout, proc.stdout[-3000:]
    rows = ResultsStore(tmp_path / "store.sqlite").rows()
    assert any(r["source"] == "autotune" and r["not_applied"] == "compiler" for r in rows)
    (job,) = [r for r in rows if r["source"] != "autotune"]
    assert job["status"] == "ok" and job["compiler"] == "off"


@pytest.mark.usefixtures("local_model")
def test_a_knob_the_script_does_not_take_is_named_with_its_reason(tmp_path):
    """torch.compile forced on an LSTM tagger (Dynamo does not trace its LSTM): the job
    runs, uncompiled, and its summary names the knob and why, as the store keeps it."""
    if not shutil.which("ansible-playbook"):
        pytest.skip("needs ansible-core: scripts/setup-venv installs it")
    request = user_project(tmp_path, "lstm_tagger.py")
    doc = json.loads(request.read_text())
    doc["job"]["application"]["arguments"] = "--steps 6"
    request.write_text(json.dumps(doc))
    env = dict(os.environ, MODAK_RESULTS=str(tmp_path / "store.sqlite"),
               MODAK_MODEL=str(tmp_path / "model.joblib"))
    plan = plan_json(request, env, "--infra", str(ROOT / "examples/infra/local.yaml"))
    compiled = next(c["configuration"] for c in plan["candidates"]
                    if c["configuration"]["compiler"])
    proc, _ = local_deploy(tmp_path, request, modak_force=compiled)
    ok(proc)
    (row,) = ResultsStore(tmp_path / "store.sqlite").rows()
    assert row["status"] == "ok" and row["not_applied"] == "compiler"
    why = json.loads(row["raw"])["not_applied"]["compiler"]
    assert f"not applied: compiler - {why}" in proc.stdout, proc.stdout[-3000:]


@pytest.mark.usefixtures("local_model")
def test_a_script_that_breaks_under_a_knob_fails_naming_it_and_is_not_offered_it_again(
        tmp_path):
    """Local connection: a user's script on a front-end whose compiler cache cannot be
    created (as on a cluster whose /tmp is not writable): it fails only when compiled."""
    if not shutil.which("ansible-playbook"):
        pytest.skip("needs ansible-core: scripts/setup-venv installs it")
    proj = tmp_path / "project"
    proj.mkdir()
    (proj / "train.py").write_text((ROOT / "tests/user_scripts/mlp.py").read_text())
    doc = json.loads(json.dumps(USER_REQUEST))
    doc["job"]["application"]["arguments"] = "6"
    doc["job"]["environment"] = {"TORCHINDUCTOR_CACHE_DIR": "/proc/modak-no-cache"}
    (proj / "request.json").write_text(json.dumps(doc))
    env = dict(os.environ, MODAK_RESULTS=str(tmp_path / "store.sqlite"),
               MODAK_MODEL=str(tmp_path / "model.joblib"))
    plan = plan_json(proj / "request.json", env, "--infra", str(ROOT / "examples/infra/local.yaml"))
    compiled = next(c["configuration"] for c in plan["candidates"]
                    if c["configuration"]["compiler"])
    proc, _ = local_deploy(tmp_path, proj / "request.json", modak_force=compiled)
    assert proc.returncode != 0
    assert re.search(r"ended FAILED \(exit code 1\); the run failed under the knob compiler"
                     r"[^\n]*: that configuration is not offered again; a deploy of the same "
                     r"request finds this run as it ended: add -e modak_new_run=true \(to opera "
                     r"deploy: MODAK_NEW_RUN=1 in its environment\) to plan it again without "
                     r"that configuration; its output is in", proc.stdout), proc.stdout[-3000:]
    (row,) = ResultsStore(tmp_path / "store.sqlite").rows()
    assert row["status"] == "failed" and row["failed_knob"] == "compiler"
    again = plan_json(proj / "request.json", env, "--infra",
                       str(ROOT / "examples/infra/local.yaml"))
    label = (f"pytorch-2.13.0-cpu compiler={compiled['compiler']} threads={compiled['threads']} "
             f"alloc={compiled['allocator']} prec={compiled['precision']}")
    assert any(n.startswith(f"not offered: {label}: failed when run") for n in again["notes"])
    assert compiled not in [c["configuration"] for c in again["candidates"]]
