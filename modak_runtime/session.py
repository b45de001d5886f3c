"""One measured run: the knobs asked for, the step clock, the losses, what was in effect."""
from __future__ import annotations

import math
import os
import platform
import re
import resource
import signal
import statistics
import sys
import time
import traceback
from typing import Any, Callable, Mapping, Optional

from .hooks import when_imported
from .record import Config, Fingerprint, Metrics, Record, end_loss, start_loss

MAX_LOSS_POINTS = 200   # the loss trajectory is thinned to at most this many points
RELEVANT_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile",
                  "sve", "bf16")
ALLOCATOR_LIBS = {"tcmalloc": "libtcmalloc", "jemalloc": "libjemalloc"}


# the imports a failed run's record names that its Python lacks, at most
MAX_MISSING = 20
# how often the time cap's alarm is raised again once the cap has passed, until the run stops
ALARM_REPEAT_S = 0.25
# the steps a compiled run needs for a step time: the first runs eagerly (the fingerprint's),
# the second compiles, the third is the first that runs compiled
COMPILED_STEPS = 3
# a steady step that takes this many times the median step is a one-off (a recompilation for
# a new shape, XLA's at a Keras epoch's end: 648 ms against 4 ms steps, in one run of two),
# the job's once, not each step's: where a run has one such step, its excess over the
# median goes to the warm-up (``one_off_stall``; each model's apart, where a script trains
# several one after another: each compiles anew).  Keras' own end of an epoch (about 4x) is
# every epoch's and stays in the step time
STALL_FACTOR = 20.0


class StopTrial(BaseException):
    """Raised from a step hook when the trial cap is reached, or from the time cap's alarm
    (not an Exception: scripts' ``except Exception`` blocks must not swallow it)."""


class RankFailed(Exception):
    """A training rank the script started (``torch.multiprocessing``) failed: ``error`` is
    that rank's own account, as :func:`failure` gave it there."""

    def __init__(self, error: dict[str, Any]):
        super().__init__(error.get("message"))
        self.error = error


def blame(text: str, files: str, config: Config) -> Optional[str]:
    """The knob a failure is most likely due to (None: the script's own failure), from the
    error's text and the files of its traceback."""
    if config.compiler != "off" and (
            re.search(r"torch[/\\]_(dynamo|inductor)", files)
            or re.search(r"_dynamo|inductor|XLA|xla|jit_compile", text)):
        return "compiler"
    if config.precision != "fp32" and re.search(r"[bB][fF]loat16|BFloat16|float16|Half|mixed",
                                                text):
        return "precision"
    if config.channels_last and re.search(r"channels_last|memory_format|stride", text):
        return "channels_last"
    return None


# PyTorch's words for a process group initialised from the environment (env://, as a script
# written for torchrun does) in a process no launcher started
RENDEZVOUS_UNSET = re.compile(r"env:// rendezvous: environment variable \w+ expected, but not set")


def short(text: str, limit: int = 500) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def rank_error(index: int, error: dict[str, Any], before: str = "") -> dict[str, Any]:
    """Another rank's ``error`` as the run's: its message said to be rank ``index``'s."""
    return dict(error, message=short(f"{before}rank {index}: {error.get('message', '')}"))


