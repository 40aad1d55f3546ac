"""Kernel attribution from a child's reply: whose kernels ran, their share of the time, and what the
verified runner makes of it (no custom kernel, decoys, a share under --min-custom-share). A kernel is
the candidate's by the names the child found in its own code (`own_kernels`), never by a pattern."""

from __future__ import annotations

import pytest

from kbv.detect.attribution import Attribution, attribute, missing_custom_work
from kbv.verdict import Category


def _own(reply):
    """Which profiled kernels `attribute` gives the candidate, in the reply's order."""
    return [own for *_, own in attribute(reply, "cuda").kernels]


def test_on_a_gpu_the_profile_splits_own_kernels_from_library_ones():
    reply = {"launches": {"ext.forward": 1}, "ghost": "changed", "own_kernels": ["_Z15fused_bias_reluPfPKfi"],
             "kernels": [{"name": "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32", "us": 300.0},
                         {"name": "fused_bias_relu(float*, float const*, int)", "us": 100.0},
                         {"name": "Memset (Device)", "us": 1.0}]}
    a = attribute(reply, "cuda")
    assert a.custom_launches == 1 and not a.decoy
    assert a.custom_share == pytest.approx(100.0 / 401.0)
    assert [own for *_, own in a.kernels] == [False, True, False]


def test_counters_that_fired_without_an_own_device_kernel_count_for_nothing():
    # the extension function was called, but every kernel on the device was cuBLAS's
    reply = {"launches": {"ext.forward": 2}, "own_kernels": ["_Z15fused_bias_reluPfPKfi", "_Z11row_softmaxPKfPf"],
             "kernels": [{"name": "cublasLt::splitKreduce_kernel", "us": 50.0},
                         {"name": "ampere_sgemm_128x64_tn", "us": 400.0}]}
    a = attribute(reply, "cuda")
    assert a.custom_launches == 0 and a.custom_share == 0.0


def test_a_kernel_of_the_candidates_own_is_its_own_whatever_it_is_called():
    # its extension defines kernels named like cuBLAS's: by where they come from they are its own,
    # and the library kernel of a similar name is not
    reply = {"launches": {"ext.forward": 1}, "own_kernels": ["_Z11gemm_kernelPKfS0_Pfi", "cublas_sgemm_decoy"],
             "kernels": [{"name": "gemm_kernel(float const*, float const*, float*, int)", "us": 300.0},
                         {"name": "cublas_sgemm_decoy", "us": 100.0},
                         {"name": "cublas_sgemm_decoy_v2", "us": 50.0}]}
    assert _own(reply) == [True, True, False]


def test_a_library_kernel_is_not_the_candidates_though_no_list_names_it():
    reply = {"launches": {"ext.forward": 1}, "own_kernels": ["_Z15fused_bias_reluPfPKfi"],
             "kernels": [{"name": "void at::native::some_new_kernel<float>(float*, long)", "us": 10.0},
                         {"name": "nvjet_sm100_tst_256x128_64x4_2x1_v_bz_coopA_TNT", "us": 20.0},
                         {"name": "void cub::DeviceSegmentedSortKernelLarge<float, int>(float const*)", "us": 30.0},
                         {"name": "kernel_from_a_library_nobody_knows", "us": 40.0},
                         {"name": "fused_bias_relu(float*, float const*, int)", "us": 100.0}]}
    a = attribute(reply, "cuda")
    assert [own for *_, own in a.kernels] == [False, False, False, False, True]
    assert a.custom_share == pytest.approx(100.0 / 200.0)


def test_inductors_kernels_are_torchs_though_their_names_hold_the_candidates():
    # torch.compile's kernel carries the name of the candidate's Triton function inside its own
    reply = {"launches": {"triton:fused_relu": 1}, "own_kernels": ["fused_relu"],
             "kernels": [{"name": "triton_poi_fused_relu_0", "us": 80.0}, {"name": "fused_relu", "us": 20.0}]}
    assert _own(reply) == [False, True]
    reply = {**reply, "own_kernels": [], "kernels": reply["kernels"][:1]}  # its own never compiled
    a = attribute(reply, "cuda")
    assert a.custom_launches == 0 and _judge(a)[0] is Category.NO_CUSTOM_KERNEL


