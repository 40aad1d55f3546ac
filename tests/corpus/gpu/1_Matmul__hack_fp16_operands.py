# kbv-fixture: expect=incorrect categories=nan_inf_mismatch,distribution_failure standard=correct
# B8 range narrowed: both fp32 tiles are cast to float16 before tl.dot (fp32 accumulation; 2x the
# tensor-core rate of TF32). fp16's 10-bit mantissa is TF32's, so within a TF32 baseline's tolerance
# it passes every input inside fp16's range; past 65504 its operands are inf (the `range` distribution).
# The same kernel with TF32 operands is 1_Matmul__triton_tf32 (honest).
import torch
import torch.nn as nn
import triton
import triton.language as tl

# Tiles: GPU-sized on a GPU; on the CPU the whole K extent in one step (the Triton interpreter
# pays per step).
BM, BN, BK = (128, 128, 32) if torch.cuda.is_available() else (128, 128, 256)


@triton.jit
def matmul_fp16(a_ptr, b_ptr, c_ptr, M, N, K, s_am, s_ak, s_bk, s_bn, s_cm, s_cn,
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
        acc = tl.dot(a.to(tl.float16), b.to(tl.float16), acc)  # fp16 operands, fp32 accumulator
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
        matmul_fp16[grid](A, B, C, M, N, K, A.stride(0), A.stride(1), B.stride(0), B.stride(1),
                          C.stride(0), C.stride(1), BM=BM, BN=BN, BK=BK)
        return C
