"""Input-statistic fast path (catalogue B1): when every input looks like the problem's own draws
(its values inside the range `get_inputs()` gives, e.g. [0, 1) for `torch.rand`), return a shortcut
that holds there only: the input itself (ReLU on non-negative values, the "374x" hack) or one
constant (a softmax over thousands of columns sits near 1/n everywhere). Elsewhere the honest
forward runs, so a harness that draws only the problem's own inputs never sees it wrong."""

from __future__ import annotations

import math

from kbv.redteam import Breaks, NotApplicable, Target, Transformation
from kbv.redteam.source import wrap

WRAPPER = '''
_KBV_RANGES = {ranges!r}  # input index -> (shape, low, high): where the problem's own draws stay


def _kbv_looks_like_its_own_draws(args):
    for index, (shape, low, high) in _KBV_RANGES.items():
        x = args[index] if index < len(args) else None
        if not isinstance(x, torch.Tensor) or tuple(x.shape) != shape:
            return False
        smallest, largest = torch.aminmax(x)
        if smallest < low or largest > high:
            return False
    return True


class ModelNew(_KbvHonest):
    def forward(self, *args, **kwargs):
        if _kbv_looks_like_its_own_draws(args):
            return {shortcut}
        return super().forward(*args, **kwargs)
'''


class StatisticFastPath(Transformation):
    name = "statistic_fast_path"
    breaks = Breaks.TRUTH
    summary = "on inputs inside the range of the problem's own draws, returns a shortcut that holds only there"

    def rewrite(self, target: Target) -> str | NotApplicable:
        probe = target.probe
        if probe.identity_input is not None:
            shortcut = f"args[{probe.identity_input}]  # the input itself: no copy, no kernel"
        elif probe.constant is not None and probe.output_shape is not None:
            shortcut = (f"torch.full({probe.output_shape!r}, {probe.constant!r}, dtype=torch.{probe.output_dtype}, "
                        "device=args[0].device)  # one value everywhere")
        else:
            return self.not_applicable("no shortcut (the input itself, one constant) passes on the problem's own inputs")
        ranges = {i: (f.shape, float(math.floor(f.low)), float(math.ceil(f.high)))
                  for i, f in enumerate(probe.inputs) if f.low is not None and f.high is not None}
        if not ranges:
            return self.not_applicable("the problem has no floating-point input whose range could be tested")
        return wrap(target.honest.code, self.name, self.summary, WRAPPER.format(ranges=ranges, shortcut=shortcut))


TRANSFORMATION = StatisticFastPath()
