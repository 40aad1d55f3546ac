"""The standard protocol: KernelBench's evaluation (v0.1 scripts), run across the trust boundary.

Rules (`StandardProtocol`): seed 42, five correctness trials on per-trial seeds drawn from it, the
reference first on the same inputs, a shape check then `allclose(atol=rtol=1e-2)`, CUDA-event timing
(3 warm-ups, 100 trials, L2 flush, mean) against a live eager baseline with PyTorch's default
precision flags.

Per problem (`prepare`, in the parent): the model under seed 42, the five trials' inputs and the
reference outputs, the timing inputs, and the baseline timed in a child that loads no candidate code.
Per candidate (`evaluate`, in its own child): load, five forwards compared with `allclose`, and, if
all pass, KernelBench's timer (a host timer on CPU).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from kbv.builds import Build
from kbv.candidates import Pair
from kbv.compare import Comparison, compare_allclose
from kbv.errors import ProblemRunError
from kbv.inputs import flatten_outputs, kernelbench_trial_seeds, rng_isolated, set_seed, tensor_bytes, to_device
from kbv.problems import Problem, instantiate_problem, problem_code
from kbv.protocols import blank_verdict, fingerprint
from kbv.sandbox import ChildFailure, Sandbox
from kbv.sandbox.timers import StandardTimerConfig
from kbv.settings import Settings, time_left
from kbv.stages import stage
from kbv.verdict import Category, Status, Timing, TimingStats, Trial, Verdict, finish_verdict


@dataclass(frozen=True)
class StandardProtocol:
    """KernelBench's rules. `tolerance` is atol = rtol (1e-2 as in v0/v0.1; 1e-4 as KernelBench HEAD)."""

    seed: int = 42
    correctness_trials: int = 5
    tolerance: float = 1e-2
    timer: StandardTimerConfig = field(default_factory=StandardTimerConfig)
    precision: str = "default"  # PyTorch's default flags for reference, baseline and candidate
    name: str = "standard"

    @property
    def version(self) -> str:
        return f"kernelbench-v0.1+tol{self.tolerance:g}"

    @property
    def primary_baseline(self) -> str:
        return "eager"

    def fingerprint(self) -> str:
        return fingerprint(asdict(self))


@dataclass
class StandardContext:
    """Parent-side state of one problem (device tensors) and its baseline's timing."""

    problem: Problem
    init_inputs: list[Any]
    trials: list[tuple[list[Any], list[torch.Tensor]]]  # (inputs after the reference ran, reference outputs)
    timing_inputs: list[Any]
    baseline: TimingStats | None = None


# Above this, a problem's correctness trials wait on the host between candidates: the device is shared
# with the children (each of which holds its own inputs), and with the verified protocol's problem.
DEVICE_TRIALS_BUDGET_BYTES = 8 << 30


def prepare_standard(problem: Problem, protocol: StandardProtocol, device: torch.device) -> StandardContext:
    """Build the reference and its outputs on KernelBench's seeds. Raises ProblemRunError."""
    module = instantiate_problem(problem)
    with rng_isolated(), torch.no_grad(), problem_code(problem.origin, "under KernelBench's seeds"):
        set_seed(protocol.seed)
        init_inputs = list(module.get_init_inputs())
        set_seed(protocol.seed)
        model = module.Model(*init_inputs)
        if isinstance(model, torch.nn.Module):
            model = model.to(device)
        trials = []
        park = False  # on the host between candidates (moved to the device one trial at a time)
        for seed in kernelbench_trial_seeds(protocol.seed, protocol.correctness_trials):
            set_seed(seed)
            inputs = to_device(module.get_inputs(), device)
            reference = [r.detach().clone() for r in flatten_outputs(model(*inputs))]
            if not trials and device.type == "cuda":
                park = tensor_bytes(inputs + reference) * protocol.correctness_trials > DEVICE_TRIALS_BUDGET_BYTES
            if park:
                inputs, reference = to_device(inputs, torch.device("cpu")), [r.cpu() for r in reference]
            trials.append((inputs, reference))
        set_seed(protocol.seed)
        timing_inputs = to_device(module.get_inputs(), device)
    return StandardContext(problem, init_inputs, trials, timing_inputs)


