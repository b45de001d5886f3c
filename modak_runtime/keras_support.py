"""Keras 3 and TensorFlow: the plan's knobs by the frameworks' own settings, steps timed.

When the script imports keras, the runtime sets the mixed-precision dtype policy (before the
script builds its model), makes ``Model.compile`` use XLA (``jit_compile=True``) when XLA was
chosen (a script that passes ``jit_compile=True`` itself keeps its own, recorded as
``effect.script_compile``, and MODAK's is reported not applied), and times every call of
the step function Keras makes for ``fit`` and ``train_on_batch`` (reading the loss it
returns when sampled); a callback added to ``fit`` notes the start of training.  A
script's own loop on the TensorFlow backend (a
``GradientTape`` and the optimizer's ``apply_gradients``) is timed too: a step ends where
the ``tf.function`` that applied the gradients returns (its loss is what it returns, alone
or under ``"loss"``), or, in an eager loop, where they were applied; so is a plain
TensorFlow loop whose ``tf.function`` takes the tape's gradient and updates the variables
itself (an eager one without an optimizer is not).  On the torch backend
an own loop (``backward()``, then the optimizer's ``apply``) ends a step at each apply, its
loss the scalar ``backward`` was called on (torch_support notes it).  TensorFlow's threads
are set when tensorflow is imported; plain TensorFlow gets XLA from ``TF_XLA_FLAGS`` (the
plan exports it).

The fingerprint is counted analytically from the built model's layers (Dense, convolutions,
recurrent, attention, normalisation): FLOPs per sample forward, times three for a step.
"""
from __future__ import annotations

import gc
import math
import os
import sys
import weakref
from typing import Any, Optional

from .epochs import Epochs
from .hooks import when_imported
from .session import Session
from .torch_support import _is_module, fingerprint_id


def install(session: Session) -> None:
    when_imported("tensorflow", lambda tf: _on_tensorflow(session, tf))
    when_imported("keras", lambda keras: _Keras(session, keras))


def _on_tensorflow(session: Session, tf) -> None:
    if session.framework == "unknown":
        session.framework = "tensorflow"
        session.framework_version = getattr(tf, "__version__", None)
    cfg = session.config
    if cfg.threads:
        try:
            tf.config.threading.set_intra_op_parallelism_threads(cfg.threads)
            inter = int(os.environ.get("TF_NUM_INTEROP_THREADS", "0") or 0)
            if inter:
                tf.config.threading.set_inter_op_parallelism_threads(inter)
            session.applied_knob("threads", f"tf.config.threading intra={cfg.threads}"
                                 + (f" inter={inter}" if inter else ""))
        except RuntimeError as exc:  # TensorFlow was initialised already
            session.refuse("threads", str(exc)[:200])
    if cfg.compiler == "xla" and os.environ.get("TF_XLA_FLAGS"):
        session.applied_knob("compiler", f"TF_XLA_FLAGS={os.environ['TF_XLA_FLAGS']}")

    def finish():
        session.effect.setdefault(
            "threads", tf.config.threading.get_intra_op_parallelism_threads() or "default")
    session.finishers.append(finish)


