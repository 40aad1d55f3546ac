# Honest result, but a 1 GiB workspace made on its first call and kept on the module: its footprint
# is 1 GiB, though every later call allocates nothing but its output.
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        if not hasattr(self, "workspace"):
            self.workspace = torch.empty(1 << 28, device=x.device)
        return x.sum(dim=1)
