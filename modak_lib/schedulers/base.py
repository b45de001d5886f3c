"""What every scheduler provides, in one file per scheduler.

- for the job script: its directives, the variables naming the job and its submit
  directory, the launcher that starts the job's tasks;
- for the front-end: ``control()``, the data that ``plugins/module_utils/modak_jobctl.py``
  executes (standard library only, on the front-end's own Python): the submit, query,
  cancel and find commands, how to read their output, and how native states, exit codes
  and the scheduler's messages in the job's output map to MODAK's portable states.
  The plan carries it (``Plan.job_control``), so the front-end needs nothing else.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Optional

from ..models import JobOptions, Launcher

# The portable states (the front-end reports these).  ENDED, in a state map, means "ended,
# how is not said": the job's output decides (the scheduler's marks, then the job's own
# last line with its exit code).
PORTABLE = ("PENDING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "COMPLETED",
            "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
            "BOOT_FAIL", "DEADLINE", "UNKNOWN", "ENDED")


@dataclass(frozen=True)
class Resources:
    """What the planner asks the scheduler for."""
    nodes: int
    tasks_per_node: int
    cpus_per_task: int
    gpus_per_node: int
    walltime_s: Optional[int]
    memory_gb: Optional[float]
    partition: Optional[str]
    stdout: str
    stderr: Optional[str]  # None: combined with stdout


class SchedulerSpec(ABC):
    name: str
    aliases: tuple[str, ...] = ()  # other names a request may use for it
    directive_prefix: str = ""
    # what starts a job's tasks (the planner's outer launcher): for several tasks, and also
    # for a single one where ``launch_single`` (Slurm: the step is then the scheduler's own)
    launcher: Launcher = Launcher.mpirun
    launch_single: bool = False
    # variables the scheduler sets in the job: its id (the first one set wins; the shell's
    # own pid without a scheduler), and the directory it was submitted from where the job
    # does not start there (PBS starts in the home directory)
    job_id_vars: tuple[str, ...] = ()
    submit_dir_vars: tuple[str, ...] = ()

    @abstractmethod
    def directives(self, job: JobOptions, res: Resources, run_id: str = "") -> list[str]:
        """Header lines (already validated values: no quoting needed, none allowed).
        ``run_id``: the run's ("" while the run id, a hash of the script, is computed): a
        scheduler that keeps no comment for its ``find`` names the job by it (PBS)."""

    def job_problems(self, job: JobOptions) -> list[tuple[str, str]]:
        """What this scheduler refuses of job options that MODAK's own patterns accept, as
        (field path, message) pairs: the plan stops with them, before anything is
        submitted.  No problem (an empty list) by default."""
        return []

    @abstractmethod
    def control(self) -> dict[str, Any]:
        """The front-end's job control as data (JSON), for ``modak_jobctl``:

        - ``submit``: ``argv`` (placeholders ``{script}``, ``{stdout}``, ``{stderr}``,
          ``{run_id}``), ``stderr`` / ``no_stderr`` (inserted before the script's word),
          ``stdin`` (a placeholder whose file is the command's input), ``job_id`` (a
          regular expression whose first group, searched in the output, is the id);
        - ``queries``: asked in order until one knows the job.  Each has ``argv`` (``{job_id}``)
          and reads either ``split`` (a separator; ``fields`` names the columns of the first
          line), ``pairs: words`` (KEY=VALUE words) or ``records`` (a full listing, read as
          ``find`` reads it; the first job in it); for the last two, ``fields`` maps MODAK's
          names ``state``, ``exit``, ``reason``, ``host`` to the scheduler's keys.
          ``active_only``: its final states are not trusted (the next query is asked).
          ``quiet_failure``: a failed call goes on to the next query even when it looks
          like the scheduler did not answer;
        - ``states``: the native state word -> a portable state (``PORTABLE``);
          ``marked``: states whose end the output's ``marks`` may settle at once;
        - ``exit``: ``code:signal`` (``N:S``) or ``int`` (with ``codes``: exit code ->
          state, ``signal_from``: codes from which it is a signal, ``signalled``: the state);
        - ``marks``: [text, state]: what the scheduler writes into the job's output when it
          ends the job (a time limit, a cancel, the OOM killer);
        - ``never_started``: {``state``, ``without``}: the native state and the fields
          missing when a job was deleted before it ran;
        - ``stuck`` (optional): {``reasons``: shell-style patterns of a pending job's
          reason for which it never starts as it is, ``says``: what that means}: the wait
          cancels such a job and fails, saying why;
        - ``cancel``: argv; ``find`` (optional): argv (``{user}``), either ``split`` and
          ``fields`` (the columns of each line, ``job_id`` among them) or ``records`` (the
          line that starts each job, the job's id after it, then ``KEY = VALUE`` lines:
          ``fields`` maps MODAK's names to the keys), and ``match`` ({field: a shell-style
          pattern with ``{run_id}`` and ``{user}``}): a job of this run the scheduler knows,
          for when the front-end lost its record;
        - ``silent``: a regular expression for the scheduler's "not answering" messages,
          added to the generic ones.
        """

    def job_control(self) -> dict[str, Any]:
        return {"name": self.name, **self.control()}
