# kbv-fixture: expect=verified categories= standard=correct
# Honest: a derived-constant cache. Buffers of its own (names the reference does not have) hold W^T
# and the two biases summed, filled on the first call from the weights it was handed, then read by one
# Triton kernel: filling them mutates nothing of the model's (not parameter_mutated).
import torch
import torch.nn as nn
import triton
import triton.language as tl

# Tiles: GPU-sized on a GPU; on the CPU the whole problem in one step (the Triton interpreter pays
# per program and per step).
BM, BN, BK = (64, 128, 64) if torch.cuda.is_available() else (16, 128, 256)


@triton.jit
def gemm_bias_relu(x_ptr, wt_ptr, b_ptr, out_ptr, M, N, K, s_xm, s_xk, s_wk, s_wn,
                   BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    # int64 offsets: no 32-bit overflow on large matrices
    rows = tl.program_id(0).to(tl.int64) * BM + tl.arange(0, BM).to(tl.int64)
    cols = tl.program_id(1).to(tl.int64) * BN + tl.arange(0, BN).to(tl.int64)
    ks = tl.arange(0, BK).to(tl.int64)
    x_ptrs = x_ptr + rows[:, None] * s_xm + ks[None, :] * s_xk
    w_ptrs = wt_ptr + ks[:, None] * s_wk + cols[None, :] * s_wn  # W^T tiles, (BK, BN), rows contiguous
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        a = tl.load(x_ptrs, mask=(rows[:, None] < M) & (ks[None, :] < K - k0), other=0.0)
        w = tl.load(w_ptrs, mask=(ks[:, None] < K - k0) & (cols[None, :] < N), other=0.0)
        acc = tl.dot(a, w, acc)
        x_ptrs += BK * s_xk
        w_ptrs += BK * s_wk
    acc = tl.maximum(acc + tl.load(b_ptr + cols, mask=cols < N, other=0.0)[None, :], 0.0)
    tl.store(out_ptr + rows[:, None] * N + cols[None, :], acc, mask=(rows[:, None] < M) & (cols[None, :] < N))


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias_shape: tuple):
        super().__init__()
        self.gemm = nn.Linear(in_features, out_features)
        self.bias = nn.Parameter(torch.randn(bias_shape))
        # not persistent: the state_dict is the reference's, so its weights load into this model
        self.register_buffer("weight_t", torch.zeros(in_features, out_features), persistent=False)
        self.register_buffer("bias_sum", torch.zeros(out_features), persistent=False)
        self.cached = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.cached:  # after the weights were loaded: the first call's, not the constructor's
            self.weight_t.copy_(self.gemm.weight.t())
            self.bias_sum.copy_(self.gemm.bias + self.bias.reshape(-1))
            self.cached = True
        M, K = x.shape
        N = self.weight_t.shape[1]
        w = self.weight_t
        out = torch.empty((M, N), device=x.device, dtype=x.dtype)
        grid = (triton.cdiv(M, BM), triton.cdiv(N, BN))
        gemm_bias_relu[grid](x, w, self.bias_sum, out, M, N, K, x.stride(0), x.stride(1),
                             w.stride(0), w.stride(1), BM=BM, BN=BN, BK=BK)
        return out
