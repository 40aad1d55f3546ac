"""The staging buffer a CUDA reduction takes where it splits its rows across CTAs (kbv.cuda_reduce),
worked out on the meta device and counted in the CUDA figures of a problem's footprint."""

from __future__ import annotations

import dataclasses

import pytest

from kbv.cuda_reduce import Card, accumulator_bytes, output_holds_accumulator, reduced_dims, staging_bytes
from kbv.footprint import problem_footprint
from kbv.memory_plan import Hold, standard_need, verified_need
from kbv.problems import load_problem_file, load_problems
from sources import write_tree

MIB = 1 << 20
# the bundled L1/7 and L1/12: 128 x 4096 x 2880 float32, reduced over the middle dimension
SHAPE, STRIDES = (128, 4096, 2880), (4096 * 2880, 2880, 1)


def _problem(key: str):  # noqa: ANN202 - a kbv.problems.Problem
    (problem,) = [p for p in load_problems("full") if p.key == key]
    return problem


@pytest.mark.parametrize(("key", "device_peak_mib"), [("L1/7_SumReduction", 181), ("L1/12_MaxReduction", 730)])
def test_a_reductions_cuda_peak_is_what_an_h100_took_for_it(key: str, device_peak_mib: int) -> None:
    """An H100 took 181 MiB (sum) and 730 MiB (max with its indices) for these forwards, whose own
    tensors are 1.4 and 4.2 MiB (docs/gpu/2026-12-07-d): the trace's CUDA figure holds it, to 1%, and
    a CPU, which stages nothing, keeps the traced figure."""
    fp = problem_footprint(_problem(key))
    assert fp is not None
    assert fp.forward_bytes < 5 * MIB
    assert abs(fp.on("cuda").forward_bytes - device_peak_mib * MIB) <= 0.01 * device_peak_mib * MIB
    assert fp.on("cpu") == fp
    assert fp.on("cuda").float64_bytes > fp.float64_bytes  # the float64 truth's reduction stages too


def test_a_reduction_that_fills_the_card_with_its_outputs_stages_nothing() -> None:
    """KernelBench's L1/47 (an odd innermost extent, 4 pieces of 32 rows): 4095 CTAs of outputs already
    fill an H100, so no row is split across CTAs; nor is one over the innermost dimension of a tall
    matrix, nor a short row."""
    assert staging_bytes((128, 4096, 4095), (4096 * 4095, 4095, 1), 4, (1,), 4) == 0
    assert staging_bytes(SHAPE, STRIDES, 4, (2,), 4) == 0
    assert staging_bytes((16, 4096), (4096, 1), 4, (1,), 4) == 0


def test_a_split_grows_with_the_card_and_an_unheld_accumulator_crosses_the_pieces() -> None:
    """Few long rows split across more CTAs on a card with more SMs; a value and its index, which the
    output cannot hold, take one more buffer of the whole output where the input is cut in pieces."""
    rows = ((16, 1 << 20), (1 << 20, 1), 4, (1,), 4)
    assert 0 < staging_bytes(*rows, card=Card(66, 2048)) < staging_bytes(*rows, card=Card(132, 2048))
    summed = staging_bytes(SHAPE, STRIDES, 4, (1,), 16)
    assert staging_bytes(SHAPE, STRIDES, 4, (1,), 16, outputs_fit_acc=False) == summed + 16 * 128 * 2880


def test_an_accumulator_is_as_wide_as_the_inputs_dtype_makes_it() -> None:
    """An integer sum accumulates in int64; a float16 sum in float32, which its output cannot hold: where
    the input is cut in 32-bit pieces, the partial sums cross them in a buffer of their own."""
    assert accumulator_bytes("sum", float64=False, integer=True) == 8
    assert accumulator_bytes("amax", float64=False, integer=True) == 4
    assert output_holds_accumulator("sum", 4, True) and not output_holds_accumulator("sum", 2, True)
    assert not output_holds_accumulator("max", 4, True)
    half = (2048, 1 << 20)  # 4 GiB of float16 offsets: two pieces at least
    held = staging_bytes(half, (1 << 20, 1), 2, (0,), 4, outputs_fit_acc=True)
    assert staging_bytes(half, (1 << 20, 1), 2, (0,), 4, outputs_fit_acc=False) == held + 4 * (1 << 20)


def test_the_cut_in_32_bit_pieces_reads_each_operands_own_element_size() -> None:
    """An argmax over pairs of 300 M int8 values: the input's offsets fit 32 bits, its int64 indices'
    do not, so the iterator is cut in pieces and the value-and-index partial results cross them."""
    pairs = ((300_000_000, 2), (2, 1), 1, (1,), 16)
    as_input = staging_bytes(*pairs, outputs_fit_acc=False)
    assert staging_bytes(*pairs, outputs_fit_acc=False, out_bytes=8) == as_input + 16 * 300_000_000


def test_dims_read_as_torch_reads_them() -> None:
    assert reduced_dims((2, 3, 4), None) == (0, 1, 2)
    assert reduced_dims((2, 3, 4), []) == (0, 1, 2)
    assert reduced_dims((2, 3, 4), -1) == (2,)
    assert reduced_dims((2, 3, 4), [2, 0]) == (0, 2)


def test_a_plan_on_cuda_holds_the_staging_and_one_on_a_cpu_does_not() -> None:
    fp = problem_footprint(_problem("L1/12_MaxReduction"))
    assert fp is not None
    unstaged = dataclasses.replace(fp, cuda_forward_bytes=None, cuda_float64_bytes=None)
    staging = fp.on("cuda").forward_bytes - fp.forward_bytes
    assert staging > 700 * MIB
    for hold, held in ((Hold.ALL, 10), (Hold.TRUTH, 3)):
        need = verified_need(fp, hold, held, "device", 2, on_cuda=True)
        assert need.device - verified_need(unstaged, hold, held, "device", 2, on_cuda=True).device >= staging
        assert verified_need(fp, hold, held, "device", 2, on_cuda=False) == \
            verified_need(unstaged, hold, held, "device", 2, on_cuda=False)
    assert standard_need(fp, 5, "device", True).device - standard_need(unstaged, 5, "device", True).device >= staging


ROWS = """
import torch, torch.nn as nn
class Model(nn.Module):
    def forward(self, x):
        return torch.sum(x, dim=1)
def get_inputs():
    return [torch.rand(16, 1 << 20)]
def get_init_inputs():
    return []
"""


def test_each_lane_plans_with_its_own_cards_split(tmp_path, monkeypatch) -> None:
    """Lanes on cards of two kinds in one process: a few long rows split across as many CTAs as the
    card has room for, so each card's plan counts its own staging, traced once per card."""
    import kbv.footprint

    cards = {"cuda:0": Card(132, 2048), "cuda:1": Card(66, 2048)}
    monkeypatch.setattr(kbv.footprint, "card_of", lambda device=None: cards.get(str(device), Card()))
    problem = load_problem_file(write_tree(tmp_path, {"level1/1_RowSum.py": ROWS}) / "level1" / "1_RowSum.py")
    large, small = problem_footprint(problem, "cuda:0"), problem_footprint(problem, "cuda:1")
    assert large is not None and small is not None
    assert small.forward_bytes < small.on("cuda").forward_bytes < large.on("cuda").forward_bytes
    assert problem_footprint(problem, "cuda:0") is large
