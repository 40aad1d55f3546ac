# Honest result, with a 1 GiB workspace that no allocator statistic of PyTorch's can see: every call
# takes it with a raw cudaMalloc, touches it, and frees it before returning. Only a driver-level
# peak measured during the call shows it.
import ctypes
import glob
import os

import torch
import torch.nn as nn
from honest_triton_kernel import matmul


def _cudart():
    libdir = os.path.join(os.path.dirname(torch.__file__), "lib")
    nvidia = os.path.join(os.path.dirname(os.path.dirname(torch.__file__)), "nvidia")
    for path in (glob.glob(os.path.join(libdir, "libcudart.so*")) + glob.glob(os.path.join(nvidia, "**", "libcudart.so*"),
                                                                             recursive=True)):
        return ctypes.CDLL(path)
    raise OSError("no libcudart")


_RT = None


class ModelNew(nn.Module):
    def forward(self, a, b):
        global _RT
        _RT = _RT or _cudart()
        ws = ctypes.c_void_p()
        assert _RT.cudaMalloc(ctypes.byref(ws), ctypes.c_size_t(1 << 30)) == 0
        assert _RT.cudaMemset(ws, 0, ctypes.c_size_t(1 << 30)) == 0
        out = matmul(a, b)
        torch.cuda.synchronize()
        assert _RT.cudaFree(ws) == 0
        return out
