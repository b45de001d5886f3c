"""PyTorch: apply the plan's knobs to the modules a script trains, time its optimizer steps.

Nothing here changes the script's text.  When the script imports torch, the runtime:

* sets the intra-/inter-op threads and oneDNN as asked;
* wraps ``torch.optim.Optimizer.__init__``: the first optimizer created names the trained
  parameters, hence the trained module(s) (the outermost modules whose parameters it owns);
  on them it applies bf16 autocast (``forward`` under ``torch.autocast``), channels-last,
  and, after the first step, ``torch.compile`` in place (the script's own reference to its
  model then runs compiled);
* a new optimizer over other parameters, made after the first model stepped and stepping
  without it, is the next model's (a sweep, folds): the same knobs are applied to its
  modules, and its steps are the run's from then on (``_Torch.next_model``);
* times each step of that optimizer with the global step post-hook, and reads the loss
  (the scalar ``torch.autograd.backward`` is called on); when the parameters are on a CUDA
  GPU, a step ends when the GPU finishes it (a CUDA event recorded at each step's end,
  read once at the end of the run: the script's own overlap of CPU and GPU is kept);
* counts the first step's FLOPs with a dispatch mode (forward and backward), and the share
  of the forward FLOPs by the kind of module they ran in: the workload's fingerprint.

Scripts that use HF Accelerate or Lightning get those libraries' own settings
(``ACCELERATE_MIXED_PRECISION``, ``ACCELERATE_DYNAMO_*``, ``PL_TRAINER_PRECISION``) instead.
"""
from __future__ import annotations

import gc
import hashlib
import inspect
import json
import math
import os
import sys
import warnings
import weakref
from collections import defaultdict
from typing import Any, Optional

from .epochs import Epochs
from .hooks import when_imported
from .session import Session

CONVENTIONS = {"accelerate": "accelerate", "lightning": "lightning",
               "pytorch_lightning": "lightning"}
MATMUL_OPS = {"mm", "addmm", "bmm", "baddbmm", "convolution", "_convolution"}
# a new optimizer over other parameters, made once the first model stepped, is the next
# model's (a sweep, a fold) once it has stepped so often with none of the current one's
# between (a GAN's second optimizer steps between the first one's steps)
NEXT_MODEL_STEPS = 2
LATER_MODELS_KEPT = 8  # the later models the record describes one by one (it counts all)


def install(session: Session) -> None:
    set_convention_environment(session)
    when_imported("torch", lambda torch: _Torch(session, torch))


def set_convention_environment(session: Session) -> None:
    """Launcher libraries' own variables (only read by them; the user's values win)."""
    cfg = session.config
    env = {}
    if cfg.precision in ("bf16", "fp16"):
        env["ACCELERATE_MIXED_PRECISION"] = cfg.precision
        env["PL_TRAINER_PRECISION"] = f"{cfg.precision}-mixed"
    if cfg.compiler.startswith("torch.compile"):
        env["ACCELERATE_DYNAMO_BACKEND"] = "inductor"
        env["ACCELERATE_DYNAMO_MODE"] = _compile_mode(cfg)
    if cfg.threads:
        env["OMP_NUM_THREADS"] = str(cfg.threads)  # Accelerate sets 1 when it is unset
    for key, value in env.items():
        os.environ.setdefault(key, value)


def module_kind(module: Any) -> Optional[str]:
    name = type(module).__name__
    if name.startswith(("Conv", "LazyConv")):
        return "conv"
    if "Attention" in name:
        return "attention"
    if name in ("RNN", "LSTM", "GRU", "RNNCell", "LSTMCell", "GRUCell"):
        return "recurrent"
    if "Norm" in name:
        return "norm"
    if name in ("Linear", "LazyLinear", "Bilinear", "NonDynamicallyQuantizableLinear"):
        return "linear"
    return None


def _is_module(obj: Any, cls: type) -> bool:
    try:
        return isinstance(obj, cls)
    except Exception:  # proxies that fail on __class__
        return False


