"""Memory figures (kbv.sandbox.memory), counted from before the model's first call: the rules over
recorded levels, the CPU's level (the tensor storages alive, touched or not), a CPU child after the
verified protocol's first call, and the protocol end to end on the CPU and (`gpu`) on a GPU, where a
row sum keeps a 1 GiB workspace made on its first call."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from kbv.api import EvalConfig, evaluate
from kbv.metrics import raises_peak_memory
from kbv.protocols.verified.correctness import forward
from kbv.protocols.verified.timer import load_pool
from kbv.report.figures import peak_ratio
from kbv.sandbox import ChildSpec, Sandbox, memory
from kbv.sandbox.memory import FirstCallFigures, Levels, held_since, read_levels, with_first_call
from kbv.verdict import MemoryStats, Status
from verdict_log import log_verdicts

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
FIXTURES = Path(__file__).parent / "gpu_fixtures"

ROW_SUM_PROBLEM = '''\
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return x.sum(dim=1)


def get_inputs():
    return [torch.randn(256, 1024)]


def get_init_inputs():
    return []
'''
KEEPS_WORKSPACE = '''\
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        if not hasattr(self, "workspace"):  # made on the first call, kept: 64 MiB
            self.workspace = torch.empty(16 << 20, device=x.device)
        return x.sum(dim=1)
'''
HONEST_ROW_SUM = '''\
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        return x.sum(dim=1)
'''


# -- the rules over recorded levels ---------------------------------------------------------------

def test_what_the_harness_allocated_since_the_first_call_is_not_held():
    before = Levels(total_bytes=100 * MIB, harness_bytes=10 * MIB)
    pool_loaded = Levels(total_bytes=180 * MIB, harness_bytes=90 * MIB)  # 80 MiB of timing pool
    assert held_since(before, pool_loaded) == 0
    assert held_since(before, Levels(total_bytes=180 * MIB + GIB, harness_bytes=90 * MIB)) == GIB
    assert held_since(before, Levels(total_bytes=50 * MIB, harness_bytes=10 * MIB)) == 0  # never negative


def test_a_workspace_kept_from_the_first_call_is_retained_and_in_the_peak():
    steady = MemoryStats(peak_bytes=16 * KIB, retained_bytes=0, device_peak_bytes=16 * KIB, device_raw_bytes=0)
    first = FirstCallFigures(held_bytes=GIB, peak_bytes=GIB + 16 * KIB, raw_peak_bytes=0, library_bytes=0)
    got = with_first_call(steady, first)
    assert got == MemoryStats(peak_bytes=GIB + 16 * KIB, retained_bytes=GIB, device_peak_bytes=GIB + 16 * KIB,
                              device_raw_bytes=0)


def test_the_peak_is_never_less_than_what_is_retained():
    """On a CPU the first call's own peak is not taken; an untouched workspace is no resident memory."""
    steady = MemoryStats(peak_bytes=0, retained_bytes=0)
    got = with_first_call(steady, FirstCallFigures(held_bytes=64 * MIB, peak_bytes=None, raw_peak_bytes=None,
                                                   library_bytes=0))
    assert got == MemoryStats(peak_bytes=64 * MIB, retained_bytes=64 * MIB)


def test_an_honest_models_figures_are_the_measured_calls():
    """Nothing kept, and a first call whose peak above the measured call's is cuBLAS's workspace (made
    once per stream and kept, in a baseline's child as in a candidate's): the measured call's figures."""
    steady = MemoryStats(peak_bytes=36 * MIB, retained_bytes=0, device_peak_bytes=36 * MIB, device_raw_bytes=0)
    first = FirstCallFigures(held_bytes=0, peak_bytes=68 * MIB, raw_peak_bytes=0, library_bytes=32 * MIB)
    assert with_first_call(steady, first) == steady
    cpu = MemoryStats(peak_bytes=4 * KIB, retained_bytes=0)
    assert with_first_call(cpu, FirstCallFigures(0, None, None, 0)) == cpu


def test_one_time_work_of_the_first_call_freed_before_it_returns_is_no_peak_of_the_kernels():
    """An autotuner benchmarking its configurations over a 256 MB buffer, once: not the kernel's footprint."""
    steady = MemoryStats(peak_bytes=16 * KIB, retained_bytes=0, device_peak_bytes=16 * KIB, device_raw_bytes=0)
    first = FirstCallFigures(held_bytes=0, peak_bytes=256 * MIB, raw_peak_bytes=512 * MIB, library_bytes=0)
    assert with_first_call(steady, first) == steady


def test_figures_not_measured_stay_so():
    steady = MemoryStats(peak_bytes=-1, retained_bytes=-1)
    assert with_first_call(steady, FirstCallFigures(GIB, GIB, None, 0)) == steady


def test_the_cpu_level_counts_storages_touched_or_not_and_the_harness_apart():
    pool: list[torch.Tensor] = []
    before = read_levels(torch.device("cpu"), [pool])
    kept = torch.empty(2 * MIB)  # 8 MiB, never touched: no resident memory, still held
    views = [kept[1:], kept.view(2, -1)]  # views of its storage: no more bytes
    pool.append(torch.empty(MIB))  # the harness's own
    after = read_levels(torch.device("cpu"), [pool])
    assert held_since(before, after) == 8 * MIB
    assert after.harness_bytes - before.harness_bytes == 4 * MIB
    del kept, views


