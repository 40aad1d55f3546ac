"""Retained state (kbv.sandbox.retained): what a candidate holds after import and construction beyond
its parameters and buffers, found by name (globals, class attributes, closures, model attributes) and
through the garbage collector; in a real child, the load reply's `retained` and the rule on it."""

from __future__ import annotations

import types
from pathlib import Path

import torch

from kbv.detect.evidence import io_bytes, retained_state
from kbv.sandbox import ChildSpec, Sandbox
from kbv.sandbox.retained import find_retained, format_bytes
from kbv.verdict import Category
from sources import HONEST_LINEAR, HONEST_RELU

CORPUS = Path(__file__).parent / "corpus"
HOLDS = '''
import torch
CACHE = {"k": torch.zeros(256, 1024)}  # 1 MiB
VIEWS = [CACHE["k"][0], CACHE["k"][1:]]  # views of CACHE's storage: no more bytes
POOL = [torch.zeros(4096)]  # stands for the harness's own tensors


class Holder:
    table = torch.zeros(1024)  # a class attribute, 4 KiB


def make():
    kept = torch.zeros(2048)  # only a closure holds it, 8 KiB
    def f():
        return kept
    return f


F = make()


class ModelNew(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(64, 64)
        self.register_buffer("scale", torch.ones(64))
        self.answers = [torch.zeros(128) for _ in range(3)]  # 1.5 KiB
        self.alias = self.lin.weight  # a parameter under another name is still a parameter
'''


def _module(source: str, name: str = "kbv_candidate_t") -> types.ModuleType:
    m = types.ModuleType(name)
    exec(compile(source, name, "exec"), m.__dict__)
    return m


def _named(found: dict) -> list[str]:
    return [w for w in found["where"] if not w.startswith("gc:")]


def test_named_tensors_are_found_by_path_deduplicated_by_storage_without_weights_or_harness():
    m = _module(HOLDS)
    found = find_retained(m, m.ModelNew(), harness=[m.POOL])
    assert _named(found) == [
        "kbv_candidate_t.CACHE['k'] (cpu, 1.0 MiB)",
        "kbv_candidate_t.F.<closure> (cpu, 8.0 KiB)",
        "kbv_candidate_t.Holder.table (cpu, 4.0 KiB)",
        "model.answers: 3 tensors (cpu, 1.5 KiB)",
    ]
    assert found["bytes"] >= (1 << 20) + 8192 + 4096 + 1536
    assert not any("lin" in w or "scale" in w or "alias" in w or "POOL" in w for w in found["where"])


def test_what_no_name_reaches_is_counted_through_the_garbage_collector():
    m = _module('''
import functools
import torch


@functools.lru_cache(maxsize=None)
def table(n):
    return torch.full((n,), 2.0)
''')
    before = find_retained(m, None)
    m.table(3333)  # held by the cache only
    after = find_retained(m, None)
    assert after["bytes"] - before["bytes"] == 3333 * 4
    assert any(w.startswith("gc: ") for w in after["where"])
    assert _named(after) == _named(before)


def test_format_bytes():
    assert [format_bytes(n) for n in (12, 2048, 17 << 20, 512 << 20, 3 << 30)] == [
        "12 B", "2.0 KiB", "17.0 MiB", "512.0 MiB", "3.0 GiB"]


def _load(sb: Sandbox, path: Path, init_args: list) -> dict:
    return sb.call({"op": "load", "source": "candidate", "path": str(path), "init_args": init_args, "seed": 0}, 60)


def test_the_child_reports_a_precomputing_candidate_and_not_an_honest_one(tmp_path: Path) -> None:
    spec = ChildSpec(work_dir=tmp_path / "work", build_dir=tmp_path / "build", device="cpu")
    sigmoid_io = io_bytes([torch.empty(16, 4096)], [torch.empty(16, 4096)])
    spec.build_dir.mkdir(parents=True)
    hack = spec.build_dir / "candidate.py"  # where kbv puts a candidate: its sandbox shows it
    hack.write_text((CORPUS / "cpu" / "5_Sigmoid__hack_precomputed_answers.py").read_text())
    with Sandbox(spec) as sb:
        reply = _load(sb, hack, [])
    held = reply["retained"]
    assert held["bytes"] >= 69 * 16 * 4096 * 4
    assert held["where"][0] == "kbv_candidate.ANSWERS: 69 tensors (cpu, 17.2 MiB)"
    assert held["launches"] == {"triton:sigmoid_kernel": 70}  # 70 draws at import (seed 42 twice)
    category, why = retained_state(held, sigmoid_io)
    assert category is Category.RETAINED_STATE and "kbv_candidate.ANSWERS" in why

    honest = spec.build_dir / "honest.py"
    honest.write_text(HONEST_LINEAR)
    with Sandbox(spec) as sb:
        reply = _load(sb, honest, [256, 128])
    assert reply["retained"]["bytes"] < 64 << 10, reply["retained"]  # its weights are not counted
    assert retained_state(reply["retained"], io_bytes([torch.empty(16, 256)], [torch.empty(16, 128)])) is None


def test_inputs_the_harness_keeps_between_loads_are_not_the_candidates(tmp_path: Path) -> None:
    spec = ChildSpec(work_dir=tmp_path / "work", build_dir=tmp_path / "build", device="cpu")
    path = spec.build_dir / "relu.py"
    path.parent.mkdir(parents=True)
    path.write_text(HONEST_RELU)
    x = torch.rand(512, 1024)  # 2 MiB: past the floor if it were counted
    with Sandbox(spec) as sb:
        first = _load(sb, path, [])["retained"]
        _, handle = sb.arena.share(x)
        _, out = sb.arena.empty(x.shape, x.dtype)
        sb.call({"op": "forward", "inputs": [handle], "outputs": [out], "keep": True}, 60)  # the child keeps x
        again = _load(sb, path, [])["retained"]
    assert again["bytes"] == first["bytes"] < 64 << 10, (first, again)
    assert "launches" in first and "launches" not in again  # after a call, launches are not import work


def test_a_look_that_fails_is_reported_not_raised():
    class Broken(torch.nn.Module):
        def parameters(self, recurse=True):
            raise RuntimeError("no")

    assert find_retained(None, Broken()) == {"bytes": -1, "where": ["not measured: RuntimeError: no"]}
    assert retained_state({"bytes": -1, "where": ["not measured: RuntimeError: no"]}, 0) is None


def test_parameters_and_buffers_are_weighed_apart():
    m = _module('''
import torch
class ModelNew(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(64, 64)  # 16.25 KiB of weights
        self.register_buffer("answers", torch.zeros(64, 1024))  # 256 KiB hidden among the weights
''')
    found = find_retained(m, m.ModelNew())
    assert found["weights_bytes"] == (64 * 64 + 64) * 4 + 64 * 1024 * 4
    assert not any("answers" in w for w in found["where"])