class _Torch:
    def __init__(self, session: Session, torch):
        self.s, self.torch = session, torch
        session.framework = "pytorch"
        session.framework_version = torch.__version__
        cfg = session.config
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
            session.applied_knob("threads", f"torch.set_num_threads({cfg.threads})")
        interop = os.environ.get("MODAK_INTEROP_THREADS", "").strip()
        if interop.isdigit() and int(interop) > 0:
            try:
                torch.set_num_interop_threads(int(interop))
            except RuntimeError as exc:  # too late: inter-op work already started
                session.refuse("interop_threads", str(exc)[:200])
        if not cfg.onednn:
            torch.backends.mkldnn.enabled = False
            session.applied_knob("onednn", "torch.backends.mkldnn.enabled = False")
        if cfg.compiler == "xla":
            session.refuse("compiler", "XLA is not a PyTorch compiler")
        self.primary = None
        self.primary_params: set[int] = set()  # ids of the parameters it optimizes
        self.successor = None  # a later optimizer over other parameters, perhaps the next model's
        self.successor_steps = 0  # its steps since the current model's last one
        self.pending_loss = None
        self.step_loss = None  # the pending loss when the primary optimizer last stepped
        self.counter = None
        self._roots: list = []  # weak references: see roots
        self.events: Optional[list] = None  # CUDA events, one per step end, on a GPU
        self.compile_mode: Optional[str] = None
        # how the script compiled its trained module(s) itself (:func:`_script_compiled`,
        # seen at the first step; "" where it did not)
        self.script_compile: Optional[str] = None
        self.convention: Optional[str] = None
        # the dtype of an autocast the script itself opened around its trained module's
        # call (seen at the first call of the counted step; "" when it opened none)
        self.own_autocast: Optional[str] = None
        # the epoch's length (Session.steps_per_epoch), from the passes over data loaders
        self.epochs = Epochs(session, "data loader", len)
        self._patch()
        session.finishers.append(self.finish)

    # -- patches ------------------------------------------------------------------
    def _patch(self) -> None:
        torch, me = self.torch, self
        optim_module = sys.modules["torch.optim.optimizer"]  # torch.optim deletes the attribute
        original_init = torch.optim.Optimizer.__init__

        def init(opt, *args, **kwargs):
            original_init(opt, *args, **kwargs)
            ids = _param_ids(opt)
            if me.primary is None:
                me.primary, me.primary_params = opt, ids
                me.optimizer_created(opt)
            elif me.primary_params & ids:
                # a new optimizer over the trained parameters (a script that makes one each
                # epoch, or after a learning-rate range test) takes over the step count;
                # one over others (a GAN's second) does not
                me.primary, me.primary_params = opt, ids
            elif me.s.step_ends:  # made once the model trained: perhaps the next model's
                me.successor, me.successor_steps = opt, 0

        init.__wrapped__ = original_init
        torch.optim.Optimizer.__init__ = init
        optim_module.register_optimizer_step_post_hook(
            lambda opt, args, kwargs: me.after_step(opt))
        original_backward = torch.autograd.backward

        def backward(tensors, *args, **kwargs):
            if isinstance(tensors, torch.Tensor) and tensors.numel() == 1:
                me.pending_loss = me.s.backward_loss = tensors.detach()
            counter = me.counter
            if counter is None:
                return original_backward(tensors, *args, **kwargs)
            counter.in_backward, counter.reached = True, False
            try:
                return original_backward(tensors, *args, **kwargs)
            finally:
                counter.in_backward = False
                counter.backwards += counter.reached

        backward.__wrapped__ = original_backward
        torch.autograd.backward = backward
        # (the loaders' iterators: a private class, which ``watch`` does without)
        self.epochs.watch(torch.utils.data.DataLoader,
                          getattr(sys.modules.get("torch.utils.data.dataloader"),
                                  "_BaseDataLoaderIter", None))

    # -- the trained modules --------------------------------------------------------
    @property
    def roots(self) -> list:
        """The trained modules still alive.  Held weakly: a module lives as long as the
        script keeps it, and its memory (a data-parallel wrapper's buckets and process
        group too) goes when the script lets it go, not at the interpreter's end."""
        return [m for m in (ref() for ref in self._roots) if m is not None]

    @roots.setter
    def roots(self, modules: list) -> None:
        self._roots = [weakref.ref(m) for m in modules]

    def trained_modules(self, params: list) -> list:
        nn = self.torch.nn
        ids = {id(p) for p in params}
        owners = []
        with warnings.catch_warnings():  # isinstance on deprecated lazy objects warns
            warnings.simplefilter("ignore")
            modules = [o for o in gc.get_objects() if _is_module(o, nn.Module)]
        for obj in modules:
            own = [id(p) for p in obj.parameters()]
            if own and all(i in ids for i in own):
                owners.append(obj)
        inner = {id(sub) for m in owners for sub in m.modules() if sub is not m}
        return [m for m in owners if id(m) not in inner]

    def optimizer_created(self, opt) -> None:
        s, torch, cfg = self.s, self.torch, self.s.config
        s.training_started()
        params = _trained_params(opt)
        if not params:
            return
        fp = s.fingerprint
        fp.trainable_parameters = _size(params)
        fp.dtype = str(params[0].dtype).replace("torch.", "")
        device = params[0].device.type
        s.effect["device"] = device
        if device == "cuda":
            self.events = []
            try:
                s.effect["accelerator"] = torch.cuda.get_device_name(params[0].device)
            except Exception:  # the name is a fact for the record, not a need
                pass
        self.convention = next((CONVENTIONS[m] for m in CONVENTIONS if m in sys.modules), None)
        self.roots = self.trained_modules(params)
        names = ", ".join(sorted({_module_name(m) for m in self.roots})) or "none"
        s.effect["trained_modules"] = names
        if self.convention:
            s.effect["convention"] = self.convention
            self._by_convention()
        elif not self.roots:
            for knob in ("precision", "compiler", "channels_last"):
                if self._asked(knob):
                    s.refuse(knob, "no module owns the optimizer's parameters")
        else:
            if cfg.channels_last:
                self._channels_last()
            if cfg.precision != "fp32":
                self._autocast(device)
            if cfg.compiler.startswith("torch.compile"):
                self.compile_mode = _compile_mode(cfg)
        if not (self.convention and cfg.compiler != "off"):
            self.counter = _FlopCounter(self, torch)
            self.counter.start(params)

    def _asked(self, knob: str) -> bool:
        cfg = self.s.config
        return {"precision": cfg.precision != "fp32", "compiler": cfg.compiler != "off",
                "channels_last": cfg.channels_last}[knob]

    def _by_convention(self) -> None:
        s, cfg, conv = self.s, self.s.config, self.convention
        if cfg.precision != "fp32":
            var = "ACCELERATE_MIXED_PRECISION" if conv == "accelerate" else "PL_TRAINER_PRECISION"
            s.applied_knob("precision", f"{var}={os.environ.get(var)} ({conv})")
        if cfg.compiler.startswith("torch.compile"):
            if conv == "accelerate":
                s.applied_knob("compiler", "ACCELERATE_DYNAMO_BACKEND=inductor, "
                               f"ACCELERATE_DYNAMO_MODE={os.environ.get('ACCELERATE_DYNAMO_MODE')}")
            else:
                s.refuse("compiler", "Lightning has no setting for torch.compile by environment; "
                         "the runtime does not patch a Lightning script")
        if cfg.channels_last:
            s.refuse("channels_last", f"not applied to a {conv} script")

    def _channels_last(self, roots: Optional[list] = None, quiet: bool = False) -> bool:
        """Channels-last on ``roots`` (the trained modules); ``quiet``: a later model's,
        the knob already reported.  Whether it applied (a 2-D convolution to take it)."""
        torch, roots = self.torch, self.roots if roots is None else roots
        convs = [m for r in roots for m in r.modules()
                 if isinstance(m, (torch.nn.Conv2d,))]
        if not convs:
            self.s.refuse("channels_last", "the trained module has no 2-D convolution")
            return False
        for root in roots:
            root.to(memory_format=torch.channels_last)
            self._wrap_forward(root, lambda args: tuple(
                a.contiguous(memory_format=torch.channels_last)
                if isinstance(a, torch.Tensor) and a.dim() == 4 else a for a in args), None)
        if not quiet:
            self.s.applied_knob("channels_last", "module and 4-D inputs in channels_last")
        return True

    def _autocast(self, device: str, roots: Optional[list] = None, quiet: bool = False) -> None:
        torch, s, prec = self.torch, self.s, self.s.config.precision
        if prec == "fp16":
            s.refuse("precision", "fp16 needs a gradient scaler, which the script does not have")
            return
        for root in self.roots if roots is None else roots:
            self._wrap_forward(root, None, (device, torch.bfloat16))
        if not quiet:
            s.applied_knob("precision", f"forward of {s.effect['trained_modules']} under "
                           f"torch.autocast({device!r}, bfloat16), its outputs in float32")

    def _wrap_forward(self, module, convert, autocast) -> None:
        torch = self.torch
        bound = module.forward
        # (the module's own forward, its module held weakly: the wrapper lives in the
        # module's __dict__, and a bound method there would keep it alive to the
        # interpreter's end.  Its function and a weak reference, not a WeakMethod, whose
        # call Dynamo does not trace (``super().__call__()``): it broke the graph of every
        # model compiled with bf16 at this wrapper, its forward a graph of its own)
        if inspect.ismethod(bound) and bound.__self__ is module:
            func, ref = bound.__func__, weakref.ref(module)

            def inner(*args, **kwargs):
                return func(ref(), *args, **kwargs)
        else:
            inner = bound

        def forward(*args, **kwargs):
            if convert is not None:
                args = convert(args)
            if autocast is None or self.own_autocast:  # (the script's own autocast stands)
                return inner(*args, **kwargs)
            with torch.autocast(autocast[0], dtype=autocast[1]):
                out = inner(*args, **kwargs)
            return _to_float32(out, torch)

        module.forward = forward

    # -- steps ------------------------------------------------------------------------
    def after_step(self, opt) -> None:
        if opt is self.primary:
            self.successor_steps = 0
        elif opt is self.successor:
            self.successor_steps += 1
            if self.successor_steps < NEXT_MODEL_STEPS:
                return
            self.next_model(opt)  # this step is the next model's first one timed
        else:
            return
        s = self.s
        self.epochs.at_step()
        self.step_loss = self.pending_loss  # (the trained model's, not a later critic's)
        if self.pending_loss is not None and s.loss_due():
            s.loss(float(self.pending_loss))
        if self.counter is not None:
            self.counter.stop()
            self.counter = None
        if self.script_compile is None and opt is self.primary:
            # how the script compiled its trained module itself, seen once it has stepped
            # (it may wrap the module in torch.compile after making its optimizer)
            self.script_compile = _script_compiled(self.roots) or ""
            if self.script_compile:
                s.effect["script_compile"] = self.script_compile
        if self.compile_mode is not None and self.script_compile:
            self.compile_mode = None
            s.refuse("compiler", f"the script compiles {s.effect.get('trained_modules')} "
                     f"itself ({self.script_compile}), which stands: MODAK's "
                     "torch.compile is not put over it")
        if self.compile_mode is not None:
            mode, self.compile_mode = self.compile_mode, None
            # a data-parallel wrapper's own forward (its gradient buckets, its logger) is
            # not Dynamo's to trace: the module it wraps is compiled
            targets = [_wrapped(root) for root in self.roots]
            for target in targets:
                self._compile(target, None if mode == "default" else mode)
            what = ", ".join(sorted({f"{type(t).__name__} inside {type(r).__name__}"
                                     if t is not r else type(r).__name__
                                     for r, t in zip(self.roots, targets)}))
            if "compiler" not in s.applied:  # (a later model's compilation: the first one's)
                s.applied_knob("compiler", f"torch.compile(mode={mode!r}) of {what} in "
                               "place, after the first step")
        if self.events is not None:
            if not self.events:  # the first step's end on the GPU anchors the clock
                self.torch.cuda.synchronize()
            event = self.torch.cuda.Event(enable_timing=True)
            event.record()
            self.events.append(event)
        s.step_done()

    def next_model(self, opt) -> None:
        """The script trains another model after the first one (a sweep over learning rates,
        cross-validation's folds): its steps are the run's steps from now on (the trial caps
        count them), the knobs applied to the first model are applied to it, and its steady
        steps are timed with the first one's where it is of the first one's size (the
        fingerprint is the first one's)."""
        s = self.s
        params = _trained_params(opt)
        size = _size(params)
        self.primary, self.primary_params = opt, _param_ids(opt)
        self.successor, self.successor_steps = None, 0
        same = size == s.fingerprint.trainable_parameters
        s.next_model(same)
        roots = self.trained_modules(params) if params else []
        knobs = []
        if roots and not self.convention:
            self.roots = roots
            if "channels_last" in s.applied and self._channels_last(roots, quiet=True):
                knobs.append("channels_last")
            if "precision" in s.applied:
                self._autocast(params[0].device.type, roots, quiet=True)
                knobs.append("precision")
            if "compiler" in s.applied:
                self.compile_mode = _compile_mode(s.config)
                knobs.append("compiler")
        later = s.effect.setdefault("later_models", [])
        if len(later) < LATER_MODELS_KEPT:
            later.append({"trained_modules": ", ".join(sorted({type(m).__name__ for m in roots}))
                          or "none", "trainable_parameters": size,
                          "first_step": len(s.step_ends) + 1, "timed": same, "knobs": knobs})

    def _gpu_clock(self) -> None:
        """The step ends as the GPU reached them: the first step's (synchronised) end plus
        the time between its event and each later one."""
        s, events = self.s, self.events
        if not events or len(events) != len(s.step_ends):
            return
        try:
            self.torch.cuda.synchronize()
            first = s.step_ends[0]
            s.step_ends = [first + events[0].elapsed_time(e) / 1000.0 for e in events]
            s.effect["step_clock"] = "cuda events"
        except Exception as exc:  # a GPU in error: the host clock stands, and says so
            s.effect["step_clock"] = f"host (cuda events unreadable: {str(exc)[:120]})"

    def _compile(self, root, mode: Optional[str]) -> None:
        """``Module.compile`` in place, but traced from a wrapper frame as ``torch.compile(m)``
        does: dynamo skips frames of torch.nn itself, so ``Module.compile`` on a plain
        ``nn.Sequential`` would compile nothing."""
        torch = self.torch
        try:
            from torch._dynamo.external_utils import wrap_inline
        except ImportError:  # an older or newer torch: the public method
            root.compile(mode=mode)
            return
        root._compiled_call_impl = torch.compile(wrap_inline(root._call_impl), mode=mode)

    def finish(self) -> None:
        s, torch = self.s, self.torch
        self._gpu_clock()
        if self.counter is not None:
            self.counter.stop()
            self.counter = None
        last = self.step_loss if self.step_loss is not None else self.pending_loss
        if last is not None:
            s.last_loss = float(last)
        self.epochs.finish(s.fingerprint.micro_batches or 1)
        s.effect["threads"] = torch.get_num_threads()
        s.effect["interop_threads"] = torch.get_num_interop_threads()
        s.effect["onednn"] = bool(torch.backends.mkldnn.enabled)
        cfg = s.config
        if "threads" in s.applied and s.effect["threads"] != cfg.threads:
            # the script set its own count after MODAK's (torch.set_num_threads): the
            # knob measured nothing of its own
            s.withdraw("threads", f"the script sets {s.effect['threads']} thread(s) itself "
                       f"(torch.set_num_threads), over MODAK's {cfg.threads}")
        if "onednn" in s.applied and s.effect["onednn"]:
            s.withdraw("onednn", "the script enables oneDNN itself "
                       "(torch.backends.mkldnn.enabled)")
        if s.config.compiler.startswith("torch.compile") and "compiler" in s.applied:
            graphs = _dynamo_graphs()
            s.effect["compiled"] = graphs > 0
            s.effect["compiled_graphs"] = graphs
            skipped = dynamo_skipped()
            if s.stopped_by == "time" and len(s.step_ends) < 2:
                # stopped at its time cap while it compiled: nothing to judge it by
                s.effect["compiled"] = None
            elif graphs == 0 and s.status != "failed":  # a failed compile stays applied
                s.withdraw("compiler", f"torch.compile traced no graph of it: {skipped}"
                           if skipped else
                           "compiled, but the module never ran after the first step")
            elif skipped:  # some of it compiled, the rest ran eagerly
                s.effect["compile_skipped"] = skipped
        elif self.script_compile:  # (what the script compiled itself: in a stock run too)
            graphs = _dynamo_graphs()
            s.effect["compiled"] = graphs > 0 if graphs >= 0 else None
            s.effect["compiled_graphs"] = graphs
        else:
            s.effect.setdefault("compiled", False)


