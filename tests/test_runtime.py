"""The runtime on unmodified user scripts (tests/user_scripts/, written as users write them).

Each test runs a script the way a job script does (``python3 -m modak_runtime -- SCRIPT``),
with the plan's knobs as environment variables, and reads the figure-of-merit record.
"""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import ROOT, request, need

from modak_lib import workload
from modak_lib.results import ResultsStore, load_frame, parse_fom_lines, row_from_fom
from modak_runtime.record import STORE_COLUMNS, Record, flatten

SCRIPTS = ROOT / "tests" / "user_scripts"
KNOBS = ("MODAK_THREADS", "MODAK_TORCH_COMPILE", "MODAK_JIT_COMPILE", "MODAK_PRECISION",
         "MODAK_CHANNELS_LAST", "MODAK_ALLOCATOR", "MODAK_MAX_STEPS", "MODAK_ONEDNN",
         "MODAK_MAX_SECONDS", "MODAK_SEED")


def run(script, *args, env=None, runtime=True, cwd=None, timeout=600):
    """(return code, stdout without the record, the record or None, stderr)."""
    full = {k: v for k, v in os.environ.items() if k not in KNOBS}
    full.update(env or {})
    cmd = [sys.executable] + (["-m", "modak_runtime", "--"] if runtime else []) + \
        [str(script), *args]
    full["PYTHONPATH"] = str(ROOT)  # where modak_runtime lives (a run directory holds it)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=full, timeout=timeout,
                          cwd=cwd or ROOT)
    recs = parse_fom_lines(proc.stdout)
    plain = "\n".join(line for line in proc.stdout.splitlines()
                      if not line.startswith('{"') and line.strip())
    return proc.returncode, plain, (recs[-1] if recs else None), proc.stderr


# ---------------------------------------------------------------------------
# with every knob at its default, the runtime changes nothing the script computes
@pytest.mark.parametrize("script, args", [("tiny_lm.py", ["--steps", "20"]),
                                          ("mlp.py", ["25"])])
def test_defaults_reproduce_the_plain_scripts_losses_exactly(script, args):
    need("torch")
    rc0, plain, none, _ = run(SCRIPTS / script, *args, runtime=False)
    rc1, wrapped, rec, err = run(SCRIPTS / script, *args)
    assert rc0 == rc1 == 0, err
    assert none is None and plain and wrapped == plain  # every printed loss, every digit
    assert rec["status"] == "ok" and rec["applied"] == {} and rec["not_applied"] == {}
    assert rec["effect"]["matmul_dtype"] == "float32" and rec["effect"]["compiled"] is False
    steps = rec["metrics"]["steps"]
    assert steps == int(args[-1])
    losses = rec["metrics"]["losses"]
    assert [s for s, _ in losses] == list(range(1, steps + 1))  # sampled: all, when few
    if script == "mlp.py":  # it prints every loss: the record read the same scalars
        printed = [float(line.split()[1]) for line in plain.splitlines()]
        assert [round(v, 8) for _, v in losses] == printed


