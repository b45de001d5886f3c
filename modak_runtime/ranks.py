"""Training ranks that the script starts itself with ``torch.multiprocessing`` (``mp.spawn``,
``mp.start_processes``), as PyTorch's DDP tutorial does.

The ranks are processes the runtime did not start: without this, none of their steps would
be timed and none of the plan's knobs applied (the run would measure nothing).  The function
the ranks run is wrapped (:class:`RankEntry`, pickled by reference like the function
itself).  In each rank a session applies the knobs and times the steps from the run's start
(the clock is the machine's monotonic one): a spawned rank installs a session of its own, a
forked one restarts the copy of the script process's.  Rank 0 writes what it measured to a
file, and the script's process adopts it when it joins the ranks: the run's record is rank
0's (its fingerprint is of one rank's batch; ``effect.ranks`` says how many ran).

Only rank 0 has the trial caps.  Once it has written its record it exits non-zero
(:data:`CAPPED_EXIT`), and ``ProcessContext.join`` then ends the other ranks: a rank that
stopped on its own would leave the others waiting in a collective.
"""
from __future__ import annotations

import os
import pickle
import signal
import sys
import tempfile
from typing import Any, Callable, Optional

from . import torch_support
from .hooks import when_imported
from .session import (RankFailed, Session, StopTrial, knobs_from_env, on_hard_exit,
                      rank_error, run_guarded, seed_the_run, short)

# rank 0's exit status after its trial cap stopped it and its record is written
CAPPED_EXIT = 75
# the script process's session; a forked rank finds its copy here (a spawned rank: None)
_SESSION: Optional[Session] = None


def install(session: Session) -> None:
    when_imported("torch", lambda torch: _patch(session, torch))


def _patch(session: Session, torch) -> None:
    module = sys.modules.get("torch.multiprocessing.spawn")
    if module is None or not hasattr(module, "start_processes"):
        return
    original = module.start_processes

    def start_processes(fn, args=(), nprocs=1, join=True, daemon=False, start_method="spawn"):
        return _start(session, original, fn, args, nprocs, join, daemon, start_method)

    start_processes.__wrapped__ = original
    module.start_processes = start_processes  # (mp.spawn calls it by this name)
    torch.multiprocessing.start_processes = start_processes


def _start(session: Session, original: Callable, fn, args, nprocs: int, join: bool,
           daemon: bool, start_method: str):
    global _SESSION
    fd, out = tempfile.mkstemp(prefix="modak-rank0-", suffix=".pickle")
    os.close(fd)
    _SESSION = session
    armed = session.armed
    session.disarm_time_cap()  # (rank 0 has the cap now)
    try:
        context = original(RankEntry(fn, session.script, session.t_start, out), args, nprocs,
                           False, daemon, start_method)
    except BaseException:  # (no ranks to join: nothing will remove the reports' files)
        _remove_reports(out, nprocs)
        if armed:  # (no rank 0 to stop the run: the script's process has the cap again)
            session.arm_time_cap()
        raise
    context.join = _Joiner(session, context.join, out, nprocs, start_method)
    if not join:
        return context
    while not context.join():
        pass
    return None


def _report_file(out: str, index: int) -> str:
    """Where rank ``index`` leaves its report (rank 0's measurements, another's failure)."""
    return f"{out}.{index}"


def _remove_reports(out: str, nprocs: int) -> None:
    """Remove rank 0's file and every rank's report (and one a rank was writing when it
    was killed), those that exist."""
    reports = [_report_file(out, i) for i in range(nprocs)]
    for name in [out] + reports + [r + ".part" for r in reports]:
        try:
            os.unlink(name)
        except OSError:
            pass