def _dynamo_graphs() -> int:
    """The graphs Dynamo has compiled in this process (-1: unknown)."""
    try:
        from torch._dynamo.utils import counters
        return int(counters["stats"]["unique_graphs"])
    except Exception:
        return -1


def _module_name(module: Any) -> str:
    """A trained module's class name; of the module inside a ``torch.compile`` wrapper
    (``OptimizedModule``), the one the script wrote."""
    inner = _compiled_inner(module)
    return type(module if inner is None else inner).__name__


def _compiled_inner(module: Any) -> Any:
    """The module a ``torch.compile`` wrapper (``OptimizedModule``) compiles, or None."""
    if type(module).__name__ == "OptimizedModule":
        return getattr(module, "_orig_mod", None)
    return None


def _script_compiled(roots: list) -> Optional[str]:
    """How the script compiled its trained modules ``roots`` itself before MODAK could:
    ``torch.compile`` (a wrapper, ``OptimizedModule``, made before or after its optimizer,
    around a trained module or a data-parallel wrapper of one) or ``Module.compile`` (in
    place); None where it did not.  Before, such a script's stock run said ``compiled:
    false``, and MODAK's compiler knob compiled the wrapper a second time."""
    if not roots:
        return None
    if any(_compiled_inner(m) is not None for m in roots):
        return "torch.compile"
    if any(getattr(_wrapped(m), "_compiled_call_impl", None) is not None for m in roots):
        return "Module.compile"
    if "torch._dynamo.eval_frame" not in sys.modules:  # (no torch.compile in this process)
        return None
    ids = {id(m) for m in roots} | {id(_wrapped(m)) for m in roots}
    with warnings.catch_warnings():  # (isinstance on deprecated lazy objects warns)
        warnings.simplefilter("ignore")
        for obj in gc.get_objects():
            if type(obj).__name__ != "OptimizedModule":
                continue
            inner = getattr(obj, "_orig_mod", None)
            if inner is not None and (id(inner) in ids or id(_wrapped(inner)) in ids):
                return "torch.compile"
    return None


