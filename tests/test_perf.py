"""The model's features from fingerprints and probes, the probe on this machine, the cache."""
import json
import math
import os
import subprocess
import sys

import pytest
from conftest import ROOT, request

from modak_lib.perf import features as F

ROW = {"framework": "pytorch", "compiler": "torch.compile:default", "allocator": "glibc",
       "precision": "bf16", "channels_last": 0, "onednn": 1, "accelerator": None,
       "trainable_parameters": 1_000_000, "flops_per_step": 6.4e9, "batch_size": 64,
       "flops_conv": 0.9, "flops_linear": 0.1, "flops_attention": 0.0,
       "flops_recurrent": float("nan"), "flops_norm": 0.0, "threads": 1, "cores": 2,
       "gflops_fp32": 100.0, "gflops_bf16": 250.0, "bandwidth_gbs": 20.0}


def test_features_describe_the_workload_and_the_target_not_their_names():
    cats, nums = F.features({**ROW, "workload": "anything", "fingerprint": "fp-x",
                             "microarchitecture": "zen5"})
    assert cats == ["pytorch", "torch.compile:default", "glibc", "bf16", "0", "1", "none"]
    x = dict(zip(F.NUMERIC, nums))
    assert x["log_params"] == pytest.approx(math.log(1e6))
    assert x["log_flops_per_sample"] == pytest.approx(math.log(1e8))
    assert (x["share_conv"], x["share_linear"], x["share_recurrent"]) == (0.9, 0.1, 0.0)
    assert x["thread_share"] == 0.5 and x["log_gflops"] == pytest.approx(math.log(100))
    assert x["log_bf16_ratio"] == pytest.approx(math.log(2.5))
    assert x["log_compute_s"] == pytest.approx(math.log(6.4e9 / 100e9))
    assert x["log_memory_s"] == pytest.approx(math.log(16e6 / 20e9))
    # names are not features: another workload name or CPU name changes nothing
    assert F.features({**ROW, "workload": "other", "microarchitecture": "icelake"}) == (
        cats, nums)
    # a step that accumulates gradients over 4 micro-batches of 64 trains on 256 samples:
    # its FLOPs per sample are a quarter, its batch (what the kernels see) the same; one
    # micro-batch, or none counted, is the plain step
    x4 = dict(zip(F.NUMERIC, F.features({**ROW, "micro_batches": 4})[1]))
    assert x4["log_flops_per_sample"] == pytest.approx(math.log(1e8 / 4))
    assert x4["log_batch"] == x["log_batch"] and x4["log_compute_s"] == x["log_compute_s"]
    for plain in (1, None, float("nan")):
        assert F.features({**ROW, "micro_batches": plain}) == (cats, nums)


# ROW's parameters' traffic: 1e6 parameters at 16 bytes each over 20 GB/s
PARAMS_S = 1e6 * F.BYTES_PER_PARAMETER / 20e9


def test_the_baseline_is_the_steps_arithmetic_at_the_measured_rates():
    fp32 = {**ROW, "precision": "fp32", "threads": 2}
    assert F.baseline(fp32) == pytest.approx(math.log(6.4e9 / 100e9 + PARAMS_S))
    # one thread of two: half the rate (the traffic is the same)
    assert F.baseline({**fp32, "threads": 1}) == pytest.approx(
        math.log(2 * 6.4e9 / 100e9 + PARAMS_S))
    # bf16: the matrix share (conv + linear = all of it here) at the bf16 rate
    assert F.baseline({**ROW, "threads": 2}) == pytest.approx(math.log(6.4e9 / 250e9 + PARAMS_S))
    # no native bf16 (1/50 of the fp32 rate): a bf16 step is far slower before any data
    slow = {**ROW, "threads": 2, "gflops_bf16": 2.0, "flops_conv": 0.5, "flops_linear": 0.0}
    assert F.baseline(slow) == pytest.approx(
        math.log(6.4e9 / 100e9 * (0.5 + 0.5 * 50) + PARAMS_S))
    assert math.isnan(F.baseline({**ROW, "gflops_fp32": None}))