class StandardRunner:
    """The standard protocol as the executor drives it: prepare / evaluate / release / blank."""

    name = "standard"

    def __init__(self, protocol: StandardProtocol, settings: Settings, baselines: Any, device_fingerprint: str) -> None:
        self.protocol = protocol
        self.settings = settings
        self.baselines = baselines  # the store's baseline cache (get_baseline / put_baseline), or None
        self.device_fingerprint = device_fingerprint

    def fingerprint(self) -> str:
        return self.protocol.fingerprint()

    def prepare(self, pair: Pair) -> StandardContext:
        key = f"{pair.problem.hash}:{self.protocol.fingerprint()}:{self.device_fingerprint}:eager"
        cached = self.baselines.get_baseline(key) if self.baselines else None
        with stage("prepare"), contextlib.ExitStack() as stack:
            sb = None
            if cached is None:  # the baseline's child comes up while KernelBench's inputs are drawn
                spec = stack.enter_context(self.settings.child_scratch(f"baseline-{pair.problem.hash[:12]}"))
                sb = stack.enter_context(Sandbox(spec))
            ctx = prepare_standard(pair.problem, self.protocol, torch.device(self.settings.device))
            ctx.baseline = cached
            if sb is not None:
                ctx.baseline = self._time_baseline(ctx, sb)
                if self.baselines:
                    self.baselines.put_baseline(key, pair.problem.hash, "eager", ctx.baseline)
        return ctx

    def _time_baseline(self, ctx: StandardContext, sb: Sandbox) -> TimingStats:
        """Eager PyTorch with default flags, timed like a candidate, in a child without candidate code."""
        timeout = self.settings.timeout_s
        try:
            sb.ready(timeout)
            sb.call({"op": "load", "source": "reference", "code": ctx.problem.code, "origin": ctx.problem.origin,
                     "init_args": ctx.init_inputs, "seed": self.protocol.seed,
                     "precision": self.protocol.precision}, timeout)
            inputs = sb.put(ctx.timing_inputs, timeout)
            with stage("timing"):
                reply = sb.call({"op": "time", "inputs": inputs, "config": asdict(self.protocol.timer)}, timeout)
        except ChildFailure as failure:
            raise ProblemRunError(f"{ctx.problem.origin}: timing the reference failed: {failure.message}") from failure
        return TimingStats.of(reply["samples_ms"])

    def blank(self, pair: Pair) -> Verdict:
        return blank_verdict(pair, self.protocol, self.settings.provenance)

    def release(self, ctx: StandardContext) -> None:
        ctx.trials.clear()  # the tensors go now, whoever still holds the context
        ctx.timing_inputs = []

    def evaluate(self, pair: Pair, ctx: StandardContext, build: Build, sb: Sandbox) -> Verdict:
        """The standard verdict of one pair in the started child `sb`. Never raises for a bad candidate."""
        t0 = time.monotonic()
        base = self.blank(pair)
        if build.status is not None:
            return finish_verdict(base, t0, status=build.status, message=build.message, evidence=build.evidence)
        deadline = t0 + self.settings.timeout_s
        try:
            with stage("load"):
                sb.call({"op": "load", "source": "candidate", "path": str(build.candidate_path),
                         "init_args": ctx.init_inputs, "seed": self.protocol.seed,
                         "precision": self.protocol.precision}, time_left(deadline))
            with stage("correctness"):
                trials = _run_trials(sb, ctx, self.protocol, deadline, torch.device(self.settings.device))
            failed = [t for t in trials if not t.passed]
            if failed:
                return finish_verdict(base, t0, status=Status.INCORRECT, trials=tuple(trials),
                                      categories=tuple(dict.fromkeys(t.category or Category.VALUE_MISMATCH
                                                                     for t in failed)),
                                      message=f"{len(trials) - len(failed)}/{len(trials)} trials passed: "
                                              f"{failed[0].note}")
            with stage("timing"):
                reply = sb.call({"op": "time", "inputs": sb.put(ctx.timing_inputs, time_left(deadline)),
                                 "config": asdict(self.protocol.timer)}, time_left(deadline))
        except ChildFailure as failure:
            return finish_verdict(base, t0, status=failure.status, message=failure.message, evidence=failure.evidence)
        assert ctx.baseline is not None
        timing = _timing(reply["samples_ms"], ctx.baseline, self.settings)
        return finish_verdict(base, t0, status=Status.CORRECT, trials=tuple(trials), timing=timing,
                              speedup=timing.speedups["eager"], message=f"{len(trials)}/{len(trials)} trials passed")


