"""Work deferred to a side stream (catalogue A1): the honest forward is launched on a CUDA stream of
the candidate's own and the call returns without joining it. A harness that records its timing events
on the current stream times nearly nothing; its device-wide synchronise before comparing sees every
value. CUDA only."""

from __future__ import annotations

from kbv.candidates import Backend
from kbv.redteam import Breaks, NotApplicable, Target, Transformation
from kbv.redteam.source import wrap

WRAPPER = '''
class ModelNew(_KbvHonest):
    def forward(self, *args, **kwargs):
        stream = self.__dict__.get("_kbv_stream")
        if stream is None:
            stream = self.__dict__["_kbv_stream"] = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())  # the inputs are ready there
        with torch.cuda.stream(stream):
            return super().forward(*args, **kwargs)
'''


class DeferredStream(Transformation):
    name = "deferred_stream"
    breaks = Breaks.SPEED
    summary = "launches the honest forward on a side stream of its own and returns without joining it"
    backends = frozenset({Backend.CUDA, Backend.TRITON, Backend.TORCH})
    devices = frozenset({"cuda"})

    def rewrite(self, target: Target) -> str | NotApplicable:
        return wrap(target.honest.code, self.name, self.summary, WRAPPER)


TRANSFORMATION = DeferredStream()