class _Keras:
    def __init__(self, session: Session, keras):
        self.s, self.keras = session, keras
        session.framework = "keras"
        session.framework_version = keras.__version__
        session.effect["keras_backend"] = keras.backend.backend()
        cfg = session.config
        # the models trained, by id, weakly (a script's sweep lets each go after its fit):
        # the first one's facts for the record are noted when it starts training
        self.models: dict[int, weakref.ref] = {}
        self.first: Optional[weakref.ref] = None
        self.first_facts: dict[str, Any] = {}
        self.in_keras_step = False  # inside Keras' own step function (fit, train_on_batch)
        self.applying = False       # inside the optimizer's apply (a wrapper's nested one)
        self.calls: list = []       # the tf.functions being called, outermost first
        # those that applied gradients, by id, weakly (a freed one's id leaves with it: no
        # other function takes it over); a step function holds its model
        self.step_functions: dict[int, weakref.ref] = {}
        self.function_steps = False  # a tf.function of the script's own applied gradients
        # whether the script compiled a model with XLA itself (Model.compile's jit_compile)
        self.script_jit = False
        # those that took a GradientTape's gradient without applying it through a Keras
        # optimizer (a loop that updates its variables itself): steps while no function
        # applied gradients
        self.gradient_functions: dict[int, weakref.ref] = {}
        self.trained: Optional[list] = None    # the variables a custom loop trains
        self.pending_loss: Any = None  # the target of an eager loop's last GradientTape
        self.own_loop = False  # an eager loop of its own applied gradients (not TensorFlow)
        self.last_input: Any = None  # the latest outermost model call's input, till training
        self.calling = 0             # model calls under way (nested ones are not noted)
        self.unwatch: Optional[Any] = None
        # the epoch's length of a loop of its own over a tf.data dataset (fit says its own)
        self.epochs = Epochs(session, "dataset", _dataset_batches)
        if cfg.precision != "fp32":
            policy = "mixed_bfloat16" if cfg.precision == "bf16" else "mixed_float16"
            keras.mixed_precision.set_global_policy(policy)
            session.applied_knob("precision", f"keras.mixed_precision.set_global_policy({policy!r})")
        if cfg.compiler.startswith("torch.compile"):
            session.refuse("compiler", "torch.compile does not apply to a Keras model")
        if cfg.channels_last:
            session.refuse("channels_last", "Keras layers choose their own data format")
        self._patch()
        self._watch_inputs()
        session.finishers.append(self.finish)

    def _watch_inputs(self) -> None:
        """Until a model's training begins, note the input of the latest outermost model
        call: an eager loop of the script's own passes no batch to anything MODAK sees
        (a ``tf.function`` step's is its first argument), and its fingerprint needs one.
        ``began`` puts ``Model.__call__`` back, so training steps pay nothing for it."""
        Model, me = self.keras.Model, self
        own = Model.__dict__.get("__call__")
        inner = Model.__call__

        def noted_call(model, *args, **kwargs):
            if not me.calling and args:
                me.last_input = args[0]
            me.calling += 1
            try:
                return inner(model, *args, **kwargs)
            finally:
                me.calling -= 1

        def unwatch() -> None:
            if own is None:
                del Model.__call__
            else:
                Model.__call__ = own
            me.last_input, me.unwatch = None, None

        noted_call.__wrapped__ = inner
        Model.__call__ = noted_call
        self.unwatch = unwatch

    def _patch(self) -> None:
        keras, me = self.keras, self
        Model = keras.Model
        compile_, fit, train_on_batch = Model.compile, Model.fit, Model.train_on_batch
        make_train_function = Model.make_train_function

        def compile(model, *args, **kwargs):
            if _asks_jit(compile_, model, args, kwargs) and not me.script_jit:
                # the script's own XLA stands, in a stock run too; MODAK's knob would only
                # repeat it, and a trial of it would measure nothing of its own
                me.script_jit = True
                me.s.effect["script_compile"] = "Model.compile(jit_compile=True)"
                if me.s.config.compiler == "xla":
                    me.s.withdraw("compiler", "the script compiles its model with XLA itself "
                                  "(Model.compile(jit_compile=True)), which stands: MODAK's "
                                  "XLA is not put over it")
            elif me.s.config.compiler == "xla" and not me.script_jit:
                kwargs["jit_compile"] = True
                me.s.applied_knob("compiler", "Model.compile(jit_compile=True)")
            return compile_(model, *args, **kwargs)

        def fit_with_clock(model, *args, **kwargs):
            callbacks = list(kwargs.get("callbacks") or [])
            callbacks.append(me.callback(model, args, kwargs))
            kwargs["callbacks"] = callbacks
            return fit(model, *args, **kwargs)

        def noted_train_on_batch(model, x=None, *args, **kwargs):
            me.began(model, x, None)
            return train_on_batch(model, x, *args, **kwargs)

        def timed_make_train_function(model, *args, **kwargs):
            out = make_train_function(model, *args, **kwargs)
            step = getattr(model, "train_function", None)
            if step is not None and not getattr(step, "_modak_timed", False):
                def timed(*a, **k):
                    me.in_keras_step = True
                    try:
                        logs = step(*a, **k)
                    finally:
                        me.in_keras_step = False
                    me.step_done(logs)
                    return logs
                timed._modak_timed = True
                model.train_function = timed
                if out is step:
                    out = timed
            return out

        Model.compile, Model.fit, Model.train_on_batch = compile, fit_with_clock, \
            noted_train_on_batch
        Model.make_train_function = timed_make_train_function
        tf = sys.modules.get("tensorflow")
        if tf is not None and keras.backend.backend() == "tensorflow":
            self._patch_own_loops(tf)
            # the passes over tf.data datasets a loop of its own makes (``for x, y in
            # dataset``), for the epoch's length
            self.epochs.watch(tf.data.Dataset, getattr(
                sys.modules.get("tensorflow.python.data.ops.iterator_ops"), "OwnedIterator",
                None))
        elif keras.backend.backend() != "tensorflow":
            self._patch_eager_loops()

    def _own_apply(self, apply, opt, args, kwargs) -> tuple[Any, bool]:
        """The optimizer's ``apply``: its result, and whether it was a loop of the script's
        own (not inside Keras' step, nor nested in another apply).  The first such names
        the trained model (the variables it applies gradients to), and training starts."""
        if self.in_keras_step or self.applying:
            return apply(opt, *args, **kwargs), False
        self.applying = True
        try:
            if self.trained is None:
                self.s.training_started()
                given = kwargs.get("trainable_variables", args[1] if len(args) > 1 else None)
                self.trained = list(given) if given is not None else []
            return apply(opt, *args, **kwargs), True
        finally:
            self.applying = False

    def _patch_eager_loops(self) -> None:
        """A script's own loop on the torch backend, as Keras' guide writes it: the loss's
        ``backward()``, then the optimizer's ``apply``, each call of which ends a step; its
        loss is the scalar ``backward`` was last called on.  (On JAX, a loop that calls
        ``apply`` is timed alike, without its loss; one that calls ``stateless_apply``
        inside a jitted step is not timed.)"""
        me = self
        Optimizer = self.keras.optimizers.Optimizer
        apply = Optimizer.apply

        def timed_apply(opt, *args, **kwargs):
            out, own = me._own_apply(apply, opt, args, kwargs)
            if not own:
                return out
            loss, me.s.backward_loss = me.s.backward_loss, None
            me.own_loop = True
            me.own_step(None, loss)
            return out

        timed_apply.__wrapped__ = apply
        Optimizer.apply = timed_apply

    def _patch_own_loops(self, tf) -> None:
        """Time a script's own loop: the optimizer's ``apply`` (which ``apply_gradients``
        calls) marks the ``tf.function`` being traced around it as a step function, each
        call of which is then a step; applied eagerly, outside any, it ends a step itself.
        A ``tf.function`` that takes a ``GradientTape``'s gradient and updates the variables
        itself (``assign_sub``: no Keras optimizer) is a step function too, while no
        function applied gradients through an optimizer (a loop that accumulates gradients
        in one function and applies them in another is timed by the second).  An eager loop
        without an optimizer is not timed.  Keras' own step function is left to
        ``make_train_function``'s clock."""
        me = self
        Optimizer = self.keras.optimizers.Optimizer
        apply = Optimizer.apply
        Function = type(tf.function(lambda: None))
        call = Function.__call__
        gradient = tf.GradientTape.gradient

        def noted_gradient(tape, target, *args, **kwargs):
            if not me.calls and tf.executing_eagerly():  # (an eager loop's loss)
                me.pending_loss = target
            elif me.calls and not me.in_keras_step:  # (traced: the outermost tf.function)
                _note(me.gradient_functions, me.calls[0])
            return gradient(tape, target, *args, **kwargs)

        def timed_apply(opt, *args, **kwargs):
            out, own = me._own_apply(apply, opt, args, kwargs)
            if not own:
                return out
            if me.calls:  # (traced: the outermost tf.function is the step)
                _note(me.step_functions, me.calls[0])
                me.function_steps = True
            elif tf.executing_eagerly():
                loss, me.pending_loss = me.pending_loss, None
                me.own_step(None, loss)
            return out

        def timed_call(fn, *args, **kwargs):
            if me.in_keras_step:
                return call(fn, *args, **kwargs)
            me.calls.append(fn)
            try:
                out = call(fn, *args, **kwargs)
            finally:
                me.calls.pop()
            if not me.calls and (id(fn) in me.step_functions or (
                    id(fn) in me.gradient_functions and not me.step_functions)):
                if me.trained is None:  # (no optimizer named the variables it trains)
                    me.s.training_started()
                    me.trained = []
                me.own_step(args[0] if args else None, out)
            return out

        timed_apply.__wrapped__, timed_call.__wrapped__ = apply, call
        noted_gradient.__wrapped__ = gradient
        Optimizer.apply, Function.__call__ = timed_apply, timed_call
        tf.GradientTape.gradient = noted_gradient

    def own_step(self, x: Any, out: Any) -> None:
        """A step of the script's own loop ended (``x``: the step function's first argument,
        its batch; ``out``: what it returned)."""
        if self.first is None:
            model = self._trained_model()
            if model is not None:
                self.began(model, x if x is not None else self.last_input, None)
                self.trained = []  # (found: its variables are not held any longer)
        loss = out.get("loss") if isinstance(out, dict) else \
            out[0] if isinstance(out, (tuple, list)) and out else out
        if self.s.loss_due() and getattr(loss, "shape", None) == () and loss is not None:
            try:
                self.s.loss(float(loss))
            except (TypeError, ValueError):
                pass
        self.epochs.at_step()
        self.s.step_done()

    def _trained_model(self) -> Any:
        """The outermost Keras model whose trainable weights the loop's optimizer applies
        gradients to (None: none is found)."""
        ids = {id(v) for v in self.trained or []}
        if not ids:
            return None
        owners = [o for o in gc.get_objects() if _is_module(o, self.keras.Model)
                  and o.trainable_weights and {id(w) for w in o.trainable_weights} <= ids]
        inner = {id(layer) for m in owners for layer in _layers(m)}
        return next((m for m in owners if id(m) not in inner), None)

    def step_done(self, logs) -> None:
        """After each call of Keras' own step function (``fit`` and ``train_on_batch``
        both call it); the loss is read only when it is sampled."""
        if self.s.loss_due() and isinstance(logs, dict) and logs.get("loss") is not None:
            self.s.loss(float(logs["loss"]))
        self.s.step_done()

    def began(self, model, x, batch_size: Optional[int]) -> None:
        if id(model) in self.models:
            return
        _note(self.models, model)
        if self.first is None:
            self.first, self.first_facts = weakref.ref(model), _facts(model)
        if self.unwatch is not None:
            self.unwatch()
        self.s.training_started()
        fp = self.s.fingerprint
        size = int(sum(math.prod(w.shape) for w in model.trainable_weights))
        if fp.id is not None:  # a later model (a sweep, folds): its steps timed apart
            if self.s.step_ends:
                self.s.next_model(size == fp.trainable_parameters)
            return
        if batch_size is None:
            shape = getattr(x, "shape", None)
            batch_size = int(shape[0]) if shape is not None and len(shape) else None
        fp.batch_size = batch_size
        fp.trainable_parameters = size
        fp.dtype = str(model.dtype_policy.variable_dtype)
        try:
            fp.input_shape = [int(d) for d in model.inputs[0].shape[1:]]
        except Exception:
            pass
        per_sample, shares, grouped = keras_flops(model)
        if per_sample and batch_size:
            fp.flops_per_step = 3.0 * per_sample * batch_size
            fp.flop_share = shares
            fp.grouped_share = grouped
            fp.method = "analytic from the Keras layers' shapes (step = 3 x forward)"
            written, steps = keras_traffic(model)
            fp.elements_per_step = (ELEMENTS_OVER_FORWARD * written * batch_size
                                    + ELEMENTS_PER_PARAMETER * size) or None
            fp.recurrent_steps = steps
        fp.id = fingerprint_id("keras", fp)

    def callback(self, model, args, kwargs):
        """A callback for the start of ``fit`` only: a batch-level one would turn off Keras'
        asynchronous callback dispatch and cost every step (about 0.2 ms here)."""
        me = self

        class Clock(self.keras.callbacks.Callback):
            def on_train_begin(self, logs=None):
                x = args[0] if args else kwargs.get("x")
                batch = kwargs.get("batch_size")
                if batch is None and getattr(x, "shape", None) is not None:
                    batch = min(32, int(x.shape[0]))  # Keras' default batch size
                me.began(model, None, batch)
                steps = (self.params or {}).get("steps")
                if me.s.steps_per_epoch is None and isinstance(steps, int) and steps > 0:
                    me.s.steps_per_epoch = steps  # (the first fit's: the trained model's)
                    me.s.effect["steps_per_epoch"] = "Keras fit's steps per epoch"

        return Clock()

    def finish(self) -> None:
        s = self.s
        self.epochs.finish()
        if self.first is not None:
            model = self.first()  # (the script may have let it go: its facts as noted)
            facts = _facts(model) if model is not None else self.first_facts
            jit = facts["jit_compile"]
            own = (self.function_steps or self.own_loop) and not facts["compiled"]
            if own:  # (its own loop's tf.function: XLA only by TF_XLA_FLAGS)
                jit = "compiler" in s.applied
            s.effect["compiled"] = bool(jit)
            s.effect["compute_dtype"] = facts["compute_dtype"]
            s.effect["matmul_dtype"] = s.effect["compute_dtype"]
            if s.config.compiler == "xla" and not jit:
                if not own:
                    why = "Keras turned jit_compile off for this model"
                elif self.own_loop:
                    why = (f"the script trains in a loop of its own on the "
                           f"{self.keras.backend.backend()} backend, which "
                           "Model.compile(jit_compile=True) does not reach")
                else:
                    why = ("the script trains in a loop of its own, whose tf.function "
                           "Model.compile(jit_compile=True) does not reach "
                           "(TF_XLA_FLAGS is not set)")
                s.withdraw("compiler", why)


