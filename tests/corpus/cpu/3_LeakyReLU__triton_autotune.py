# kbv-fixture: expect=verified categories= standard=correct
# Honest: an @triton.autotune'd LeakyReLU choosing among block sizes on the first call. Autotuning
# launches the kernel several times into the same output; on a CPU (no Triton GPU driver to benchmark
# with) the configurations are timed on the host clock.
import time

import torch
import torch.nn as nn
import triton
import triton.language as tl


def host_bench(kernel_call, quantiles):
    """Triton's do_bench contract (times in ms at the given quantiles), on the host clock."""
    kernel_call()
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        kernel_call()
        times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return [times[min(int(q * len(times)), len(times) - 1)] for q in quantiles]


BENCH = None if torch.cuda.is_available() else host_bench


@triton.autotune(configs=[triton.Config({"BLOCK": 4096}), triton.Config({"BLOCK": 16384}),
                          triton.Config({"BLOCK": 65536})],
                 key=["n"], do_bench=BENCH)
@triton.jit
def leaky_relu_kernel(x_ptr, out_ptr, n, slope, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, tl.where(x >= 0.0, x, x * slope), mask=mask)


class ModelNew(nn.Module):
    def __init__(self, negative_slope: float):
        super().__init__()
        self.negative_slope = negative_slope

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        out = torch.empty_like(x)
        n = x.numel()
        grid = lambda meta: (triton.cdiv(n, meta["BLOCK"]),)
        leaky_relu_kernel[grid](x, out, n, self.negative_slope)
        return out