def dynamo_skipped() -> Optional[str]:
    """What ``torch.compile`` left eager, in Dynamo's own words (None: nothing).  Dynamo
    gives up on a frame it cannot trace and runs the whole frame eagerly (a forward that
    calls ``nn.GRU``, ``nn.LSTM`` or ``nn.RNN``, which it does not trace unless told to,
    compiles nothing), or breaks the graph there and runs that part eagerly."""
    try:
        from torch._dynamo.utils import counters
        found = [(how, str(k)) for key, how in (("unimplemented", "skipped a frame"),
                                                ("graph_break", "ran a part eagerly"))
                 for k in counters.get(key, {})]
    except Exception:
        found = []
    if not found:
        return None
    how, first = found[0]
    lines = [line.strip() for line in first.splitlines() if line.strip()]
    why = next((line.partition(":")[2].strip() for line in lines[1:]
                if line.startswith("Explanation:")), "")
    text = f"Dynamo {how} ({lines[0]}{': ' + why if why else ''})"
    return text if len(text) <= 240 else text[:237] + "..."


class _FlopCounter:
    """Counts one step's FLOPs (torch's own formulas) and where the forward ones ran."""

    def __init__(self, owner: _Torch, torch):
        from torch.overrides import TorchFunctionMode
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils.flop_counter import flop_registry

        self.owner, self.torch = owner, torch
        self.registry = dict(flop_registry)
        self.total = 0.0
        self.elements = 0.0  # tensor elements the step's operations wrote (no views, no casts)
        self.ops = 0  # the operations the step dispatched (no views, no casts): each pays
        #               the framework's per-operation overhead in eager mode
        self.recurrent_steps = 0  # time steps its recurrent layers ran in sequence (forward)
        # the calls from Python (a torch function, a tensor's method, ``backward``) that
        # dispatched one or more of those operations: a layer that runs its time steps in
        # the library's own loop (``nn.GRU`` on a CPU), or an autograd engine running the
        # backward, dispatches many operations for one call; a Python loop one or two each
        self.python_ops = 0
        self.module_calls = 0  # calls of any module: a container's and those it calls alike
        # backward passes that reached the optimizer's parameters, and calls of the trained
        # modules: several of each where the script accumulates gradients over micro-batches
        # (a batch's several losses, each its backward pass, or a Siamese network's several
        # calls, are one micro-batch; so is a GAN's generator called again for its
        # discriminator's step, whose backward pass does not reach it)
        self.backwards = 0
        self.calls = 0
        self.reached = False
        self.forward: dict[str, float] = defaultdict(float)
        self.grouped = 0.0  # forward FLOPs of grouped (depthwise) convolutions
        self.stack: list[str] = []
        self.in_backward = False
        self.matmul_dtypes: dict[str, int] = defaultdict(int)
        self.handles: list = []
        self.active = False
        counter = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                out = func(*args, **kwargs)
                try:
                    counter.count(func, args, kwargs, out)
                except Exception:  # a formula that does not fit: count nothing for it
                    pass
                return out

        class Calls(TorchFunctionMode):
            # (a mode is off inside its own handler: the calls a function makes in turn are
            # not counted again)
            def __torch_function__(self, func, types, args=(), kwargs=None):
                before = counter.ops
                out = func(*args, **(kwargs or {}))
                if counter.ops != before:
                    counter.python_ops += 1
                return out

        self.mode = Mode()
        self.calls_mode = Calls()

    def start(self, params: list) -> None:
        hooks = self.torch.nn.modules.module
        roots = {id(m) for m in self.owner.roots}
        fp = self.owner.s.fingerprint
        device = self.owner.s.effect.get("device", "cpu")

        def pre(module, args):
            kind = module_kind(module)
            self.module_calls += 1
            self.stack.append(kind or "")
            if kind == "recurrent":
                try:
                    self.recurrent_steps += _sequence_steps(module, args)
                except Exception:  # (a module of the script's own making: counted as none)
                    pass
            if id(module) in roots:
                self.calls += 1
                if self.owner.own_autocast is None:
                    self.owner.own_autocast = _autocast_dtype(self.torch, device) or ""
                first = (None if fp.batch_size is not None
                         else _first_tensor(args, self.torch.Tensor))
                if first is not None:
                    fp.batch_size = int(first.shape[0])
                    fp.input_shape = [int(d) for d in first.shape[1:]]

        def post(module, args, output):
            if self.stack:
                self.stack.pop()

        def reached(grad):
            self.reached = True

        def on_gradient(param):
            try:
                return param.register_hook(reached)
            except Exception:  # (a parameter of a kind that takes no hook: not counted)
                return None

        self.handles = [hooks.register_module_forward_pre_hook(pre),
                        hooks.register_module_forward_hook(post),
                        *(h for h in map(on_gradient, params) if h is not None)]
        self.calls_mode.__enter__()
        self.mode.__enter__()
        self.active = True

    def count(self, func, args, kwargs, out) -> None:
        packet = func.overloadpacket
        if not getattr(func, "is_view", False) and packet.__name__ != "_to_copy":
            # (a view writes nothing; a cast is the configuration's, not the workload's)
            self.elements += _written(out, self.torch.Tensor)
            self.ops += 1
        name = packet.__name__
        formula = self.registry.get(packet)
        strided = self.torch.strided
        if any(isinstance(a, self.torch.Tensor) and a.layout != strided for a in args):
            # a sparse operand (a graph's adjacency): the dense formulas would count its
            # zeros, a 20000-node graph's as 200 GFLOP a product
            flops = _sparse_product_flops(name, args, strided)
        elif name == "convolution_backward" and len(args) > 10 and args[9] != 1:
            flops = _grouped_conv_backward(args)
        elif formula is not None:
            flops = float(formula(*args, **kwargs, out_val=out))
        elif name.startswith("_scaled_dot_product_flash_attention_for_cpu"):
            q, k = args[0], args[1]  # (batch, heads, L, E), (batch, heads, S, E)
            flops = 4.0 * q.shape[0] * q.shape[1] * q.shape[2] * k.shape[2] * q.shape[3]
            if name.endswith("backward"):
                q, k = args[1], args[2]
                flops = 8.0 * q.shape[0] * q.shape[1] * q.shape[2] * k.shape[2] * q.shape[3]
        elif name in ("mkldnn_rnn_layer", "mkldnn_rnn_layer_backward"):
            # oneDNN's fused recurrent layer (an LSTM on the CPU), which torch's formulas
            # lack: the gates' products with the input and hidden weights at every time
            # step, (time x batch) rows of them; twice that backward (inputs and weights)
            x, w_ih, w_hh = args[0], args[1], args[2]
            flops = 2.0 * x.shape[0] * x.shape[1] * (w_ih.numel() + w_hh.numel())
            if name.endswith("backward"):
                flops *= 2
        elif name in ("_cudnn_rnn", "_cudnn_rnn_backward"):
            # cuDNN's fused recurrent network (an LSTM or GRU on an NVIDIA GPU), all its
            # layers in one call: the same count as oneDNN's, every layer's weight matrices
            # (``args[1]``, biases aside) times the (time x batch) rows of the input
            x, weights = args[0], args[1]
            rows = x.numel() // x.shape[-1] if x.dim() else 0
            flops = 2.0 * rows * sum(w.numel() for w in weights if w.dim() == 2)
            if name.endswith("backward"):
                flops *= 2
        elif self.stack and self.stack[-1] == "norm":
            first = out[0] if isinstance(out, (tuple, list)) and out else out
            if not isinstance(first, self.torch.Tensor):
                return
            flops = 4.0 * first.numel()  # normalisation: about 4 FLOPs per element
        else:
            return
        if not flops:
            return
        self.total += flops
        if name in MATMUL_OPS and args and isinstance(args[0], self.torch.Tensor):
            tensor = args[1] if name == "addmm" else args[0]
            self.matmul_dtypes[str(tensor.dtype).replace("torch.", "")] += 1
        if self.in_backward:
            return
        if name in ("convolution", "_convolution") and len(args) > 8 and args[8] != 1:
            self.grouped += flops  # (aten.convolution's ninth argument: its groups)
        kind = next((k for k in reversed(self.stack) if k), None)
        if kind is None:
            kind = ("conv" if "conv" in name else "attention" if "attention" in name
                    else "linear" if name in MATMUL_OPS else "other")
        self.forward[kind] += flops

    def stop(self) -> None:
        if not self.active:
            return
        self.active = False
        self.mode.__exit__(None, None, None)
        self.calls_mode.__exit__(None, None, None)
        for h in self.handles:
            h.remove()
        # Dynamo marks a frame it met under a dispatch mode (the count's) as skipped, for
        # good: a script that compiled its own model (torch.compile) would train
        # uncompiled, with no word of it.  Its caches are dropped, so that the next step
        # compiles as the script asked (what it had compiled before is compiled again)
        dynamo = sys.modules.get("torch._dynamo")
        if dynamo is not None:
            dynamo.reset()
        s = self.owner.s
        fp = s.fingerprint
        fwd = sum(self.forward.values())
        from .record import FLOP_KINDS
        fp.flops_per_step = self.total
        fp.elements_per_step = self.elements or None
        fp.ops_per_step = self.ops or None
        fp.recurrent_steps = self.recurrent_steps
        fp.python_ops_per_step = self.python_ops or None
        fp.module_calls_per_step = self.module_calls or None
        fp.micro_batches = min(self.backwards, self.calls) or None
        fp.flop_share = {k: (self.forward.get(k, 0.0) / fwd if fwd else 0.0) for k in FLOP_KINDS}
        fp.grouped_share = self.grouped / fwd if fwd else 0.0
        fp.method = "torch dispatch: torch.utils.flop_counter formulas, one step"
        if self.matmul_dtypes:
            s.effect["matmul_dtype"] = max(self.matmul_dtypes, key=self.matmul_dtypes.get)
        own = self.owner.own_autocast
        if own:
            s.effect["script_autocast"] = own
            if "precision" in s.applied and not self.owner.convention:
                s.withdraw("precision", f"the script calls {s.effect.get('trained_modules')} "
                           f"under its own torch.autocast(dtype={own}), which stands: MODAK's "
                           "autocast is not put over it")
        fp.id = fingerprint_id("pytorch", fp)


