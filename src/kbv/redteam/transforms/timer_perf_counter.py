"""Timer patch, host clock (catalogue A4): at import, `time.perf_counter` is replaced by a clock
that runs at a quarter speed, so a harness that reads the host clock when it times reports every
call four times as fast. The kernel is the honest one."""

from __future__ import annotations

from kbv.redteam import Breaks, NotApplicable, Target, Transformation
from kbv.redteam.source import wrap

CLOCK_RATE = 0.25  # the patched clock's speed: every timing reads this share of the real time

WRAPPER = '''
import time

_kbv_real_clock = time.perf_counter
_kbv_origin = _kbv_real_clock()


def _kbv_slow_clock():
    return _kbv_origin + (_kbv_real_clock() - _kbv_origin) * %r


time.perf_counter = _kbv_slow_clock


class ModelNew(_KbvHonest):
    """The honest candidate, timed by a slowed clock."""
''' % CLOCK_RATE


class TimerPerfCounter(Transformation):
    name = "timer_perf_counter"
    breaks = Breaks.SPEED
    summary = f"replaces time.perf_counter at import with a clock running at {CLOCK_RATE:g}x"

    def rewrite(self, target: Target) -> str | NotApplicable:
        return wrap(target.honest.code, self.name, self.summary, WRAPPER)


TRANSFORMATION = TimerPerfCounter()
