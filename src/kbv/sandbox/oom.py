"""Host memory: when a machine runs out of it, the kernel's out-of-memory killer picks a process to
kill. A candidate that eats the host's memory must be the one it picks, never kbv's own process
(the run, its store, every verdict still to come) nor anything else on the machine.

- `volunteer`: every child (a candidate's, a build's, a reference's) makes itself the killer's first
  choice (`oom_score_adj` 1000), before it runs anything a candidate wrote. Raising one's own score
  needs no privilege; lowering it again does, which a child has not (it has dropped them, or runs
  as the user who started kbv, whose processes cannot lower it either without CAP_SYS_RESOURCE).
- `kill_count`: the kernel's count of such kills (`oom_kill` of /proc/vmstat: every one on this
  host, a memory cgroup's included). A child that dies of a SIGKILL kbv did not send, while the count
  went up, is named as killed for host memory (`kbv.sandbox.parent`), not as a mystery crash.
"""

from __future__ import annotations

import contextlib

FIRST_CHOICE = 1000  # the largest oom_score_adj: killed before any process at a lower one


def volunteer() -> None:
    """Make this process (and what it starts) the out-of-memory killer's first choice."""
    with contextlib.suppress(OSError):
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write(str(FIRST_CHOICE))


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
