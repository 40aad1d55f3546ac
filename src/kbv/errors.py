"""Every exception kbv raises, in one tree.

A bad candidate is data (a verdict), never an exception: these are raised only for bad *input*
(problem files, candidate files, options) and for a broken harness.

    KbvError                       base of all; the CLI prints its message and exits non-zero
    ├── UsageError                 an option or argument that cannot be honoured
    │   └── SandboxUnavailable     --sandbox strict where full isolation cannot be had
    ├── ProblemError               a problem file that cannot be used (names the file)
    │   ├── ProblemLoadError       syntax error, missing Model/get_inputs/get_init_inputs, import failure
    │   ├── ProblemRunError        get_inputs()/get_init_inputs()/Model(...) raised or returned junk
    │   ├── UnsoundProblemError    the verified protocol cannot judge it (no input distribution applies);
    │   │                          its runner turns this into an `unsound_problem` verdict per candidate
    │   └── RunFailure             not the problem's fault nor the candidate's: the run could not judge a
    │                              pair (kbv's own memory ran out, the host's memory ran short); stored
    │                              like a problem's failure, and tried again when the run resumes
    ├── CandidateSourceError       a candidate file/dir/JSONL that cannot be read or paired at all
    ├── StoreError                 the results database is unreadable or belongs to another schema
    ├── ServiceError               `kbv serve` refused a request (its HTTP status), or could not be
    │                              reached (`kbv.client`: no status)
    └── HarnessError               kbv itself failed (never a candidate's fault)
        └── SandboxError           a child process could not be started or spoke out of protocol
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence


class KbvError(Exception):
    """Base class: a message fit to print as one line."""


def first_line(exc: BaseException, limit: int = 300) -> str:
    """The first line of `exc`'s message (its type's name where it has none), at most `limit` characters."""
    return (str(exc).splitlines() or [type(exc).__name__])[0][:limit]


class UsageError(KbvError):
    """An option or argument that cannot be honoured."""


class SandboxUnavailable(UsageError):
    """`--sandbox strict`, where full isolation (bubblewrap's namespaces) cannot be had."""


class ProblemError(KbvError):
    """A problem that cannot be used; the message names its file."""


class ProblemLoadError(ProblemError):
    """The problem's source does not compile or lacks the three names of the contract."""


class ProblemRunError(ProblemError):
    """The problem's own code raised (get_inputs, get_init_inputs, Model construction or forward)."""


class UnsoundProblemError(ProblemError):
    """The problem runs, but no candidate of it can be judged: on every input distribution the
    reference's output is degenerate (all zero, constant, not finite)."""


class RunFailure(ProblemError):
    """The run could not judge a pair, through no fault of the problem or the candidate (kbv itself ran
    out of the device's memory; the host ran out of memory that others took). No verdict is stored;
    the failure is, and a resumed run tries the pair again."""


class DeviceRoomFailure(RunFailure):
    """A buffer kbv itself makes in a candidate's child (the inputs it hands over, the outputs it takes
    back) found no room on the device while the child held little of it: the memory is the run's other
    problems' or other processes'. A lane tries the pair once more after releasing what it holds."""


class CandidateSourceError(KbvError):
    """Candidate input that cannot be read at all (missing path, malformed JSONL, bad layout)."""


class StoreError(KbvError):
    """The results database cannot be opened or is of an incompatible schema."""


class ServiceError(KbvError):
    """A request `kbv serve` refused, with the HTTP status it answers (400 malformed, 401 token,
    404 unknown problem, 413 too large, 429 queue full, 500 kbv or the problem failed, 503 stopping).
    `kbv.client` raises it too, with the service's status and message, or `status` None when the
    service could not be reached."""

    def __init__(self, status: int | None, message: str) -> None:
        super().__init__(message)
        self.status = status


class HarnessError(KbvError):
    """kbv failed; a run never scores a candidate 0 because of this."""


class SandboxError(HarnessError):
    """A child process could not be started, or broke the wire protocol in a way kbv caused."""


def close_matches(name: str, choices: Iterable[str]) -> list[str]:
    """The (at most three) choices closest to `name`, closest first."""
    return difflib.get_close_matches(name, list(choices), n=3, cutoff=0.6)


def suggestion(close: Sequence[str]) -> str:
    """' Did you mean X or Y?', or '' for none."""
    return " Did you mean " + " or ".join(close) + "?" if close else ""


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """' Did you mean X?' when a close match exists, else ''."""
    return suggestion(close_matches(name, choices))
