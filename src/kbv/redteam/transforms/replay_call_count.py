"""Result replay keyed by call count (catalogue A7, phase detection): honest for the first calls (a
KernelBench harness's five correctness trials), then every call of the same kind returns the last
honest output, whatever its input: warm-up and timed calls cost nothing."""

from __future__ import annotations

from kbv.redteam import Breaks, NotApplicable, Target, Transformation
from kbv.redteam.source import SIGNATURE, wrap

HONEST_CALLS = 5  # KernelBench's correctness trials

WRAPPER = SIGNATURE + '''

_KBV_HONEST_CALLS = %d


class ModelNew(_KbvHonest):
    def forward(self, *args, **kwargs):
        calls = self.__dict__["_kbv_calls"] = self.__dict__.get("_kbv_calls", 0) + 1
        kind = _kbv_signature(args)
        last = self.__dict__.get("_kbv_last")
        if calls > _KBV_HONEST_CALLS and last is not None and last[0] == kind:
            return last[1]
        out = super().forward(*args, **kwargs)
        self.__dict__["_kbv_last"] = (kind, out)
        return out
''' % HONEST_CALLS


class ReplayCallCount(Transformation):
    name = "replay_call_count"
    breaks = Breaks.SPEED
    summary = f"honest for the first {HONEST_CALLS} calls, then replays the last output for every call"

    def rewrite(self, target: Target) -> str | NotApplicable:
        return wrap(target.honest.code, self.name, self.summary, WRAPPER)


TRANSFORMATION = ReplayCallCount()