def _trained_params(opt: Any) -> list:
    """The parameters an optimizer trains (those that take a gradient)."""
    return [p for g in opt.param_groups for p in g["params"] if p.requires_grad]


def _size(params: list) -> int:
    return int(sum(p.numel() for p in params))


def _compile_mode(cfg: Any) -> str:
    """``torch.compile``'s mode of the plan's compiler (``torch.compile:MODE``)."""
    return cfg.compiler.partition(":")[2] or "default"


def _param_ids(opt: Any) -> set[int]:
    return {id(p) for group in opt.param_groups for p in group["params"]}


DATA_PARALLEL = ("DistributedDataParallel", "DataParallel")


def _wrapped(module: Any) -> Any:
    """The module a data-parallel wrapper (``DistributedDataParallel``, ``DataParallel``)
    trains, however deep; the module itself when it is none."""
    while type(module).__name__ in DATA_PARALLEL and hasattr(module, "module"):
        module = module.module
    return module


def _autocast_dtype(torch, device: str) -> Optional[str]:
    """The dtype of the autocast in force for ``device`` here (None: none is)."""
    try:
        if not torch.is_autocast_enabled(device):
            return None
        return str(torch.get_autocast_dtype(device)).replace("torch.", "")
    except (TypeError, AttributeError, RuntimeError):  # a torch before 2.4
        if device == "cpu":
            on, dtype = torch.is_autocast_cpu_enabled, torch.get_autocast_cpu_dtype
        else:
            on, dtype = torch.is_autocast_enabled, torch.get_autocast_gpu_dtype
        return str(dtype()).replace("torch.", "") if on() else None