def test_keras_fit_defaults_reproduce_the_plain_scripts_loss():
    need("keras")
    need("tensorflow")
    env = {"KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "3"}
    rc0, plain, _, _ = run(SCRIPTS / "keras_fit.py", env=env, runtime=False)
    rc1, wrapped, rec, err = run(SCRIPTS / "keras_fit.py", env=env)
    assert rc0 == rc1 == 0, err
    final = [line for line in plain.splitlines() if line.startswith("final loss")]
    assert final and final == [line for line in wrapped.splitlines()
                               if line.startswith("final loss")]
    assert rec["framework"] == "keras" and rec["metrics"]["steps"] == 16  # 2 epochs x 8
    assert rec["metrics"]["steps_per_epoch"] == 8
    assert rec["effect"]["compute_dtype"] == "float32" and rec["effect"]["compiled"] is False
    fp = rec["fingerprint"]
    # an independent count: Conv2D(8, 3) on 16x16x1, then Dense 392->32 and 32->2
    conv = 2 * 9 * 1 * 8 * 14 * 14
    dense = 2 * 392 * 32 + 2 * 32 * 2
    assert fp["trainable_parameters"] == (9 * 8 + 8) + (392 * 32 + 32) + (32 * 2 + 2)
    assert fp["flops_per_step"] == 3 * (conv + dense) * 64 and fp["batch_size"] == 64
    assert fp["flop_share"]["conv"] == pytest.approx(conv / (conv + dense))

    # two models fitted one after another: each one's steps timed after its own warm-up
    # (the second one's first step traces its step function anew), none across the two
    rc, out, rec, err = run(SCRIPTS / "keras_fit.py", "--models", "2", "--epochs", "1",
                            env=env)
    assert rc == 0 and out.count("final loss") == 2, err
    assert rec["effect"]["models_trained"] == 2 and rec["metrics"]["steps"] == 16
    assert rec["metrics"]["timed_steps"] == 12 and rec["metrics"]["warmup_steps"] == 2


def test_a_keras_model_the_script_compiles_with_xla_itself_is_reported_and_not_claimed():
    """``Model.compile(jit_compile=True)`` written by the script: its XLA stands and is
    recorded (``effect.script_compile``, ``compiled``), in a stock run too; MODAK's XLA is
    reported not applied over it (it only repeated the script's, and claimed it), which
    the planner reads as no compiler to offer this workload.  Without the script's own,
    MODAK's XLA is applied as before."""
    need("keras")
    need("tensorflow")
    env = {"KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "3"}
    args = ("--epochs", "1", "--samples", "256")
    rc, _, stock, err = run(SCRIPTS / "keras_fit.py", *args, "--jit", env=env)
    assert rc == 0, err
    assert stock["effect"]["script_compile"] == "Model.compile(jit_compile=True)"
    assert stock["effect"]["compiled"] is True and "compiler" not in stock["not_applied"]
    rc, _, xla, err = run(SCRIPTS / "keras_fit.py", *args, "--jit",
                          env={**env, "MODAK_JIT_COMPILE": "1"})
    assert rc == 0, err
    assert "compiler" not in xla["applied"]
    assert "compiles its model with XLA itself" in xla["not_applied"]["compiler"]
    assert xla["effect"]["compiled"] is True and xla["metrics"]["steps"] == 4
    rc, _, ours, err = run(SCRIPTS / "keras_fit.py", *args, env={**env, "MODAK_JIT_COMPILE": "1"})
    assert rc == 0, err
    assert ours["applied"]["compiler"] == "Model.compile(jit_compile=True)"
    assert "script_compile" not in ours["effect"] and ours["effect"]["compiled"] is True


@pytest.mark.parametrize("mode", ["function", "eager", "fit-after", "dataset"])
def test_a_keras_scripts_own_training_loop_is_timed(mode):
    """A script's own loop on TensorFlow (GradientTape, apply_gradients) never calls Keras'
    step function: each call of the tf.function that applied the gradients is a step (in an
    eager loop, each apply), with its loss, and the model it trains is fingerprinted; a
    later ``fit`` adds its own steps, each counted once.  With every knob at its default the
    script prints what it prints plainly.  Over a ``tf.data`` dataset, an epoch's steps are
    counted over a whole pass over it (not over the validation dataset it passes over after
    each), else, in a trial its cap stopped within the first epoch, its stated batches."""
    need("keras")
    need("tensorflow")
    env = {"KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "3"}
    args = {"function": [], "eager": ["--eager"], "fit-after": ["--fit-after"],
            "dataset": ["--dataset"]}[mode]
    rc0, plain, _, _ = run(SCRIPTS / "keras_tape.py", *args, env=env, runtime=False)
    rc1, wrapped, rec, err = run(SCRIPTS / "keras_tape.py", *args, env=env)
    assert rc0 == rc1 == 0, err
    assert wrapped == plain and plain.count("loss") == 2
    m = rec["metrics"]
    assert m["steps"] == 16 + (8 if mode == "fit-after" else 0)  # 2 epochs x 8 (+ fit's 8)
    assert m["s_per_step"] > 0
    last = float(plain.splitlines()[-1].split()[-1])  # the loop's last loss, as printed
    assert [s for s, _ in m["losses"]][:16] == list(range(1, 17))
    assert round(dict(m["losses"])[16], 6) == last
    fp = rec["fingerprint"]
    assert fp["trainable_parameters"] == 20 * 64 + 64 + 64 * 2 + 2
    # (an eager loop's batch is the input of the model's call before its first step)
    assert fp["batch_size"] == 32
    assert fp["flops_per_step"] == 3 * 2 * (20 * 64 + 64 * 2) * 32
    if mode == "dataset":
        assert m["steps_per_epoch"] == 8
        assert rec["effect"]["steps_per_epoch"] == (
            "counted: the optimizer steps of a whole pass over the training dataset")
        rc, _, capped, err = run(SCRIPTS / "keras_tape.py", *args,
                                 env={**env, "MODAK_MAX_STEPS": "5"})
        assert rc == 0, err
        assert capped["metrics"]["steps"] == 5 and capped["metrics"]["steps_per_epoch"] == 8
        assert capped["effect"]["steps_per_epoch"] == (
            "the training dataset's 8 batches over 1 micro-batch a step")
    elif mode != "fit-after":  # (a loop over arrays states no epoch; fit does its own)
        assert m["steps_per_epoch"] is None and "steps_per_epoch" not in rec["effect"]
    if mode == "function":  # XLA reaches its tf.function only by TF_XLA_FLAGS, and says so
        rc, _, xla, err = run(SCRIPTS / "keras_tape.py", env={**env, "MODAK_JIT_COMPILE": "1"})
        assert rc == 0, err
        assert "loop of its own" in xla["not_applied"]["compiler"]
        assert xla["effect"]["compiled"] is False and xla["metrics"]["steps"] == 16


def test_a_plain_tensorflow_loop_that_updates_its_variables_itself_is_timed():
    """No Keras model nor optimizer: the tf.function that took the tape's gradient (and
    assigned the updates itself) is the step, each call one, with the loss it returns (such
    a run measured 0 steps before, and the store refused it).  The runtime sees no model to
    fingerprint; the store keeps the run without one."""
    need("tensorflow")
    env = {"TF_CPP_MIN_LOG_LEVEL": "3"}
    rc0, plain, _, _ = run(SCRIPTS / "tf_plain_loop.py", env=env, runtime=False)
    rc1, wrapped, rec, err = run(SCRIPTS / "tf_plain_loop.py", env=env)
    assert rc0 == rc1 == 0, err
    assert wrapped == plain and plain.count("loss") == 2
    m = rec["metrics"]
    assert m["steps"] == 16 and m["s_per_step"] > 0  # 2 epochs x 8 batches
    assert round(dict(m["losses"])[16], 6) == float(plain.splitlines()[-1].split()[-1])
    assert rec["fingerprint"]["id"] is None
    row = row_from_fom(rec, source="deploy")
    assert row["s_per_step"] == m["s_per_step"] and row["batch_size"] is None


# ---------------------------------------------------------------------------
# knobs in effect, as the record shows them
def test_a_keras_loop_of_its_own_on_the_torch_backend_is_timed():
    """Keras' guide's loop on the torch backend (backward(), then the optimizer's apply)
    never calls Keras' step function nor a torch optimizer: the run measured 0 steps, which
    the store refuses.  Each apply is a step now, its loss the one backward ran on."""
    need("keras")
    env = {"KERAS_BACKEND": "torch", "TF_CPP_MIN_LOG_LEVEL": "3"}
    rc0, plain, _, _ = run(SCRIPTS / "keras_torch_loop.py", env=env, runtime=False)
    rc1, wrapped, rec, err = run(SCRIPTS / "keras_torch_loop.py", env=env)
    assert rc0 == rc1 == 0, err
    assert wrapped == plain and plain.count("loss") == 2
    assert rec["effect"]["keras_backend"] == "torch"
    m = rec["metrics"]
    assert m["steps"] == 16 and m["s_per_step"] > 0  # 2 epochs x 8 batches
    assert [s for s, _ in m["losses"]] == list(range(1, 17))
    assert round(m["final_loss"], 6) == float(plain.splitlines()[-1].split()[-1])
    fp = rec["fingerprint"]
    assert fp["trainable_parameters"] == 16 * 64 + 64 + 64 + 1
    assert fp["batch_size"] == 32 and fp["flops_per_step"] == 3 * 2 * (16 * 64 + 64) * 32
    rc, _, rec, err = run(SCRIPTS / "keras_torch_loop.py",
                          env={**env, "MODAK_PRECISION": "bf16", "MODAK_MAX_STEPS": "5"})
    assert rc == 0 and rec["status"] == "capped" and rec["metrics"]["steps"] == 5, err
    assert rec["effect"]["compute_dtype"] == "bfloat16" and "precision" in rec["applied"]


def test_bf16_and_compile_are_in_effect_on_a_plain_pytorch_script():
    need("torch")
    with tempfile.TemporaryDirectory() as cache:  # a cold compile, as on a fresh machine
        rc, _, rec, err = run(SCRIPTS / "mlp.py", "8", env={
            "MODAK_PRECISION": "bf16", "MODAK_TORCH_COMPILE": "default", "MODAK_THREADS": "1",
            "TORCHINDUCTOR_CACHE_DIR": cache})
    assert rc == 0, err
    assert rec["config"] == {"compiler": "torch.compile:default", "threads": 1,
                             "allocator": "glibc", "precision": "bf16", "channels_last": False,
                             "onednn": True}
    effect = rec["effect"]
    assert effect["matmul_dtype"] == "bfloat16"          # what the matmuls really saw
    assert effect["compiled"] is True and effect["compiled_graphs"] >= 1
    assert effect["threads"] == 1 and effect["trained_modules"] == "Sequential"
    assert set(rec["applied"]) == {"precision", "compiler", "threads"}
    assert rec["metrics"]["warmup_steps"] >= 2 and rec["metrics"]["warmup_s"] > 0.5


MIXED_OUTPUTS = """
import collections
import torch
torch.manual_seed(0)
Out = collections.namedtuple("Out", "logits aux")


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Linear(16, 16)

    def forward(self, x):
        h = self.body(x)
        return {"pair": Out(h, [h.sum(1)]), "steps": torch.arange(3)}


net = Net()
opt = torch.optim.SGD(net.parameters(), lr=0.01)
x, y = torch.randn(32, 16), torch.randn(32, 16)
for step in range(3):
    opt.zero_grad()
    out = net(x)
    loss = torch.nn.functional.mse_loss(out["pair"].logits, y)  # a float32 target
    loss.backward()
    opt.step()
print("dtypes", out["pair"].logits.dtype, out["pair"].aux[0].dtype, out["steps"].dtype,
      type(out["pair"]).__name__, loss.dtype)
"""


def test_bf16_runs_the_forward_in_bfloat16_and_hands_the_loss_float32_outputs(tmp_path):
    """The bf16 knob puts the trained module's forward under autocast; its outputs come back
    in float32 (in a dict, a named tuple, a list), so the script's loss is computed in
    float32 as inside an autocast region of its own: it was computed in bfloat16 (a
    transformer's cross-entropy rounded to 3.71875 against fp32's 3.7444), and on the
    H100 a mean-squared error against a float32 target failed its backward ('Found dtype
    Float but expected BFloat16')."""
    need("torch")
    script = tmp_path / "mixed.py"
    script.write_text(MIXED_OUTPUTS)
    rc, out, rec, err = run(script, env={"MODAK_PRECISION": "bf16"})
    assert rc == 0, err
    assert rec["effect"]["matmul_dtype"] == "bfloat16"  # the forward did run in bfloat16
    assert out.splitlines()[-1] == "dtypes torch.float32 torch.float32 torch.int64 Out " \
        "torch.float32", out
    assert "its outputs in float32" in rec["applied"]["precision"]


LET_GO = """
import sys, weakref
import torch
from torch import nn


def train():
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6 * 6, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(int(sys.argv[1])):
        loss = model(torch.randn(4, 3, 8, 8)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return weakref.ref(model)


model = train()
print("alive after training", model() is not None)
"""


@pytest.mark.parametrize("knobs", [{}, {"MODAK_PRECISION": "bf16", "MODAK_CHANNELS_LAST": "1"}])
def test_the_trained_module_goes_when_the_script_lets_it_go(knobs, tmp_path):
    """The runtime holds no reference that keeps a trained module alive after the script's
    last one: it was kept to the interpreter's end (the session's list of trained modules,
    the bf16 and channels-last wrappers' bound forward), with its memory, and a DDP
    module's buckets and process group."""
    need("torch")
    script = tmp_path / "let_go.py"
    script.write_text(LET_GO)
    rc, out, rec, err = run(script, "3", env=knobs)
    assert rc == 0 and rec["status"] == "ok", err
    assert rec["effect"]["trained_modules"] == "Sequential" and rec["metrics"]["steps"] == 3
    assert sorted(rec["applied"]) == sorted(k.lower()[6:] for k in knobs)
    assert out.splitlines()[-1] == "alive after training False"


KERAS_LET_GO = """
import gc, sys, weakref
import numpy as np
import keras


def train(own_loop, steps):
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(4)])
    x = np.random.default_rng(0).normal(size=(8 * steps, 8)).astype("float32")
    if not own_loop:
        model.compile(optimizer="sgd",
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(x, np.zeros(8 * steps, "int64"), batch_size=8, epochs=1, verbose=0)
        return weakref.ref(model)
    import tensorflow as tf
    opt = keras.optimizers.SGD(0.1)

    @tf.function
    def step(batch):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(batch)))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss
    for i in range(steps):
        step(x[8 * i:8 * i + 8])
    return weakref.ref(model)


models = [train(sys.argv[1] == "own", 4) for _ in range(3)]
gc.collect()
print("alive after training", [m() is not None for m in models])
"""


@pytest.mark.parametrize("loop", ["fit", "own"])
def test_the_trained_keras_models_go_when_the_script_lets_them_go(loop, tmp_path):
    """The runtime holds no Keras model a script has let go (a sweep's, a fold's): it held
    every model it timed, and a script's own step function (which holds its model), to the
    interpreter's end.  The record still says what the first model ran with."""
    need("keras")
    need("tensorflow")
    script = tmp_path / "keras_let_go.py"
    script.write_text(KERAS_LET_GO)
    env = {"KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "3",
           "MODAK_PRECISION": "bf16", "MODAK_JIT_COMPILE": "1"}
    rc, plain, none, _ = run(script, loop, runtime=False, env=env)
    assert rc == 0 and plain.splitlines()[-1] == "alive after training [False, False, False]"
    rc, out, rec, err = run(script, loop, env=env)
    assert rc == 0 and rec["status"] == "ok", err
    assert out.splitlines()[-1] == "alive after training [False, False, False]"
    assert rec["metrics"]["steps"] == 12 and rec["effect"]["compute_dtype"] == "bfloat16"
    # Model.compile's XLA for fit; an own loop's tf.function is not reached by it
    assert rec["effect"]["compiled"] is (loop == "fit")
    assert ("compiler" in rec["not_applied"]) is (loop == "own")


def test_what_the_compiler_left_eager_is_said_in_dynamos_words():
    """Dynamo does not trace nn.LSTM/GRU/RNN: a forward that calls one compiles nothing, and
    the record must say so and why (it said "the module never ran after the first step");
    where a second trained module did compile, the record says what ran eagerly."""
    need("torch")
    rc, _, rec, err = run(SCRIPTS / "lstm_tagger.py", "--steps", "4",
                          env={"MODAK_TORCH_COMPILE": "default"})
    assert rc == 0, err
    assert rec["effect"]["compiled"] is False and rec["effect"]["compiled_graphs"] == 0
    assert "compiler" not in rec["applied"]
    why = rec["not_applied"]["compiler"]
    assert why.startswith("torch.compile traced no graph of it: Dynamo") and "LSTM" in why, why
    assert len(why) <= 240

    rc, _, rec, err = run(SCRIPTS / "tiny_lstm.py", env={"MODAK_TORCH_COMPILE": "default"})
    assert rc == 0, err  # two trained modules: the head compiled, the LSTM did not
    assert rec["effect"]["compiled"] is True and "compiler" in rec["applied"]
    assert "LSTM" in rec["effect"]["compile_skipped"], rec["effect"]

    rc, _, rec, err = run(SCRIPTS / "mlp.py", "4", env={"MODAK_TORCH_COMPILE": "default"})
    assert rc == 0, err  # nothing left eager: nothing said
    assert rec["effect"]["compiled"] is True and "compile_skipped" not in rec["effect"]
    graphs = rec["effect"]["compiled_graphs"]
    # nor with bf16: MODAK's autocast wrapper around the forward is traced with it (a
    # user's MLP-Mixer said "Dynamo ran a part eagerly": the wrapper called the module's
    # forward through a WeakMethod, which Dynamo does not trace)
    rc, _, rec, err = run(SCRIPTS / "mlp.py", "4", env={"MODAK_TORCH_COMPILE": "default",
                                                         "MODAK_PRECISION": "bf16"})
    assert rc == 0, err
    assert rec["effect"]["compiled"] is True and "compile_skipped" not in rec["effect"], \
        rec["effect"]
    assert rec["effect"]["compiled_graphs"] == graphs


SELF_COMPILED = """
import torch
import torch._dynamo.utils
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
model = torch.compile(net)  # the script compiles its own model
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(64, 16), torch.randn(64, 1)
for step in range(4):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
print("graphs", torch._dynamo.utils.counters["stats"]["unique_graphs"])
"""


def test_a_script_that_compiles_its_own_model_still_trains_compiled(tmp_path):
    """Found from an installed wheel with a script of its own: the first step runs under
    the FLOP counter's dispatch mode, and Dynamo, meeting the script's compiled model
    there, skipped it for good: every step of the job ran eager, the script's
    torch.compile silently undone by stock MODAK."""
    need("torch")
    script = tmp_path / "self_compiled.py"
    script.write_text(SELF_COMPILED)
    rc, out, rec, err = run(script, env={"MODAK_THREADS": "1"})
    assert rc == 0, err
    assert out.splitlines()[-1] != "graphs 0", out
    assert int(out.splitlines()[-1].split()[1]) >= 1
    assert rec["fingerprint"]["flops_per_step"] > 0  # and its first step still counted
    # (the module the script wrote, not torch.compile's wrapper of it)
    assert rec["effect"]["trained_modules"] == "Sequential"
    assert rec["effect"]["script_compile"] == "torch.compile" and rec["effect"]["compiled"]


OWN_SETTINGS = """
import torch
torch.manual_seed(0)
torch.set_num_threads(1)
torch.backends.mkldnn.enabled = True
net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
opt = torch.optim.SGD(net.parameters(), lr=0.1)
x, y = torch.randn(64, 16), torch.randint(0, 4, (64,))
for step in range(4):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = net(x)
    loss = torch.nn.functional.cross_entropy(out.float(), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    print("loss", loss.item())
print("output", out.dtype)
"""


def test_a_setting_the_script_makes_itself_is_reported_not_claimed(tmp_path):
    """A script that sets its own threads, enables oneDNN and opens its own bf16 autocast:
    MODAK's threads, oneDNN off and bf16 are not in effect, and the record says so; the
    script computes what it computes without them (every printed digit), its own autocast
    standing (MODAK's would hand its outputs back in float32).  Its stock run records the
    autocast it opened."""
    need("torch")
    script = tmp_path / "own_settings.py"
    script.write_text(OWN_SETTINGS)
    rc, stock_out, stock, err = run(script)
    assert rc == 0, err
    assert stock["effect"]["script_autocast"] == "bfloat16" and stock["not_applied"] == {}
    rc, out, rec, err = run(script, env={"MODAK_THREADS": "2", "MODAK_PRECISION": "bf16",
                                         "MODAK_ONEDNN": "off"})
    assert rc == 0, err
    assert out == stock_out and out.endswith("output torch.bfloat16"), out
    na = rec["not_applied"]
    assert set(na) == {"threads", "precision", "onednn"} and not rec["applied"], rec["applied"]
    assert "sets 1 thread(s) itself" in na["threads"] and "MODAK's 2" in na["threads"]
    assert "its own torch.autocast(dtype=bfloat16)" in na["precision"]
    assert "enables oneDNN itself" in na["onednn"]
    assert rec["effect"]["threads"] == 1 and rec["effect"]["onednn"] is True
    assert rec["effect"]["script_autocast"] == "bfloat16"


OWN_COMPILE = """
import sys, torch, torch.nn as nn
how = sys.argv[1]
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
if how == "before":
    model = torch.compile(model, backend="eager")
elif how == "in-place":
    model.compile(backend="eager")
opt = torch.optim.SGD(model.parameters(), lr=0.05)
if how == "after":  # (wrapped once its optimizer has the parameters)
    model = torch.compile(model, backend="eager")
x, y = torch.randn(32, 8), torch.randn(32, 1)
for _ in range(6):
    loss = ((model(x) - y) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
print("loss", loss.item())
"""


@pytest.mark.parametrize("how, wrapper", [("before", "torch.compile"),
                                          ("after", "torch.compile"),
                                          ("in-place", "Module.compile")])
def test_a_model_the_script_compiles_itself_is_reported_and_not_compiled_again(tmp_path, how,
                                                                               wrapper):
    """A script that compiles its model itself (a ``torch.compile`` wrapper made before or
    after its optimizer, or ``Module.compile`` in place): its stock run records that, and
    the wrapper's module by its own name; MODAK's compiler knob is reported not applied,
    not put over the script's, and the script computes what it computes without it."""
    need("torch")
    script = tmp_path / "own_compile.py"
    script.write_text(OWN_COMPILE)
    rc, stock_out, stock, err = run(script, how)
    assert rc == 0, err
    assert stock["effect"]["script_compile"] == wrapper, stock["effect"]
    assert stock["effect"]["trained_modules"] == "Sequential"
    # (Module.compile on a plain Sequential traces nothing: Dynamo skips torch.nn's frames)
    assert stock["effect"]["compiled"] is (wrapper == "torch.compile")
    assert stock["applied"] == {} and stock["not_applied"] == {}
    rc, out, rec, err = run(script, how, env={"MODAK_TORCH_COMPILE": "default"})
    assert rc == 0, err
    assert out == stock_out
    assert rec["applied"] == {}, rec["applied"]
    assert f"compiles Sequential itself ({wrapper})" in rec["not_applied"]["compiler"]
    assert rec["effect"]["compiled_graphs"] == stock["effect"]["compiled_graphs"]


BY_HAND = """
import torch
from torch.func import functional_call, grad
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
params = {k: v.detach() for k, v in net.named_parameters()}
x, y = torch.randn(64, 10), torch.randn(64, 1)
def loss_of(p):
    return ((functional_call(net, p, (x,)) - y) ** 2).mean()
for step in range(20):  # its own update: no torch.optim optimizer
    g = grad(loss_of)(params)
    params = {k: v - 0.01 * g[k] for k, v in params.items()}
print("loss", loss_of(params).item())
"""


def test_knobs_of_a_script_with_no_optimizer_step_are_reported_not_applied(tmp_path):
    """A script that applies its gradients by hand (torch.func, no optimizer): the model's
    knobs reach nothing, and the record says so instead of leaving them unmentioned; the
    script computes what it computes."""
    need("torch")
    script = tmp_path / "by_hand.py"
    script.write_text(BY_HAND)
    rc, stock_out, stock, err = run(script)
    assert rc == 0, err
    assert stock["not_applied"] == {} and stock["metrics"]["steps"] == 0
    rc, out, rec, err = run(script, env={"MODAK_PRECISION": "bf16",
                                         "MODAK_TORCH_COMPILE": "default",
                                         "MODAK_CHANNELS_LAST": "1"})
    assert rc == 0, err
    assert out == stock_out and rec["applied"] == {}
    assert set(rec["not_applied"]) == {"precision", "compiler", "channels_last"}
    assert all("no optimizer step" in why for why in rec["not_applied"].values())


def test_a_data_parallel_script_trains_compiled_inside_its_wrapper():
    """A script that wraps its model in DistributedDataParallel (one process, as a
    cluster script runs without torchrun): Dynamo cannot trace the wrapper's own forward
    (its logger), so compiling the wrapper compiled nothing; the module inside it is
    compiled, and the wrapper's gradient synchronisation stays as it was."""
    need("torch")
    with socket.socket() as free:  # (a port of its own for the process group)
        free.bind(("127.0.0.1", 0))
        port = str(free.getsockname()[1])
    with tempfile.TemporaryDirectory() as cache:
        rc, out, rec, err = run(SCRIPTS / "ddp_cnn.py", "8", env={
            "MODAK_TORCH_COMPILE": "default", "MASTER_PORT": port,
            "TORCHINDUCTOR_CACHE_DIR": cache})
    assert rc == 0, err
    assert rec["effect"]["trained_modules"] == "DistributedDataParallel"
    assert "of Sequential inside DistributedDataParallel in place" in rec["applied"]["compiler"]
    assert rec["effect"]["compiled"] is True and rec["effect"]["compiled_graphs"] >= 1
    assert rec["not_applied"] == {} and len(out.splitlines()) == 8


def _free_port() -> str:
    with socket.socket() as free:  # (a port of its own for the process group)
        free.bind(("127.0.0.1", 0))
        return str(free.getsockname()[1])


SHUTDOWN_ABORT = "its function returned, then its process was ended by SIGABRT in the " \
    "interpreter's shutdown, after the training"


def _trained(rc: int, rec: dict) -> bool:
    """The ranks trained to their end: the run ended ok, or a rank was aborted in the
    interpreter's shutdown after it, by PyTorch 2.13's gloo (1 run in 36 of the plain
    spawn_ddp.py here, without MODAK: a worker thread that frees a finished collective's
    Python context after the interpreter began to go).  The script then fails, as it would
    without MODAK, and its measurements stand."""
    return (rc == 0 and rec["status"] == "ok") or (
        rc == 1 and rec["status"] == "failed" and rec["error"]["message"].startswith(
            "rank ") and rec["error"]["message"].endswith(SHUTDOWN_ABORT))


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_training_ranks_the_script_starts_itself_are_measured(method):
    """A script that starts its ranks with torch.multiprocessing (the DDP tutorial's
    mp.spawn): the ranks are processes the runtime did not start, and measured nothing
    (0 steps, no knob).  Now each rank applies the knobs, rank 0's steps and fingerprint
    are the run's, its trial cap ends the other rank, another rank's failure is reported
    in its own words, and ranks that leave by os._exit still report."""
    need("torch")
    rc, out, rec, err = run(SCRIPTS / "spawn_ddp.py", "12", method,
                            env={"MASTER_PORT": _free_port()})
    assert _trained(rc, rec), err
    assert rec["metrics"]["steps"] == 12
    assert rec["metrics"]["s_per_step"] > 0
    # the loss the script printed at its end is the one recorded: rank 0's, unchanged
    assert float(out.split()[-1]) == pytest.approx(rec["metrics"]["final_loss"], rel=1e-6)
    assert rec["effect"]["ranks"] == 2 and rec["effect"]["rank_start_method"] == method
    assert rec["effect"]["trained_modules"] == "DistributedDataParallel"
    assert rec["fingerprint"]["batch_size"] == 32 and rec["fingerprint"]["flops_per_step"] > 0

    rc, out, rec, err = run(SCRIPTS / "spawn_ddp.py", "400", method, env={
        "MASTER_PORT": _free_port(), "MODAK_PRECISION": "bf16", "MODAK_MAX_STEPS": "5"},
        timeout=120)
    assert rc == 0, err
    assert rec["status"] == "capped" and rec["metrics"]["steps"] == 5
    assert rec["effect"]["stopped_by"] == "MODAK_MAX_STEPS"
    assert "under torch.autocast('cpu', bfloat16)" in rec["applied"]["precision"]
    assert rec["effect"]["matmul_dtype"] == "bfloat16"

    rc, out, rec, err = run(SCRIPTS / "spawn_ddp.py", "12", method, "fail",
                            env={"MASTER_PORT": _free_port()}, timeout=120)
    assert rc == 1 and rec["status"] == "failed"
    assert rec["error"] == {"type": "builtins.ValueError", "knob": None,
                            "message": "rank 1: rank 1 cannot read its shard"}

    # ranks that leave by os._exit (skipping the process group's teardown) still report
    rc, out, rec, err = run(SCRIPTS / "spawn_ddp.py", "12", method, "exit",
                            env={"MASTER_PORT": _free_port()}, timeout=120)
    assert rc == 0 and rec["status"] == "ok" and rec["metrics"]["steps"] == 12, err


def test_a_rank_ended_after_its_function_returned_is_told_apart():
    """A rank whose function returned, and whose process a signal then ended in the
    interpreter's shutdown (as PyTorch's gloo can abort a rank there): the run failed, as the
    script did, and the record says the training was over, with rank 0's measurements; it
    said only 'process 1 terminated with signal SIGABRT'."""
    need("torch")
    rc, out, rec, err = run(SCRIPTS / "spawn_ddp.py", "6", "spawn", "abort",
                            env={"MASTER_PORT": _free_port()}, timeout=120)
    assert rc == 1 and rec["status"] == "failed", err
    assert rec["error"] == {"type": "torch.multiprocessing.spawn.ProcessExitedException",
                            "knob": None, "message": "rank 1: " + SHUTDOWN_ABORT}
    assert rec["metrics"]["steps"] == 6 and rec["effect"]["ranks"] == 2
    assert float(out.split()[-1]) == pytest.approx(rec["metrics"]["final_loss"], rel=1e-6)


def _torchrun(args, env, tmp_path, late=0.0, timeout=180, script="torchrun_ddp.py",
              apart=False):
    """The ranks as the job script starts them (``torchrun ... --no-python -- python3 -m
    modak_runtime SCRIPT``), rank 1's runtime starting ``late`` seconds after rank 0's
    (``apart``: each rank with a temporary directory of its own, as in a container each):
    (return code, the records printed, stdout, stderr, seconds)."""
    full = {k: v for k, v in os.environ.items() if k not in KNOBS}
    full.update(env, PYTHONPATH=str(ROOT), TMPDIR=str(tmp_path))
    start = (f'[ "$LOCAL_RANK" = 1 ] && sleep {late}; '
             + ('export TMPDIR="$TMPDIR/rank$LOCAL_RANK"; mkdir "$TMPDIR"; ' if apart else "")
             + 'exec "$0" -m modak_runtime -- "$@"')
    cmd = [str(Path(sys.executable).with_name("torchrun")), "--standalone",
           "--nproc-per-node=2", "--no-python", "--", "sh", "-c", start, sys.executable,
           str(SCRIPTS / script), *args]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=full, timeout=timeout,
                          cwd=ROOT)
    return (proc.returncode, parse_fom_lines(proc.stdout), proc.stdout, proc.stderr,
            time.monotonic() - t0)


def test_ranks_torchrun_starts_are_one_run_and_stop_together(tmp_path):
    """torchrun's ranks each run the runtime: the run's record is rank 0's alone (each
    rank printed one, and the store kept the run twice), and a trial's time cap stops every
    rank after the same step: with each rank's own cap, rank 1 (started 0.4 s after rank 0)
    failed in its collective once rank 0 had stopped, and torchrun with it.  A step that
    outlasts the cap (a compilation) is stopped inside, the other rank ended without a
    failure; another rank's failure is named in rank 0's record, and where rank 0 was killed
    (no record), the other rank's record is the run's."""
    need("torch")
    rc, recs, out, err, _ = _torchrun(["30"], {}, tmp_path)
    assert rc == 0 and len(recs) == 1, err
    rec = recs[0]
    assert rec["status"] == "ok" and rec["metrics"]["steps"] == 30
    assert rec["effect"]["ranks"] == 2 and rec["effect"]["launcher"] == "torchrun"
    assert rec["fingerprint"]["batch_size"] == 24  # (one rank's batch)
    assert float(out.split("final loss")[1].split()[0]) == pytest.approx(
        rec["metrics"]["final_loss"], rel=1e-6)

    # (12 s: two ranks' start and the process group's take most of 6 s on a busy machine,
    # and a run of the suite's other worker beside them left none for a step)
    rc, recs, out, err, _ = _torchrun(["100000"], {"MODAK_MAX_SECONDS": "12"}, tmp_path,
                                      late=0.5)
    assert rc == 0 and len(recs) == 1, err
    assert recs[0]["status"] == "capped" and recs[0]["metrics"]["steps"] >= 2
    assert recs[0]["effect"]["stopped_by"] == "MODAK_MAX_SECONDS"

    rc, recs, out, err, took = _torchrun(["100000", "stall"], {"MODAK_MAX_SECONDS": "10"},
                                         tmp_path, late=0.5)
    assert rc == 0 and len(recs) == 1 and recs[0]["status"] == "capped", err
    assert took < 40  # (its step would have taken 60 s)
    assert "Traceback" not in err  # (rank 1, ended by rank 0's stop, did not fail)

    rc, recs, out, err, _ = _torchrun(["100000", "fail"], {}, tmp_path)
    assert rc != 0 and len(recs) == 1 and recs[0]["status"] == "failed"
    assert recs[0]["error"]["message"] == "rank 1: rank 1 cannot read its shard"
    assert "modak_runtime: rank 1 of 2: rank 1 cannot read its shard" in err
    assert not list(tmp_path.glob("modak-ranks-*"))  # (what the ranks shared is gone)

    # rank 0 killed (no record of its own): rank 1's failure is the run's record
    rc, recs, out, err, _ = _torchrun(["100000", "kill"], {}, tmp_path)
    assert rc != 0 and len(recs) == 1 and recs[0]["status"] == "failed", err
    assert recs[0]["error"]["message"].startswith(
        "rank 0 ended without its record (killed?); rank 1: "), recs[0]["error"]
    assert recs[0]["effect"]["ranks"] == 2 and recs[0]["metrics"]["steps"] == 5
    assert not list(tmp_path.glob("modak-ranks-*"))

    # ranks that do not in fact share the directory (independent ones here): rank 1 stops
    # by its own clock, a little after rank 0 (it had no cap of its own)
    rc, recs, out, err, took = _torchrun(["1000000"], {"MODAK_MAX_SECONDS": "5"}, tmp_path,
                                         script="mlp.py", apart=True)
    assert rc == 0 and len(recs) == 1 and recs[0]["status"] == "capped", err
    assert took < 60  # (a million steps: minutes)


def test_a_script_written_for_torchrun_run_as_one_process_says_what_it_needs():
    """Run as one process, a script that takes its rank from torchrun's variables fails in
    PyTorch's words, which name a variable, not what to ask of MODAK: the record says; and
    as a rank of mpirun without the job script's MASTER_ADDR, what sets it."""
    need("torch")
    rc, out, rec, err = run(SCRIPTS / "torchrun_ddp.py", "10")
    assert rc == 1 and rec["status"] == "failed" and rec["error"]["knob"] is None
    assert rec["error"]["message"].endswith(
        "environment variable RANK expected, but not set (the script takes its rank from a "
        "launcher such as torchrun: it runs as several processes per node, which the "
        "request's job_options.process_count_per_node asks for)")
    # rank 0 of two that Open MPI's mpirun started, outside MODAK's job script: the runtime
    # gives it its rank, not where the ranks meet
    rc, out, rec, err = run(SCRIPTS / "torchrun_ddp.py", "10", env={
        "OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2",
        "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "1"})
    assert rc == 1 and rec["effect"]["torchrun_variables"] == \
        "RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE"
    assert re.search(r"environment variable MASTER_(ADDR|PORT) expected, but not set \(the "
                     r"script takes its place from torchrun's variables: the runtime set those "
                     r"mpirun gives, but where the ranks meet, MASTER_ADDR and MASTER_PORT, is "
                     r"set by MODAK's job script, or in a Slurm step by the runtime\)$",
                     rec["error"]["message"]), rec["error"]["message"]


def test_a_launchers_ranks_get_torchruns_variables():
    """The variables torchrun would have set, from srun's (two nodes, two tasks each),
    Open MPI's and MPICH's; none that the job already set, and none under torchrun."""
    from modak_runtime import launched

    srun = {"SLURM_JOB_ID": "123456", "SLURM_STEP_ID": "0", "SLURM_PROCID": "3",
            "SLURM_STEP_NUM_TASKS": "4", "SLURM_STEP_NUM_NODES": "2", "SLURM_NODEID": "1",
            "SLURM_LOCALID": "1", "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
            "SLURM_LAUNCH_NODE_IPADDR": "10.1.2.3"}

    def given_by(env):  # (the rank's place, as launched() reads it from env)
        return launched.torchrun_variables(launched.launched(env), env)

    assert given_by(srun) == {
        "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "10.1.2.3", "MASTER_PORT": str(20000 + 123456 % 10000)}
    # an uneven step: three tasks on the first node, one on the second
    uneven = {**srun, "SLURM_STEP_TASKS_PER_NODE": "3,1", "SLURM_LOCALID": "0"}
    assert given_by(uneven)["LOCAL_WORLD_SIZE"] == "1"
    for nonsense in ("2(xz)", "2(x2", "x", "2(x1)"):  # (the last: no second node)
        assert "LOCAL_WORLD_SIZE" not in given_by(
            {**srun, "SLURM_STEP_TASKS_PER_NODE": nonsense})
    # the job script's (or the user's) rendezvous is kept
    given = {**srun, "MASTER_ADDR": "node001", "MASTER_PORT": "29500"}
    assert set(given_by(given)) == {
        "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"}
    ompi = {"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "8",
            "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
            "MASTER_ADDR": "node001", "MASTER_PORT": "21234"}
    assert given_by(ompi) == {
        "RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"}
    hydra = {"PMI_RANK": "2", "PMI_SIZE": "4", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "2"}
    assert given_by(hydra) == {
        "RANK": "2", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"}
    torchrun = {"TORCHELASTIC_RUN_ID": "abc", "RANK": "1", "WORLD_SIZE": "2",
                "LOCAL_WORLD_SIZE": "2"}
    assert given_by(torchrun) == {}


def test_a_launchers_ranks_are_read_from_its_variables(tmp_path):
    """torchrun's, a Slurm step's and Open MPI's variables give the rank and how many ran;
    a single rank, a batch script's variables and nonsense give none.  The directory the
    ranks share must be this user's own."""
    from modak_runtime import launched

    torchrun = {"TORCHELASTIC_RUN_ID": "abc", "RANK": "1", "WORLD_SIZE": "4",
                "LOCAL_WORLD_SIZE": "4"}
    assert launched.launched(torchrun) == launched.Launched("torchrun", 1, 4, True, "abc.0",
                                                            None, 4)
    assert launched.launched({**torchrun, "LOCAL_WORLD_SIZE": "2"}).local is False
    assert launched.launched({**torchrun, "WORLD_SIZE": "1", "RANK": "0"}) is None
    assert launched.launched({**torchrun, "RANK": "4"}) is None
    assert launched.launched({**torchrun, "RANK": "x"}) is None
    srun = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0",
            "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_NUM_NODES": "1"}
    assert launched.launched(srun) == launched.Launched("srun", 0, 2, True, "7.0", None, 2)
    assert launched.launched({**srun, "SLURM_STEP_NUM_NODES": "2"}).local is False
    batch = {"SLURM_JOB_ID": "7", "SLURM_PROCID": "0", "SLURM_NTASKS": "4"}
    assert launched.launched(batch) is None  # (the batch script: one process)
    ompi = {"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "3",
            "OMPI_COMM_WORLD_LOCAL_SIZE": "3", "PMIX_NAMESPACE": "ns1"}
    assert launched.launched(ompi) == launched.Launched("mpirun", 2, 3, True, "ns1", None, 3)
    # Open MPI under Slurm: the ranks are Open MPI's, not those of the step of its daemons
    assert launched.launched({**srun, **ompi, "SLURM_STEP_NUM_TASKS": "1"}).rank == 2
    hydra = {"PMI_RANK": "1", "PMI_SIZE": "4"}  # (MPICH: no id of the launch, not shared)
    assert launched.launched(hydra) == launched.Launched("mpirun", 1, 4, False, "")
    assert launched.launched({}) is None

    me = launched.launched(torchrun)
    peers = launched.Peers(me, root=str(tmp_path))
    assert peers.usable and (Path(peers.dir) / "pid.1").read_text() == str(os.getpid())
    assert peers.stop() is None
    peers.leave()
    assert not Path(peers.dir).exists()
    os.mkdir(peers.dir, 0o755)  # (made by someone else, or readable by others: not used)
    assert not launched.Peers(me, root=str(tmp_path)).usable


def test_a_sigterm_after_a_ranks_function_returned_waits_for_its_report(tmp_path):
    """mp.spawn's join sends SIGTERM to the other ranks once one has ended badly (a rank
    that aborts in its interpreter's shutdown, as gloo can): rank 0 hit while it wrote its
    report lost the run's measurements (a CI run on a busy machine recorded 0 steps for 6).
    A rank whose function has returned finishes its report whatever SIGTERM comes (join
    kills it 30 s on), and the report is whole or absent, never half-written.  Here rank 0's
    SIGTERM comes in the middle of its report, in a process of its own."""
    out = tmp_path / "rank0"
    code = f"""
import os, signal
from modak_runtime import ranks
from modak_runtime.record import Config
from modak_runtime.session import Session
session = Session(Config(), "x.py")
ranks._SESSION = session
record = session.record
def record_hit(status, error):  # (join's SIGTERM, while the report is being written)
    os.kill(os.getpid(), signal.SIGTERM)
    record(status, error)
session.record = record_hit
ranks.RankEntry(lambda index: None, "x.py", 0.0, {str(out)!r})(0)
print("reported")
"""
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and "reported" in proc.stdout, (proc.returncode, proc.stderr)
    import pickle
    with open(f"{out}.0", "rb") as f:
        report = pickle.load(f)
    assert report["status"] == "ok" and report["measured"] is not None
    assert not os.path.exists(f"{out}.0.part")


def test_ranks_that_cannot_be_started_leave_no_report_file(tmp_path, monkeypatch):
    """torch.multiprocessing failing to start the ranks (no processes left to join): the
    file rank 0 was to report in is removed, the script gets the error as it was, and the
    time cap that rank 0 was to have is the script process's again."""
    from modak_runtime import ranks
    from modak_runtime.record import Config
    from modak_runtime.session import Session
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("MODAK_MAX_SECONDS", "600")

    def original(*args):
        assert not session.armed and signal.getitimer(signal.ITIMER_REAL)[0] == 0
        raise OSError("cannot start a process")

    session = Session(Config(), "x.py")
    session.arm_time_cap()
    try:
        with pytest.raises(OSError, match="cannot start a process"):
            ranks._start(session, original, print, (), 2, True, False, "spawn")
        assert session.armed and 0 < signal.getitimer(signal.ITIMER_REAL)[0] <= 600
    finally:
        session.disarm_time_cap()
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
    assert list(tmp_path.iterdir()) == []


def test_models_trained_one_after_another_each_get_the_knobs_and_count_against_the_cap():
    """A sweep (a fresh model and optimizer per learning rate): only the first model had
    the knobs and was timed, and the trial caps never stopped the later ones.  Now every
    model gets the first one's knobs, the later models' steps count against the cap, and
    the steady steps of those of the first one's size are timed with it."""
    need("torch")
    rc, out, rec, err = run(SCRIPTS / "lr_sweep.py", "8", "0.3", "0.1", "0.05:256", env={
        "MODAK_PRECISION": "bf16", "MODAK_TORCH_COMPILE": "default"})
    assert rc == 0 and rec["status"] == "ok", err
    lines = [line.split() for line in out.splitlines() if line.startswith("rate")]
    assert [(w[3], w[6], w[7]) for w in lines] == [
        ("128", "bfloat16", "compiled"), ("128", "bfloat16", "compiled"),
        ("256", "bfloat16", "compiled")]
    assert rec["effect"]["models_trained"] == 3
    second, third = rec["effect"]["later_models"]
    assert second["knobs"] == third["knobs"] == ["precision", "compiler"]
    assert second["timed"] and not third["timed"]
    assert second["trainable_parameters"] == rec["fingerprint"]["trainable_parameters"]
    assert third["trainable_parameters"] > second["trainable_parameters"]
    # a later model's first step is not yet known to be the next model's: 8 + 7 + 7 steps;
    # timed after each timed model's warm-up of 3 steps: 5 of the first, 4 of the second
    assert rec["metrics"]["steps"] == 22 and second["first_step"] == 9
    assert rec["metrics"]["timed_steps"] == 9 and rec["metrics"]["warmup_steps"] == 3

    rc, out, rec, err = run(SCRIPTS / "lr_sweep.py", "8", env={"MODAK_MAX_STEPS": "12"})
    assert rc == 0 and rec["status"] == "capped" and rec["metrics"]["steps"] == 12, err
    assert [line.split()[1] for line in out.splitlines() if line.startswith("rate")] == ["0.3"]


def test_a_knob_that_cannot_be_applied_is_reported_not_claimed():
    need("torch")
    rc, _, rec, err = run(SCRIPTS / "mlp.py", "4", env={"MODAK_CHANNELS_LAST": "1",
                                                        "MODAK_JIT_COMPILE": "1",
                                                        "MODAK_ALLOCATOR": "tcmalloc"})
    assert rc == 0, err
    na = rec["not_applied"]
    assert "2-D convolution" in na["channels_last"]
    assert "XLA is not a PyTorch compiler" in na["compiler"]
    assert "tcmalloc is not loaded" in na["allocator"]  # asked for, but no LD_PRELOAD
    assert not set(na) & set(rec["applied"])


def test_an_allocator_is_checked_in_the_process_maps():
    need("torch")
    lib = "/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4"
    if not os.path.exists(lib) and os.environ.get("CI"):  # the project installs it
        subprocess.run([str(ROOT / "scripts/frontend"), "install"], check=True, timeout=900)
    if not os.path.exists(lib):
        pytest.skip("tcmalloc is not installed: scripts/frontend install (as root)")
    rc, _, rec, err = run(SCRIPTS / "mlp.py", "3", env={"MODAK_ALLOCATOR": "tcmalloc",
                                                        "LD_PRELOAD": lib})
    assert rc == 0, err
    assert rec["effect"]["allocator"] == "tcmalloc" and "allocator" in rec["applied"]


def test_launcher_libraries_get_their_own_settings(tmp_path):
    """A script that uses HF Accelerate is given ACCELERATE_* instead of being patched
    (a stand-in 'accelerate' module records what it was given)."""
    need("torch")
    (tmp_path / "accelerate.py").write_text(
        "import os\nSEEN = {k: v for k, v in os.environ.items() if k.startswith(('ACCELERATE',"
        " 'OMP'))}\n")
    script = tmp_path / "train.py"
    script.write_text((SCRIPTS / "mlp.py").read_text().replace(
        "import torch\n", "import torch\nimport accelerate\nprint('SEEN', sorted("
        "accelerate.SEEN.items()))\n", 1))
    rc, out, rec, err = run(script, "3", env={"MODAK_PRECISION": "bf16", "MODAK_THREADS": "2",
                                              "MODAK_TORCH_COMPILE": "max-autotune"})
    assert rc == 0, err
    seen = dict(eval(out.splitlines()[0][5:]))
    assert seen == {"ACCELERATE_MIXED_PRECISION": "bf16", "ACCELERATE_DYNAMO_BACKEND": "inductor",
                    "ACCELERATE_DYNAMO_MODE": "max-autotune", "OMP_NUM_THREADS": "2"}
    assert rec["effect"]["convention"] == "accelerate"
    assert "ACCELERATE_MIXED_PRECISION=bf16" in rec["applied"]["precision"]
    # the runtime patched nothing itself; with the library compiling, it counts no FLOPs
    # (a dispatch mode under a compiled step is not safe), so the fingerprint has none
    assert rec["fingerprint"]["flops_per_step"] is None
    assert rec["fingerprint"]["trainable_parameters"] == 2177


# ---------------------------------------------------------------------------
# the fingerprint, against independent counts
def test_fingerprint_of_the_papers_mnist_cnn_matches_a_count_by_hand():
    need("torch")
    rc, _, rec, err = run(ROOT / "workloads/train.py", "--steps", "2", "--warmup", "0")
    assert rc == 0, err
    fp = rec["fingerprint"]
    assert fp["trainable_parameters"] == 1_199_882
    # forward FLOPs per sample: conv 3x3x1->32 on 26x26, conv 3x3x32->64 on 24x24, dense
    conv1, conv2 = 2 * 9 * 1 * 32 * 26 * 26, 2 * 9 * 32 * 64 * 24 * 24
    dense = 2 * 9216 * 128 + 2 * 128 * 10
    forward = conv1 + conv2 + dense
    assert forward == 2 * 11_992_448  # the paper's 12.0 M multiply-accumulates
    backward = conv1 + 2 * conv2 + 2 * dense  # no input gradient for the first layer
    assert fp["flops_per_step"] == (forward + backward) * 128
    assert fp["batch_size"] == 128 and fp["input_shape"] == [1, 28, 28]
    assert fp["flop_share"]["conv"] == pytest.approx((conv1 + conv2) / forward)
    assert fp["grouped_share"] == 0.0  # (no grouped convolution)
    assert fp["id"].startswith("fp-")
    # the elements the step wrote: at least every forward output and its gradient (conv1,
    # conv2, pooling, dense, logits), at most a few times that and the parameters' updates
    outputs = (32 * 26 * 26 + 64 * 24 * 24 + 64 * 12 * 12 + 128 + 10) * 128
    assert 2 * outputs <= fp["elements_per_step"] <= 10 * (outputs + 1_199_882)
    # the operations it dispatched: at least each layer's forward and backward (2 x 9), at
    # most a few per layer and per parameter tensor (the optimizer's update)
    assert 18 <= fp["ops_per_step"] <= 10 * (9 + 8)
    assert fp["recurrent_steps"] == 0  # (no recurrent layer)
    # bf16's casts are the configuration's, not the workload's: the same count
    rc, _, bf16, err = run(ROOT / "workloads/train.py", "--steps", "2", "--warmup", "0",
                           env={"MODAK_PRECISION": "bf16"})
    assert rc == 0, err
    assert bf16["effect"]["matmul_dtype"] == "bfloat16"
    assert bf16["fingerprint"]["elements_per_step"] == fp["elements_per_step"]
    assert bf16["fingerprint"]["ops_per_step"] == fp["ops_per_step"]


def test_fingerprint_counts_the_share_of_grouped_convolutions():
    """A depthwise-separable block: the depthwise convolution's forward FLOPs, counted by
    hand, over the step's forward FLOPs (its share of conv's: few FLOPs, much traffic); and
    the step's FLOPs, the grouped convolution's backward counted as its forward's twice."""
    need("torch")
    rc, _, rec, err = run(SCRIPTS / "depthwise.py", "4")
    assert rc == 0, err
    fp = rec["fingerprint"]
    pixels = 16 * 16  # (padding 1: every convolution keeps 16 x 16)
    dense, depthwise = 2 * 9 * 3 * 8 * pixels, 2 * 9 * 1 * 8 * pixels
    pointwise, linear = 2 * 8 * 16 * pixels, 2 * 16 * 10
    forward = dense + depthwise + pointwise + linear
    assert fp["grouped_share"] == pytest.approx(depthwise / forward)
    assert fp["flop_share"]["conv"] == pytest.approx((forward - linear) / forward)
    # the step: each layer's backward twice its forward (input and weight gradients), the
    # first's once (no input gradient); torch's formula alone counted the depthwise
    # convolution's weight gradient 8x (its groups)
    step = 2 * dense + 3 * (depthwise + pointwise + linear)
    assert fp["flops_per_step"] == pytest.approx(4 * step)


def test_fingerprint_counts_a_sparse_products_stored_values_not_its_zeros():
    """A graph convolution over a sparse adjacency (3 stored values a row of 500): its
    products count two FLOPs per stored value and dense column, forward and backward (the
    adjacency's gradient is not asked for); the dense formula counted the zeros, 170x."""
    need("torch")
    rc, _, rec, err = run(SCRIPTS / "sparse_gcn.py", "4")
    assert rc == 0, err
    fp = rec["fingerprint"]
    nodes, stored, features, hidden, classes = 500, 1500, 16, 32, 4
    first, second = 2 * nodes * features * hidden, 2 * nodes * hidden * classes
    spread = 2 * stored * hidden + 2 * stored * classes  # the two sparse products
    # backward: each linear layer's two products (the first's input needs no gradient), each
    # sparse product's one (the gradient of its dense factor)
    step = (first + second + spread) + (first + 2 * second + spread)
    assert fp["flops_per_step"] == pytest.approx(step)
    assert fp["elements_per_step"] < 50 * nodes * hidden  # no dense 500 x 500 counted


def test_keras_fingerprint_counts_depthwise_convolutions_alike():
    """Keras' analytic count: a depthwise layer's FLOPs, and a separable one's depthwise
    part, are its grouped share."""
    need("keras")
    import keras

    from modak_runtime.keras_support import keras_flops
    model = keras.Sequential([keras.Input((16, 16, 3)), keras.layers.Conv2D(8, 3, padding="same"),
                              keras.layers.DepthwiseConv2D(3, padding="same"),
                              keras.layers.SeparableConv2D(16, 3, padding="same"),
                              keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)])
    pixels = 16 * 16
    conv, depthwise = 2 * 9 * 3 * 8 * pixels, 2 * 9 * 8 * pixels
    separable = 2 * 9 * 8 * pixels + 2 * 8 * 16 * pixels
    dense = 2 * 16 * 10
    total, shares, grouped = keras_flops(model)
    assert total == pytest.approx(conv + depthwise + separable + dense)
    assert grouped == pytest.approx(2 * depthwise / total)  # (the separable's is as large)
    assert shares["conv"] == pytest.approx((total - dense) / total)


def test_keras_fingerprint_counts_the_elements_written_and_the_recurrent_time_steps():
    """Keras has no dispatcher to count on: the elements a step writes are estimated from
    the layers' outputs (a view none, a layer's own activation twice, a recurrent layer's
    gates and states at every time step), and the time steps its recurrent layers run in
    sequence are counted, a Bidirectional layer's in both directions, its FLOPs too."""
    need("keras")
    import keras

    from modak_runtime.keras_support import keras_flops, keras_traffic
    length, features, units = 10, 4, 6
    model = keras.Sequential([keras.Input((length, features)),
                              keras.layers.LSTM(units, return_sequences=True),
                              keras.layers.Bidirectional(keras.layers.GRU(units)),
                              keras.layers.Flatten(), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(2)])
    lstm = length * units + length * units * (2 * 4 + 2)  # output; gates, cell and state
    gru = units + length * units * (2 * 3 + 1)  # the last step's output; gates and state
    elements, steps = keras_traffic(model)
    assert steps == length + 2 * length
    assert elements == pytest.approx(lstm + 2 * gru + 2 * 8 + 2)  # (Flatten: a view)
    total, shares, _ = keras_flops(model)
    recurrent = (2 * 4 * (features + units) * units * length
                 + 2 * 2 * 3 * (units + units) * units * length)
    dense = 2 * (2 * units) * 8 + 2 * 8 * 2
    assert total == pytest.approx(recurrent + dense)
    assert shares["recurrent"] == pytest.approx(recurrent / total)


def test_fingerprint_of_a_transformer_counts_attention():
    need("torch")
    rc, _, rec, err = run(SCRIPTS / "tiny_lm.py", "--steps", "2")
    assert rc == 0, err
    share = rec["fingerprint"]["flop_share"]
    assert share["attention"] > 0.05 and share["linear"] > 0.5 and share["norm"] > 0
    assert sum(share.values()) == pytest.approx(1.0)
    # the model's parameters: embedding, positions, 2 blocks, head (dim 64, vocabulary 27)
    v, d, seq = 27, 64, 64
    block = 2 * 2 * d + (d * 3 * d + 3 * d) + (d * d + d) + (d * 4 * d + 4 * d) + (4 * d * d + d)
    assert rec["fingerprint"]["trainable_parameters"] == v * d + seq * d + 2 * block + d * v + v


ACCUMULATING = """
import sys
import torch

mode = sys.argv[1]
if mode == "unhooked":  # parameters that take no gradient hook: trained all the same
    def refuse(*args, **kwargs):
        raise RuntimeError("no hooks on these")
    torch.Tensor.register_hook = refuse
torch.manual_seed(3)
x, y = torch.randn(256, 32), torch.randn(256, 1)
net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
opt = torch.optim.SGD(net.parameters(), lr=0.01)
critic = torch.nn.Linear(1, 1)
critic_opt = torch.optim.SGD(critic.parameters(), lr=0.01)
mse = torch.nn.functional.mse_loss
for step in range(6):
    opt.zero_grad()
    if mode == "accumulate":  # two micro-batches of 128, one optimizer step
        for k in range(2):
            (mse(net(x[128 * k:128 * (k + 1)]), y[128 * k:128 * (k + 1)]) / 2).backward()
    elif mode == "two-losses":  # one batch of 256, a backward pass per loss
        out = net(x)
        mse(out, y).backward(retain_graph=True)
        out.abs().mean().backward()
    elif mode == "unhooked":  # one batch of 256
        mse(net(x), y).backward()
    elif mode == "siamese":  # the network called on two halves, one loss
        mse(net(x[:128]) - net(x[128:]), y[:128] - y[128:]).backward()
    else:  # a GAN's two optimizers: a critic's step on the network's detached output first
        critic_opt.zero_grad()
        critic(net(x).detach()).mean().backward()
        critic_opt.step()
        (-critic(net(x)).mean()).backward()
    opt.step()
"""


@pytest.mark.parametrize("mode, batch, micro, passes", [
    ("accumulate", 128, 2, 1), ("two-losses", 256, 1, 2), ("siamese", 128, 1, 1),
    ("gan", 256, 1, None), ("unhooked", 256, None, 1)])
def test_a_step_that_accumulates_gradients_counts_its_micro_batches(tmp_path, mode, batch, micro,
                                                                   passes):
    """Gradient accumulation: the optimizer steps once every few backward passes, each over
    a micro-batch of the batch the network is called with. The step trains on all of them
    (the fingerprint's FLOPs already count them; its throughput in samples too); a batch's
    several losses, a network called twice for one loss, or a GAN's generator called again
    for its critic's step (whose backward pass does not reach it), are one micro-batch; and
    parameters that take no gradient hook leave the count out, not the training."""
    need("torch")
    script = tmp_path / "accumulate.py"
    script.write_text(ACCUMULATING)
    rc, _, rec, err = run(script, mode)
    assert rc == 0, err
    fp, m = rec["fingerprint"], rec["metrics"]
    assert fp["batch_size"] == batch and fp["micro_batches"] == micro
    # two dense layers over the 256 rows of every step: forward, and each backward pass the
    # weights' gradients and the second layer's input gradient (the data needs none)
    forward = 2 * 256 * (32 * 64 + 64 * 1)
    backward = 2 * 256 * 32 * 64 + 2 * 2 * 256 * 64
    if passes:
        assert fp["flops_per_step"] == pytest.approx(forward + passes * backward)
    assert m["samples_per_s"] == pytest.approx(batch * (micro or 1) / m["s_per_step"])
    assert row_from_fom(rec, source="deploy")["micro_batches"] == micro


EPOCHS = """
import sys
import torch
from torch.utils.data import DataLoader, TensorDataset

mode = sys.argv[1]
torch.manual_seed(5)
x, y = torch.randn(96, 8), torch.randn(96, 1)
train = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True)  # 12 batches
val = DataLoader(TensorDataset(x[:40], y[:40]), batch_size=8)  # 5 batches
net = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(net.parameters(), lr=0.01)
mse = torch.nn.functional.mse_loss


def validate():
    with torch.no_grad():
        return sum(mse(net(xb), yb) for xb, yb in val)


if mode == "tensors":  # no loader: batches cut from the tensors by hand
    for i in range(30):
        opt.zero_grad()
        mse(net(x[8 * (i % 12):8 * (i % 12 + 1)]), y[8 * (i % 12):8 * (i % 12 + 1)]).backward()
        opt.step()
for epoch in range(3 if mode != "tensors" else 0):
    for i, (xb, yb) in enumerate(train):
        if mode == "short-epochs" and i == 7:  # the script's own limit on an epoch
            break
        (mse(net(xb), yb) / (2 if mode == "accumulate" else 1)).backward()
        if mode != "accumulate" or i % 2 == 1:
            opt.step()
            opt.zero_grad()
        if i == 4:  # a validation pass within the epoch, as some scripts run every so often
            validate()
    validate()
"""


@pytest.mark.parametrize("mode, cap, per_epoch, how", [
    ("accumulate", None, 6, "counted"), ("accumulate", "4", 6, "12 batches over 2"),
    ("short-epochs", None, 7, "counted"), ("short-epochs", "5", 12, "12 batches over 1"),
    ("tensors", None, None, None)])
def test_an_epochs_steps_are_counted_over_the_training_loaders_pass(tmp_path, mode, cap,
                                                                     per_epoch, how):
    """A job stated in epochs is as long as an epoch's optimizer steps: counted over a whole
    pass over the loader the trained model's steps ran over (not the validation loader
    iterated within and between its passes; as many as the script lets an epoch run), else, in a
    trial its cap stopped within the first epoch, the loader's batches over the step's
    micro-batches; and no figure for a loop over no loader."""
    need("torch")
    script = tmp_path / "epochs.py"
    script.write_text(EPOCHS)
    rc, _, rec, err = run(script, mode, env={"MODAK_MAX_STEPS": cap} if cap else None)
    assert rc == 0, err
    m = rec["metrics"]
    assert m["steps"] == {"accumulate": 18, "short-epochs": 21, "tensors": 30}[mode] \
        if cap is None else m["steps"] == int(cap)
    assert m["steps_per_epoch"] == per_epoch
    assert (how in rec["effect"]["steps_per_epoch"]) if how else \
        "steps_per_epoch" not in rec["effect"]
    assert row_from_fom(rec, source="trial")["steps_per_epoch"] == per_epoch


def test_fingerprint_of_an_lstm_counts_its_recurrent_layers():
    """On the CPU an LSTM runs as oneDNN's fused layer, for which torch has no FLOP
    formula: the runtime counts the gates' products itself (else the model would see only
    the head)."""
    need("torch")
    rc, _, rec, err = run(SCRIPTS / "tiny_lstm.py")
    assert rc == 0, err
    fp = rec["fingerprint"]
    rows = 4 * 10  # (batch x time) rows through each layer
    lstm = 2 * rows * (4 * 32 * 16 + 4 * 32 * 32 + 4 * 32 * 32 + 4 * 32 * 32)
    linear = 2 * rows * 32 * 5
    assert fp["flop_share"]["recurrent"] == pytest.approx(lstm / (lstm + linear))
    assert fp["flops_per_step"] == pytest.approx(3 * (lstm + linear))
    # its ten time steps in sequence through each of its two layers (batch first)
    assert fp["recurrent_steps"] == 10 * 2


def test_fingerprint_counts_the_calls_from_python_and_the_modules_apart_from_the_operations():
    """The same GRU, as one ``nn.GRU`` call (the library loops over the twelve time steps)
    and as a Python loop of ``nn.GRUCell``: about as many operations dispatched, but the
    loop's come from twelve module calls and a Python call each, the fused layer's from
    one; what the eager overhead of a step depends on (``features.cpu_dispatch_us``)."""
    need("torch")
    from modak_lib.perf import features as F
    from modak_lib.results import row_from_fom

    fp = {}
    for way in ("fused", "cells"):
        rc, _, rec, err = run(SCRIPTS / "gru_two_ways.py", way)
        assert rc == 0, err
        fp[way] = rec["fingerprint"]
        assert 0 < fp[way]["python_ops_per_step"] < fp[way]["ops_per_step"]
        row = row_from_fom(rec, source="deploy")
        assert row["python_ops_per_step"] == fp[way]["python_ops_per_step"]
        assert row["module_calls_per_step"] == fp[way]["module_calls_per_step"]
    fused, cells = fp["fused"], fp["cells"]
    # the network, its recurrent module and its head; the loop calls the cell once a step
    assert fused["module_calls_per_step"] == 3 and cells["module_calls_per_step"] == 2 + 12
    assert cells["python_ops_per_step"] >= 12 > fused["python_ops_per_step"] - 12
    assert abs(cells["ops_per_step"] - fused["ops_per_step"]) < 0.2 * fused["ops_per_step"]
    # so a step of the loop costs more to dispatch than the fused layer's
    assert F.cpu_dispatch_us(cells) > 1.25 * F.cpu_dispatch_us(fused)


def test_a_recurrent_layers_time_steps_are_counted_from_its_input():
    """A fused recurrent layer is one dispatched operation whatever its length: its time
    steps in sequence are counted from the module's input (time first or batch first,
    unbatched, packed), times its layers; a cell, one step a call whose operations are
    dispatched one by one, adds none."""
    torch = need("torch")
    from torch import nn
    from modak_runtime.torch_support import _sequence_steps

    gru = nn.GRU(8, 16, num_layers=3)
    assert _sequence_steps(gru, (torch.zeros(7, 4, 8),)) == 7 * 3  # (time, batch, features)
    assert _sequence_steps(gru, (torch.zeros(7, 8),)) == 7 * 3  # unbatched
    first = nn.LSTM(8, 16, num_layers=2, batch_first=True)
    assert _sequence_steps(first, (torch.zeros(4, 9, 8),)) == 9 * 2
    packed = nn.utils.rnn.pack_padded_sequence(torch.zeros(4, 9, 8), [9, 6, 5, 2],
                                               batch_first=True)
    assert _sequence_steps(first, (packed,)) == 9 * 2
    assert _sequence_steps(nn.LSTMCell(8, 16), (torch.zeros(4, 8),)) == 0


def test_a_recurrent_network_on_the_gpu_counts_as_on_the_cpu():
    """On an NVIDIA GPU the same LSTM runs as one cuDNN call for all its layers, which
    torch's formulas lack too: counted as oneDNN's layers are, the fingerprint of a
    workload does not depend on the device (a GPU run measured the GRU family at 1/15000 of
    its FLOPs before).  The call is fed here as the dispatcher would feed it."""
    torch = need("torch")
    from modak_runtime.torch_support import _FlopCounter

    counter = _FlopCounter(None, torch)
    batch, time, inp, hidden = 4, 10, 16, 32
    x = torch.zeros(time, batch, inp)
    weights = [torch.zeros(4 * hidden, inp), torch.zeros(4 * hidden, hidden),
               torch.zeros(4 * hidden), torch.zeros(4 * hidden),
               torch.zeros(4 * hidden, hidden), torch.zeros(4 * hidden, hidden),
               torch.zeros(4 * hidden), torch.zeros(4 * hidden)]
    out = (torch.zeros(time, batch, hidden), torch.zeros(2, batch, hidden))
    counter.stack = ["recurrent"]  # inside the LSTM module's forward
    counter.count(torch.ops.aten._cudnn_rnn.default, (x, weights), {}, out)
    forward = 2 * time * batch * (4 * hidden * inp + 3 * 4 * hidden * hidden)
    assert counter.total == forward and counter.forward == {"recurrent": forward}
    counter.in_backward = True
    counter.count(torch.ops.aten._cudnn_rnn_backward.default, (x, weights), {}, (x,))
    assert counter.total == 3 * forward  # backward: the inputs' and the weights' gradients
    # batch-first, as a (batch, time, features) input: the same rows
    first = _FlopCounter(None, torch)
    first.count(torch.ops.aten._cudnn_rnn.default, (x.transpose(0, 1), weights), {}, out)
    assert first.total == forward


def test_fingerprint_finds_the_batch_inside_a_tuple_of_inputs():
    need("torch")
    rc, _, rec, err = run(SCRIPTS / "two_inputs.py", "3")
    assert rc == 0, err
    fp = rec["fingerprint"]
    assert fp["batch_size"] == 24 and fp["input_shape"] == [5]  # the first tensor: dense
    assert fp["flops_per_step"] > 0 and fp["trainable_parameters"] == 100 * 8 + 5 * 8 + 8 + 17


# ---------------------------------------------------------------------------
# failures, the trial cap, the record as the store reads it
def test_a_compile_failure_names_the_knob_and_is_never_offered_again(tmp_path):
    need("torch")
    no_compiler = tmp_path / "bin"
    no_compiler.mkdir()
    app = {"framework": "pytorch", "script": "mlp.py", "arguments": ["6"]}
    req = request(application=app, optimisation={"compilers": ["torch.compile"],
                                                 "allow_reduced_precision": True},
                  target={"microarchitecture": "zen4", "cores_per_node": 2,
                          "cpu_features": ["avx512_bf16"]})
    key = workload.key(req.application)
    base = {"MODAK_WORKLOAD_KEY": key, "MODAK_WORKLOAD": "mlp", "MODAK_THREADS": "2",
            "MODAK_MICROARCHITECTURE": "zen4"}
    store = ResultsStore(tmp_path / "store.sqlite")
    for env in ({}, {"MODAK_PRECISION": "bf16"}, {"MODAK_THREADS": "1"}):
        rc, _, rec, err = run(SCRIPTS / "mlp.py", "6", env={**base, **env})
        assert rc == 0, err
        store.append([row_from_fom(rec, source="deploy", run_id="ok", cores=2)])
    rc, _, rec, err = run(SCRIPTS / "mlp.py", "6", env={
        **base, "MODAK_TORCH_COMPILE": "default", "PATH": str(no_compiler),
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache")})
    assert rc != 0 and rec["status"] == "failed"
    assert rec["error"]["knob"] == "compiler" and "compiler" in rec["error"]["message"].lower()
    assert "the run failed under the knob 'compiler'" in err
    store.append([row_from_fom(rec, source="deploy", run_id="broken", cores=2)])
    (failed,) = [r for r in store.rows() if r["status"] == "failed"]
    assert failed["failed_knob"] == "compiler" and failed["s_per_step"] is None

    from modak_lib.perf import fit as m
    from modak_lib.pipeline import make_plan
    frame = load_frame(store, include_shipped=True)
    predictor = m.model_predictor(m.fit(frame, estimators=("linear",)), frame)
    plan = make_plan(req, predictor=predictor, run_id="t").plan
    offered = [c.configuration for c in plan.candidates]
    assert offered and all(c.compiler is None or c.precision.value != "fp32" or c.threads != 2
                           or c.allocator.value != "glibc" for c in offered)
    assert any("not offered" in n and "under the knob compiler" in n for n in plan.notes), plan.notes
    assert plan.decided_by == "model"  # three measured configurations of this fingerprint


def test_the_trial_cap_stops_the_script_and_records_the_steps():
    need("torch")
    rc, out, rec, err = run(SCRIPTS / "mlp.py", "1000", env={"MODAK_MAX_STEPS": "7"})
    assert rc == 0, err
    assert rec["status"] == "capped" and rec["metrics"]["steps"] == 7
    assert len(out.splitlines()) == 6  # the 7th step's print never ran


EXIT_HOOK = """
import atexit, pathlib, subprocess, sys
import torch
# (as a compile worker pool or a data loader's workers are ended at the interpreter's exit)
atexit.register(lambda: pathlib.Path(sys.argv[1]).write_text("ran"))
# (as a compiler's process it left compiling)
worker = subprocess.Popen(["sleep", "300"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
pathlib.Path(sys.argv[1] + ".pid").write_text(str(worker.pid))
net = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(net.parameters(), lr=0.1)
x, y = torch.randn(32, 8), torch.randn(32, 1)
for i in range(int(sys.argv[2])):
    loss = torch.nn.functional.mse_loss(net(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def test_a_trial_stopped_at_its_cap_leaves_without_the_scripts_exit_hooks(tmp_path):
    """A trial its cap stopped has printed all it is for: the runtime leaves at once, as it
    does on SIGTERM, since the budget pays for what exit hooks do (a compiled trial stopped
    at its time cap took 2.9 s outside the runtime's clock here, stock's 0.8 s), and ends
    the processes the run started (a C++ compilation Inductor left ran on for 2 s beside
    what came next).  A run that is not capped (the job itself) runs them, as the script
    would alone."""
    need("torch")
    script = tmp_path / "hooked.py"
    script.write_text(EXIT_HOOK)
    mark = tmp_path / "hook-ran"
    pid_file = tmp_path / "hook-ran.pid"

    def gone(pid, tries=50):  # (no such process, or one its new parent has not reaped yet)
        for _ in range(tries):
            try:
                with open(f"/proc/{pid}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                        return True
            except OSError:
                return True
            time.sleep(0.1)
        return False
    rc, _, rec, err = run(script, str(mark), "50", env={"MODAK_MAX_STEPS": "5"})
    assert rc == 0, err
    assert rec["status"] == "capped" and rec["metrics"]["steps"] == 5
    assert not mark.exists()
    assert gone(int(pid_file.read_text()))
    rc, _, rec, err = run(script, str(mark), "5")
    worker = int(pid_file.read_text())
    try:
        assert rc == 0 and rec["status"] == "ok", err
        assert mark.read_text() == "ran"
        assert not gone(worker, tries=1)  # (the script's own to end)
    finally:
        os.kill(worker, signal.SIGKILL)


NEW_OPTIMIZER_EACH_EPOCH = """
import torch
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
critic = torch.nn.Linear(1, 1)  # trained by an optimizer of its own, as a GAN's second
critic_opt = None
x, y = torch.randn(64, 16), torch.randn(64, 1)
for epoch in range(3):
    opt = torch.optim.SGD(net.parameters(), lr=0.05 / (epoch + 1))  # its decay, by hand
    for i in range(6):
        loss = torch.nn.functional.mse_loss(net(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if critic_opt is None:
            critic_opt = torch.optim.SGD(critic.parameters(), lr=0.01)
        critic_loss = critic(net(x).detach()).pow(2).mean()
        critic_opt.zero_grad()
        critic_loss.backward()
        critic_opt.step()
        print(epoch, i, loss.item())
"""


def test_a_script_that_makes_a_new_optimizer_each_epoch_has_every_step_counted(tmp_path):
    """A new optimizer over the trained parameters takes over the step count (it counted
    the first epoch's steps only, and a trial's step cap never stopped such a script); an
    optimizer over other parameters (the critic's, made after the first) does not."""
    need("torch")
    script = tmp_path / "new_optimizer.py"
    script.write_text(NEW_OPTIMIZER_EACH_EPOCH)
    rc, out, rec, err = run(script)
    assert rc == 0, err
    assert rec["metrics"]["steps"] == 18 and len(out.splitlines()) == 18
    # the trained model's last loss, not the critic's after it
    assert round(rec["metrics"]["final_loss"], 6) == round(float(out.split()[-1]), 6)
    rc, out, rec, err = run(script, env={"MODAK_MAX_STEPS": "9"})
    assert rc == 0, err
    assert rec["status"] == "capped" and rec["metrics"]["steps"] == 9
    assert len(out.splitlines()) == 8  # the 9th step (the second epoch's third) never printed


# a training script whose third step stalls (a compilation that takes minutes, as
# Inductor's of a GRU took 122 s here): only the time cap can end it inside the step
STALLING = """
import sys, time
import torch
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(16, 8), torch.randn(16, 1)
for step in range(int(sys.argv[1])):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    if step == int(sys.argv[2]):
        time.sleep(120)
    loss.backward()
    opt.step()
    print("step", step, float(loss))
"""


def test_the_time_cap_stops_a_trial_even_inside_a_step(tmp_path):
    """MODAK_MAX_SECONDS ends the run where it is: a step that stalls is cut at the cap
    (the script would sleep 120 s), recorded as capped with nothing measured and why, and
    the compiler asked for is not refused for it (its trial ran out of time; the script
    did not fail).  The store keeps it as how long the compiler ran at least (its
    training's time, start-up left out), never as a measurement; uncompiled, it keeps
    nothing.  Where the steps are quick, the cap ends the run after a measured stretch of
    them."""
    need("torch")
    script = tmp_path / "stall.py"
    script.write_text(STALLING)
    started = __import__("time").monotonic()
    # (the cap leaves the first step time to end: importing torch alone took 3.8 s on a
    # 2-core AMD EPYC, 6 s and more beside a second busy process)
    rc, out, rec, err = run(script, "50", "1", env={"MODAK_MAX_SECONDS": "15",
                                                    "MODAK_TORCH_COMPILE": "default"})
    took = __import__("time").monotonic() - started
    assert rc == 0, err
    assert took < 60  # not the 120 s the step sleeps
    assert rec["status"] == "capped" and rec["metrics"]["s_per_step"] is None
    assert rec["error"]["type"] == "TimeCap" and rec["error"]["knob"] is None
    assert "time cap of 15 s" in rec["error"]["message"]
    assert "torch.compile:default compiles" in rec["error"]["message"]
    assert rec["effect"]["stopped_by"] == "MODAK_MAX_SECONDS"
    assert "compiler" not in rec["not_applied"] and rec["effect"]["compiled"] is None
    from modak_lib.results import kept, still_compiling
    ran = still_compiling(rec)
    assert kept(rec) and 0 < ran < rec["metrics"]["wall_s"]
    assert ran == pytest.approx(rec["metrics"]["wall_s"] - rec["metrics"]["startup_s"])
    row = row_from_fom(rec, source="autotune")
    assert row["status"] == "capped" and row["s_per_step"] is None
    from modak_lib.perf.fit import training_frame
    import pandas as pd
    assert training_frame(pd.DataFrame([row])).empty  # (a bound, not a measurement)
    eager = {**rec, "config": {**rec["config"], "compiler": "off"}}
    assert still_compiling(eager) is None and not kept(eager)
    for wall in (float("inf"), float("nan"), "soon", rec["metrics"]["startup_s"]):
        assert still_compiling({**rec, "metrics": {**rec["metrics"], "wall_s": wall}}) is None
    with pytest.raises(Exception, match="measured no step time"):
        row_from_fom(eager, source="autotune")  # (the recorder does not offer it: kept())

    rc, out, rec, err = run(script, "1000000", "-1", env={"MODAK_MAX_SECONDS": "8"})
    assert rc == 0, err
    assert rec["status"] == "capped" and rec["effect"]["stopped_by"] == "MODAK_MAX_SECONDS"
    assert rec["error"] is None and rec["metrics"]["s_per_step"] > 0
    assert 2 < rec["metrics"]["steps"] < 1000000 and rec["metrics"]["wall_s"] < 20
    assert kept(rec)
    rc, _, _, err = run(script, "3", "-1", env={"MODAK_MAX_SECONDS": "soon"})
    assert rc != 0 and "MODAK_MAX_SECONDS='soon' is not a number of seconds" in err


# a script whose first stall runs in a weakref callback, where Python prints an exception
# and goes on (an Inductor compilation's alarm landed in Dynamo's weakref callback, and the
# run went 67 s past its 9.7 s cap); then it stalls in plain code
SWALLOWING = """
import time, weakref
class Thing:
    pass
def slow(ref):
    time.sleep(15)
thing = Thing()
ref = weakref.ref(thing, slow)
del thing  # slow() runs here, past the cap
time.sleep(120)
print("not reached")
"""


def test_the_time_cap_holds_when_its_first_stop_is_swallowed(tmp_path):
    """The time cap's alarm is raised again until the run stops: the first StopTrial,
    raised inside a weakref callback, is ignored by Python, the next one ends the run."""
    script = tmp_path / "swallow.py"
    script.write_text(SWALLOWING)
    started = __import__("time").monotonic()
    rc, out, rec, err = run(script, env={"MODAK_MAX_SECONDS": "5"})
    took = __import__("time").monotonic() - started
    assert rc == 0, err
    assert "StopTrial" in err  # (Python's "Exception ignored in" the callback)
    assert took < 60 and "not reached" not in out  # not the 120 s sleep after it
    assert rec["status"] == "capped" and rec["error"]["type"] == "TimeCap"
    assert rec["effect"]["stopped_by"] == "MODAK_MAX_SECONDS"


def test_a_compiled_run_capped_by_its_compiling_step_has_no_step_time():
    """A compiled run whose time cap stopped it at the end of its second step (the one
    that compiled) has one interval, the compilation: no step time, and the record says
    it was stopped in the warm-up; a third step gives one, as an eager run's second does."""
    from modak_runtime.record import Config
    from modak_runtime.session import Session
    for compiler, steps, measured in (("torch.compile:default", [1.0, 64.0], False),
                                      ("torch.compile:default", [1.0, 64.0, 64.05], True),
                                      ("off", [1.0, 1.05], True)):
        s = Session(Config(compiler=compiler), "x.py")
        s.t_train, s.step_ends, s.stopped_by, s.max_seconds = 0.5, steps, "time", 9.7
        m = s.metrics()
        assert (m.s_per_step is not None) == measured, (compiler, steps)
        if not measured:
            assert "before a steady step time, in the warm-up where torch.compile:default " \
                "compiles" in s.time_cap_error()["message"]
        else:
            assert m.s_per_step == pytest.approx(0.05) and s.time_cap_error() is None


def test_a_one_off_stall_after_the_warm_up_goes_to_it_not_to_the_step_time():
    """A run's one steady step far slower than the others (XLA recompiling at a Keras epoch's
    end: 648 ms against 4 ms steps) is paid once in a job: it is the warm-up's, and the step
    time is the others'.  Two such steps may be every epoch's (an evaluation), and a step
    a few times the others (Keras' own end of an epoch, about 4x) is each epoch's: both
    stay in the step time."""
    from modak_runtime.record import Config
    from modak_runtime.session import Session

    def metrics(intervals):
        s = Session(Config(), "x.py")
        ends = [1.0, 1.1]  # the warm-up: two steps
        for t in intervals:
            ends.append(ends[-1] + t)
        s.t_train, s.step_ends = 0.5, ends
        return s.metrics()

    steady = metrics([0.004] * 30)
    assert steady.s_per_step == pytest.approx(0.004) and steady.stall_s is None
    m = metrics([0.004] * 15 + [0.648] + [0.004] * 14)
    assert m.s_per_step == pytest.approx(0.004) and m.stall_s == pytest.approx(0.644)
    assert m.warmup_s == pytest.approx(steady.warmup_s + 0.644)
    assert m.timed_steps == 30
    two = metrics([0.004] * 10 + [0.648] + [0.004] * 9 + [0.648] + [0.004] * 9)
    assert two.s_per_step == pytest.approx((28 * 0.004 + 2 * 0.648) / 30)
    assert two.stall_s is None
    epochs = metrics(([0.004] * 15 + [0.020]) * 2)  # each epoch's end, 5x a step
    assert epochs.s_per_step == pytest.approx((30 * 0.004 + 2 * 0.020) / 32)
    assert epochs.stall_s is None
    # a sweep of three models of one size, each compiling anew: one stall in each model's
    # steps (a k-fold Keras script under XLA measured a mean step 2.5x its median)
    s = Session(Config(), "x.py")
    ends = [1.0]
    for model in range(3):
        if model:
            s.models.append((len(ends), True))
        for t in [0.1, 0.004] + [0.004] * 10 + [0.648] + [0.004] * 10:
            ends.append(ends[-1] + t)
    s.t_train, s.step_ends = 0.5, ends
    sweep = s.metrics()
    assert sweep.s_per_step == pytest.approx(0.004) and sweep.stall_s == pytest.approx(3 * 0.644)


def test_a_script_that_exits_non_zero_keeps_its_status():
    rc, _, rec, _ = run(SCRIPTS / "mlp.py", "not-a-number")
    assert rc == 1 and rec["status"] == "failed" and rec["error"]["knob"] is None


@pytest.mark.parametrize("code", [0, 3])
def test_a_script_that_leaves_by_os_exit_still_has_its_record(code):
    """os._exit skips the interpreter's shutdown, where the record used to be printed:
    the run had no record at all (the deploy found no result)."""
    need("torch")
    rc, out, rec, err = run(SCRIPTS / "hard_exit.py", "12", str(code))
    assert rc == code and rec is not None, err
    assert rec["metrics"]["steps"] == 12
    assert rec["metrics"]["final_loss"] == pytest.approx(float(out.split()[-1]), rel=1e-6)
    if code:
        assert rec["status"] == "failed"
        assert rec["error"]["message"] == "the script exited with status 3 (os._exit)"
    else:
        assert rec["status"] == "ok" and rec["error"] is None


def test_usage_errors_exit_2():
    for args in ([], ["--"], ["-m"], ["--bogus"]):
        proc = subprocess.run([sys.executable, "-m", "modak_runtime", *args], cwd=ROOT,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and "usage:" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "modak_runtime", "--", "x.py"], cwd=ROOT,
                          env=dict(os.environ, MODAK_THREADS="two"), capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode != 0 and "MODAK_THREADS='two' is not a whole number" in proc.stderr


def test_the_record_is_the_one_declaration_the_store_reads():
    rec = json.loads(Record(workload="w", framework="pytorch").to_json())
    row = flatten(rec)
    assert set(row) == {c for c, (_, path) in STORE_COLUMNS.items() if path}
    with pytest.raises(ValueError, match="schema"):
        flatten({**rec, "schema": 1})
    from modak_lib.results import COLUMNS
    assert list(COLUMNS) == list(STORE_COLUMNS)


def test_a_store_of_the_previous_schema_is_brought_up_to_date(tmp_path):
    """A store written by MODAK 0.1 (s_per_step NOT NULL, no status or fingerprint) keeps its
    rows and takes failed runs after the migration."""
    import sqlite3
    old_cols = ["recorded_at", "source", "run_id", "repeat", "workload", "framework",
                "framework_version", "trainable_parameters", "batch_size", "image_size",
                "compiler", "threads", "allocator", "precision", "channels_last", "onednn",
                "image", "target", "cpu_model", "microarchitecture", "cores", "accelerator",
                "steps", "s_per_step", "steps_per_s", "samples_per_s", "compile_s",
                "peak_rss_mb", "final_loss", "accuracy", "raw"]
    notnull = {"recorded_at", "source", "workload", "framework", "compiler", "allocator",
               "precision", "channels_last", "onednn", "s_per_step", "raw"}
    path = tmp_path / "old.sqlite"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE measurements (id INTEGER PRIMARY KEY, " + ", ".join(
        f'"{c}" TEXT' + (" NOT NULL" if c in notnull else "") for c in old_cols) + ")")
    con.execute(f"INSERT INTO measurements ({', '.join(old_cols)}) VALUES "
                f"({', '.join('?' for _ in old_cols)})",
                [{"s_per_step": 0.1, "channels_last": 0, "onednn": 1}.get(c, "x")
                 for c in old_cols])
    con.commit()
    con.close()
    store = ResultsStore(path)
    rec = json.loads(Record(workload="w", framework="pytorch", status="failed",
                            error={"type": "E", "message": "boom", "knob": "compiler"}).to_json())
    store.append([row_from_fom(rec, source="deploy", run_id="new", cores=2)])
    old, new = store.rows()
    assert old["status"] == "ok" and float(old["s_per_step"]) == 0.1
    assert new["status"] == "failed" and new["s_per_step"] is None
    assert new["failed_knob"] == "compiler"


def test_a_trials_seed_makes_runs_of_an_unseeded_script_start_alike(tmp_path):
    """MODAK_SEED (the search's trials): Python's, NumPy's and PyTorch's generators are
    seeded before the script runs, so an unseeded model and its random batches are the
    same in every trial; unset, the runs draw differently."""
    need("torch")
    script = tmp_path / "unseeded.py"
    script.write_text("""
import random
import numpy as np
import torch
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for _ in range(6):
    x = torch.randn(16, 8) + float(np.random.rand()) + random.random()
    loss = ((model(x) - 1) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
""")

    def losses(**env):
        rc, _, rec, err = run(script, env=env, cwd=tmp_path)
        assert rc == 0 and rec["status"] == "ok", err
        return rec["metrics"]["losses"], rec["effect"]

    first, effect = losses(MODAK_SEED="7")
    again, _ = losses(MODAK_SEED="7")
    assert effect["seed"] == 7 and "seed_errors" not in effect
    assert len(first) == 6 and first == again  # every loss, every digit
    plain, effect = losses()
    assert "seed" not in effect and plain != first and plain != losses()[0]
    rc, _, rec, err = run(script, env={"MODAK_SEED": "-1"}, cwd=tmp_path)
    assert rc != 0 and rec is None and "MODAK_SEED" in err


def _unseeded(name: str, seeding: str, tmp_path) -> Path:
    """A test script with the line that seeds it left out."""
    text = (SCRIPTS / name).read_text()
    assert seeding + "\n" in text
    script = tmp_path / name
    script.write_text(text.replace(seeding + "\n", ""))
    return script


@pytest.mark.parametrize("name, seeding, args, env", [
    # Keras draws a model's first weights from its own seed generator, seeded when Keras
    # is imported
    ("keras_fit.py", "keras.utils.set_random_seed(7)", ["--epochs", "1"],
     {"TF_CPP_MIN_LOG_LEVEL": "3"}),
    # a spawned rank is a fresh interpreter: it seeds its own (the seed plus its rank)
    ("spawn_ddp.py", "    torch.manual_seed(0)", ["4", "spawn"], {})])
def test_a_trials_seed_reaches_keras_and_the_ranks_a_script_spawns(name, seeding, args, env,
                                                                   tmp_path):
    """An unseeded model.fit, and a DDP script that spawns its ranks and does not seed its
    model, train alike in every trial."""
    need("keras" if name.startswith("keras") else "torch")
    script = _unseeded(name, seeding, tmp_path)

    def final_loss():
        rc, _, rec, err = run(script, *args, cwd=tmp_path,
                              env={**env, "MODAK_SEED": "3", "MASTER_PORT": _free_port()})
        assert _trained(rc, rec), err
        assert rec["effect"]["seed"] == 3 and "seed_errors" not in rec["effect"]
        return rec["metrics"]["final_loss"]
    assert final_loss() == final_loss()


def test_the_loss_at_a_runs_end_is_its_second_halfs_mean_in_old_records_too(tmp_path):
    """``end_loss``: the mean of the losses sampled after the first half of the steps
    (thinned samples too); ``start_loss``: the first one sampled.  A record of a runtime
    before them, a store written before the columns and a CSV without them get them from
    the record's losses; and so do the ranks and their launcher, from the record's effect."""
    import sqlite3
    from modak_runtime.record import Metrics, end_loss, start_loss
    assert end_loss([[1, 9.0], [2, 5.0], [3, 4.0], [4, 2.0]], 4) == 3.0
    assert end_loss([[2, 9.0], [4, 5.0], [6, 4.0], [8, 2.0]], 9) == 3.0  # every other step
    assert end_loss([[1, 9.0]], 10) is None and end_loss([], 4) is None
    assert end_loss([[1, "x"]], 2) is None and end_loss(None, None) is None
    assert start_loss([[4, 2.0], [2, 9.0], [3, 4.0]]) == 9.0  # the lowest step's
    assert start_loss([]) is None and start_loss(None) is None
    assert start_loss([[1, "x"]]) is None and start_loss([[1, float("nan")]]) is None

    def old_record(losses, steps):  # as a runtime before end_loss and start_loss printed them
        rec = json.loads(Record(workload="w", framework="pytorch", metrics=Metrics(
            steps=steps, s_per_step=0.1, final_loss=losses[-1][1], losses=losses)).to_json())
        del rec["metrics"]["end_loss"], rec["metrics"]["start_loss"]
        rec["effect"].update(ranks=2, launcher="srun")  # (rank 0's record of a Slurm step)
        return rec
    first = old_record([[1, 4.0], [2, 3.0], [3, 2.0], [4, 1.0]], 4)
    assert flatten(first)["end_loss"] == 1.5 and flatten(first)["start_loss"] == 4.0
    assert (flatten(first)["ranks"], flatten(first)["launcher"]) == (2, "srun")
    # a store of the MODAK before the columns
    path = tmp_path / "before.sqlite"
    derived = ("end_loss", "start_loss", "ranks", "launcher")
    cols = [c for c in STORE_COLUMNS if c not in derived]
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE measurements (id INTEGER PRIMARY KEY, " + ", ".join(
        f'"{c}" {STORE_COLUMNS[c][0]}' for c in cols) + ")")
    row = row_from_fom(first, source="deploy", run_id="r1", cores=2)
    con.execute(f"INSERT INTO measurements ({', '.join(chr(34) + c + chr(34) for c in cols)}) "
                f"VALUES ({', '.join('?' for _ in cols)})", [row[c] for c in cols])
    con.commit()
    con.close()
    store = ResultsStore(path)
    (kept,) = store.rows()
    assert kept["end_loss"] == 1.5 and kept["start_loss"] == 4.0 and kept["final_loss"] == 1.0
    assert (kept["ranks"], kept["launcher"]) == (2, "srun")
    # a CSV of the time, loaded and imported
    csv_path = tmp_path / "before.csv"
    store.export_csv(csv_path)
    text = csv_path.read_text().splitlines()
    import csv as csvmod
    rows = list(csvmod.reader(text))
    keep = [i for i, c in enumerate(rows[0]) if c not in derived]
    with open(csv_path, "w", newline="") as f:
        csvmod.writer(f).writerows([[r[i] for i in keep] for r in rows])
    assert not set(derived) & set(csv_path.read_text().splitlines()[0].split(","))
    other = ResultsStore(tmp_path / "imported.sqlite")
    assert other.import_csv(csv_path) == 1
    assert (other.rows()[0]["end_loss"], other.rows()[0]["start_loss"]) == (1.5, 4.0)
    assert (other.rows()[0]["ranks"], other.rows()[0]["launcher"]) == (2, "srun")
    frame = load_frame(None, include_shipped=False, extra=[csv_path])
    assert frame["end_loss"].tolist() == [1.5] and frame["start_loss"].tolist() == [4.0]
    assert frame["ranks"].tolist() == [2] and frame["launcher"].tolist() == ["srun"]


def test_application_files_of_orchestrator_nodes_come_from_the_named_directory(tmp_path):
    """xOpera's requests come from node properties, not a file: their files are relative to
    the CSAR's root, given as a plain string (as Ansible passes a path)."""
    from modak_lib.readers.appfiles import application_files
    from modak_lib.readers.tosca import request_from_nodes
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "train.py").write_text("")
    (tmp_path / "pkg" / "__pycache__").mkdir()
    (tmp_path / "pkg" / "__pycache__" / "x.pyc").write_text("")
    (tmp_path / "pkg" / "link.py").symlink_to("/etc/hostname")
    req = request_from_nodes("job", {"application": {"framework": "pytorch",
                                                     "script": "pkg/train.py"}},
                             "fe", {"scheduler": "local"}, "TOSCA node job", None)
    got = application_files(req, base=str(tmp_path))
    assert [dest for _, dest in got] == ["pkg/train.py"]  # no cache, no link
    assert application_files(req) == []  # no file, no directory: nothing to copy


def test_listed_application_files_take_the_script_with_them(tmp_path):
    """A request that lists its data file still means its script to run: the run directory
    receives the listed files and the script (a user's first deploy ran every trial into
    "No such file" for the script); the modules beside it are the list's to name.  A
    script that is not there is named as the field at fault."""
    from modak_lib.errors import InputError
    from modak_lib.readers.appfiles import application_files
    from modak_lib.readers.tosca import request_from_nodes
    (tmp_path / "train.py").write_text("")
    (tmp_path / "helpers.py").write_text("")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "tokens.npz").write_bytes(b"0")

    def staged(app):
        req = request_from_nodes("job", {"application": {"framework": "pytorch", **app}},
                                 "fe", {"scheduler": "local"}, "TOSCA node job", None)
        return [dest for _, dest in application_files(req, base=str(tmp_path))]

    assert staged({"script": "train.py", "files": ["data"]}) == ["data/tokens.npz", "train.py"]
    assert staged({"script": "train.py", "files": ["data", "helpers.py", "train.py"]}) == [
        "data/tokens.npz", "helpers.py", "train.py"]
    assert staged({"script": "train.py"}) == ["helpers.py", "train.py"]  # as before
    (tmp_path / "train.py").unlink()
    with pytest.raises(InputError, match="application.script.*'train.py' not found"):
        staged({"script": "train.py", "files": ["data"]})


def test_a_top_level_script_takes_the_packages_beside_it_and_no_other_directory(tmp_path):
    """`train.py` beside `gcn/` (`from gcn.graph import ...`): the run directory receives the
    package too (a user's GCN failed every trial with "No module named 'gcn'"). A directory
    with an `__init__.py` is a package; one without is taken where the script or a module
    beside it imports it by name (a namespace package); a data directory, a directory that
    only a comment or a string names, a linked one and a hidden one stay behind."""
    from modak_lib.readers.appfiles import application_files
    from modak_lib.readers.tosca import request_from_nodes
    (tmp_path / "train.py").write_text(
        "import os, numpy as np\nfrom gcn.graph import block_graph  # not data/\n"
        "from . import nothing\nprint('import data')\n")
    (tmp_path / "helpers.py").write_text("import ns.tools\n")
    (tmp_path / "broken.py").write_text("def (:\n")  # does not parse: names nothing
    for d, files in {"gcn": ["__init__.py", "graph.py", "sub/model.py"], "ns": ["tools.py"],
                     "plugins": ["__init__.py"], "data": ["x.py", "tokens.npz"],
                     ".cache": ["__init__.py"], "my-dir": ["__init__.py"]}.items():
        for f in files:
            (tmp_path / d / f).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / d / f).write_text("")
    (tmp_path / "linked").symlink_to(tmp_path / "gcn")
    req = request_from_nodes("job", {"application": {"framework": "pytorch",
                                                     "script": "train.py"}},
                             "fe", {"scheduler": "local"}, "TOSCA node job", None)
    got = [dest for _, dest in application_files(req, base=str(tmp_path))]
    assert got == ["broken.py", "gcn/__init__.py", "gcn/graph.py", "gcn/sub/model.py",
                   "helpers.py", "ns/tools.py", "plugins/__init__.py", "train.py"]


def test_the_script_the_request_names_goes_whatever_its_name_and_nothing_more(tmp_path):
    """``./train.py`` is ``train.py`` (it was read as the folder ``.``: the whole request
    directory went to the run directory); a hidden script (``.train.py``), or one in a
    hidden folder of its package, goes though a folder's walk leaves hidden entries out
    (the job ran a script its run directory lacked); ``./`` names no script at all."""
    from modak_lib.errors import InputError
    from modak_lib.readers.appfiles import application_files
    from modak_lib.readers.tosca import request_from_nodes
    for f in ("train.py", ".train.py", "notes.txt", "pkg/t.py", "pkg/.exp/t.py"):
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_text("")

    def staged(script):
        req = request_from_nodes("job", {"application": {"framework": "pytorch",
                                                         "script": script}},
                                 "fe", {"scheduler": "local"}, "TOSCA node job", None)
        return req.application.script, [d for _, d in application_files(req, base=str(tmp_path))]

    assert staged("./train.py") == ("train.py", ["train.py"])
    assert staged(".train.py") == (".train.py", [".train.py", "train.py"])
    assert staged("pkg//t.py") == ("pkg/t.py", ["pkg/t.py"])
    assert staged("pkg/.exp/t.py") == ("pkg/.exp/t.py", ["pkg/.exp/t.py", "pkg/t.py"])
    with pytest.raises(InputError, match="names the request file's directory itself"):
        staged("./")


def test_files_the_script_names_that_the_run_directory_lacks_are_named(tmp_path):
    """A script that opens ``labels.txt`` beside it, or reads ``Path("data") / name``,
    where the request lists no ``application.files``: the run directory has neither, and
    the plan warns, naming them (a script's and a module's names alike); a name nothing
    here has (the script's output), a hidden file, a link, and what is sent are not named,
    nor anything once the request lists its files."""
    from modak_lib.readers.appfiles import application_files, unsent_names, unsent_warning
    from modak_lib.readers.tosca import request_from_nodes
    (tmp_path / "train.py").write_text(
        "import json, pathlib, helpers\nlabels = open('labels.txt').read()\n"
        "rows = (pathlib.Path('data') / 'train.csv').read_text()\n"
        "open('out.csv', 'w')\nopen('.env')\nopen('linked.txt')\nopen('./helpers.py')\n")
    (tmp_path / "helpers.py").write_text("VOCAB = 'vocab.json'\n")
    for name in ("labels.txt", "vocab.json", ".env", "data/train.csv"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    (tmp_path / "linked.txt").symlink_to(tmp_path / "labels.txt")

    def unsent(app):
        req = request_from_nodes("job", {"application": {"framework": "pytorch", **app}},
                                 "fe", {"scheduler": "local"}, "TOSCA node job", None)
        files = application_files(req, base=str(tmp_path))
        return unsent_names(req, files, base=str(tmp_path))

    names = unsent({"script": "train.py"})
    assert names == ["data", "labels.txt", "vocab.json"], names
    said = unsent_warning(names)
    assert said.startswith("the job names 'data', 'labels.txt', 'vocab.json' (its script, "
                           "arguments or settings), beside the")
    assert "list them (with the script) in application.files" in said
    assert unsent_warning(["labels.txt"]).endswith(
        "'labels.txt' (its script, arguments or settings), beside the request here but not "
        "sent to the run directory: if the job reads it, list it (with the script) in "
        "application.files")
    listed = {"script": "train.py", "files": ["helpers.py", "labels.txt", "vocab.json", "data"]}
    assert unsent(listed) == [] and unsent_warning([]) is None


def test_files_the_arguments_and_their_settings_name_are_named_and_outputs_are_not(tmp_path):
    """A script whose settings come from a file its arguments name (``--config
    settings.json``, ``--vocab=words.txt``), the settings naming the data (``"data":
    "series.csv"``, in JSON and in YAML): the run directory lacks all of them, and the plan
    names them.  What the script only writes, left here by a run of it on the user's own
    machine (``os.makedirs``, ``torch.save``, ``open(.., "w")``, ``Path(..).write_text``,
    a pandas ``to_csv``), is not named; a checkpoint it also reads (to resume) is."""
    from modak_lib.readers.appfiles import application_files, unsent_names
    from modak_lib.readers.tosca import request_from_nodes
    (tmp_path / "train.py").write_text(
        "import json, os, pathlib, torch\n"
        "os.makedirs('checkpoints', exist_ok=True)\n"
        "torch.save({}, os.path.join('checkpoints', 'last.pt'))\n"
        "if os.path.exists('checkpoints/best.pt'):\n"
        "    torch.load('checkpoints/best.pt')\n"
        "torch.save({}, 'checkpoints/best.pt')\n"
        "json.dump({}, open('metrics.json', 'w'))\n"
        "pathlib.Path('report.txt').write_text('done')\n"
        "df.to_csv('predictions.csv')\n"
        "open('log.txt', 'a+')\n")
    for name, text in (("settings.json", '{"data": "series.csv", "sizes": [1, "extra.yaml"]}'),
                       ("extra.yaml", "vocab: [words.txt, 'not-here.txt']\n"),
                       ("series.csv", "1,2\n"), ("words.txt", "a\n"),
                       ("checkpoints/best.pt", "x"), ("checkpoints/last.pt", "x"),
                       ("metrics.json", "{}"), ("report.txt", "x"), ("predictions.csv", "x"),
                       ("log.txt", "x"), ("unnamed.csv", "x")):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)

    def unsent(app):
        req = request_from_nodes("job", {"application": {"framework": "pytorch", **app}},
                                 "fe", {"scheduler": "local"}, "TOSCA node job", None)
        return unsent_names(req, application_files(req, base=str(tmp_path)),
                            base=str(tmp_path))

    args = ["--config", "settings.json", "--vocab=words.txt", "--epochs", "3"]
    assert unsent({"script": "train.py", "arguments": args}) == [
        "checkpoints/best.pt", "extra.yaml", "log.txt", "series.csv", "settings.json",
        "words.txt"]
    # the settings sent, what they name not: still named (and the log the script appends
    # to and reads, 'a+')
    assert unsent({"script": "train.py", "arguments": args,
                   "files": ["settings.json", "extra.yaml", "checkpoints"]}) == [
        "log.txt", "series.csv", "words.txt"]
    assert unsent({"script": "train.py"}) == ["checkpoints/best.pt", "log.txt"]
    # a settings file past MODAK's reading limits (an alias bomb) is named, not read
    bomb = "a: &a [words.txt, words.txt]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n"
        for i in range(20))
    (tmp_path / "bomb.yaml").write_text(bomb)
    assert unsent({"script": "train.py", "arguments": ["--config", "bomb.yaml"]}) == [
        "bomb.yaml", "checkpoints/best.pt", "log.txt"]


def test_sigterm_reaches_the_script_even_as_pid_1(tmp_path):
    """In a container the runtime is PID 1, which the kernel shields from signals it has no
    handler for; a wall-time SIGTERM must still end the training, with its record."""
    import shutil
    import signal
    import time
    if not shutil.which("unshare") or os.geteuid() != 0:
        pytest.skip("needs root and unshare (util-linux) for a PID namespace")
    script = tmp_path / "forever.py"
    script.write_text("import time\nwhile True:\n    time.sleep(0.1)\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child", sys.executable,
                             "-m", "modak_runtime", "--", str(script)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(3)
    children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True)
    (pid_1,) = children.stdout.split()  # the runtime: PID 1 of its namespace
    os.kill(int(pid_1), signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    (record,) = parse_fom_lines(out)
    assert record["status"] == "failed" and "SIGTERM" in record["error"]["message"]
    assert proc.returncode == 128 + signal.SIGTERM
