"""python3 -m modak_runtime [--] SCRIPT [ARGS...]  |  python3 -m modak_runtime [--] -m MODULE [ARGS...]

Runs the script as ``python3 SCRIPT ARGS`` would (same ``sys.argv``, ``sys.path[0]`` and
``__main__``), with the plan's knobs applied, and prints its figure-of-merit record.  The
exit status is the script's.
"""
from __future__ import annotations

import os
import re
import runpy
import signal
import sys
import traceback
from typing import Optional

from . import keras_support, torch_support
from .record import Config, emit
from .session import Session, StopTrial, knobs_from_env

USAGE = "usage: python3 -m modak_runtime [--] SCRIPT [ARGS...] | -m MODULE [ARGS...]"


def blame(exc: BaseException, config: Config) -> Optional[str]:
    """The knob a failure is most likely due to (None: the script's own failure)."""
    files = " ".join(f.filename for f in traceback.extract_tb(exc.__traceback__))
    text = f"{type(exc).__module__}.{type(exc).__name__}: {exc}"
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


def _short(text: str, limit: int = 500) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


class Terminated(BaseException):
    """SIGTERM (a scheduler's wall-time or cancel signal) reached the training."""


def _on_sigterm(signum, frame):
    raise Terminated("terminated by SIGTERM (the scheduler's wall-time limit or a cancel)")


def handle_sigterm() -> None:
    """In a container this process is PID 1, and the kernel drops signals that PID 1 has no
    handler for: without one, a scheduler's SIGTERM at the wall time would not stop the
    training (it would run on until the SIGKILL). The handler ends the script cleanly, so
    that its record (status failed, the reason) is still printed."""
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _on_sigterm)


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
    handle_sigterm()
    config = knobs_from_env()
    session = Session(config, target)
    torch_support.install(session)
    keras_support.install(session)

    # what `python3 SCRIPT ARGS` would show the script
    if module is None:
        sys.argv = [target] + rest
        sys.path[0] = os.path.dirname(os.path.abspath(target))
    else:
        sys.argv = [module] + rest
        sys.path[0] = os.getcwd()
    status, error, code = "ok", None, 0
    try:
        session.arm_time_cap()
        try:
            if module is None:
                runpy.run_path(target, run_name="__main__")
            else:
                runpy.run_module(module, run_name="__main__", alter_sys=True)
        finally:
            session.disarm_time_cap()
    except StopTrial:
        status = "capped"
        error = session.time_cap_error()
    except SystemExit as exc:
        if exc.code not in (None, 0):
            code = exc.code if isinstance(exc.code, int) else 1
            if not isinstance(exc.code, int):
                print(exc.code, file=sys.stderr)
            status = "failed"
            error = {"type": "SystemExit", "knob": None,
                     "message": _short(f"the script exited with status {exc.code}")}
    except BaseException as exc:  # the script's failure: report it, then exit non-zero
        traceback.print_exc()
        code = (130 if isinstance(exc, KeyboardInterrupt)
                else 128 + signal.SIGTERM if isinstance(exc, Terminated) else 1)
        knob = blame(exc, config)
        status = "failed"
        error = {"type": f"{type(exc).__module__}.{type(exc).__name__}", "knob": knob,
                 "message": _short(str(exc) or type(exc).__name__)}
        if knob:
            print(f"modak_runtime: the run failed under the knob {knob!r} "
                  f"({getattr(config, knob) if knob != 'compiler' else config.compiler})",
                  file=sys.stderr)
    sys.stdout.flush()
    emit(session.record(status, error))
    if code == 128 + signal.SIGTERM and error and error["type"].endswith(".Terminated"):
        # the scheduler wants the processes gone: no interpreter shutdown (a framework's
        # exit hooks, e.g. a compile worker pool, could hold the job for its kill timeout)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
