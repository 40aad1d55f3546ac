"""What preparing a problem costs, in reference calls: an account kept as the calls are made.

Every forward of the reference that kbv itself makes (`kbv.reference.Reference`) is counted under
the purpose it serves, the input distribution it ran on and the precision it ran in:

    calibration   a variant of a distribution tried and refused (its outputs not finite, constant...);
                  the accepted variant's call is the first trial's own baseline call
    baseline      a trial's baseline output, under the protocol's policy (its error sets the tolerance)
    truth         a trial's float64 output
    tf32          the strict-fp32 and TF32-truncated outputs that decide a TF32 allowance (only where the
                  forward runs an operator TF32 changes)
    screen        the soundness screen's own calls: the reference once more on the same inputs
                  (determinism), and at the next trial's inputs (an output that ignores its inputs)
    state         what one call changes in the model's state (BatchNorm in training mode)
    standard      the standard protocol's reference outputs on KernelBench's seeds

Beside the calls, the ledger keeps the seconds spent under each purpose, exclusive of the purposes
nested inside (a truth call's seconds are truth's, not its trial's). On a GPU a call returns before its
kernels have run, so the ledger waits for the device (`synchronize`) each time the purpose changes: the
kernels a purpose queued count as its own, not as whatever waits on them next (an H100's sweep counted
L1/68's float64 truth as 31 s of "trial" and 1 s of "truth"). Several lanes of one process queue on
one stream, so there a purpose's seconds also hold what another lane queued before it. The ledger
also keeps seconds under two purposes that make no call:
`hold` (a trial's truth moved to where its plan keeps it, the host's memory for a problem too large for
the device) and `timing` (the timing pool and the baselines' children).

The ledger also bounds preparation: past its deadline, the next call raises `PreparationTimeout`
(a problem failure naming the step), and it tells the run's heartbeat which step it is in
(`prepare: truth 6/10`). The deadline moves on by the time preparation waited for other pairs of its
device (their timed windows, their seeded and precision blocks: `kbv.gate.waited_s`).
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from kbv.errors import ProblemRunError
from kbv.gate import waited_s as pair_waited_s
from kbv.stages import note


class PreparationTimeout(ProblemRunError):
    """Preparing a problem ran past its bound (`--prepare-timeout`); the message names the step."""


@dataclass
class CallLedger:
    """Reference calls by (purpose, distribution, precision); the step under way; the deadline."""

    problem: str = "problem"
    protocol: str = ""
    deadline: float | None = None  # time.monotonic()
    limit_s: float | None = None  # the bound the deadline came from, for the message
    counts: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    purpose: str = "other"
    distribution: str = "-"
    step: str = ""  # what the heartbeat shows: "truth 6/10"
    seconds: Counter[str] = field(default_factory=Counter)  # by purpose, exclusive of nested purposes
    # waits for the device's queued work (a GPU's): run before each switch of purpose, so that the
    # seconds of asynchronous kernels go to the purpose that queued them (None: the work is synchronous)
    synchronize: Callable[[], None] | None = field(default=None, repr=False, compare=False)
    # when the current purpose last took over
    _since: float = field(default_factory=time.monotonic, init=False, repr=False, compare=False)
    # the pair's time waited for other pairs (`kbv.gate.waited_s`) when the ledger began
    _waited0: float = field(default_factory=pair_waited_s, init=False, repr=False, compare=False)

    @property
    def waited_s(self) -> float:
        """The seconds preparation waited for other pairs of its device (their windows, their seeded and
        precision blocks): the deadline moves on by them, and the purposes' seconds hold them."""
        return max(pair_waited_s() - self._waited0, 0.0)  # read in another pair's account: none

    @contextlib.contextmanager
    def doing(self, purpose: str, distribution: str = "-", step: str | None = None) -> Iterator[None]:
        """Count the calls of the block under `purpose` and `distribution`, and its seconds under
        `purpose` (less its nested purposes'); `step` names it."""
        saved = (self.purpose, self.distribution, self.step)
        self._switch()
        self.purpose, self.distribution = purpose, distribution
        if step is not None:
            self.step = step
            note(step)
        try:
            yield
        finally:
            try:
                self._switch()  # may raise: a device error surfaces at the wait
            finally:
                self.purpose, self.distribution, self.step = saved
                note(self.step)

    def _switch(self) -> None:
        """The seconds since the last switch (its device work done), to the purpose that had them."""
        if self.synchronize is not None:
            self.synchronize()
        now = time.monotonic()
        self.seconds[self.purpose] += now - self._since
        self._since = now

    def count(self, precision: str) -> None:
        """One reference call in `precision`, made now; raises PreparationTimeout past the deadline."""
        self.check()
        self.counts[(self.purpose, self.distribution, precision)] += 1

    def check(self) -> None:
        if self.deadline is not None and time.monotonic() - self.waited_s > self.deadline:
            where = f" in {self.step}" if self.step else ""
            raise PreparationTimeout(f"{self.problem}: preparing it for the {self.protocol or 'verified'} protocol "
                                     f"ran past its {self.limit_s or 0:.0f} s (--prepare-timeout){where}; "
                                     f"{self.total} reference calls made")

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def summary(self) -> dict[str, Any]:
        """{'calls': N, 'by_purpose': {...}, 'by_precision': {...}, 'by_distribution': {...}} (JSON-safe)."""
        out: dict[str, Any] = {"calls": self.total}
        for name, index in (("by_purpose", 0), ("by_distribution", 1), ("by_precision", 2)):
            tally: Counter[str] = Counter()
            for key, n in self.counts.items():
                if n > 0:
                    tally[key[index]] += n
            out[name] = dict(sorted(tally.items()))
        seconds = self.seconds + Counter({self.purpose: time.monotonic() - self._since})  # the current one's so far
        out["seconds_by_purpose"] = {k: round(v, 4) for k, v in sorted(seconds.items()) if v > 0}
        if self.waited_s > 0:
            out["waited_s"] = round(self.waited_s, 4)
        return out


def bounded(problem: str, protocol: str, limit_s: float | None) -> CallLedger:
    """A ledger whose calls raise PreparationTimeout once `limit_s` seconds from now have passed."""
    deadline = time.monotonic() + limit_s if limit_s else None
    return CallLedger(problem=problem, protocol=protocol, deadline=deadline, limit_s=limit_s)
