# Honest: the work runs on its own stream, which the current stream joins through an event before
# returning; memory is recorded on the consumer stream.
import torch
import torch.nn as nn
from honest_triton_kernel import matmul

_side = None


class ModelNew(nn.Module):
    def forward(self, a, b):
        global _side
        if _side is None:
            _side = torch.cuda.Stream()
        cur = torch.cuda.current_stream()
        _side.wait_stream(cur)
        with torch.cuda.stream(_side):
            out = matmul(a, b)
            done = torch.cuda.Event()
            done.record(_side)
        cur.wait_event(done)
        out.record_stream(cur)
        return out