def _run_trials(sb: Sandbox, ctx: StandardContext, protocol: StandardProtocol, deadline: float,
                device: torch.device) -> list[Trial]:
    trials = []
    for index, (inputs, references) in enumerate(ctx.trials):
        inputs, references = to_device(inputs, device), [r.to(device) for r in references]  # parked ones come back
        refs = sb.put(inputs, time_left(deadline))
        fields, receipt = sb.expect(references)
        reply = sb.call({"op": "forward", "inputs": refs, **fields}, time_left(deadline))
        outputs = sb.take(reply, receipt, time_left(deadline))
        comparison = _compare(reply, references, outputs, protocol.tolerance)
        trials.append(Trial("default", index, comparison.passed, comparison.max_abs_err, comparison.max_rel_err,
                            category=comparison.category, note=comparison.note or _describe_error(comparison)))
    return trials


def _compare(reply: dict[str, Any], references: list[torch.Tensor], outputs: list[torch.Tensor] | None,
             tolerance: float) -> Comparison:
    if reply["count"] != len(references):
        return Comparison(False, Category.SHAPE_MISMATCH,
                          note=f"returned {reply['count']} outputs, expected {len(references)}")
    worst = Comparison(True)
    for k, (meta, ref) in enumerate(zip(reply["outputs"], references)):
        if not meta.get("tensor"):
            return Comparison(False, Category.NOT_A_TENSOR, note=f"returned a {meta.get('type')}, not a tensor")
        if tuple(meta["shape"]) != tuple(ref.shape):
            return Comparison(False, Category.SHAPE_MISMATCH, note=f"shape {tuple(meta['shape'])} != {tuple(ref.shape)}")
        if meta["dtype"] != str(ref.dtype).removeprefix("torch."):
            return Comparison(False, Category.DTYPE_MISMATCH, note=f"dtype {meta['dtype']} != {str(ref.dtype)[6:]}")
        if meta["device"].split(":")[0] != ref.device.type:
            return Comparison(False, Category.WRONG_DEVICE, note=f"output on {meta['device']}, expected {ref.device}")
        if outputs is None:
            return Comparison(False, Category.NOT_A_TENSOR,
                              note=f"the output could not be read: {meta.get('copy_error', 'not copied')}")
        comparison = compare_allclose(ref, outputs[k], atol=tolerance, rtol=tolerance)
        if not comparison.passed:
            return comparison
        worst = comparison if (comparison.max_abs_err or 0) >= (worst.max_abs_err or 0) else worst
    return worst


def _describe_error(c: Comparison) -> str:
    if c.passed:
        return ""
    return f"max abs error {c.max_abs_err:.3g}" if c.max_abs_err is not None else "mismatch"


def _timing(samples_ms: list[float], baseline: TimingStats, settings: Settings) -> Timing:
    cand = TimingStats.of(samples_ms)
    method = "kernelbench-cuda-events" if settings.device_type == "cuda" else "host-timer"
    speedup = baseline.mean_ms / cand.mean_ms if cand.mean_ms > 0 else float("inf")
    return Timing(method=method, statistic="mean_ms", candidate=cand, baselines={"eager": baseline},
                  speedups={"eager": speedup})
