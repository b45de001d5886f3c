"""python3 -m modak_runtime [--] SCRIPT [ARGS...]  |  python3 -m modak_runtime [--] -m MODULE [ARGS...]

Runs the script as ``python3 SCRIPT ARGS`` would (same ``sys.argv``, ``sys.path[0]`` and
``__main__``), with the plan's knobs applied, and prints its figure-of-merit record.  The
exit status is the script's.
"""
from __future__ import annotations

import os
import runpy
import signal
import sys
import time
from typing import Optional

from . import keras_support, launched, ranks, torch_support
from .record import emit
from .session import (Session, StopTrial, knobs_from_env, on_hard_exit, rank_error,
                      run_guarded, seed_the_run)

USAGE = "usage: python3 -m modak_runtime [--] SCRIPT [ARGS...] | -m MODULE [ARGS...]"


# how long a rank that failed waits for rank 0 to print its record and leave before it
# takes rank 0 as killed (launched.Peers.lost_rank_0)
LOST_RANK_0_WAIT_S = 10.0


class Terminated(BaseException):
    """SIGTERM (a scheduler's wall-time or cancel signal) reached the training."""


def handle_sigterm(session: Session) -> None:
    """In a container this process is PID 1, and the kernel drops signals that PID 1 has no
    handler for: without one, a scheduler's SIGTERM at the wall time would not stop the
    training (it would run on until the SIGKILL). The handler ends the script cleanly, so
    that its record (status failed, the reason) is still printed.  Once the script has
    ended (``session.ending``) it does nothing: the record is being made, and a SIGTERM
    then (torchrun's to every rank once one has failed) would leave none."""
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        def on_sigterm(signum, frame):
            if not session.ending:
                raise Terminated("terminated by SIGTERM (the scheduler's wall-time limit or "
                                 "a cancel)")
        signal.signal(signal.SIGTERM, on_sigterm)
        session.sigterm_handler = on_sigterm


def main(argv: Optional[list[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--"]:
        args = args[1:]
    module = None
    if args[:1] == ["-m"]:
        if len(args) < 2:
            print(USAGE, file=sys.stderr)
            return 2
        module, rest = args[1], args[2:]
        target = module
    elif args and not args[0].startswith("-"):
        target, rest = args[0], args[1:]
    else:
        print(USAGE, file=sys.stderr)
        return 2
    session = Session(knobs_from_env(), target)
    me = launched.launched()  # (one of the ranks torchrun, srun or mpirun started)
    if me is not None:
        launched.join(session, me)
    handle_sigterm(session)
    torch_support.install(session)
    keras_support.install(session)
    ranks.install(session)
    seed_the_run(session, me.rank if me is not None else 0)

    # what `python3 SCRIPT ARGS` would show the script
    if module is None:
        sys.argv = [target] + rest
        sys.path[0] = os.path.dirname(os.path.abspath(target))
    else:
        sys.argv = [module] + rest
        sys.path[0] = os.getcwd()

    def script() -> None:
        if module is None:
            runpy.run_path(target, run_name="__main__")
        else:
            runpy.run_module(module, run_name="__main__", alter_sys=True)

    if me is not None and me.rank:
        return _another_rank(session, me, script)
    # (a script that leaves by os._exit: its record is printed first)
    restore = on_hard_exit(lambda status, error: emit(session.record(status, error)),
                           session)
    status, error, code = run_guarded(session, script, terminated=Terminated)
    restore()
    sys.stdout.flush()
    peers = session.peers
    if peers is not None and status == "failed":
        # (after another rank's failure: the collective it left, the launcher's SIGTERM)
        failures = peers.failures(before=time.time())
        if failures:
            error = rank_error(*failures[0])
    emit(session.record(status, error))
    if peers is not None:
        if peers.stop_at is not None:  # (it stopped the run: the others stop with it)
            ends = session.step_ends
            step = ends[-1] - ends[-2] if len(ends) > 1 else 0.0
            peers.end_others(0.2 if peers.cut else max(launched.END_GRACE_S, 3 * step))
        else:
            peers.leave()
    terminated = (code == 128 + signal.SIGTERM and error
                  and error["type"].endswith(".Terminated"))
    if terminated or status == "capped":
        # the scheduler wants the processes gone, or a trial stopped at its cap has printed
        # all it is for: no interpreter shutdown (a framework's exit hooks, e.g. a compile
        # worker pool, could hold the job for its kill timeout; a trial's budget pays for
        # them), and what the run started ends with it (a compiler it left compiling would
        # run on beside the next trial)
        sys.stdout.flush()
        sys.stderr.flush()
        end_descendants()
        os._exit(code)
    return code


def _another_rank(session: Session, me: "launched.Launched", script) -> int:
    """A launched rank other than 0: it trains as rank 0 does and prints no record (the
    run's is rank 0's).  Its failure is left for rank 0 and said on its standard error;
    ended by rank 0's stop (a collective rank 0 left, its SIGTERM), it exits 0."""
    peers = session.peers

    def failed(status: str, error) -> None:
        if status == "failed" and peers is not None:
            peers.failed(error)

    runtimes = session.sigterm_handler
    if peers is not None and runtimes is not None and \
            signal.getsignal(signal.SIGTERM) is runtimes:
        def on_sigterm(signum, frame):  # (rank 0's, having stopped the run: no failure)
            if peers.stop() is not None and not session.ending:
                raise StopTrial()
            runtimes(signum, frame)
        signal.signal(signal.SIGTERM, on_sigterm)
        session.sigterm_handler = on_sigterm
    restore = on_hard_exit(failed, session)
    status, error, code = run_guarded(session, script, terminated=Terminated)
    restore()
    stopped = peers is not None and peers.stop() is not None
    if status == "failed" and not stopped:
        failed(status, error)
        error = {"message": "failed", **(error or {})}
        print(f"modak_runtime: rank {me.rank} of {me.ranks}: {error['message']}",
              file=sys.stderr)
        if peers is not None and peers.lost_rank_0(LOST_RANK_0_WAIT_S):
            # (killed: no record would say that the run failed, nor how)
            emit(session.record(status, rank_error(
                me.rank, error, before="rank 0 ended without its record (killed?); ")))
    if peers is not None:
        peers.leave()
    if status == "capped" or stopped:
        sys.stdout.flush()
        sys.stderr.flush()
        end_descendants()
        os._exit(0)
    return code


def end_descendants() -> None:
    """SIGTERM to every process this one started and theirs, as Linux lists them
    (``/proc/PID/task/TID/children``; nothing where it does not): the workers and the
    compilers a run stopped at its cap leaves, which outlived it (a C++ compilation of
    Inductor's ran on for 2 s after a trial stopped while compiling).  A process that
    ignores SIGTERM (multiprocessing's resource tracker) ends on its own, as its pipe
    closes."""
    seen: list[int] = []
    todo = [os.getpid()]
    while todo:
        pid = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{pid}/task/{task}/children") as f:
                    children = [int(c) for c in f.read().split()]
            except (OSError, ValueError):
                continue
            fresh = [c for c in children if c not in seen]
            seen += fresh
            todo += fresh
    for pid in seen:
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError:
            pass


if __name__ == "__main__":
    sys.exit(main())
