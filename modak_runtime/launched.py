"""Training ranks that a launcher started, each a process running the runtime: ``torchrun``
(the job script starts a PyTorch job's ranks on one node with it), a Slurm step's tasks
(``srun``) and MPI's (``mpirun``: Open MPI's, MPICH's, Intel MPI's).

Each rank applies the knobs and times its steps as a single process does.  The run's record
is rank 0's (its fingerprint is of one rank's batch; ``effect.ranks`` and
``effect.launcher`` say how many ran and what started them); another rank prints none, or
the store would hold the run once per rank.  A rank other than 0 that fails leaves its
error where rank 0 finds it (:class:`Peers`), and rank 0's record, where rank 0 failed
after it (a collective whose peer is gone, or the launcher's SIGTERM), names it: "rank 1:
...".  Where rank 0 ended without its record (killed: out of memory, a signal), the first
other rank that failed after it prints the record instead, its error saying so: the store
keeps the run's failure, and its configuration is not offered again.

A trial's caps must stop every rank after the same step: a rank that stops alone leaves the
others waiting in a collective for a step it never takes.  (Measured here before: torchrun's
rank 1 started 0.4 s after rank 0, each rank's own time cap stopped rank 0 a step before
rank 1, rank 1 failed with gloo's "Connection closed by peer" and torchrun with exit status
1; under NCCL it would have waited for its collective's timeout.)  The step cap does so by
itself: every rank counts the same optimizer steps.  The time cap is rank 0's to decide.
Once rank 0's clock passes it, rank 0 writes that the run stops after a step that no other
rank can have ended yet (each step's gradients wait for rank 0's): at the end of one of its
steps, the next one; from its alarm inside a step, the one after that (the others may have
ended the step under way, its collectives done).  It ends that step too; every other rank
reads the stop at the end of each of its steps (a file opened, or not there: a few µs) and
stops there.  A step that has not ended :data:`STOP_GRACE_S` after the cap (a compilation
longer than the cap) is stopped where it is, as a single process's is: rank 0 writes that
the run stops now, prints its record and ends the other ranks (SIGTERM; SIGKILL for one
still there after :data:`END_GRACE_S`, waiting in a collective).  A rank ended by rank 0's
stop prints nothing and exits 0.

The ranks share a directory for this (in the temporary directory, its name from the
launcher's id for the run), so only ranks on rank 0's node are coordinated: ranks on other
nodes keep caps of their own, as before (MODAK starts a multi-node job's ranks with the
scheduler's launcher, which ends the others when one exits non-zero).  Another rank on the
node keeps a cap of its own too, :data:`RANK_CAP_SLACK_S` later than rank 0's: where the
ranks do not in fact share the directory (each in a container of its own, with its own
``/tmp``), it still stops.
"""
from __future__ import annotations

import hashlib
import json
import os
import signal
import stat
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Mapping, Optional

# how long after the time cap rank 0 waits for the step under way to end before it stops
# the run inside it (its alarm repeats every session.ALARM_REPEAT_S until then)
STOP_GRACE_S = 1.0
# how long after the time cap another rank stops by its own clock, where rank 0 has not
# stopped it by then: longer than rank 0 takes to stop the run (a step, or STOP_GRACE_S
# and END_GRACE_S), and than the ranks' starts may be apart
RANK_CAP_SLACK_S = 5.0
# how long rank 0, having stopped, waits for the other ranks to end before SIGTERM, and
# after SIGTERM before SIGKILL
END_GRACE_S = 2.0


@dataclass(frozen=True)
class Launched:
    """This process's place among the ranks a launcher started."""
    launcher: str      # torchrun, srun, mpirun
    rank: int
    ranks: int
    local: bool        # every rank runs on this node
    run: str           # the launcher's id for this start of the ranks
    local_rank: Optional[int] = None   # its place among the ranks on its node (if said)
    local_ranks: Optional[int] = None  # how many ranks run on its node (if said)


def _int(environ: Mapping[str, str], name: str) -> Optional[int]:
    try:
        return int(environ.get(name, "").strip())
    except ValueError:
        return None


