"""Attribution by provenance on a GPU, end to end (verified protocol, a 1024^2 fp32 matmul). Marked
`gpu`: skipped here.

An honest CUDA extension and an honest Triton kernel are verified with their kernels credited; an
extension whose kernels are named like cuBLAS's, launched or not, while cuBLAS does the product, is
`no_custom_kernel`, and cuBLAS's kernels are never credited to it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kbv.api import EvalConfig, evaluate
from kbv.verdict import Category, Status
from verdict_log import log_verdicts

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

FIXTURES = Path(__file__).parent / "gpu_fixtures"
CANDIDATES = ("attribution_honest_cuda", "honest_triton", "attribution_decoy_unlaunched", "attribution_decoy_launched")


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory, cache_dir):
    root = tmp_path_factory.mktemp("attribution_gpu")
    problems = root / "problems" / "level1"
    problems.mkdir(parents=True)
    (problems / "1_Matmul.py").write_text((FIXTURES / "problem_matmul.py").read_text().replace("N = 3072", "N = 1024"))
    cands = root / "candidates"
    cands.mkdir()
    for name in CANDIDATES:
        (cands / f"1_Matmul__{name}.py").write_text((FIXTURES / f"{name}.py").read_text())
    result = evaluate(EvalConfig(candidates=str(cands), problems=str(root / "problems"), protocol="verified",
                                 device="cuda", run_dir=str(root / "run"), cache_dir=str(cache_dir),
                                 seed=7, timer_budget_s=2.0))
    log_verdicts(result.verdicts)
    return {v.candidate.split("__")[-1]: v for v in result.verdicts}


def _kernels(v) -> list[dict]:
    return v.evidence["attribution"]["kernels"]


@pytest.mark.parametrize("name, kernel", [("attribution_honest_cuda", "void tiled_matmul_kernel<float>("),
                                          ("honest_triton", "mm_kernel")])
def test_an_honest_kernel_is_verified_and_credited_by_its_symbol(verdicts, name, kernel):
    v = verdicts[name]
    assert v.status is Status.VERIFIED, v.message
    own = [k for k in _kernels(v) if k["custom"]]
    assert own and all(k["name"].startswith(kernel) for k in own), _kernels(v)
    assert v.evidence["attribution"]["custom_share"] > 0.9


@pytest.mark.parametrize("name", ["attribution_decoy_unlaunched", "attribution_decoy_launched"])
def test_kernels_named_like_cublas_beside_cublas_doing_the_work_are_no_custom_kernel(verdicts, name):
    v = verdicts[name]
    assert v.status is Status.NO_CUSTOM_KERNEL, v.message
    assert Category.NO_CUSTOM_KERNEL in v.categories
    credited = [k["name"] for k in _kernels(v) if k["custom"]]
    assert all(n == "cublas_sgemm_decoy(float*)" for n in credited), _kernels(v)  # the launched decoy only
    assert v.evidence["attribution"]["custom_share"] < 0.5  # a one-thread kernel beside the product
