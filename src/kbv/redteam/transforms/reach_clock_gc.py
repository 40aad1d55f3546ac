"""Reaching the harness through gc (catalogue A4, B5): a harness that binds its clock to an object of
its own (so that patching the time module cannot reach it) is found by walking `gc.get_objects()`:
every attribute that holds the real `time.perf_counter` (or, on a GPU, `torch.cuda.Event.elapsed_time`)
is rebound to a clock running at a quarter speed. Done at import and at the first calls (a harness may
build its timer after importing the candidate); module globals are left alone, where identity checks
look. The kernel is the honest one."""

from __future__ import annotations

from kbv.redteam import Breaks, NotApplicable, Target, Transformation
from kbv.redteam.source import wrap

CLOCK_RATE = 0.25
WALKS = 3  # calls that walk the heap again (untimed correctness calls in a KernelBench harness)

WRAPPER = '''
import gc
import time
import types
import warnings

_KBV_RATE = %r
_kbv_real_clock = time.perf_counter
_kbv_origin = _kbv_real_clock()
_kbv_real_elapsed = torch.cuda.Event.elapsed_time


def _kbv_slow_clock():
    return _kbv_origin + (_kbv_real_clock() - _kbv_origin) * _KBV_RATE


def _kbv_short_elapsed(start, end):
    return _kbv_real_elapsed(start, end) * _KBV_RATE


def _kbv_rebind_clocks():
    swaps = {id(_kbv_real_clock): _kbv_slow_clock, id(_kbv_real_elapsed): _kbv_short_elapsed}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # touching every object wakes deprecation shims
        _kbv_rebind(swaps)


def _kbv_rebind(swaps):
    for obj in gc.get_objects():
        if isinstance(obj, (types.ModuleType, type)):
            continue
        try:
            holder = object.__getattribute__(obj, "__dict__")
        except Exception:
            continue
        if not isinstance(holder, dict):
            continue
        for name, value in list(holder.items()):
            if id(value) in swaps and (value is _kbv_real_clock or value is _kbv_real_elapsed):
                holder[name] = swaps[id(value)]


_kbv_rebind_clocks()


class ModelNew(_KbvHonest):
    def forward(self, *args, **kwargs):
        walks = self.__dict__.get("_kbv_walks", 0)
        if walks < %d:
            self.__dict__["_kbv_walks"] = walks + 1
            _kbv_rebind_clocks()
        return super().forward(*args, **kwargs)
''' % (CLOCK_RATE, WALKS)


class ReachClockGc(Transformation):
    name = "reach_clock_gc"
    breaks = Breaks.SPEED
    summary = f"finds the harness's own clock through gc and rebinds it to one running at {CLOCK_RATE:g}x"

    def rewrite(self, target: Target) -> str | NotApplicable:
        return wrap(target.honest.code, self.name, self.summary, WRAPPER)


TRANSFORMATION = ReachClockGc()