def test_the_baseline_adds_the_steps_memory_traffic_which_bf16_does_not_speed_up():
    fp32 = {**ROW, "precision": "fp32", "threads": 2, "elements_per_step": 1e9}
    traffic = 1e9 * F.BYTES_PER_ELEMENT / 20e9  # written and read back at 20 GB/s
    assert F.baseline(fp32) == pytest.approx(math.log(6.4e9 / 100e9 + traffic + PARAMS_S))
    # ten times the parameters: ten times their traffic (an embedding table's step is that)
    big = {**fp32, "trainable_parameters": 1e7}
    assert math.exp(F.baseline(big)) - math.exp(F.baseline(fp32)) == pytest.approx(9 * PARAMS_S)
    # without native bf16 (1/50 of the fp32 rate), a step that is mostly traffic loses far
    # less than one that is all arithmetic
    slow = {**ROW, "threads": 2, "gflops_bf16": 2.0}

    def penalty(row):
        return math.exp(F.baseline(row) - F.baseline({**row, "precision": "fp32"}))
    assert penalty(slow) == pytest.approx((3.2 + PARAMS_S) / (0.064 + PARAMS_S))
    assert 40 < penalty(slow) < 50
    assert 1.0 < penalty({**slow, "elements_per_step": 1e9}) < 10.0


def test_the_baseline_adds_the_normalisations_passes_at_the_threads_share():
    fp32 = {**ROW, "precision": "fp32", "threads": 2}
    arithmetic = 6.4e9 / 100e9 + PARAMS_S
    # 5% of the forward FLOPs in normalisations: 4 an element, the forward a third of the
    # step's 6.4 GFLOP -> 26.7 million elements at NORM_BYTES_PER_ELEMENT over 20 GB/s
    normed = {**fp32, "flops_conv": 0.85, "flops_norm": 0.05}
    elements = 0.05 * 6.4e9 / 3 / 4
    assert F.norm_elements(normed) == pytest.approx(elements)
    norm_s = elements * F.NORM_BYTES_PER_ELEMENT / 20e9
    assert F.baseline(normed) == pytest.approx(math.log(arithmetic + norm_s))
    # one thread of two: the normalisations, like the arithmetic, at half the rate
    assert F.baseline({**normed, "threads": 1}) == pytest.approx(
        math.log(2 * 6.4e9 / 100e9 + PARAMS_S + 2 * norm_s))
    # bf16 does not speed them up (autocast keeps them in fp32): only the matrix share
    # (conv 0.85 + linear 0.1)
    bf16 = {**normed, "precision": "bf16"}
    assert F.baseline(bf16) == pytest.approx(
        math.log(6.4e9 / 100e9 * (0.05 + 0.95 * 100 / 250) + PARAMS_S + norm_s))
    # no share (a fingerprint without normalisations, or none counted): no term
    for share in (0.0, None, float("nan")):
        assert F.baseline({**normed, "flops_norm": share}) == pytest.approx(
            math.log(arithmetic))


def test_the_baseline_adds_the_operations_at_the_probes_time_each_or_the_cpus():
    fp32 = {**ROW, "precision": "fp32", "threads": 2, "ops_per_step": 300}
    arithmetic = 6.4e9 / 100e9 + PARAMS_S
    # a CPU's probe has no time per operation: each costs CPU_OP_US (eager dispatch)
    assert F.baseline(fp32) == pytest.approx(math.log(arithmetic + 300 * F.CPU_OP_US * 1e-6))
    # a GPU's probe measures it (its launches): 300 operations at 25 us are 7.5 ms
    gpu = {**fp32, "accelerator": "H100", "op_us": 25.0}
    assert F.baseline(gpu) == pytest.approx(math.log(arithmetic + 300 * 25e-6))
    # a tiny step on a fast GPU is mostly its launches: twice the operations, ~twice the time
    tiny = {**gpu, "flops_per_step": 1e6, "gflops_fp32": 50_000.0, "trainable_parameters": 1e3}
    assert math.exp(F.baseline({**tiny, "ops_per_step": 600}) - F.baseline(tiny)) == (
        pytest.approx(2.0, rel=1e-3))
    # a fingerprint without the count: no operations term
    assert F.baseline({**gpu, "ops_per_step": None}) == pytest.approx(math.log(arithmetic))


