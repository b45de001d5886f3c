"""Unmodified user scripts: stock against MODAK's choice, and the runtime's own overhead.

    .venv/bin/python benchmarks/user_scripts.py [--repeats 3] [--only NAME ...]

For each of three ordinary scripts (MNIST-CNN in PyTorch, a small transformer LM in
PyTorch, a Keras ``model.fit`` classifier), in one run on this machine:

1. **trials**: the script runs through the runtime a few short times (stock, bf16, tcmalloc,
   and torch.compile for PyTorch) into a fresh results store, as MODAK's autotuning would;
2. **plan**: ``make_plan`` with a model fitted on the shipped dataset plus those trials (the
   quick refit's estimators, as after a deploy) says what MODAK would run for a job that
   states its steps (those of the compared runs), so that a compiler's warm-up is weighed
   against them;
3. **compare**, interleaved and repeated: ``python3 SCRIPT`` (stock, exactly what the user
   runs) against ``python3 -m modak_runtime -- SCRIPT`` with the chosen knobs, the wall time
   of a fixed number of steps *including* start-up and compilation, and the last loss
   (a speed-up that changes the result is not one);
4. **overhead**: what the runtime costs per step with every knob at default, measured where
   it cannot hide in the noise: a one-parameter model whose step takes tens of microseconds,
   timing its own loop, plain and through the runtime (interleaved); that cost is then set
   against each script's measured step time.

It prints two tables; the run takes about 10 minutes on 2 cores.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from modak_lib.perf import fit as mm  # noqa: E402
from modak_lib.pipeline import make_plan  # noqa: E402
from modak_lib.readers.dsl import read_dsl  # noqa: E402
from modak_lib.report import table_lines  # noqa: E402
from modak_lib.results import ResultsStore, load_frame, parse_fom_lines, row_from_fom  # noqa: E402

TCMALLOC = "/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4"
KNOBS = ("MODAK_THREADS", "MODAK_TORCH_COMPILE", "MODAK_JIT_COMPILE", "MODAK_PRECISION",
         "MODAK_ALLOCATOR", "LD_PRELOAD", "MODAK_MAX_STEPS", "MODAK_CHANNELS_LAST")

# name -> (script, framework, arguments(steps), steps per unit, trial configurations)
SCRIPTS = {
    "mnist-cnn (torch)": (ROOT / "examples/mnist-cnn/train.py", "pytorch",
                          lambda n: ["--steps", str(n)], 1),
    "tiny-lm (torch)": (ROOT / "tests/user_scripts/tiny_lm.py", "pytorch",
                        lambda n: ["--steps", str(n)], 1),
    "keras-fit (keras)": (ROOT / "tests/user_scripts/keras_fit.py", "keras",
                          lambda n: ["--epochs", str(max(1, n // 8)), "--samples", "512"], 8),
}
LENGTHS = {"mnist-cnn (torch)": 120, "tiny-lm (torch)": 600, "keras-fit (keras)": 160}
PROBES = {  # framework -> a script timing its own loop of tiny steps (hook cost dominates)
    "pytorch": """
import time, torch
w = torch.nn.Linear(1, 1)
opt = torch.optim.SGD(w.parameters(), lr=0.01)
x = torch.ones(1, 1)
def step():
    opt.zero_grad()
    w(x).pow(2).sum().backward()
    opt.step()
for _ in range(300):
    step()
t = time.perf_counter()
for _ in range(3000):
    step()
print("US_PER_STEP", (time.perf_counter() - t) / 3000 * 1e6)
""",
    "keras": """