class RankEntry:
    """What each rank runs in place of the script's function."""

    def __init__(self, fn: Callable, script: str, t_start: float, out: str):
        self.fn, self.script, self.t_start, self.out = fn, script, t_start, out

    def __call__(self, index: int, *args: Any) -> None:
        session = _SESSION
        if session is None:  # spawned: a fresh interpreter, its script imported as __mp_main__
            session = Session(knobs_from_env(), self.script)
            torch_support.install(session)
            seed_the_run(session, index)  # (a trial's: its script's function draws alike)
        else:  # forked: the script process's handlers, whose session is a copy
            if session.alarm_handler is not None and \
                    signal.getsignal(signal.SIGALRM) is session.alarm_handler:
                signal.signal(signal.SIGALRM, signal.SIG_DFL)  # (the cap is armed anew)
            if index != 0 and session.sigterm_handler is not None and \
                    signal.getsignal(signal.SIGTERM) is session.sigterm_handler:
                # (join's SIGTERM ends it at once, even inside a collective's wait)
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
        session.restart_clock(self.t_start)
        if index != 0:
            session.max_steps = session.max_seconds = None

        def report(status: str, error: Optional[dict[str, Any]]) -> None:
            # rank 0's measurements; another's failure, or that its function returned (a
            # rank that dies after it, in the interpreter's shutdown, is told apart)
            if index == 0:
                session.record(status, error)  # (its finishers complete the fingerprint)
            # (whole or not at all: join reads it once this rank has ended, however)
            path = _report_file(self.out, index)
            with open(path + ".part", "wb") as f:
                pickle.dump({"status": status, "error": error,
                             "measured": session.measured() if index == 0 else None}, f)
            os.replace(path + ".part", path)

        restore = on_hard_exit(report, session)  # (a function that leaves by os._exit)
        status, error, code = run_guarded(session, lambda: self.fn(index, *args))
        restore()
        # the function has ended: join's SIGTERM (another rank ended first, as one aborted
        # in its interpreter's shutdown does) no longer cuts this rank's report short; a CI
        # run on a busy machine lost rank 0's measurements so.  Its exit follows the report,
        # and join kills a rank that has not exited 30 s after its SIGTERM
        try:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        except (ValueError, OSError):  # (not the main thread)
            pass
        report(status, error)
        sys.stdout.flush()
        sys.stderr.flush()
        if status == "capped" and index == 0:
            os._exit(CAPPED_EXIT)
        if status == "failed":
            raise SystemExit(code or 1)


def _after_return(exc: BaseException, index: int) -> dict[str, Any]:
    """The record's ``error`` for a rank whose function returned and whose process was
    then ended by a signal, in the interpreter's shutdown: the training was over.
    (PyTorch 2.13's gloo can abort a rank there: a worker thread that frees a finished
    collective's Python context once the interpreter is going.)"""
    return {"type": f"{type(exc).__module__}.{type(exc).__name__}", "knob": None,
            "message": short(f"rank {index}: its function returned, then its process was "
                             f"ended by {exc.signal_name} in the interpreter's shutdown, "
                             "after the training")}


class _Joiner:
    """``ProcessContext.join`` that adopts rank 0's measurements once the ranks are done,
    or when one of them ended the run."""

    def __init__(self, session: Session, join: Callable, out: str, nprocs: int, method: str):
        self.session, self.join, self.out = session, join, out
        self.nprocs, self.method = nprocs, method

    def __call__(self, *args: Any, **kwargs: Any) -> bool:
        try:
            done = self.join(*args, **kwargs)
        except BaseException as exc:
            rank0 = self._adopt()
            index = getattr(exc, "error_index", None)
            ended = self._report(index) if index else rank0  # (the rank join found ended)
            self._clean()
            if index and ended is not None and ended["error"]:  # (join ended rank 0 for it)
                raise RankFailed(rank_error(index, ended["error"])) from exc
            if ended is not None and ended["status"] == "ok" and \
                    getattr(exc, "signal_name", None):
                raise RankFailed(_after_return(exc, index or 0)) from exc
            if rank0 is not None and rank0["status"] == "capped":
                raise StopTrial() from None
            if rank0 is not None and rank0["status"] == "failed" and rank0["error"]:
                raise RankFailed(rank0["error"]) from exc
            raise
        if done:
            rank0 = self._adopt()
            self._clean()
            if rank0 is not None and rank0["status"] == "capped":
                raise StopTrial()
        return done

    def _report(self, index: int) -> Optional[dict[str, Any]]:
        try:
            with open(_report_file(self.out, index), "rb") as f:
                return pickle.load(f)
        except (OSError, EOFError, pickle.UnpicklingError):
            return None  # (ended before it wrote, by another rank's failure or a signal)

    def _adopt(self) -> Optional[dict[str, Any]]:
        rank0 = self._report(0)
        if rank0 is None:
            return None
        measured = rank0["measured"]
        if measured["step_ends"] or not self.session.step_ends:
            # (a later spawn that trains nothing, an evaluation's, does not replace it)
            self.session.adopt(measured)
            self.session.effect.update(ranks=self.nprocs, rank_start_method=self.method)
        return rank0

    def _clean(self) -> None:
        _remove_reports(self.out, self.nprocs)