def _dataset_batches(dataset) -> Optional[int]:
    """A ``tf.data`` dataset's batches, where it states them (None: infinite or unknown)."""
    n = int(dataset.cardinality())
    return n if n >= 0 else None


def _note(held: dict[int, weakref.ref], obj: Any) -> None:
    """Note ``obj`` in ``held`` by its id, weakly: the entry leaves when ``obj`` is freed,
    before another object can take its id."""
    key = id(obj)
    held[key] = weakref.ref(obj, lambda _, key=key: held.pop(key, None))


def _asks_jit(compile_, model, args: tuple, kwargs: dict) -> bool:
    """Whether the script's ``Model.compile`` call asks for XLA itself (``jit_compile=True``,
    by keyword or by position; Keras' default, ``"auto"``, is not asking)."""
    if "jit_compile" in kwargs:
        return kwargs["jit_compile"] is True
    try:
        import inspect
        bound = inspect.signature(compile_).bind_partial(model, *args)
    except (TypeError, ValueError):
        return False
    return bound.arguments.get("jit_compile") is True


def _facts(model) -> dict[str, Any]:
    """What the record says of a trained model: whether Keras compiles its step with XLA,
    whether ``Model.compile`` ran, and the dtype its layers compute in."""
    policy = getattr(model, "dtype_policy", None)
    return {"jit_compile": getattr(model, "jit_compile", None),
            "compiled": bool(getattr(model, "compiled", False)),
            "compute_dtype": str(getattr(policy, "compute_dtype", None))}


