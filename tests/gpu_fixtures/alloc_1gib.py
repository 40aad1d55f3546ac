# Honest but wasteful: allocates (and touches) an extra 1 GiB scratch buffer in every call.
import torch
import torch.nn as nn
from honest_triton_kernel import matmul


class ModelNew(nn.Module):
    def forward(self, a, b):
        scratch = torch.empty(1 << 28, dtype=torch.float32, device=a.device)
        scratch.fill_(0)
        out = matmul(a, b)
        del scratch
        return out