def failure(exc: BaseException, config: Config, script: Optional[str] = None
            ) -> dict[str, Any]:
    """A record's ``error`` for an exception the script raised; after a failed import, with
    the other imports of the run's files that this Python lacks too (``missing``: the
    module, file and line of each, :func:`imports.missing_here`), the failed one first."""
    if isinstance(exc, RankFailed):
        return exc.error
    missing = None
    if isinstance(exc, ModuleNotFoundError) and script is not None:
        from .imports import missing_here
        failed = (exc.name or "").split(".", 1)[0]
        try:
            lacking = missing_here(script)
        except Exception:  # (what it says is an aid; the failure is reported without it)
            lacking = []
        missing = [list(i) for i in sorted(lacking, key=lambda i: i.module != failed)]
    files = " ".join(f.filename for f in traceback.extract_tb(exc.__traceback__))
    text = f"{type(exc).__module__}.{type(exc).__name__}: {exc}"
    message = str(exc) or type(exc).__name__
    if RENDEZVOUS_UNSET.search(message):  # (a script written for torchrun, not under it)
        from .launched import launched
        me = launched()
        message += (" (the script takes its rank from a launcher such as torchrun: it runs as "
                    "several processes per node, which the request's "
                    "job_options.process_count_per_node asks for)" if me is None else
                    f" (the script takes its place from torchrun's variables: the runtime set "
                    f"those {me.launcher} gives, but where the ranks meet, MASTER_ADDR and "
                    "MASTER_PORT, is set by MODAK's job script, or in a Slurm step by the "
                    "runtime)")
    error = {"type": f"{type(exc).__module__}.{type(exc).__name__}",
             "knob": blame(text, files, config), "message": short(message)}
    if missing:
        error["missing"] = missing[:MAX_MISSING]
    return error


def _exit_error(code: Any, how: str = "") -> dict[str, Any]:
    """A record's ``error`` for a script that exited with a non-zero status."""
    return {"type": "SystemExit", "knob": None,
            "message": short(f"the script exited with status {code}{how}")}


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def one_off_stall(intervals: list[float]) -> float:
    """The excess over the median of the one steady step over :data:`STALL_FACTOR` times
    it, where a run has exactly one (0.0 otherwise): a one-off the job pays once.  Two or
    more such steps may be every epoch's (an evaluation, a checkpoint): they stay."""
    if len(intervals) < 3:
        return 0.0
    median = statistics.median(intervals)
    over = [t for t in intervals if t > STALL_FACTOR * median]
    return over[0] - median if len(over) == 1 else 0.0


def run_guarded(session: "Session", call: Callable[[], Any],
                terminated: Optional[type] = None) -> tuple[str, Optional[dict[str, Any]], int]:
    """Run ``call`` (the script, or a rank's function) under the session's time cap: its
    status (ok, capped, failed), the record's ``error`` and the exit status it warrants.
    ``terminated``: the exception that SIGTERM raises (exit status 128 + SIGTERM)."""
    status, error, code = "ok", None, 0
    try:
        session.arm_time_cap()
        try:
            call()
        finally:
            session.disarm_time_cap()
            session.ending = True  # (the record is made from here on)
    except StopTrial:
        status = "capped"
        error = session.time_cap_error()
    except SystemExit as exc:
        if exc.code not in (None, 0):
            code = exc.code if isinstance(exc.code, int) else 1
            if not isinstance(exc.code, int):
                print(exc.code, file=sys.stderr)
            status, error = "failed", _exit_error(exc.code)
    except BaseException as exc:  # the script's failure: report it, then exit non-zero
        traceback.print_exc()
        code = (130 if isinstance(exc, KeyboardInterrupt)
                else 128 + signal.SIGTERM if terminated and isinstance(exc, terminated) else 1)
        status, error = "failed", failure(exc, session.config, session.script)
        knob = error["knob"]
        if knob:
            cfg = session.config
            print(f"modak_runtime: the run failed under the knob {knob!r} "
                  f"({getattr(cfg, knob) if knob != 'compiler' else cfg.compiler})",
                  file=sys.stderr)
    return status, error, code


def on_hard_exit(report: Callable[[str, Optional[dict[str, Any]]], None],
                 session: "Session") -> Callable[[], None]:
    """A script (or a rank's function) that leaves by ``os._exit``, to skip a data
    loader's or a process group's slow teardown, ends without the interpreter's shutdown:
    what it measured would never be reported.  In this process (not in its forked
    children), ``report(status, error)`` runs first.  Returns what puts ``os._exit`` back."""
    pid, original = os.getpid(), os._exit

    def hard_exit(code: int) -> None:
        if os.getpid() == pid:
            os._exit = original
            session.disarm_time_cap()
            error = None if code == 0 else _exit_error(code, " (os._exit)")
            sys.stdout.flush()
            report("ok" if code == 0 else "failed", error)
        original(code)

    os._exit = hard_exit

    def restore() -> None:
        os._exit = original
    return restore