def test_a_cpus_dispatch_costs_the_calls_from_python_and_the_modules_more():
    """Where the fingerprint says where its operations came from, a CPU's step pays
    CPU_KERNEL_US an operation, CPU_CALL_US more for each Python called and CPU_MODULE_US
    a module call: a fused recurrent layer's thousands of operations from a few calls cost
    less each than a Python loop's; without the counts, CPU_OP_US each, as before."""
    fp32 = {**ROW, "precision": "fp32", "threads": 2, "ops_per_step": 4266}
    arithmetic = math.exp(F.baseline({**fp32, "ops_per_step": None}))
    fused = {**fp32, "python_ops_per_step": 29, "module_calls_per_step": 3}
    assert math.exp(F.baseline(fused)) - arithmetic == pytest.approx(
        (4266 * F.CPU_KERNEL_US + 29 * F.CPU_CALL_US + 3 * F.CPU_MODULE_US) * 1e-6)
    loop = {**fp32, "ops_per_step": 1897, "python_ops_per_step": 74,
            "module_calls_per_step": 51}
    assert F.cpu_dispatch_us(loop) / 1897 > F.cpu_dispatch_us(fused) / 4266
    # an older fingerprint (no calls counted): every operation at CPU_OP_US
    assert math.exp(F.baseline(fp32)) - arithmetic == pytest.approx(4266 * F.CPU_OP_US * 1e-6)
    # a GPU's probe measures its time per operation: the calls change nothing there
    gpu = {**fused, "accelerator": "H100", "op_us": 25.0}
    assert F.baseline(gpu) == pytest.approx(F.baseline({**gpu, "python_ops_per_step": None,
                                                        "module_calls_per_step": None}))


def test_the_baseline_adds_a_gpus_recurrent_time_steps_but_not_a_cpus():
    fp32 = {**ROW, "precision": "fp32", "threads": 2, "ops_per_step": 30}
    gpu = {**fp32, "accelerator": "H100", "op_us": 6.0}
    # 128 time steps in sequence (a two-layer GRU over 64): RECURRENT_KERNELS operations
    # each at the probe's time of one, on top of the 30 dispatched operations
    assert math.exp(F.baseline({**gpu, "recurrent_steps": 128})) - math.exp(F.baseline(gpu)) \
        == pytest.approx(128 * F.RECURRENT_KERNELS * 6e-6)
    # a CPU: the steps run in the library's loop, or are dispatched one by one and counted
    assert F.baseline({**fp32, "recurrent_steps": 128}) == pytest.approx(F.baseline(fp32))
    for none in (0, None):
        assert F.baseline({**gpu, "recurrent_steps": none}) == pytest.approx(F.baseline(gpu))


def test_a_keras_models_recurrent_time_steps_cost_a_cpu_each():
    """Keras runs a recurrent layer's time steps on a CPU as a loop of its backend's graph:
    each step costs KERAS_RECURRENT_STEP_US beyond its FLOPs, where PyTorch's layer runs
    them in the library's loop; on a GPU both pay the probe's kernels a step."""
    keras = {**ROW, "precision": "fp32", "threads": 2, "framework": "keras"}
    assert "ops_per_step" not in keras  # (Keras' fingerprint counts no dispatched operations)
    arithmetic = math.exp(F.baseline(keras))
    assert math.exp(F.baseline({**keras, "recurrent_steps": 96})) - arithmetic == \
        pytest.approx(96 * F.KERAS_RECURRENT_STEP_US * 1e-6)
    torch = {**keras, "framework": "pytorch"}
    assert F.baseline({**torch, "recurrent_steps": 96}) == pytest.approx(F.baseline(torch))
    gpu = {**keras, "accelerator": "H100", "op_us": 6.0}
    assert math.exp(F.baseline({**gpu, "recurrent_steps": 96})) - math.exp(F.baseline(gpu)) \
        == pytest.approx(96 * F.RECURRENT_KERNELS * 6e-6)


