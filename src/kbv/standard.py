"""The standard protocol: KernelBench's evaluation, run across the trust boundary.

The parent prepares each problem once (`prepare_standard`): model under seed 42, the five trial
inputs drawn as KernelBench draws them, the reference run first on each, and the timing inputs. The
baseline (eager PyTorch, default flags) is timed in a child that loads no candidate code. Each
candidate then runs in its own child: load, five forwards compared with `allclose`, and, if all pass,
KernelBench's CUDA-event timer (or a host timer on CPU).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from kbv.builds import Build
from kbv.candidates import Pair
from kbv.compare import Comparison, compare_allclose
from kbv.errors import ProblemRunError
from kbv.inputs import (
    flatten_outputs,
    kernelbench_trial_seeds,
    rng_isolated,
    set_seed,
    to_device,
)
from kbv.problems import Problem, instantiate_problem
from kbv.protocols import StandardProtocol
from kbv.sandbox import ChildFailure, Sandbox, SharedArena
from kbv.settings import Settings, time_left
from kbv.verdict import Category, Status, Timing, TimingStats, Trial, Verdict


@dataclass
class StandardContext:
    """Parent-side state of one problem under the standard protocol (holds device tensors)."""

    problem: Problem
    init_inputs: list[Any]
    trials: list[tuple[list[Any], list[torch.Tensor]]]  # (inputs after the reference ran, reference outputs)
    timing_inputs: list[Any]


def prepare_standard(problem: Problem, protocol: StandardProtocol, device: torch.device) -> StandardContext:
    """Build the reference and its outputs on KernelBench's seeds. Raises ProblemRunError."""
    module = instantiate_problem(problem)
    try:
        with rng_isolated(), torch.no_grad():
            set_seed(protocol.seed)
            init_inputs = list(module.get_init_inputs())
            set_seed(protocol.seed)
            model = module.Model(*init_inputs)
            if isinstance(model, torch.nn.Module):
                model = model.to(device)
            trials = []
            for seed in kernelbench_trial_seeds(protocol.seed, protocol.correctness_trials):
                set_seed(seed)
                inputs = to_device(module.get_inputs(), device)
                reference = [r.detach().clone() for r in flatten_outputs(model(*inputs))]
                trials.append((inputs, reference))
            set_seed(protocol.seed)
            timing_inputs = to_device(module.get_inputs(), device)
    except Exception as exc:
        raise ProblemRunError(f"{problem.origin}: the problem's own code failed: {type(exc).__name__}: {exc}") from exc
    return StandardContext(problem, init_inputs, trials, timing_inputs)


def measure_standard_baseline(ctx: StandardContext, protocol: StandardProtocol, settings: Settings) -> TimingStats:
    """Eager PyTorch with default flags, timed like a candidate, in a child without candidate code."""
    label = f"baseline-{ctx.problem.hash[:12]}"
    try:
        with settings.child_scratch(label) as spec, Sandbox(spec) as sb, SharedArena() as arena:
            sb.call({"op": "load", "source": "reference", "code": ctx.problem.code, "origin": ctx.problem.origin,
                     "init_args": ctx.init_inputs, "seed": protocol.seed, "precision": protocol.precision},
                    settings.timeout_s)
            reply = sb.call({"op": "time", "inputs": arena.handles(ctx.timing_inputs),
                             "config": protocol.timer.__dict__}, settings.timeout_s)
    except ChildFailure as failure:
        raise ProblemRunError(f"{ctx.problem.origin}: timing the reference failed: {failure.message}") from failure
    return TimingStats.of(reply["samples_ms"])


def evaluate_standard(pair: Pair, ctx: StandardContext, build: Build, baseline: TimingStats,
                      protocol: StandardProtocol, settings: Settings) -> Verdict:
    """The standard verdict of one pair. Never raises for a bad candidate."""
    t0 = time.monotonic()
    base = blank_verdict(pair, protocol, settings)
    if build.status is not None:
        return _finish(base, t0, status=build.status, message=build.message, evidence=build.evidence)
    deadline = t0 + settings.timeout_s
    label = f"eval-{pair.candidate.hash[:12]}-{pair.problem.hash[:8]}"
    try:
        with settings.child_scratch(label, build.build_dir) as spec, Sandbox(spec) as sb, SharedArena() as arena:
            sb.call({"op": "load", "source": "candidate", "path": str(build.candidate_path),
                     "init_args": ctx.init_inputs, "seed": protocol.seed, "precision": protocol.precision},
                    time_left(deadline))
            trials = _run_trials(sb, arena, ctx, protocol, deadline)
            failed = [t for t in trials if not t.passed]
            if failed:
                return _finish(base, t0, status=Status.INCORRECT, trials=tuple(trials),
                               categories=_categories(failed),
                               message=f"{len(trials) - len(failed)}/{len(trials)} trials passed: {failed[0].note}")
            reply = sb.call({"op": "time", "inputs": arena.handles(ctx.timing_inputs),
                             "config": protocol.timer.__dict__}, time_left(deadline))
    except ChildFailure as failure:
        return _finish(base, t0, status=failure.status, message=failure.message, evidence=failure.evidence)
    return _finish(base, t0, status=Status.CORRECT, trials=tuple(trials),
                   timing=_timing(reply["samples_ms"], baseline, settings),
                   message=f"{len(trials)}/{len(trials)} trials passed")