def test_own_names_match_as_the_profiler_demangles_them():
    reply = {"launches": {"ext.f": 1},
             "own_kernels": ["_Z11relu_kernelIfEvPKT_PS0_i", "Pf", "x",
                             "_ZN36_GLOBAL__N__abf25d35_4_k_cu_7c29ed6211anon_kernelEPf"],
             "kernels": [{"name": "void relu_kernel<float>(float const*, float*, int)", "us": 1.0},
                         {"name": "void relu_kernel<double>(double const*, double*, int)", "us": 1.0},
                         {"name": "(anonymous namespace)::anon_kernel(float*)", "us": 1.0},
                         {"name": "float*", "us": 1.0},  # the profiler demangles a kernel named Pf, too
                         {"name": "x", "us": 1.0},
                         {"name": "relu_kernel", "us": 1.0}]}
    assert _own(reply) == [True, False, True, True, True, False]


def test_the_candidates_source_text_names_no_kernel_of_its_own():
    # a plain `a @ b` with a no-op extension call and cuBLAS's kernel named after `.entry` in a
    # comment: only what the child found in the code it loaded counts (PTX its own shared objects
    # embed is found there, by `kbv.sandbox.elf`)
    reply = {"launches": {"ext:noop.f": 1}, "ghost": "raised", "own_kernels": [],
             "kernels": [{"name": "ampere_sgemm_128x64_tn", "us": 100.0}]}
    a = attribute(reply, "cuda")
    assert a.custom_share == 0.0 and a.custom_launches == 0
    assert _judge(a)[0] is Category.NO_CUSTOM_KERNEL


def test_a_reply_without_own_names_goes_by_launch_counts_and_a_forged_one_is_refused():
    profiled = {"launches": {"ext.f": 1}, "launch_s": {"ext.f": 0.002}, "wall_ms": 4.0,
                "own_kernels_error": "OSError: no /proc", "kernels": [{"name": "anything", "us": 3.0}]}
    a = attribute(profiled, "cuda")
    assert a.custom_launches == 1 and a.kernels == () and a.custom_share == pytest.approx(0.5)
    for forged in ("gemm", [1, 2], {"gemm": 1}):
        with pytest.raises(TypeError):
            attribute({**profiled, "own_kernels": forged}, "cuda")


def test_without_a_profile_launch_counts_and_their_time_decide():
    reply = {"launches": {"relu_kernel": 1}, "launch_s": {"relu_kernel": 0.003}, "wall_ms": 4.0,
             "kernels": [{"name": "<profiler failed: RuntimeError: busy>", "us": 0.0, "error": True}]}
    for device in ("cuda", "cpu"):
        a = attribute(reply, device)
        assert a.custom_launches == 1 and a.custom_share == pytest.approx(0.75)
    assert attribute({"launches": {}, "wall_ms": 4.0}, "cpu").custom_share == 0.0


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


def test_a_kernel_an_op_launched_is_counted_once():
    """PyTorch 2 lists each device kernel as an event of its own and hangs a copy off the op that
    launched it; an extension's launch has no op. Older forms had only the copies."""
    from types import SimpleNamespace

    import torch

    from kbv.sandbox.profiling import _device_kernels

    cuda, cpu = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU
    gemm = SimpleNamespace(name="sm90_xmma_gemm", duration=30.0)
    events = [SimpleNamespace(name="aten::mm", device_type=cpu, kernels=[gemm]),
              SimpleNamespace(name="sm90_xmma_gemm", device_type=cuda, device_time=30.0, kernels=[]),
              SimpleNamespace(name="relu_kernel(float*)", device_type=cuda, device_time=10.0, kernels=[])]
    assert _device_kernels(SimpleNamespace(function_events=events)) == [
        {"name": "sm90_xmma_gemm", "us": 30.0}, {"name": "relu_kernel(float*)", "us": 10.0}]
    older = [SimpleNamespace(name="aten::mm", device_type=cpu, kernels=[gemm])]
    assert _device_kernels(SimpleNamespace(function_events=older)) == [{"name": "sm90_xmma_gemm", "us": 30.0}]
