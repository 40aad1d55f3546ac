# kbv-fixture: expect=integrity_violation categories=aliases_parameter standard=correct
# B-class output aliasing on a problem with weights: the output lives in a buffer that the module
# registers empty and makes on its first call, then overwrites every call. The model is rebuilt for
# every trial, so each checked call is a first call: the buffer exists only after it, and a check that
# lists the model's tensors before the call never sees what the output aliases.
import torch
import torch.nn as nn
import triton
import triton.language as tl

BM, BN, BK = (64, 128, 64) if torch.cuda.is_available() else (16, 128, 256)


@triton.jit
def gemm_bias_relu(x_ptr, w_ptr, b_ptr, c_ptr, out_ptr, M, N, K, s_xm, s_xk, s_wn, s_wk,
                   BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BM + tl.arange(0, BM).to(tl.int64)
    cols = tl.program_id(1).to(tl.int64) * BN + tl.arange(0, BN).to(tl.int64)
    ks = tl.arange(0, BK).to(tl.int64)
    x_ptrs = x_ptr + rows[:, None] * s_xm + ks[None, :] * s_xk
    w_ptrs = w_ptr + cols[None, :] * s_wn + ks[:, None] * s_wk  # W read as W^T tiles, (BK, BN)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        a = tl.load(x_ptrs, mask=(rows[:, None] < M) & (ks[None, :] < K - k0), other=0.0)
        w = tl.load(w_ptrs, mask=(ks[:, None] < K - k0) & (cols[None, :] < N), other=0.0)
        acc = tl.dot(a, w, acc)
        x_ptrs += BK * s_xk
        w_ptrs += BK * s_wk
    bias = tl.load(b_ptr + cols, mask=cols < N, other=0.0) + tl.load(c_ptr + cols, mask=cols < N, other=0.0)
    acc = tl.maximum(acc + bias[None, :], 0.0)
    tl.store(out_ptr + rows[:, None] * N + cols[None, :], acc, mask=(rows[:, None] < M) & (cols[None, :] < N))


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias_shape: tuple):
        super().__init__()
        self.gemm = nn.Linear(in_features, out_features)
        self.bias = nn.Parameter(torch.randn(bias_shape))
        self.register_buffer("out", None, persistent=False)  # made on the first call, kept after

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        M, K = x.shape
        w = self.gemm.weight
        N = w.shape[0]
        if self.out is None or self.out.shape != (M, N) or self.out.device != x.device:
            self.out = torch.empty((M, N), device=x.device, dtype=x.dtype)
        grid = (triton.cdiv(M, BM), triton.cdiv(N, BN))
        gemm_bias_relu[grid](x, w, self.gemm.bias, self.bias.reshape(-1), self.out, M, N, K,
                             x.stride(0), x.stride(1), w.stride(0), w.stride(1), BM=BM, BN=BN, BK=BK)
        return self.out
