"""Kernel attribution from a child's reply: whose kernels ran, their share of the time, and what the
verified runner makes of it (no custom kernel, decoys, a share under --min-custom-share)."""

from __future__ import annotations

import pytest

from kbv.detect.attribution import Attribution, attribute, kernel_names, missing_custom_work
from kbv.verdict import Category

CUDA_SOURCE = '''
cuda_src = r"""
__global__ void __launch_bounds__(256) fused_bias_relu(float* y, const float* b, int n) { }
__global__ static void row_softmax(const float* x, float* y) { }
"""
'''
TRITON_SOURCE = '''
@triton.jit
def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pass

@triton.autotune(configs=[], key=["n"])
@triton.jit
def tuned_kernel(x_ptr):
    pass
'''


def test_kernel_names_come_from_cuda_globals_and_triton_jits():
    assert kernel_names(CUDA_SOURCE) == ["fused_bias_relu", "row_softmax"]
    assert kernel_names(TRITON_SOURCE) == ["relu_kernel", "tuned_kernel"]


def test_on_a_gpu_the_profile_splits_own_kernels_from_library_ones():
    reply = {"launches": {"ext.forward": 1}, "ghost": "changed", "kernels": [
        {"name": "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32", "us": 300.0},
        {"name": "fused_bias_relu(float*, float const*, int)", "us": 100.0},
        {"name": "Memset (Device)", "us": 1.0}]}
    a = attribute(reply, CUDA_SOURCE, "cuda")
    assert a.custom_launches == 1 and not a.decoy
    assert a.custom_share == pytest.approx(100.0 / 401.0)
    assert [own for *_, own in a.kernels] == [False, True, False]


def test_counters_that_fired_without_an_own_device_kernel_count_for_nothing():
    # the extension function was called, but every kernel on the device was cuBLAS's
    reply = {"launches": {"ext.forward": 2}, "kernels": [{"name": "cublasLt::splitKreduce_kernel", "us": 50.0},
                                                          {"name": "ampere_sgemm_128x64_tn", "us": 400.0}]}
    a = attribute(reply, CUDA_SOURCE, "cuda")
    assert a.custom_launches == 0 and a.custom_share == 0.0


def test_without_a_profile_launch_counts_and_their_time_decide():
    reply = {"launches": {"relu_kernel": 1}, "launch_s": {"relu_kernel": 0.003}, "wall_ms": 4.0,
             "kernels": [{"name": "<profiler failed: RuntimeError: busy>", "us": 0.0, "error": True}]}
    for device in ("cuda", "cpu"):
        a = attribute(reply, TRITON_SOURCE, device)
        assert a.custom_launches == 1 and a.custom_share == pytest.approx(0.75)
    assert attribute({"launches": {}, "wall_ms": 4.0}, TRITON_SOURCE, "cpu").custom_share == 0.0


def _judge(a: Attribution, min_share: float = 0.0):
    return missing_custom_work(a, min_share)


def test_what_attribution_lacks_is_named():
    assert _judge(Attribution(0, 0.0))[0] is Category.NO_CUSTOM_KERNEL
    assert _judge(Attribution(3, 0.9, ghost="unchanged"))[0] is Category.NO_CUSTOM_KERNEL  # decoys
    assert "decoys" in _judge(Attribution(3, 0.9, ghost="unchanged"))[1]
    assert _judge(Attribution(3, 0.2, ghost="changed")) is None  # partial library use is allowed
    low = _judge(Attribution(3, 0.2, ghost="changed"), min_share=0.5)
    assert low[0] is Category.LOW_CUSTOM_SHARE and "20%" in low[1] and "50%" in low[1]


# -- what the child says about the profile ---------------------------------------------------------


def test_the_childs_account_of_attributions_seconds_keeps_only_plausible_figures():
    from kbv.protocols.verified.runner import _child_seconds

    said = {"profiled_call": 0.5, "huge": 10 ** 400, "nan": float("nan"), "negative": -1.0, "text": "1.0",
            "flag": True, 7: 1.0}
    assert _child_seconds(said, 300.0) == {"child_profiled_call": 0.5}
    assert _child_seconds("not a dict", 300.0) == {}
    assert len(_child_seconds({f"k{i}": 0.1 for i in range(100)}, 300.0)) == 8