def test_what_the_model_lacks_is_said():
    assert F.missing(ROW) == []
    lacking = F.missing({**ROW, "flops_per_step": None, "gflops_fp32": None})
    assert any("fingerprint" in m for m in lacking) and any("modak probe" in m for m in lacking)


def test_one_function_for_fitting_and_planning():
    pd = pytest.importorskip("pandas")
    frame = F.frame(pd.DataFrame([ROW, {**ROW, "precision": "fp32", "gflops_bf16": None}]))
    cats, nums = F.features(ROW)
    assert list(frame.iloc[0][F.CATEGORICAL]) == cats
    assert list(frame.iloc[0][F.NUMERIC]) == pytest.approx(nums)
    assert frame.iloc[1]["log_bf16_ratio"] == 0.0  # no bf16 figure: no ratio


def test_the_probe_measures_this_machine_within_a_sane_range():
    pytest.importorskip("torch")
    from modak_runtime import probe
    rec = probe.measure(seconds=2.0)
    assert rec["modak"] == "probe" and rec["schema"] == probe.SCHEMA
    assert 1 < rec["gflops_fp32"] < 100_000, rec
    assert 0.5 < rec["bandwidth_gbs"] < 5_000, rec
    assert rec["gflops_bf16"] > 0 and rec["threads"] == len(os.sched_getaffinity(0))
    # capped at AVX2 (no native bf16), bf16 products are far slower than fp32 ones
    env = dict(os.environ, ONEDNN_MAX_CPU_ISA="AVX2", ATEN_CPU_CAPABILITY="avx2")
    out = subprocess.run([sys.executable, "-m", "modak_runtime.probe", "--seconds", "2"],
                         capture_output=True, text=True, env=env, timeout=120, cwd=ROOT)
    capped = probe.parse(out.stdout)
    assert capped["isa_caps"] == {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}
    ratio, capped_ratio = (r["gflops_bf16"] / r["gflops_fp32"] for r in (rec, capped))
    assert capped_ratio < 0.5
    if {"avx512_bf16", "amx_bf16"} & set(rec["host"]["cpu_features"]):
        assert capped_ratio < 0.5 * ratio  # the cap took the native bf16 away
    else:  # a CPU without native bf16 (an AMD Zen 2, say): emulated with or without the cap
        assert ratio < 0.5


def test_the_probes_measurements_take_turns_so_that_a_slow_stretch_does_not_set_a_figure():
    """A machine slow for the first half of the probe (the AMX machine's bf16 for seconds
    at a time): measured one after the other, the first measurement would fall wholly in
    it; taking turns, each one's best is of the fast half too."""
    import time as clock
    from modak_runtime import probe
    start = clock.perf_counter()
    total = 0.6

    def run() -> None:  # 1 unit of work: 40 ms in the slow half, 4 ms after it
        slow = clock.perf_counter() - start < total / 2
        clock.sleep(0.04 if slow else 0.004)

    runs = {name: (run, 1.0) for name in ("first", "second", "third")}
    rates = probe._best_rates(runs, total)
    assert set(rates) == set(runs)
    assert all(r > 60 for r in rates.values()), rates  # (fast: 250 a second; slow: 25)
    assert clock.perf_counter() - start >= total  # (it spends its time)
    # one after the other, as the probe measured before: the first had only the slow half
    start = clock.perf_counter()
    one_by_one = {name: probe._best_rate(r, w, total / 3) for name, (r, w) in runs.items()}
    assert one_by_one["first"] < 60 < one_by_one["third"], one_by_one


