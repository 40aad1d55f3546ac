"""The verified comparison: scale-invariant errors and the calibrated acceptance test."""

from __future__ import annotations

import pytest
import torch

from kbv.compare import ErrorMeasure, Tolerance, allowed_error, compare_allclose, measure_error, within
from kbv.verdict import Category


def _tf32(x: torch.Tensor) -> torch.Tensor:
    """Round float32 to TF32's 10 explicit mantissa bits (what tensor cores do to matmul inputs)."""
    bits = x.view(torch.int32)
    return ((bits + 0x1000) & ~0x1FFF).view(torch.float32)


def _matmul_errors(a, b):
    truth = a.double() @ b.double()
    baseline = _tf32(a) @ _tf32(b)
    return truth, measure_error(truth, baseline)


def test_errors_are_scale_invariant():
    torch.manual_seed(0)
    t = torch.randn(1000, dtype=torch.float64)
    o = (t + 1e-4 * torch.randn(1000, dtype=torch.float64)).float()
    e1 = measure_error(t, o)
    e2 = measure_error(t * 1e3, o * 1e3)
    e3 = measure_error(t * 1e-3, o * 1e-3)
    assert abs(e1.norm - e2.norm) < 1e-9 * max(e1.norm, 1) and abs(e1.norm - e3.norm) < 1e-6
    assert abs(e1.elem - e2.elem) < 1e-6


def test_tf32_level_math_passes_and_bf16_math_fails_against_a_tf32_baseline():
    torch.manual_seed(1)
    a, b = torch.randn(256, 512), torch.randn(512, 256)
    truth, base = _matmul_errors(a, b)
    allowed = allowed_error(base, Tolerance())
    tf32_other_order = (_tf32(a).double() @ _tf32(b).double()).float()
    bf16 = (a.bfloat16() @ b.bfloat16()).float()
    assert within(measure_error(truth, tf32_other_order), allowed)
    assert not within(measure_error(truth, bf16), allowed)


def test_fp32_reductions_in_any_order_pass_against_an_exact_baseline():
    torch.manual_seed(2)
    x = torch.randn(64, 4096)
    truth = x.double().sum(1)
    base = measure_error(truth, x.sum(1))
    sequential = torch.zeros(64)
    for j in range(4096):  # the worst honest order: one running sum
        sequential += x[:, j]
    assert within(measure_error(truth, sequential), allowed_error(base, Tolerance()))


def test_nan_or_inf_where_the_truth_is_finite_fails_even_if_values_elsewhere_match():
    t = torch.randn(100, dtype=torch.float64)
    o = t.float().clone()
    o[3] = float("nan")
    e = measure_error(t, o)
    assert not e.nan_inf_match
    assert not within(e, ErrorMeasure(1.0, 1.0, True))
    o[3] = float("inf")
    assert not measure_error(t, o).nan_inf_match


def test_zeros_do_not_pass_a_tiny_output():
    t = torch.randn(1000, dtype=torch.float64) * 1e-6
    base = measure_error(t, t.float())
    assert not within(measure_error(t, torch.zeros(1000)), allowed_error(base, Tolerance()))


def test_allclose_checks_shape_dtype_and_values():
    ref = torch.ones(4, 3)
    assert compare_allclose(ref, torch.ones(3), 1e-2, 1e-2).category is Category.SHAPE_MISMATCH
    assert compare_allclose(ref, torch.ones(4, 3, dtype=torch.float64), 1e-2, 1e-2).category is Category.DTYPE_MISMATCH
    assert compare_allclose(ref, ref + 5e-3, 1e-2, 1e-2).passed
    assert not compare_allclose(ref, ref + 5e-3, 1e-4, 1e-4).passed
    nan = ref.clone()
    nan[0, 0] = float("nan")
    assert compare_allclose(ref, nan, 1e-2, 1e-2).category is Category.NAN_INF_MISMATCH


def test_errors_measured_a_chunk_at_a_time_are_the_errors_measured_at_once(monkeypatch):
    """A multi-GB output is compared in chunks (no multi-GB float64 temporaries): the figures are the same."""
    import kbv.compare as compare

    gen = torch.Generator().manual_seed(3)
    truth = torch.randn(1000, generator=gen, dtype=torch.float64) * 10
    truth[::97] = float("nan")
    out = (truth + 1e-3 * torch.randn(1000, generator=gen, dtype=torch.float64)).float()
    out[5] = float("inf")
    whole = (compare.measure_error(truth, out), compare.error_summary(truth.float(), out))
    monkeypatch.setattr(compare, "CHUNK", 7)
    chunked = (compare.measure_error(truth, out), compare.error_summary(truth.float(), out))
    figures = [(e.norm, e.elem, *summary) for e, summary in (whole, chunked)]
    assert figures[1] == pytest.approx(figures[0], rel=1e-12)
    assert whole[0].nan_inf_match == chunked[0].nan_inf_match is False  # the inf at 5 is the candidate's


def test_kernelbench_check_is_allclose_over_the_whole_made_a_chunk_at_a_time(monkeypatch):
    """torch.allclose over a multi-GB output takes ~3x its size in temporaries (KernelBench's L1/9, 4 GiB
    of output, ran kbv's process on a 24 GiB host out of memory); chunk by chunk, in the outputs' own
    dtype, it says exactly what allclose over the whole says."""
    import kbv.compare as compare

    monkeypatch.setattr(compare, "CHUNK", 1000)
    seen: list[int] = []
    whole = torch.allclose

    def recorded(a, b, **kw):
        seen.append(a.numel())
        return whole(a, b, **kw)

    gen = torch.Generator().manual_seed(3)
    ref = torch.randn(37, 101, generator=gen)
    cases = [ref.clone(), ref + 5e-3, ref * (1 + 2e-2)]
    last = ref.clone()
    last.view(-1)[-1] += 1.0  # one bad element, in the last chunk
    nan = ref.clone()
    nan.view(-1)[1500] = float("nan")
    for out in [*cases, last, nan]:
        monkeypatch.setattr(torch, "allclose", whole)
        expected = whole(out, ref, atol=1e-2, rtol=1e-2)
        monkeypatch.setattr(torch, "allclose", recorded)
        assert compare_allclose(ref, out, 1e-2, 1e-2).passed is expected
    assert seen and max(seen) <= 1000
