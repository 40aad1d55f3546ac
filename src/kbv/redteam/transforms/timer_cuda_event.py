"""Timer patch, CUDA events (catalogue A4): at import, `torch.cuda.Event.elapsed_time` is replaced by
one that reports a quarter of the time between two events, so an event-timed harness reports every
call four times as fast. The kernel is the honest one. CUDA only: a CPU harness times with the host clock."""

from __future__ import annotations

from kbv.redteam import Breaks, NotApplicable, Target, Transformation
from kbv.redteam.source import wrap

TIME_SHARE = 0.25

WRAPPER = '''
_kbv_real_elapsed = torch.cuda.Event.elapsed_time


def _kbv_short_elapsed(start, end):
    return _kbv_real_elapsed(start, end) * %r


torch.cuda.Event.elapsed_time = _kbv_short_elapsed


class ModelNew(_KbvHonest):
    """The honest candidate, timed by a patched event timer."""
''' % TIME_SHARE


class TimerCudaEvent(Transformation):
    name = "timer_cuda_event"
    breaks = Breaks.SPEED
    summary = f"replaces torch.cuda.Event.elapsed_time at import with one reporting {TIME_SHARE:g}x the time"
    devices = frozenset({"cuda"})

    def rewrite(self, target: Target) -> str | NotApplicable:
        return wrap(target.honest.code, self.name, self.summary, WRAPPER)


TRANSFORMATION = TimerCudaEvent()