def _dims(shape) -> list[int]:
    return [int(d) if d is not None else 1 for d in shape]


# elements a training step writes per element its forward's layers put out (the forward's
# output, the backward's gradient of it), and per trainable parameter (its gradient, the
# optimizer's state and the update).  An estimate from the layers' shapes: PyTorch's
# dispatcher counts what each operation writes, Keras has no such hook; on the campaign's
# four architectures written both ways this is 1.0-1.24 times PyTorch's count, 0.4-0.5 on
# the LSTM language model (the loss's and a fused LSTM's own tensors are not layer outputs)
ELEMENTS_OVER_FORWARD = 2.0
ELEMENTS_PER_PARAMETER = 3.0
# layers whose output is a view of their input (nothing written)
VIEWS = ("InputLayer", "Flatten", "Reshape", "Permute", "RepeatVector", "Identity")
# the gates of each recurrent layer
RECURRENT = {"LSTM": 4, "GRU": 3, "SimpleRNN": 1}


def _layers(model) -> list:
    out = []
    for layer in getattr(model, "layers", []):
        if hasattr(layer, "layers") and type(layer).__name__ in ("Functional", "Sequential",
                                                                 "Model"):
            out += _layers(layer)
        else:
            out.append(layer)
    return out


def layer_flops(layer) -> tuple[Optional[str], float]:
    """(kind, forward FLOPs per sample) of one built Keras layer."""
    name = _kind(layer)
    if name == "Bidirectional":  # two recurrent layers over the same input
        both = [layer_flops(inner) for inner in _directions(layer)]
        return both[0][0], sum(pair[1] for pair in both)
    try:
        inp = _dims(layer.input.shape)[1:]
        out = _dims(layer.output.shape)[1:]
    except Exception:
        return None, 0.0
    spatial = math.prod(out[:-1]) if len(out) > 1 else 1
    if name in ("Dense", "EinsumDense"):
        return "linear", 2.0 * inp[-1] * out[-1] * spatial
    if name.startswith("DepthwiseConv"):
        k = math.prod(layer.kernel_size)
        return "conv", 2.0 * k * inp[-1] * layer.depth_multiplier * spatial
    if name.startswith("SeparableConv"):
        k = math.prod(layer.kernel_size)
        mult = layer.depth_multiplier
        return "conv", 2.0 * spatial * (k * inp[-1] * mult + inp[-1] * mult * out[-1])
    if name.startswith("Conv"):
        k = math.prod(layer.kernel_size)
        groups = getattr(layer, "groups", 1) or 1
        return "conv", 2.0 * k * inp[-1] / groups * out[-1] * spatial
    if name in RECURRENT:
        gates = RECURRENT[name]
        steps = inp[0] if len(inp) > 1 else 1
        return "recurrent", 2.0 * gates * (inp[-1] + layer.units) * layer.units * steps
    if name == "MultiHeadAttention":
        t = math.prod(inp[:-1])
        width = layer.num_heads * layer.key_dim
        return "attention", 2.0 * t * inp[-1] * width * 4 + 4.0 * t * t * width
    if "Normalization" in name:
        return "norm", 4.0 * math.prod(out)
    return None, 0.0