# torchrun's variables, which a script written for it reads (``init_process_group()`` with
# the env:// rendezvous, ``LOCAL_RANK`` for its device)
TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                      "MASTER_PORT")
# where no job script gave the rendezvous a port: this plus the job's number modulo
# PORT_SPAN (under the kernel's default ephemeral ports, 32768 and up)
PORT_BASE, PORT_SPAN = 20000, 10000


def _tasks_on_node(spec: str, node: int) -> Optional[int]:
    """The tasks a Slurm step runs on its node ``node``, from ``SLURM_STEP_TASKS_PER_NODE``
    (``2(x3),1``: 2 on each of the first three nodes, 1 on the fourth)."""
    first = 0  # (the first node of each part)
    for part in spec.split(","):
        tasks, times = (part.strip().split("(x", 1) + [""])[:2]
        if times and not times.endswith(")"):
            return None
        try:
            count, nodes = int(tasks), int(times[:-1]) if times else 1
        except ValueError:
            return None
        if first <= node < first + nodes:
            return count
        first += nodes
    return None


def torchrun_variables(me: Launched, environ: Optional[Mapping[str, str]] = None
                       ) -> dict[str, str]:
    """What ``torchrun`` would have set for this rank, where a scheduler's launcher (srun,
    mpirun) started it and the variable is not set: its rank and how many ran, its place on
    its node, and where the ranks meet (``MASTER_ADDR``/``MASTER_PORT``: the job script's,
    else, in a Slurm step, the address of the node srun ran on, where rank 0 runs, and a
    port from the job's number).  Without them a script written for torchrun fails in
    ``init_process_group()``, or each rank trains alone.  Nothing for torchrun's own ranks."""
    env = os.environ if environ is None else environ
    if me.launcher == "torchrun":
        return {}
    addr = port = None
    if me.launcher == "srun":
        addr = env.get("SLURM_LAUNCH_NODE_IPADDR") or None
        job = _int(env, "SLURM_JOB_ID")
        port = PORT_BASE + job % PORT_SPAN if job is not None else None
    values = (me.rank, me.ranks, me.local_rank, me.local_ranks, addr, port)
    return {name: str(value) for name, value in zip(TORCHRUN_VARIABLES, values)
            if value is not None and not env.get(name)}


def join(session: Any, me: Launched) -> None:
    """Make ``session`` rank ``me.rank`` of launched ranks: its record says how many ran;
    where they all run on this node and share a directory, rank 0 decides when the time cap
    stops the run (another rank's own cap comes :data:`RANK_CAP_SLACK_S` later).  A rank
    that srun or mpirun started gets torchrun's variables (:func:`torchrun_variables`); the
    record names those set."""
    session.effect.update(ranks=me.ranks, launcher=me.launcher)
    given = torchrun_variables(me)
    if given:
        os.environ.update(given)
        session.effect["torchrun_variables"] = " ".join(given)
    if not me.local:
        return
    peers = Peers(me)
    if peers.usable:
        session.peers = peers
        if me.rank and session.max_seconds is not None:
            # (rank 0's word comes first; its own cap, later, holds where the directory is
            # not rank 0's too: each rank in a container of its own, with its own /tmp)
            session.max_seconds += max(RANK_CAP_SLACK_S, 0.25 * session.max_seconds)