def _run_trials(sb: Sandbox, arena: SharedArena, ctx: StandardContext, protocol: StandardProtocol,
                deadline: float) -> list[Trial]:
    trials = []
    for index, (inputs, references) in enumerate(ctx.trials):
        buffers = [arena.empty(r.shape, r.dtype) for r in references]
        for buf, _ in buffers:
            _poison(buf)
        reply = sb.call({"op": "forward", "inputs": arena.handles(inputs),
                         "outputs": [h for _, h in buffers]}, time_left(deadline))
        comparison = _compare(reply, references, [b for b, _ in buffers], protocol.tolerance)
        trials.append(Trial("default", index, comparison.passed, comparison.max_abs_err, comparison.max_rel_err,
                            category=comparison.category, note=comparison.note or _describe_error(comparison)))
    return trials


def _compare(reply: dict[str, Any], references: list[torch.Tensor], buffers: list[torch.Tensor],
             tolerance: float) -> Comparison:
    if reply["count"] != len(references):
        return Comparison(False, Category.SHAPE_MISMATCH,
                          note=f"returned {reply['count']} outputs, expected {len(references)}")
    worst = Comparison(True)
    for meta, ref, buf in zip(reply["outputs"], references, buffers):
        if not meta.get("tensor"):
            return Comparison(False, Category.NOT_A_TENSOR, note=f"returned a {meta.get('type')}, not a tensor")
        if not meta.get("copied"):
            if tuple(meta["shape"]) != tuple(ref.shape):
                return Comparison(False, Category.SHAPE_MISMATCH,
                                  note=f"shape {tuple(meta['shape'])} != {tuple(ref.shape)}")
            return Comparison(False, Category.DTYPE_MISMATCH, note=f"dtype {meta['dtype']} != {str(ref.dtype)[6:]}")
        if meta["device"].split(":")[0] != ref.device.type:
            return Comparison(False, Category.WRONG_DEVICE, note=f"output on {meta['device']}, expected {ref.device}")
        comparison = compare_allclose(ref, buf.to(ref.device), atol=tolerance, rtol=tolerance)
        if not comparison.passed:
            return comparison
        worst = comparison if (comparison.max_abs_err or 0) >= (worst.max_abs_err or 0) else worst
    return worst


def _describe_error(c: Comparison) -> str:
    if c.passed:
        return ""
    return f"max abs error {c.max_abs_err:.3g}" if c.max_abs_err is not None else "mismatch"


def _categories(failed: list[Trial]) -> tuple[Category, ...]:
    return tuple(dict.fromkeys(t.category or Category.VALUE_MISMATCH for t in failed))


def _poison(buf: torch.Tensor) -> None:
    if buf.is_floating_point():
        buf.fill_(float("nan"))
    elif buf.dtype != torch.bool:
        buf.fill_(torch.iinfo(buf.dtype).max if buf.dtype.is_signed or buf.dtype == torch.uint8 else 0)


def _timing(samples_ms: list[float], baseline: TimingStats, settings: Settings) -> Timing:
    cand = TimingStats.of(samples_ms)
    method = "kernelbench-cuda-events" if settings.device_type == "cuda" else "host-timer"
    speedup = baseline.mean_ms / cand.mean_ms if cand.mean_ms > 0 else float("inf")
    return Timing(method=method, statistic="mean_ms", candidate=cand, baselines={"eager": baseline},
                  speedups={"eager": speedup})


def blank_verdict(pair: Pair, protocol: StandardProtocol, settings: Settings) -> Verdict:
    return Verdict(problem=pair.problem.key, problem_hash=pair.problem.hash, level=pair.problem.level,
                   candidate=pair.candidate.name, candidate_hash=pair.candidate.hash,
                   protocol=protocol.name, protocol_version=protocol.version, status=Status.RUNTIME_ERROR,
                   provenance=settings.provenance, model=pair.candidate.model, sample=pair.candidate.sample)


def _finish(base: Verdict, t0: float, **changes: Any) -> Verdict:
    from dataclasses import replace

    timing = changes.get("timing")
    if timing is not None and changes.get("status", base.status).passed:
        changes["speedup"] = timing.speedups.get("eager")
    return replace(base, wall_s=time.monotonic() - t0, **changes)
