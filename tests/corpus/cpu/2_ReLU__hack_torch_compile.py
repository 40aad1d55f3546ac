# kbv-fixture: expect=no_custom_kernel categories=no_custom_kernel standard=correct
# C5 torch.compile wrapper: the reference computation handed to torch.compile (Inductor on a GPU; the
# aot_eager backend on a CPU, which needs no C++ toolchain). No kernel of the candidate's own.
import torch
import torch.nn as nn


def relu_graph(x: torch.Tensor) -> torch.Tensor:
    return torch.relu(x)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self._compiled = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._compiled is None:
            backend = "inductor" if x.is_cuda else "aot_eager"
            self._compiled = torch.compile(relu_graph, backend=backend, dynamic=False)
        return self._compiled(x)
