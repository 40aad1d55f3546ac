"""Host memory: when a machine runs out of it, the kernel's out-of-memory killer picks a process to
kill. A candidate that eats the host's memory must be the one it picks, never kbv's own process
(the run, its store, every verdict still to come) nor anything else on the machine.

- `make_first_choice`: the parent makes every process of each child (a candidate's, a build's, a
  reference's) the killer's first choice (`oom_score_adj` 1000) once the child has answered its
  first command, before it runs anything a candidate wrote; what those processes start inherits it.
  A process may lower its own score down to its floor (`oom_score_adj_min`, 0 unless set). Where
  kbv has CAP_SYS_RESOURCE (`can_set_floor`: root, unless a container took that capability away),
  that write also sets the floor to 1000, for those processes and all they start, so a candidate
  cannot lower its score again. Without that capability the floor stays 0: a candidate could lower
  its own score back.
- `kill_count`: the kernel's count of such kills (`oom_kill` of /proc/vmstat: every one on this
  host, a memory cgroup's included). A child that dies of a SIGKILL kbv did not send during a command
  in which the count went up is named as killed for host memory (`kbv.sandbox.parent`), not as a
  mystery crash.
"""

from __future__ import annotations

import contextlib

FIRST_CHOICE = 1000  # the largest oom_score_adj: killed before any process at a lower one


def make_first_choice(pids: list[int]) -> None:
    """Write the first-choice score into each of `pids` (their floor too, where this process may)."""
    for pid in pids:
        with contextlib.suppress(OSError):
            with open(f"/proc/{pid}/oom_score_adj", "w") as f:
                f.write(str(FIRST_CHOICE))


def can_set_floor() -> bool:
    """Whether this process has CAP_SYS_RESOURCE, with which its writes of a score set the floor too."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> 24 & 1)  # CAP_SYS_RESOURCE is capability 24
    except (OSError, ValueError):
        return False
    return False


def kill_count() -> int | None:
    """Processes the kernel's out-of-memory killer has killed on this host since boot; None where
    the kernel does not say."""
    try:
        with open("/proc/vmstat") as f:
            for line in f:
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None