def _sequence_steps(module: Any, args) -> int:
    """The time steps a call of a whole recurrent layer stack (``nn.RNN``, ``nn.LSTM``,
    ``nn.GRU``) runs in sequence: its input's sequence length times its layers (0 for a
    cell, ``nn.LSTMCell`` and the like: one time step a call, whose operations the count of
    dispatched operations already has)."""
    layers = getattr(module, "num_layers", None)
    if not isinstance(layers, int) or not args:
        return 0
    x = args[0]
    sizes = getattr(x, "batch_sizes", None)  # a PackedSequence: a batch size per time step
    if sizes is not None:
        return int(sizes.numel()) * layers
    shape = getattr(x, "shape", None)
    if shape is None or len(shape) not in (2, 3):
        return 0
    batch_first = len(shape) == 3 and bool(getattr(module, "batch_first", False))
    return int(shape[1] if batch_first else shape[0]) * layers


def _grouped_conv_backward(args) -> float:
    """FLOPs of ``aten.convolution_backward`` for a grouped convolution (its tenth argument,
    ``groups``, not 1): each gradient it computes (``output_mask``: input, weight) costs the
    forward's FLOPs, 2 x batch x the positions the kernel visits x the weight's elements.
    torch's formula leaves the groups out of the weight's gradient and counts it as if every
    input channel met every output channel: a depthwise 7x7 convolution's backward came to
    49x its forward, not 2x."""
    grad_out, inp, weight, transposed, mask = args[0], args[1], args[2], args[7], args[10]
    visited = inp.shape[2:] if transposed else grad_out.shape[2:]
    forward = 2.0 * inp.shape[0] * math.prod(visited) * weight.numel()
    return forward * sum(1 for m in mask[:2] if m)