def grouped_flops(layer) -> float:
    """The forward FLOPs per sample of a built Keras layer's grouped (depthwise)
    convolution: all of a depthwise or grouped convolution's, a separable one's depthwise
    part; 0 for any other layer."""
    name = _kind(layer)
    try:
        inp = _dims(layer.input.shape)[1:]
        out = _dims(layer.output.shape)[1:]
    except Exception:
        return 0.0
    spatial = math.prod(out[:-1]) if len(out) > 1 else 1
    if name.startswith(("DepthwiseConv", "SeparableConv")):
        return 2.0 * math.prod(layer.kernel_size) * inp[-1] * layer.depth_multiplier * spatial
    if name.startswith("Conv") and (getattr(layer, "groups", 1) or 1) > 1:
        return layer_flops(layer)[1]
    return 0.0


def keras_flops(model) -> tuple[float, dict[str, float], float]:
    """Forward FLOPs per sample, their shares by kind, and the share of them in grouped
    convolutions."""
    from .record import FLOP_KINDS
    per_kind: dict[str, float] = {k: 0.0 for k in FLOP_KINDS}
    grouped = 0.0
    for layer in _layers(model):
        kind, flops = layer_flops(layer)
        if kind:
            per_kind[kind] += flops
            grouped += grouped_flops(layer)
    total = sum(per_kind.values())
    return (total, {k: (v / total if total else 0.0) for k, v in per_kind.items()},
            grouped / total if total else 0.0)


