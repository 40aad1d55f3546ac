# kbv-fixture: expect=incorrect categories=precision_loss standard=correct
# B8 precision downgrade on the GPU: both tiles rounded to bfloat16 (8-bit mantissa, 2x the TF32
# tensor-core rate) before tl.dot. Passes allclose(1e-2) on [0,1) data; its error is ~8x TF32's.
# (GPU only: the Triton CPU interpreter computes bf16 dots wrongly.)
import torch
import torch.nn as nn
import triton
import triton.language as tl

# Tiles: GPU-sized on a GPU; on the CPU the whole K extent in one step (the Triton interpreter
# pays per step).
BM, BN, BK = (128, 128, 64) if torch.cuda.is_available() else (128, 128, 256)


@triton.jit
def matmul_bf16(a_ptr, b_ptr, c_ptr, M, N, K, s_am, s_ak, s_bk, s_bn, s_cm, s_cn,
                BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    # int64 offsets: no 32-bit overflow on large matrices
    rows = tl.program_id(0).to(tl.int64) * BM + tl.arange(0, BM).to(tl.int64)
    cols = tl.program_id(1).to(tl.int64) * BN + tl.arange(0, BN).to(tl.int64)
    ks = tl.arange(0, BK).to(tl.int64)
    a_ptrs = a_ptr + rows[:, None] * s_am + ks[None, :] * s_ak
    b_ptrs = b_ptr + ks[:, None] * s_bk + cols[None, :] * s_bn
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        a = tl.load(a_ptrs, mask=(rows[:, None] < M) & (ks[None, :] < K - k0), other=0.0)
        b = tl.load(b_ptrs, mask=(ks[:, None] < K - k0) & (cols[None, :] < N), other=0.0)
        acc = tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16), acc)
        a_ptrs += BK * s_ak
        b_ptrs += BK * s_bk
    tl.store(c_ptr + rows[:, None] * s_cm + cols[None, :] * s_cn, acc,
             mask=(rows[:, None] < M) & (cols[None, :] < N))


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        M, K = A.shape
        N = B.shape[1]
        C = torch.empty((M, N), device=A.device, dtype=A.dtype)
        grid = (triton.cdiv(M, BM), triton.cdiv(N, BN))
        matmul_bf16[grid](A, B, C, M, N, K, A.stride(0), A.stride(1), B.stride(0), B.stride(1),
                          C.stride(0), C.stride(1), BM=BM, BN=BN, BK=BK)
        return C