def _written(out, tensor_type) -> int:
    """Elements of the tensors an operation returned (a sparse one's stored values)."""
    if isinstance(out, tensor_type):
        return out.numel() if not out.is_sparse and not _compressed(out) else _nnz(out)
    if isinstance(out, (tuple, list)):
        return sum(_written(o, tensor_type) for o in out if isinstance(o, tensor_type))
    return 0


def _compressed(t) -> bool:
    """A sparse tensor of a compressed layout (CSR, CSC, BSR, BSC)."""
    return str(t.layout).startswith(("torch.sparse_cs", "torch.sparse_bs"))


def _nnz(t) -> int:
    try:
        return int(t._nnz())
    except (RuntimeError, AttributeError):  # (a layout without stored values)
        return 0


# matrix products with a sparse operand, and where their two factors are in the arguments
SPARSE_PRODUCTS = {"mm": (0, 1), "_sparse_mm": (0, 1), "addmm": (1, 2),
                   "_sparse_addmm": (1, 2), "sspaddmm": (1, 2), "hspmm": (0, 1),
                   "smm": (0, 1)}


def _sparse_product_flops(name, args, strided) -> float:
    """FLOPs of an operation with a sparse operand: a matrix product's, two per stored value
    of the sparse factor and column of the dense one (or row, where the sparse factor is on
    the right; the dense count where only the term a product adds is sparse); none for any
    other operation (a sparse tensor's own bookkeeping)."""
    where = SPARSE_PRODUCTS.get(name)
    if where is None or len(args) <= max(where):
        return 0.0
    a, b = args[where[0]], args[where[1]]
    if not (hasattr(a, "layout") and hasattr(b, "layout")) or a.dim() != 2 or b.dim() != 2:
        return 0.0
    if a.layout != strided and b.layout != strided:  # (each stored value of a meets a row
        return 2.0 * _nnz(a) * _nnz(b) / max(1, b.shape[0])  # of b's, as stored on average)
    if a.layout != strided:
        return 2.0 * _nnz(a) * b.shape[1]
    if b.layout != strided:
        return 2.0 * _nnz(b) * a.shape[0]
    return 2.0 * a.shape[0] * a.shape[1] * b.shape[1]  # (only the term added is sparse)


