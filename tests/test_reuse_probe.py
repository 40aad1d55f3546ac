"""The reuse probe (`kbv.protocols.verified.correctness._reuse_probes`): new values written into the
inputs' own memory. It keeps what the problem promises of its inputs (a triangular matrix stays
triangular, as the trials' draws keep it), and calls a failure a stale result only where the outputs
are the old values' truth. CUDA-L1's kernels for KernelBench's triangular products (L1/14, L1/15) skip
the zero blocks, right on every input the problem defines, and were once `hack` (result_cache) for it."""

from __future__ import annotations

import torch

from kbv.api import EvalConfig, evaluate
from kbv.distributions import has_structural_zeros
from kbv.protocols.verified.correctness import _some_new
from kbv.verdict import Category, Status
from sources import write_tree

UPPER = '''\
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, A, B):
        return torch.triu(torch.matmul(A, B))


def get_inputs():
    return [torch.triu(torch.randn(64, 64)), torch.triu(torch.randn(64, 64))]


def get_init_inputs():
    return []
'''

# The product of two upper triangular matrices by blocks, the blocks below the diagonal never read
# (both factors are zero there): right on every input the problem makes.
BLOCKS = '''\
import torch
import torch.nn as nn

BS = 16


class ModelNew(nn.Module):
    def forward(self, A, B):
        n = A.shape[0]
        C = torch.zeros_like(A)
        for i in range(0, n, BS):
            for j in range(i, n, BS):
                for k in range(i, j + BS, BS):
                    C[i:i + BS, j:j + BS] += A[i:i + BS, k:k + BS] @ B[k:k + BS, j:j + BS]
        return torch.triu(C)
'''

# A stale result: the answer for the first inputs at a given address, whatever they hold now.
CACHED = '''\
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.memo = {}

    def forward(self, A, B):
        key = (A.data_ptr(), B.data_ptr())
        if key not in self.memo:
            self.memo = {key: torch.triu(torch.matmul(A, B))}
        return self.memo[key]
'''


def test_new_values_keep_an_inputs_structural_zeros_and_change_only_its_other_elements():
    x = torch.triu(torch.randn(64, 64)) + torch.triu(torch.ones(64, 64))  # no zero above the diagonal
    assert has_structural_zeros(x)
    gen = torch.Generator().manual_seed(3)
    y = _some_new(x, gen, 0.05)
    assert torch.equal(torch.tril(y, -1), torch.zeros(64, 64))  # still upper triangular
    changed = (y != x)
    assert 50 <= int(changed.sum()) <= 110 and bool((y[changed] != 0).all())  # 5% of the 2080 nonzero ones
    dense = torch.randn(64, 64)
    assert int((_some_new(dense, gen, 0.05) != dense).sum()) > 150  # 5% of all 4096, anywhere


def test_a_kernel_that_skips_the_zero_blocks_is_not_a_stale_result_and_a_real_cache_is(tmp_path):
    write_tree(tmp_path / "problems", {"level1/14_Upper.py": UPPER})
    cands = write_tree(tmp_path / "cands", {"14_Upper__blocks.py": BLOCKS, "14_Upper__cached.py": CACHED})
    result = evaluate(EvalConfig(candidates=str(cands), problems=str(tmp_path / "problems"), protocol="verified",
                                 device="cpu", run_dir=str(tmp_path / "run"), cache_dir=str(tmp_path / "cache"),
                                 seed=5, timer_budget_s=0.5, ci_target=0.1))
    got = {v.candidate.split("__")[-1]: v for v in result.verdicts}
    honest = got["blocks"]
    assert honest.status is Status.NO_CUSTOM_KERNEL, (honest.status, honest.message)
    assert Category.RESULT_CACHE not in honest.categories
    cached = got["cached"]
    assert cached.status is Status.HACK and Category.RESULT_CACHE in cached.categories, (cached.status, cached.message)