def _env(name: str, environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    value = (os.environ if environ is None else environ).get(name, "").strip()
    return value or None


def _int_env(name: str, environ: Optional[Mapping[str, str]] = None) -> Optional[int]:
    """A whole number of at least 1 (a count of steps, of threads), or None when unset."""
    return _number_env(name, int, "a whole number", lambda n: n >= 1, "at least 1", environ)


def _seconds_env(name: str) -> Optional[float]:
    """A positive, finite number of seconds, or None when unset."""
    return _number_env(name, float, "a number of seconds",
                       lambda n: math.isfinite(n) and n > 0, "a positive number of seconds")


def _number_env(name: str, kind, what: str, fits, bound: str,
                environ: Optional[Mapping[str, str]] = None):
    value = _env(name, environ)
    if value is None:
        return None
    try:
        number = kind(value)
    except ValueError:
        raise SystemExit(f"modak_runtime: {name}={value!r} is not {what}") from None
    if not fits(number):
        raise SystemExit(f"modak_runtime: {name}={value!r} must be {bound}")
    return number


def knobs_from_env(environ: Optional[Mapping[str, str]] = None) -> Config:
    """The configuration the plan asked for, from the variables the job script exports
    (``environ``: these variables, the process's own by default)."""
    def env(name: str) -> Optional[str]:
        return _env(name, environ)
    compiler = "off"
    mode = env("MODAK_TORCH_COMPILE")
    if mode and mode != "off":
        compiler = f"torch.compile:{mode}"
    elif env("MODAK_JIT_COMPILE") == "1":
        compiler = "xla"
    precision = env("MODAK_PRECISION") or "fp32"
    if precision not in ("fp32", "bf16", "fp16"):
        raise SystemExit(f"modak_runtime: MODAK_PRECISION={precision!r}: use fp32, bf16 or fp16")
    return Config(compiler=compiler, threads=_int_env("MODAK_THREADS", environ),
                  allocator=env("MODAK_ALLOCATOR") or "glibc", precision=precision,
                  channels_last=env("MODAK_CHANNELS_LAST") == "1",
                  onednn=(env("MODAK_ONEDNN") or "on") != "off")


def seed_the_run(session: "Session", rank: int = 0) -> Optional[int]:
    """``MODAK_SEED`` (the search's trials set it): the random number generators a script
    draws its model's first weights and its batches from are seeded with it before the
    script runs: Python's at once, NumPy's global one, PyTorch's, TensorFlow's and Keras'
    when they are imported (a generator the script makes without a seed, NumPy's
    ``default_rng()``, draws from the system and is not).  Trials of different
    configurations then start from the same weights and see the same batches, and their
    losses differ by what the configuration changes, not by the draw (six stock trials of
    a script with an unseeded model had their losses after 10 steps up to 14% apart
    here).  A script that seeds them itself does so after
    this, as it would anyway.  The seed is in the record's ``effect``; unset, nothing is
    seeded (a deploy's job).  A rank the script spawns (``ranks``), a fresh interpreter,
    seeds its own with the seed plus its ``rank``: the ranks draw alike in every trial, and
    differently from one another, as they would unseeded."""
    seed = _number_env("MODAK_SEED", int, "a whole number", lambda n: 0 <= n < 2 ** 32,
                       "from 0 to 4294967295")
    if seed is None:
        return None
    seed = (seed + rank) % 2 ** 32
    import random
    random.seed(seed)
    session.effect["seed"] = seed

    def seeding(how: Callable[[Any], Any]) -> Callable[[Any], None]:
        def hook(module: Any) -> None:
            try:
                how(module)
            except Exception as exc:  # (an old or partial framework: the run goes on)
                session.effect.setdefault("seed_errors", []).append(
                    f"{module.__name__}: {exc!r}"[:200])
        return hook
    when_imported("numpy", seeding(lambda np: np.random.seed(seed)))
    when_imported("torch", seeding(lambda torch: torch.manual_seed(seed)))
    when_imported("tensorflow", seeding(lambda tf: tf.random.set_seed(seed)))
    when_imported("keras", seeding(lambda keras: keras.utils.set_random_seed(seed)))
    return seed


def loaded_allocator() -> str:
    """The allocator library really mapped into this process."""
    try:
        with open("/proc/self/maps", encoding="ascii", errors="replace") as f:
            maps = f.read()
    except OSError:
        return "unknown"
    for name, lib in ALLOCATOR_LIBS.items():
        if lib in maps:
            return name
    return "glibc"


def boot_id() -> Optional[str]:
    """The machine as booted: a host of the same kind next session is another one."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip() or None
    except OSError:
        return None


def host_facts() -> dict[str, Any]:
    facts: dict[str, Any] = {"hostname": platform.node(), "machine": platform.machine(),
                             "python": platform.python_version(), "cpu_model": "unknown",
                             "cpu_features": []}
    try:
        facts["cores"] = len(os.sched_getaffinity(0))
    except AttributeError:
        facts["cores"] = os.cpu_count()
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("model name") and facts["cpu_model"] == "unknown":
                    facts["cpu_model"] = line.split(":", 1)[1].strip()
                elif line.startswith(("flags", "Features")) and not facts["cpu_features"]:
                    facts["cpu_features"] = sorted(set(line.split(":", 1)[1].split())
                                                   & set(RELEVANT_FLAGS))
    except OSError:
        pass
    facts["boot_id"] = boot_id()
    facts["microarchitecture"] = _env("MODAK_MICROARCHITECTURE")
    if facts["microarchitecture"] is None:
        try:
            import archspec.cpu  # optional inside images
            facts["microarchitecture"] = archspec.cpu.host().name
        except Exception:
            pass
    return facts


class Session:
    """Collects the measurements of one run; frameworks' hooks call into it."""

    def __init__(self, config: Config, script: str):
        self.config = config
        self.script = script
        self.t_start = time.perf_counter()
        self.t_train: Optional[float] = None   # when training began (optimizer or fit)
        self.step_ends: list[float] = []
        # the later models a script trained one after another (a sweep, folds): where each
        # one's steps begin in step_ends, and whether it is the first one's size, so that
        # its steady steps are timed with the first one's (torch_support.next_model)
        self.models: list[tuple[int, bool]] = []
        self.losses: list[list[float]] = []
        self.loss_stride = 1
        self.last_loss: Optional[float] = None
        # the steps an epoch makes, as the framework's hooks found it (Metrics.steps_per_epoch)
        self.steps_per_epoch: Optional[int] = None
        self.max_steps = _int_env("MODAK_MAX_STEPS")
        # a trial's time cap, from the runtime's start (a search's share of its budget)
        self.max_seconds = _seconds_env("MODAK_MAX_SECONDS")
        self.stopped_by: Optional[str] = None  # "steps" or "time": which cap ended the run
        self.armed = False  # the time cap's alarm is set (arm_time_cap)
        self.alarm_handler: Optional[Callable] = None  # the SIGALRM handler it set
        self.sigterm_handler: Optional[Callable] = None  # the runtime's, where it set one
        self.ending = False  # the script (or rank's function) has ended: run_guarded
        self.warmup = _int_env("MODAK_WARMUP_STEPS")
        # the ranks a launcher started beside this one (launched.py): where they share a
        # directory on this node, rank 0 decides when the time cap stops them and tells them
        # (``peers.stop()``: the steps after which the run stops)
        self.peers: Any = None
        self.framework = "unknown"
        self.framework_version: Optional[str] = None
        self.applied: dict[str, str] = {}
        self.not_applied: dict[str, str] = {}
        self.effect: dict[str, Any] = {}
        self.fingerprint = Fingerprint()
        self.accuracy: Optional[float] = None
        self.finishers: list = []   # callables run before the record is made
        self.status = "ok"
        self.rank_peak_rss_mb: Optional[float] = None  # of the rank adopted (ranks.py)
        # the scalar the script last called torch.autograd.backward on (torch_support): the
        # loss of a Keras loop of its own on the torch backend
        self.backward_loss: Any = None

    # -- knobs ---------------------------------------------------------------------
    def applied_knob(self, knob: str, how: str) -> None:
        self.applied[knob] = how
        self.not_applied.pop(knob, None)

    def refuse(self, knob: str, why: str) -> None:
        if knob not in self.applied:
            self.not_applied[knob] = why

    def withdraw(self, knob: str, why: str) -> None:
        """A knob MODAK applied that turned out to measure nothing of its own (the
        script overrode it, or it never took hold): reported not applied, with why."""
        self.applied.pop(knob, None)
        self.not_applied[knob] = why

    # -- the clock -----------------------------------------------------------------
    def training_started(self) -> None:
        if self.t_train is None:
            self.t_train = time.perf_counter()

    def step_done(self) -> None:
        self.step_ends.append(time.perf_counter())
        if self.t_train is None:
            self.t_train = self.t_start
        steps = len(self.step_ends)
        if self.max_steps is not None and steps >= self.max_steps:
            self.stopped_by = "steps"
            raise StopTrial()
        if self.peers is not None:  # (rank 0's stop, in every rank: launched.py)
            stop = self.peers.stop()
            if stop is not None and steps >= stop:
                self.stopped_by = "time"
                raise StopTrial()
        if self.max_seconds is not None and \
                self.step_ends[-1] - self.t_start >= self.max_seconds:
            if self.leads_ranks():  # (they stop with it)
                self.peers.stop_after(steps + 1)
                return
            self.stopped_by = "time"
            raise StopTrial()

    def leads_ranks(self) -> bool:
        """Rank 0 of launched ranks that share a directory on this node (launched.py)."""
        return self.peers is not None and not self.peers.me.rank

    def next_model(self, same: bool) -> None:
        """A later model's steps begin with the next one (see ``models``)."""
        self.models.append((len(self.step_ends), same))
        self.effect["models_trained"] = 1 + len(self.models)

    # -- the time cap ----------------------------------------------------------------
    def arm_time_cap(self) -> None:
        """Stop the run at ``MODAK_MAX_SECONDS`` even inside a step (a compilation can
        take minutes before the first compiled step ends): a SIGALRM raises StopTrial
        wherever the main thread is, and again every :data:`ALARM_REPEAT_S` until the run
        has stopped: Python ignores (prints) an exception raised where it cannot propagate,
        in a weakref callback or a ``__del__``, and a cold Inductor compilation of a
        character-level LSTM (its cell stepped in Python), its alarm raised inside
        Dynamo's weakref callback, ran 67 s under a 9.7 s cap.  A
        script that sets its own SIGALRM handler keeps it; the cap is then checked at the
        end of each step only.  Armed again after ``disarm_time_cap`` (ranks that could
        not be started), it counts from the run's start as before."""
        if self.max_seconds is None or not hasattr(signal, "setitimer"):
            return
        handler = signal.getsignal(signal.SIGALRM)
        ours = self.alarm_handler is not None and handler is self.alarm_handler
        if handler is not signal.SIG_DFL and not ours:
            return
        session = self
        self.armed = True

        def on_alarm(signum, frame):
            if not session.armed:  # (one delivered as the run was ending)
                return
            if session.leads_ranks():
                # launched ranks stop together at the end of the step after the one under
                # way (the others may have ended this one: its collectives may be done),
                # unless that runs on past the grace: then here, and rank 0 ends the others
                from .launched import STOP_GRACE_S
                steps = len(session.step_ends)
                session.peers.stop_after(steps + 2)
                if time.perf_counter() - session.t_start < session.max_seconds + STOP_GRACE_S:
                    return
                session.peers.stop_after(steps)
                session.peers.cut = True  # (rank 0 ends the others: launched.Peers.end_others)
            session.stopped_by = "time"
            raise StopTrial()

        signal.signal(signal.SIGALRM, on_alarm)
        self.alarm_handler = on_alarm
        left = self.max_seconds - (time.perf_counter() - self.t_start)
        signal.setitimer(signal.ITIMER_REAL, max(left, 0.001), ALARM_REPEAT_S)

    def disarm_time_cap(self) -> None:
        self.armed = False
        if self.max_seconds is not None and hasattr(signal, "setitimer"):
            signal.setitimer(signal.ITIMER_REAL, 0)

    def time_cap_error(self) -> Optional[dict[str, Any]]:
        """Why a run stopped at its time cap measured no step time (None: it measured one,
        or the time cap did not stop it).  A record with it is ``capped``, not ``failed``:
        the configuration did not fail, its trial ran out of time (a compiler still
        compiling), and it is not barred from later plans."""
        if self.stopped_by != "time" or self.metrics().s_per_step is not None:
            return None
        steps = len(self.step_ends)
        where = ("before its first step ended" if not steps else
                 f"after {steps} step{'s' if steps > 1 else ''}, before a steady step time")
        still = (f", in the warm-up where {self.config.compiler} compiles"
                 if self.config.compiler != "off" and steps < COMPILED_STEPS else "")
        return {"type": "TimeCap", "knob": None,
                "message": f"stopped at its time cap of {self.max_seconds:g} s "
                           f"(MODAK_MAX_SECONDS) {where}{still}: nothing measured"}

    def loss_due(self) -> bool:
        """Whether the loss of the step under way is sampled (read it only then)."""
        return (len(self.step_ends) + 1) % self.loss_stride == 0

    def loss(self, value: float, step: Optional[int] = None) -> None:
        """A loss of step ``step`` (default: the step under way); sampled."""
        n = len(self.step_ends) + 1 if step is None else step
        self.last_loss = value
        if n % self.loss_stride:
            return
        if self.losses and self.losses[-1][0] == n:
            self.losses[-1][1] = value
            return
        self.losses.append([n, value])
        if len(self.losses) > MAX_LOSS_POINTS:  # keep every other point, sample half as often
            self.losses = self.losses[1::2] if self.losses[0][0] % 2 else self.losses[::2]
            self.loss_stride *= 2

    # -- a rank's measurements (ranks.py) ---------------------------------------------
    MEASURED = ("t_train", "step_ends", "models", "losses", "loss_stride", "last_loss", "stopped_by",
                "framework", "framework_version", "applied", "not_applied", "effect",
                "fingerprint", "accuracy", "steps_per_epoch")

    def measured(self) -> dict[str, Any]:
        """What a training rank measured, for the script's process to adopt; its finishers
        have run (:meth:`record`)."""
        state = {name: getattr(self, name) for name in self.MEASURED}
        state["peak_rss_mb"] = _peak_rss_mb()
        return state

    def adopt(self, state: dict[str, Any]) -> None:
        """Take a rank's measurements as this run's (the clock is the machine's monotonic
        one, shared by the processes): this process's own hooks saw no training, so its
        finishers, which would overwrite them, are dropped."""
        for name in self.MEASURED:
            setattr(self, name, state[name])
        self.rank_peak_rss_mb = state.get("peak_rss_mb")
        self.finishers = []

    def restart_clock(self, t_start: float) -> None:
        """A rank forked from the script's process starts measuring afresh, from the run's
        start."""
        self.t_start = t_start
        self.t_train, self.step_ends, self.losses, self.loss_stride = None, [], [], 1
        self.models = []
        self.last_loss, self.stopped_by, self.steps_per_epoch = None, None, None

    # -- the record ------------------------------------------------------------------
    def metrics(self) -> Metrics:
        ends = self.step_ends
        m = Metrics(steps=len(ends), wall_s=time.perf_counter() - self.t_start,
                    peak_rss_mb=max(_peak_rss_mb(), self.rank_peak_rss_mb or 0.0),
                    final_loss=self.last_loss, losses=self.losses, accuracy=self.accuracy,
                    end_loss=end_loss(self.losses, len(ends)),
                    start_loss=start_loss(self.losses), steps_per_epoch=self.steps_per_epoch)
        if self.t_train is not None:
            m.startup_s = self.t_train - self.t_start
        if len(ends) < 2 or (self.stopped_by == "time" and self.config.compiler != "off"
                             and len(ends) < COMPILED_STEPS):
            # (a compiled run its time cap stopped by the end of the step that compiled:
            # its one interval is the compilation, no step time)
            return m
        warm = self.warmup
        if warm is None:  # compilers need more than one step to settle
            warm = 3 if self.config.compiler != "off" else 2
        # each timed model's steps after its own warm-up: the first model's, and the later
        # ones' of its size (a compiler compiles each anew); no interval across two models.
        # A compiler compiles on the second step (the first one is measured eagerly for
        # the fingerprint): a warm-up must take in at least two steps
        bounds = [0] + [start for start, same in self.models] + [len(ends)]
        timed = [0] + [i + 1 for i, (start, same) in enumerate(self.models) if same]
        intervals: list[float] = []
        span = stall = 0.0
        for k in timed:
            seg = ends[bounds[k]:bounds[k + 1]]
            if len(seg) >= 2:
                cut = max(1, min(warm, len(seg) - 1))
                mine = [b - a for a, b in zip(seg[cut - 1:], seg[cut:])]
                intervals += mine
                span += seg[-1] - seg[cut - 1]
                stall += one_off_stall(mine)  # (each model's: it compiles anew)
        if not intervals:
            return m
        warm = max(1, min(warm, bounds[1] - 1))  # the first model's, whose warm-up is reported
        s = (span - stall) / len(intervals)
        m.warmup_steps, m.timed_steps = warm, len(intervals)
        m.s_per_step, m.steps_per_s = s, 1.0 / s
        m.s_per_step_median = statistics.median(intervals)
        if self.fingerprint.batch_size:  # (each micro-batch of an accumulated step)
            m.samples_per_s = self.fingerprint.batch_size * (
                self.fingerprint.micro_batches or 1) / s
        m.warmup_s = max(0.0, (ends[warm - 1] - (self.t_train or self.t_start)) - warm * s)
        if stall:
            m.stall_s = stall
            m.warmup_s += stall
        return m

    def record(self, status: str, error: Optional[dict[str, str]] = None) -> Record:
        self.status = status
        for finish in self.finishers:
            try:
                finish()
            except Exception as exc:  # a broken probe must not hide the run's figures
                self.effect.setdefault("probe_errors", []).append(repr(exc)[:200])
        self.effect["allocator"] = loaded_allocator()
        if status == "ok" and not self.step_ends:
            # a script that trains without an optimizer MODAK sees (torch.func's gradients
            # applied by hand, say): the model's knobs reached nothing, and were reported
            # neither applied nor not applied
            for knob, asked in (("precision", self.config.precision != "fp32"),
                                ("compiler", self.config.compiler != "off"),
                                ("channels_last", self.config.channels_last)):
                if asked and knob not in self.not_applied:
                    self.refuse(knob, "the script made no optimizer step MODAK counts (a "
                                "PyTorch torch.optim or a Keras optimizer's): no trained "
                                "model to apply it to")
        if self.stopped_by:  # which trial cap ended it: MODAK_MAX_STEPS or MODAK_MAX_SECONDS
            self.effect["stopped_by"] = {"steps": "MODAK_MAX_STEPS",
                                         "time": "MODAK_MAX_SECONDS"}[self.stopped_by]
        if self.config.allocator != "glibc":
            if self.effect["allocator"] == self.config.allocator:
                self.applied_knob("allocator", f"LD_PRELOAD={os.environ.get('LD_PRELOAD', '')}")
            else:
                self.refuse("allocator", f"{self.config.allocator} is not loaded "
                            f"(LD_PRELOAD={os.environ.get('LD_PRELOAD', '')!r})")
        return Record(workload=_env("MODAK_WORKLOAD") or os.path.basename(self.script),
                      workload_key=_env("MODAK_WORKLOAD_KEY"), framework=self.framework,
                      framework_version=self.framework_version, script=self.script,
                      run_id=_env("MODAK_RUN_ID"), status=status, config=self.config,
                      applied=self.applied, not_applied=self.not_applied, effect=self.effect,
                      metrics=self.metrics(), fingerprint=self.fingerprint, host=host_facts(),
                      error=error)