def _directions(layer) -> list:
    """A Bidirectional wrapper's two layers, each as if it ran on the wrapper's input
    (Keras builds them without a node of their own)."""
    return [_AsCalled(inner, layer) for inner in (layer.forward_layer, layer.backward_layer)]


def _kind(layer) -> str:
    """A layer's class name (a Bidirectional's inner layer's, for :class:`_AsCalled`)."""
    return type(getattr(layer, "_inner", layer)).__name__


class _AsCalled:
    """A Bidirectional's inner layer, with the wrapper's input shape and its own output."""

    def __init__(self, inner, wrapper):
        self._inner, self._wrapper = inner, wrapper

    def __getattr__(self, name):
        if name == "input":
            return self._wrapper.input
        if name == "output":
            shape = _dims(self._wrapper.input.shape)[:-1]
            if not getattr(self._inner, "return_sequences", False):
                shape = shape[:1]
            return type("Out", (), {"shape": (*shape, self._inner.units)})()
        return getattr(self._inner, name)


def layer_traffic(layer) -> tuple[float, int]:
    """(elements its forward writes per sample, time steps it runs in sequence) of one
    built Keras layer: its output (none for a view), again for a non-linear activation
    of its own; a recurrent layer's gates and states at every time step."""
    name = _kind(layer)
    if name == "Bidirectional":
        both = [layer_traffic(inner) for inner in _directions(layer)]
        return sum(pair[0] for pair in both), sum(pair[1] for pair in both)
    if name in VIEWS:
        return 0.0, 0
    try:
        inp = _dims(layer.input.shape)[1:]
        out = _dims(layer.output.shape)[1:]
    except Exception:
        return 0.0, 0
    written = float(math.prod(out))
    activation = getattr(getattr(layer, "activation", None), "__name__", "linear")
    if activation not in ("linear", "identity") and name not in RECURRENT:
        written *= 2
    steps = 0
    if name in RECURRENT:
        steps = inp[0] if len(inp) > 1 else 1
        # the gates' pre-activations and activations, the new state (an LSTM's cell too)
        written += steps * layer.units * (2 * RECURRENT[name] + (2 if name == "LSTM" else 1))
    return written, steps


def keras_traffic(model) -> tuple[float, int]:
    """The elements a model's forward writes per sample (its layers' outputs, see
    :func:`layer_traffic`) and the time steps its recurrent layers run in sequence, summed
    over them (the fingerprint's ``recurrent_steps``)."""
    elements, steps = 0.0, 0
    for layer in _layers(model):
        e, t = layer_traffic(layer)
        elements, steps = elements + e, steps + t
    return elements, steps