def launched(environ: Optional[Mapping[str, str]] = None) -> Optional[Launched]:
    """The rank a launcher's variables give this process, or None: not one of several
    ranks (a launcher's single rank is a run of its own)."""
    env = os.environ if environ is None else environ
    # (launcher, rank, ranks, its place on its node, how many there, the launch's id)
    found: Optional[tuple[str, Optional[int], Optional[int], Optional[int], Optional[int],
                          str]] = None
    if env.get("TORCHELASTIC_RUN_ID"):  # torchrun (torch.distributed.run)
        found = ("torchrun", _int(env, "RANK"), _int(env, "WORLD_SIZE"),
                 _int(env, "LOCAL_RANK"), _int(env, "LOCAL_WORLD_SIZE"),
                 f"{env['TORCHELASTIC_RUN_ID']}.{env.get('TORCHELASTIC_RESTART_COUNT', '0')}")
    elif env.get("OMPI_COMM_WORLD_SIZE"):  # Open MPI's mpirun (under Slurm too: its own)
        found = ("mpirun", _int(env, "OMPI_COMM_WORLD_RANK"), _int(env, "OMPI_COMM_WORLD_SIZE"),
                 _int(env, "OMPI_COMM_WORLD_LOCAL_RANK"),
                 _int(env, "OMPI_COMM_WORLD_LOCAL_SIZE"),
                 env.get("PMIX_NAMESPACE") or env.get("OMPI_MCA_ess_base_jobid") or "")
    elif env.get("PMI_SIZE"):  # MPICH's and Intel MPI's mpirun (no id of the launch known:
        # the ranks print one record, but their time caps are their own)
        found = ("mpirun", _int(env, "PMI_RANK"), _int(env, "PMI_SIZE"),
                 _int(env, "MPI_LOCALRANKID"), _int(env, "MPI_LOCALNRANKS"), "")
    elif env.get("SLURM_STEP_ID") and env.get("SLURM_JOB_ID"):  # a task of an srun step
        nodes = _int(env, "SLURM_STEP_NUM_NODES")
        ranks = _int(env, "SLURM_STEP_NUM_TASKS")
        node = _int(env, "SLURM_NODEID")
        found = ("srun", _int(env, "SLURM_PROCID"), ranks, _int(env, "SLURM_LOCALID"),
                 ranks if nodes == 1 else None if node is None else
                 _tasks_on_node(env.get("SLURM_STEP_TASKS_PER_NODE", ""), node),
                 f"{env['SLURM_JOB_ID']}.{env['SLURM_STEP_ID']}")
    if found is None:
        return None
    launcher, rank, ranks, local_rank, local_ranks, run = found
    if rank is None or ranks is None or ranks < 2 or not 0 <= rank < ranks:
        return None
    return Launched(launcher, rank, ranks, local_ranks == ranks and bool(run), run,
                    local_rank, local_ranks)