def _to_float32(value, torch, depth: int = 0):
    """A forward's outputs with their bfloat16 tensors in float32, looking into the tuples,
    lists and dicts (a named tuple, a ``ModelOutput``) a model returns: the script's loss then
    runs in float32 on them, as it would inside an autocast region of its own (loss
    functions are among autocast's float32 operations), not in bfloat16 outside it, which
    rounds the loss and, on CUDA, fails the backward of a loss against a float32 target."""
    if isinstance(value, torch.Tensor):
        return value.float() if value.dtype == torch.bfloat16 else value
    if depth > 3:
        return value
    if isinstance(value, dict):
        for key, item in list(value.items()):  # in place: keeps a ModelOutput's attributes
            value[key] = _to_float32(item, torch, depth + 1)
        return value
    if isinstance(value, (tuple, list)):
        items = [_to_float32(v, torch, depth + 1) for v in value]
        if isinstance(value, list):
            return items
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    return value


def _first_tensor(value, tensor_type, depth: int = 0):
    """The first tensor of one or more dimensions in a module's inputs, looking into the
    tuples, lists and dicts a batch is often passed as (a recommender's (dense, sparse),
    a dict of named inputs): its first dimension is the batch."""
    if isinstance(value, tensor_type):
        return value if value.dim() >= 1 else None
    if depth > 3:
        return None
    items = value.values() if isinstance(value, dict) else (
        value if isinstance(value, (tuple, list)) else ())
    for item in items:
        found = _first_tensor(item, tensor_type, depth + 1)
        if found is not None:
            return found
    return None


def fingerprint_id(framework: str, fp) -> str:
    key = [framework, fp.trainable_parameters,
           round(fp.flops_per_step) if fp.flops_per_step else None,
           {k: round(v, 3) for k, v in sorted(fp.flop_share.items())},
           fp.batch_size, fp.input_shape]
    return "fp-" + hashlib.sha256(json.dumps(key).encode()).hexdigest()[:12]