def test_the_normalisations_cost_benchmark_measures_every_layer_it_names():
    pytest.importorskip("torch")
    out = subprocess.run([sys.executable, "benchmarks/norm_cost.py", "--repeats", "1",
                          "--threads", "1"], capture_output=True, text=True, timeout=300,
                         cwd=ROOT)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("1 threads; the probe's bandwidth")
    rows = {}
    for line in lines[2:]:
        name, shape, median, low, high = line.split()
        rows[(name, shape)] = float(median)
        assert float(low) <= float(median) <= float(high)
    from benchmarks.norm_cost import CASES
    assert set(rows) == {(n, "x".join(map(str, s))) for n, s in CASES}
    # what the baseline's term rests on: a BatchNorm in training costs more than the
    # generic 8 bytes an element of its output (written and read back once)
    assert all(v > F.BYTES_PER_ELEMENT for (n, _), v in rows.items() if "Norm" in n), rows


def test_modak_probe_remembers_the_figures_for_the_planner(tmp_path, monkeypatch, capsys):
    pytest.importorskip("torch")
    from modak_lib.cli import main
    from modak_lib.perf.predictor import candidate_rows
    from modak_lib.planner import decide
    monkeypatch.setenv("MODAK_PROBES", str(tmp_path / "probes.json"))
    infra = tmp_path / "infra.yaml"
    infra.write_text("name: box\nmicroarchitecture: zen4\ncores_per_node: 2\n")
    assert main(["probe", "--infra", str(infra), "--seconds", "1", "--json"]) == 0
    rec = json.loads(capsys.readouterr().out)
    cached = json.loads((tmp_path / "probes.json").read_text())
    assert list(cached) == ["box|zen4|2|host"] and rec["gflops_fp32"] > 0
    req = request(target={"name": "box", "microarchitecture": "zen4", "cores_per_node": 2})
    row = candidate_rows(req, [decide(req).chosen])[0]
    assert row["gflops_fp32"] == rec["gflops_fp32"]
    assert row["bandwidth_gbs"] == rec["bandwidth_gbs"]


def test_a_gpu_probes_operation_time_reaches_the_planners_rows(tmp_path, monkeypatch):
    """What a GPU's probe measured of one operation, kept per target, meets the workload's
    operation count in the planner's rows: its baseline has the launches in it."""
    from modak_lib.perf import probe as P
    from modak_lib.perf.predictor import candidate_rows
    from modak_lib.planner import decide
    monkeypatch.setenv("MODAK_PROBES", str(tmp_path / "probes.json"))
    target = {"name": "gpubox", "microarchitecture": "icelake", "cores_per_node": 16}
    req = request(target=target)
    rec = {"modak": "probe", "gflops_fp32": 51500.0, "gflops_bf16": 780000.0,
           "bandwidth_gbs": 3000.0, "op_us": 7.0, "device": "cuda"}
    P.remember(req.target, rec)
    workload = {"workload": "w", "fingerprint": "fp-w", "trainable_parameters": 1e6,
                "flops_per_step": 1e9, "elements_per_step": 1e6, "ops_per_step": 400,
                "batch_size": 32}
    row = candidate_rows(req, [decide(req).chosen], workload=workload)[0]
    assert row["op_us"] == 7.0 and row["ops_per_step"] == 400
    assert math.exp(F.baseline(row)) > 400 * 7e-6
    # and so do a recurrent workload's time steps: each a few operations on the GPU
    gru = candidate_rows(req, [decide(req).chosen],
                         workload={**workload, "recurrent_steps": 128})[0]
    assert gru["recurrent_steps"] == 128
    # and a step's micro-batches (gradient accumulation)
    assert candidate_rows(req, [decide(req).chosen],
                          workload={**workload, "micro_batches": 4})[0]["micro_batches"] == 4
    assert math.exp(F.baseline(gru)) - math.exp(F.baseline(row)) == pytest.approx(
        128 * F.RECURRENT_KERNELS * 7e-6)
    # an infrastructure file's rates win, and the probe's operation time is still kept
    given = request(target={**target, "peak_gflops": 40000.0, "memory_bandwidth_gbs": 2000.0})
    assert P.target_figures(given.target) == {"gflops_fp32": 40000.0, "gflops_bf16": None,
                                              "bandwidth_gbs": 2000.0, "op_us": 7.0}