class Peers:
    """The ranks of one run on this node, through a directory they share: each rank's pid
    (``pid.N``), rank 0's stop (``stop``: the steps after which the run stops) and another
    rank's failure (``failed.N``: its record's error)."""

    def __init__(self, me: Launched, root: Optional[str] = None):
        self.me = me
        digest = hashlib.sha256(f"{me.launcher}:{me.run}".encode()).hexdigest()[:16]
        self.dir = os.path.join(root or tempfile.gettempdir(),
                                f"modak-ranks-{os.getuid()}-{digest}")
        self.stop_at: Optional[int] = None  # (rank 0: the stop it wrote)
        self.cut = False  # (rank 0: it stopped the run inside a step)
        self.usable = self._make_dir()
        if self.usable:
            self._write(f"pid.{me.rank}", str(os.getpid()))

    def _make_dir(self) -> bool:
        try:
            os.mkdir(self.dir, 0o700)
        except FileExistsError:
            pass
        except OSError:
            return False
        try:  # (a shared temporary directory: another user's, or a link, is not ours)
            st = os.lstat(self.dir)
        except OSError:
            return False
        ours = (stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid()
                and not st.st_mode & 0o077)
        if not ours:
            print(f"modak_runtime: {self.dir} is not this user's own directory: the ranks' "
                  "trial caps are not coordinated", file=sys.stderr)
        return ours

    def _path(self, name: str) -> str:
        return os.path.join(self.dir, name)

    def _write(self, name: str, text: str) -> None:
        tmp = self._path(f".{name}.{os.getpid()}")
        try:
            with open(tmp, "w") as f:
                f.write(text)
            os.replace(tmp, self._path(name))
        except OSError:
            pass

    # -- rank 0 ------------------------------------------------------------------------
    def stop_after(self, steps: int) -> None:
        """Tell the other ranks that the run stops once ``steps`` steps have ended."""
        if not self.usable or (self.stop_at is not None and self.stop_at <= steps):
            return
        self.stop_at = steps
        self._write("stop", str(steps))

    def failures(self, before: float) -> list[tuple[int, dict[str, Any]]]:
        """The errors of the other ranks that failed before ``before`` (time.time()), by
        rank."""
        out = []
        for index in range(1, self.me.ranks):
            try:
                with open(self._path(f"failed.{index}")) as f:
                    report = json.load(f)
                if float(report["at"]) <= before and isinstance(report["error"], dict):
                    out.append((index, report["error"]))
            except (OSError, ValueError, KeyError, TypeError):
                continue
        return out

    def end_others(self, grace: float) -> None:
        """Once rank 0 has stopped the run: wait ``grace`` seconds for the other ranks to
        end, SIGTERM those still there, and SIGKILL those still there after
        :data:`END_GRACE_S`; then remove the directory."""
        if not self.usable:
            return
        for sig, wait in ((None, grace), (signal.SIGTERM, END_GRACE_S),
                          (signal.SIGKILL, 0.5)):
            left = self._others()
            if not left:
                break
            if sig is not None:
                for pid in left.values():
                    try:
                        os.kill(pid, sig)
                    except OSError:
                        pass
            end = time.monotonic() + wait
            while self._others() and time.monotonic() < end:
                time.sleep(0.02)
        self.remove()

    def _others(self) -> dict[int, int]:
        """The other ranks still running: their pids."""
        out = {}
        for index in range(1, self.me.ranks):
            pid = self._running(index)
            if pid is not None:
                out[index] = pid
        return out

    def _running(self, index: int) -> Optional[int]:
        """Rank ``index``'s pid, where its file names a process of the runtime that runs
        (None: it left, or ended without leaving, its number perhaps taken by another)."""
        try:
            with open(self._path(f"pid.{index}")) as f:
                pid = int(f.read().strip())
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                return pid if b"modak_runtime" in f.read() else None
        except (OSError, ValueError):
            return None

    def remove(self) -> None:
        try:
            for name in os.listdir(self.dir):
                os.unlink(self._path(name))
            os.rmdir(self.dir)
        except OSError:
            pass

    # -- every rank / another rank ---------------------------------------------------------
    def stop(self) -> Optional[int]:
        """The steps after which rank 0 stops the run (None: it has not said); rank 0's own
        word, in rank 0."""
        if not self.me.rank:
            return self.stop_at
        try:
            with open(self._path("stop")) as f:
                return int(f.read().strip())
        except (OSError, ValueError):
            return None

    def lost_rank_0(self, wait: float) -> bool:
        """Whether rank 0 ended without leaving (killed: its record never printed) and this
        rank is the first to find so, waiting up to ``wait`` seconds for rank 0 to leave or
        end; False where it left (its record printed) or is still running."""
        end = time.monotonic() + wait
        while os.path.exists(self._path("pid.0")):  # (gone: it left, or never came)
            if self._running(0) is None:  # (the first rank to find so prints the record)
                try:
                    os.close(os.open(self._path("record"), os.O_CREAT | os.O_EXCL, 0o600))
                except OSError:
                    return False
                return True
            if time.monotonic() >= end:
                return False
            time.sleep(0.05)
        return False

    def failed(self, error: Optional[dict[str, Any]]) -> None:
        self._write(f"failed.{self.me.rank}", json.dumps({"at": time.time(),
                                                          "error": error or {}}))

    def leave(self) -> None:
        """This rank is done (its record made, where it is rank 0): its pid goes, and the
        last rank out removes the directory."""
        if not self.usable:
            return
        try:
            os.unlink(self._path(f"pid.{self.me.rank}"))
            if all(self._running(int(n[4:])) is None
                   for n in os.listdir(self.dir) if n.startswith("pid.")):
                self.remove()  # (the others left, or ended without leaving: killed)
        except (OSError, ValueError):
            pass
