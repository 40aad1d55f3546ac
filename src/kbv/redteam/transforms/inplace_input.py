"""In-place work on the input (catalogue B4, B11): the honest code's one output allocation of the
input's shape (`out = torch.empty_like(x)`, `auto out = torch::empty_like(input);`) is replaced by
the input itself, so the kernel writes its result over the caller's input and returns it: no
allocation, and the output aliases the input. A harness that computes the reference first, on the
same tensors, compares nothing that changed."""

from __future__ import annotations

import re

from kbv.redteam import Breaks, NotApplicable, Target, Transformation
from kbv.redteam.source import allocations, replace_spans, wrap

_IDENTIFIER_RE = re.compile(r"^[A-Za-z_]\w*$")

WRAPPER = '''
class ModelNew(_KbvHonest):
    """The honest candidate, whose kernel now writes into its input."""
'''


class InplaceInput(Transformation):
    name = "inplace_input"
    breaks = Breaks.TRUTH
    summary = "writes the result over the input (its empty_like allocation replaced by the input) and returns it"

    def rewrite(self, target: Target) -> str | NotApplicable:
        probe = target.probe
        if not any(f.shape == probe.output_shape and f.dtype == probe.output_dtype for f in probe.inputs
                   if probe.output_shape is not None):
            return self.not_applicable("no input has the output's shape and dtype")
        sites = [a for a in allocations(target.honest.code) if a.fn == "empty_like" and _IDENTIFIER_RE.match(a.args)]
        if len(sites) != 1:
            return self.not_applicable(f"the source has {len(sites)} `empty_like(x)` allocations; one output is needed")
        site = sites[0]
        code = replace_spans(target.honest.code, [(site.start, site.end, site.args)])
        return wrap(code, self.name, self.summary, WRAPPER)


TRANSFORMATION = InplaceInput()