import time, numpy as np, keras
m = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
m.compile(optimizer="sgd", loss="mse")
x = np.ones((3000, 1), "float32")
m.fit(x[:300], x[:300], batch_size=1, epochs=1, verbose=0)
t = time.perf_counter()
m.fit(x, x, batch_size=1, epochs=1, verbose=0)
print("US_PER_STEP", (time.perf_counter() - t) / 3000 * 1e6)
""",
}
TRIAL_STEPS = {"mnist-cnn (torch)": 40, "tiny-lm (torch)": 150, "keras-fit (keras)": 40}


def trials(framework: str) -> list[tuple[str, dict]]:
    out = [("stock", {}), ("bf16", {"MODAK_PRECISION": "bf16"})]
    if os.path.exists(TCMALLOC):
        out.append(("tcmalloc", {"MODAK_ALLOCATOR": "tcmalloc", "LD_PRELOAD": TCMALLOC}))
    if framework == "pytorch":
        out.append(("torch.compile", {"MODAK_TORCH_COMPILE": "default"}))
    else:
        out.append(("xla", {"MODAK_JIT_COMPILE": "1"}))
    return out


def run(script: Path, args: list[str], env: dict, runtime: bool) -> tuple[float, dict, str]:
    full = {k: v for k, v in os.environ.items() if k not in KNOBS}
    full.update(env, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="3", KERAS_BACKEND="tensorflow")
    cmd = [sys.executable] + (["-m", "modak_runtime", "--"] if runtime else []) + \
        [str(script), *args]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=script.parent, env=full, capture_output=True, text=True,
                          timeout=1800)
    wall = time.perf_counter() - t0
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")
    recs = parse_fom_lines(proc.stdout)
    return wall, (recs[-1] if recs else {}), proc.stdout


def last_loss(stdout: str, rec: dict) -> float | None:
    if rec:
        return rec["metrics"]["final_loss"]
    for line in reversed(stdout.splitlines()):  # the plain script's own last print
        words = [w for w in line.replace(":", " ").split() if w]
        for i, w in enumerate(words[:-1]):
            if w == "loss":
                try:
                    return float(words[i + 1])
                except ValueError:
                    pass
    return None


def request_for(name: str, script: Path, framework: str, n: int):
    _, _, argf, _ = SCRIPTS[name]
    doc = {"job": {
        "job_options": {"job_name": "bench"},
        "application": {"executable": f"python3 {script.name}", "arguments": argf(n)},
        "target": {"job_scheduler_type": "none"},
        "optimisation": {"enable_opt_build": False, "app_type": "ai_training",
                         "app_type-ai_training": {
                             "config": {"ai_framework": framework,
                                        "allow_reduced_precision": True},
                             f"ai_framework-{framework}": {
                                 "version": "2.13" if framework == "pytorch" else "3",
                                 **({"compile": True} if framework == "pytorch"
                                    else {"jit_compile": True})}}}}}
    req = read_dsl(doc, str(script.parent / "request.json"))
    from modak_lib.readers.infra import read_infra  # this machine, as the local example
    return req.model_copy(update={"target": read_infra(ROOT / "examples/infra/local.yaml")})


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--only", nargs="*", choices=list(SCRIPTS))
    p.add_argument("--quick", action="store_true", help="tiny runs: checks the benchmark "
                   "itself, its figures mean nothing")
    a = p.parse_args()
    if a.quick:
        for name in LENGTHS:
            LENGTHS[name] = 16 if "keras" in name else 8
            TRIAL_STEPS[name] = 8 if "keras" in name else 6
    names = a.only or list(SCRIPTS)
    rows, overhead_rows = [], []
    stock_step: dict[str, tuple[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        store = ResultsStore(Path(tmp) / "store.sqlite")
        for name in names:
            script, framework, argf, unit = SCRIPTS[name]
            req = request_for(name, script, framework, TRIAL_STEPS[name])
            from modak_lib import workload
            base = {"MODAK_WORKLOAD_KEY": workload.key(req.application),
                    "MODAK_WORKLOAD": workload.label(req.application)}
            # 1. short trials through the runtime, into the store
            t0 = time.perf_counter()
            stock_s = stock_steps = None
            for label, env in trials(framework):
                threads = {"MODAK_THREADS": str(req.target.cores_per_node)}
                _, rec, _ = run(script, argf(TRIAL_STEPS[name]), {**base, **threads, **env},
                                True)
                if label == "stock":
                    stock_s = rec["metrics"]["s_per_step"]
                    stock_steps = rec["metrics"]["steps"]
                store.append([row_from_fom(rec, source="autotune", run_id=f"bench/{label}",
                                           microarchitecture=req.target.microarchitecture,
                                           cores=req.target.cores_per_node)])
            trial_s = time.perf_counter() - t0
            # 2. the plan, as the refit after a run makes the model, for a job that states
            # its steps (those of the compared runs: the trial's, scaled), so that a
            # compiler's warm-up is weighed against them
            frame = load_frame(store)
            predictor = mm.model_predictor(mm.fit(frame, estimators=mm.QUICK_ESTIMATORS),
                                          frame)
            steps = round(stock_steps * LENGTHS[name] / TRIAL_STEPS[name])
            job = req.model_copy(update={"application": req.application.model_copy(
                update={"steps": steps})})
            plan = make_plan(job, predictor=predictor, run_id="bench").plan
            chosen = {k: v for k, v in plan.environment.items() if k.startswith(
                ("MODAK_", "LD_PRELOAD", "TF_", "OMP_", "MKL_"))}
            label = plan.chosen.label().split(" ", 1)[1]
            # 3. stock vs chosen, interleaved
            n = LENGTHS[name]
            walls: dict[str, list] = {"stock": [], "chosen": []}
            losses: dict[str, list] = {"stock": [], "chosen": []}
            for _ in range(a.repeats):
                for which, env, runtime in (("stock", {}, False), ("chosen", chosen, True)):
                    w, rec, out = run(script, argf(n), env, runtime)
                    walls[which].append(w)
                    losses[which].append(last_loss(out, rec))
            med = {k: statistics.median(v) for k, v in walls.items()}
            rows.append([name, label, f"{med['stock']:.1f}", f"{med['chosen']:.1f}",
                         f"{med['stock'] / med['chosen']:.2f}x",
                         f"{min(walls['stock']):.1f}-{max(walls['stock']):.1f}",
                         f"{min(walls['chosen']):.1f}-{max(walls['chosen']):.1f}",
                         _loss(losses["stock"]), _loss(losses["chosen"]), f"{trial_s:.0f}"])
            stock_step[name] = (framework, stock_s)
            print(f"done: {name}", file=sys.stderr, flush=True)
        # 4. the runtime's own cost per step, against each script's step time
        cost = {}
        for framework in sorted({fw for fw, _ in stock_step.values()}):
            probe = Path(tmp) / f"probe_{framework}.py"
            probe.write_text(PROBES[framework])
            us: dict[bool, list] = {False: [], True: []}
            for _ in range(max(5, a.repeats)):
                for runtime in (False, True):
                    out = run(probe, [], {}, runtime)[2]
                    us[runtime].append(float(out.split("US_PER_STEP")[1].split()[0]))
            cost[framework] = (statistics.median(us[False]), statistics.median(us[True]))
        for name, (framework, step_s) in stock_step.items():
            plain_us, rt_us = cost[framework]
            extra = max(0.0, rt_us - plain_us)
            overhead_rows.append([name, f"{step_s * 1e3:.1f}", f"{plain_us:.0f}", f"{rt_us:.0f}",
                                  f"{extra:.0f}", f"{extra / (step_s * 1e6) * 100:.2f}%"])
    print(f"stock vs MODAK's choice: wall seconds of a fixed number of steps (median of "
          f"{a.repeats} interleaved repeats, start-up and compilation included)")
    print("\n".join(table_lines(rows, ["script", "MODAK's choice", "stock s", "chosen s",
                                       "speed-up", "stock min-max", "chosen min-max",
                                       "stock loss", "chosen loss", "trials s"])))
    print("\nthe runtime's own cost per step, all knobs at default (a one-parameter model's "
          "step, timed by itself, plain and through the runtime; medians of 5 interleaved runs),"
          " against each script's stock step time")
    print("\n".join(table_lines(overhead_rows, ["script", "step ms", "probe plain us",
                                                "probe runtime us", "runtime us/step",
                                                "overhead"])))
    return 0


def _loss(values) -> str:
    vals = [v for v in values if v is not None]
    return f"{statistics.median(vals):.4f}" if vals else "-"


if __name__ == "__main__":
    sys.exit(main())