def test_on_cuda_the_harness_is_sized_by_the_allocators_own_blocks(monkeypatch):
    """Each allocated block at the segment's address plus the blocks before it, at the size the
    allocator counts (a request rounded up), on the device asked about only."""
    segments = [{"device": 0, "address": 0x10000, "blocks": [
        {"size": 512, "state": "active_allocated"}, {"size": 1536, "state": "inactive"},
        {"size": 4 * MIB, "state": "active_allocated"}]},
        {"device": 1, "address": 0x90000, "blocks": [{"size": 512, "state": "active_allocated"}]}]
    monkeypatch.setattr(torch.cuda, "memory_snapshot", lambda: segments)
    assert memory._allocator_blocks(torch.device("cuda", 0)) == {0x10000: 512, 0x10800: 4 * MIB}
    assert memory._segments(torch.device("cuda", 1)) == {0x90000}


# -- a CPU child ----------------------------------------------------------------------------------

def _figures_after_the_first_calls(root: Path, name: str, code: str) -> dict:
    """A candidate's child as the verified protocol drives it: load, two correctness runs (the first
    poisoned, checked, its inputs kept), the timing pool, then `memory`."""
    path = root / "build" / f"{name}.py"  # in the build directory, which a sandboxed child sees
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(code)
    sb = Sandbox(ChildSpec(work_dir=root / name, build_dir=root / "build", device="cpu"))
    try:
        sb.start()
        sb.call({"op": "load", "source": "candidate", "path": str(path), "precision": "tf32"}, 60)
        x = torch.randn(256, 1024)
        for flags in ({"poison": float("nan"), "checks": True, "keep": True}, {"poison": 0.5}):
            run = forward(sb, [x], [x.sum(dim=1)], time.monotonic() + 60, **flags)
            assert run.outputs is not None and torch.allclose(run.outputs[0], x.sum(dim=1), atol=1e-3)
        load_pool(sb, [[torch.randn(256, 1024)] for _ in range(3)], 0, 60)
        return sb.call({"op": "memory"}, 60)
    finally:
        sb.close()


def test_a_cpu_child_counts_the_workspace_kept_from_the_first_call(tmp_path):
    keeps = _figures_after_the_first_calls(tmp_path, "keeps", KEEPS_WORKSPACE)
    assert keeps["retained_bytes"] >= 64 * MIB and keeps["peak_bytes"] >= 64 * MIB, keeps
    honest = _figures_after_the_first_calls(tmp_path, "honest", HONEST_ROW_SUM)
    assert honest["retained_bytes"] == 0, honest  # the pool, the kept inputs: the harness's


# -- the verified protocol end to end -------------------------------------------------------------

def _verdicts(root: Path, problem: str, candidates: dict[str, str], device: str, cache_dir: Path) -> dict:
    (root / "problems" / "level1").mkdir(parents=True)
    (root / "problems" / "level1" / "1_RowSum.py").write_text(problem)
    cands = root / "cands"
    cands.mkdir()
    for label, code in candidates.items():
        (cands / f"1_RowSum__{label}.py").write_text(code)
    result = evaluate(EvalConfig(candidates=str(cands), problems=str(root / "problems"), protocol="verified",
                                 device=device, run_dir=str(root / "run"), cache_dir=str(cache_dir), seed=5,
                                 timer_budget_s=1.0, ci_target=0.1))
    log_verdicts(result.verdicts)
    return {v.candidate.split("__")[-1]: v for v in result.verdicts}


def test_the_verified_protocol_counts_a_workspace_kept_from_the_first_call_on_cpu(tmp_path, cache_dir):
    got = _verdicts(tmp_path, ROW_SUM_PROBLEM, {"keeps": KEEPS_WORKSPACE, "honest": HONEST_ROW_SUM}, "cpu",
                    cache_dir)
    for v in got.values():  # plain PyTorch: correct, no custom kernel, its memory measured
        assert v.status is Status.NO_CUSTOM_KERNEL, (v.candidate, v.status, v.message)
        assert v.memory is not None and v.baseline_memory is not None
        assert v.baseline_memory.retained_bytes == 0, v.baseline_memory
    keeps, honest = got["keeps"].memory, got["honest"].memory
    assert keeps.retained_bytes >= 64 * MIB and keeps.peak_bytes >= 64 * MIB, keeps
    assert raises_peak_memory(keeps, got["keeps"].baseline_memory)
    assert honest.retained_bytes == 0, honest


@pytest.mark.gpu
@pytest.mark.slow
def test_a_1_gib_workspace_kept_from_the_first_call_shows_on_a_gpu(tmp_path, cache_dir):
    """The issue's row sum: a 1 GiB workspace made on the first call and kept, against the baseline's
    16 KiB output. An honest row sum keeps nothing, and its peak is the baseline's."""
    got = _verdicts(tmp_path, (FIXTURES / "problem_row_sum.py").read_text(),
                    {"keeps": (FIXTURES / "workspace_first_call.py").read_text(), "honest": HONEST_ROW_SUM},
                    "cuda", cache_dir)
    keeps, honest = got["keeps"], got["honest"]
    for v in (keeps, honest):
        assert v.memory is not None and v.baseline_memory is not None, (v.status, v.message)
        assert v.baseline_memory.retained_bytes == 0, v.baseline_memory
    assert keeps.memory.retained_bytes >= GIB, keeps.memory
    assert keeps.memory.peak_bytes >= GIB, keeps.memory
    ratio = peak_ratio(keeps)
    assert ratio is not None and ratio > 1000, (ratio, keeps.memory, keeps.baseline_memory)
    assert raises_peak_memory(keeps.memory, keeps.baseline_memory)
    assert honest.memory.retained_bytes == 0, honest.memory
    assert honest.memory.peak_bytes == honest.baseline_memory.peak_bytes, (honest.memory, honest.baseline_memory)
    assert not raises_peak_memory(honest.memory, honest.baseline_memory)
