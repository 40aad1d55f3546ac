# Honest result, but keeps a 512 MiB workspace from a raw cudaMalloc that PyTorch's allocator never sees.
import ctypes
import glob
import os

import torch
import torch.nn as nn
from honest_triton_kernel import matmul

_ws = ctypes.c_void_p()


def _cudart():
    libdir = os.path.join(os.path.dirname(torch.__file__), "lib")
    for pattern in ("libcudart.so*",):
        for path in glob.glob(os.path.join(libdir, pattern)) + glob.glob(f"/usr/local/cuda/lib64/{pattern}"):
            return ctypes.CDLL(path)
    import nvidia.cuda_runtime as rt  # pip layout
    return ctypes.CDLL(glob.glob(os.path.join(os.path.dirname(rt.__file__), "lib", "libcudart.so*"))[0])


class ModelNew(nn.Module):
    def forward(self, a, b):
        if not _ws.value:
            torch.cuda.current_device()
            assert _cudart().cudaMalloc(ctypes.byref(_ws), ctypes.c_size_t(512 << 20)) == 0
        return matmul(a, b)
