"""The standard protocol: KernelBench's evaluation (v0.1 scripts), run across the trust boundary.

Rules (`StandardProtocol`): seed 42, five correctness trials on per-trial seeds drawn from it, the
reference first on the same inputs, a shape check then `allclose(atol=rtol=1e-2)`, CUDA-event timing
(3 warm-ups, 100 trials, L2 flush, mean) against a live eager baseline with PyTorch's default
precision flags. KernelBench's other timing methods (`do_bench`, `host_time`) on request.

Per problem (`prepare`, in the parent): the model under seed 42, the five trials' inputs and the
reference outputs, the timing inputs, and the baseline loaded in a child that loads no candidate code
(kept with the problem). Per candidate (`evaluate`, in its own child): load, five forwards compared
with `allclose`, and, if all pass, KernelBench's timer (a host timer on CPU) on the candidate,
bracketed by the same timer on the baseline right before and right after it in the same timed window
(B A B), so that both numbers are taken under the same conditions; a baseline that disagrees with
itself across the candidate's timing is timed again with it, once, and the verdict is marked if it
still does.

Where KernelBench's number is a draw rather than a measurement (`unstable_timing`), the verdict says so:
a note beside its timing and a category that changes neither its status nor its speedup.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch

from kbv.builds import Build
from kbv.candidates import Pair
from kbv.clocks import warm_before_timing
from kbv.compare import Comparison, compare_allclose
from kbv.errors import ProblemRunError, UsageError, did_you_mean
from kbv.footprint import problem_footprint
from kbv.memory_plan import StandardPlan, available_memory, claim_plan, plan_standard, planning
from kbv.inputs import flatten_outputs, kernelbench_trial_seeds, rng_isolated, set_seed, tensor_bytes, to_device
from kbv.placement import group_stopped
from kbv.precision import precision_policy
from kbv.problems import Problem, instantiate_problem, problem_code
from kbv.protocols import blank_verdict, fingerprint
from kbv.sandbox import ChildFailure, Sandbox
from kbv.sandbox.timers import STANDARD_TIMINGS, StandardTimerConfig
from kbv.sandbox.spares import reference_child
from kbv.settings import Settings, deadline_in, parent_work, time_left, timeout_message
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
        method = self.timer.method
        return f"kernelbench-v0.1+tol{self.tolerance:g}" + ("" if method == "cuda_event" else f"+{method}")

    @property
    def primary_baseline(self) -> str:
        return "eager"

    def fingerprint(self) -> str:
        return fingerprint(asdict(self))


@dataclass
class StandardContext:
    """Parent-side state of one problem (device tensors) and its baseline's child. `trials[i]` is
    (inputs after the reference ran, reference outputs), or None for a trial the memory plan does not
    hold: `trial(i)` remakes it from its seed with the kept model, as KernelBench itself runs a trial."""

    problem: Problem
    init_inputs: list[Any]
    trials: list[tuple[list[Any], list[torch.Tensor]] | None]
    timing_inputs: list[Any]
    baseline: Sandbox | None = None  # the reference loaded, in a child without candidate code (`prepare`)
    stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)  # closes the baseline's child
    module: Any = None
    model: Any = None  # kept only where some trial is remade
    seeds: list[int] = field(default_factory=list)
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    plan: StandardPlan | None = None  # how its memory is held (None: its footprint is unknown)

    def trial(self, index: int) -> tuple[list[Any], list[torch.Tensor]]:
        """Trial `index` on the device: held (brought back from the host where parked), else remade."""
        held = self.trials[index]
        if held is not None:
            inputs, references = held
            return to_device(inputs, self.device), [r.to(self.device) for r in references]
        with parent_work():  # kbv's own work, never charged to the candidate's timeout
            return _make_trial(self.module, self.model, self.seeds[index], self.device, self.problem.origin)


def check_timing_method(name: str) -> str:
    """`name` if the standard protocol can time with it (one of STANDARD_TIMINGS); raises UsageError
    in one line otherwise, naming what is missing for KernelBench's profiler-based method."""
    if name in STANDARD_TIMINGS:
        return name
    choices = f"{', '.join(STANDARD_TIMINGS[:-1])} or {STANDARD_TIMINGS[-1]}"
    if name in ("nsight_python", "nsight_python_time"):
        import importlib.util
        import shutil

        missing = [what for what, found in (("the nsight-python package", importlib.util.find_spec("nsight")),
                                            ("NVIDIA Nsight Compute (ncu on PATH)", shutil.which("ncu")))
                   if not found]
        lacking = f"{' and '.join(missing)}, and " if missing else ""
        raise UsageError(f"--standard-timing {name} needs {lacking}a child started under Nsight Compute's "
                         f"profiler, which kbv's sandbox does not do: use {choices}.")
    raise UsageError(f"Unknown standard timing '{name}': expected {choices}.{did_you_mean(name, STANDARD_TIMINGS)}")


# -- when KernelBench's number is a draw (`unstable_timing`) -------------------------------------
# KernelBench's cuda_event timer records its start event right after launching the L2 flush, with no
# synchronise between: the forward's host path runs while the flush runs on the device, and whatever
# of it outlasts the flush is timed as device idle time. Where the two take comparable times, which
# side of that line a trial falls on is a race, and the mean moves from run to run (up to 4x on
# launch-bound kernels on an H200) though every run's trials look tight. The same holds for the other
# methods' flushes (host_time's window even includes the flush's remaining time). Either side (the
# candidate or the baseline) makes the speedup a draw. All three thresholds are judged on one run's
# figures; TODO: calibrate them on the H200 against bench/repeat.py's spreads across runs.
#
# std / mean of one side's trials. An honest kernel on a quiet device times within a few percent (the
# verified timer reaches a 1% interval on its median in tens of calls); a spread of a tenth means the
# trials mix regimes (hidden under the flush or not, clocks, other work), and a run that draws another
# mix moves the mean by about that much: enough to carry a speedup across one of fast_p's lines.
UNSTABLE_CV = 0.10
# the host time of one forward (median) against the flush's device time: at half the flush or more, a
# hiccup of the host (a page fault, a descheduled thread) pushes part of the host path out from under
# the flush; beyond four flushes, at most a quarter of it ever hides and the figure is host-bound
# (its own spread, judged by UNSTABLE_CV, says whether that holds still)
RACE_HOST_OVER_FLUSH = (0.5, 4.0)
# ... and only where the host time is at least this share of the side's mean: the race moves the
# figure by at most the host time, so a device-bound forward (an 8 ms problem) is not at stake
RACE_HOST_SHARE = 0.10


def unstable_timing(candidate: TimingStats, baseline: TimingStats, flush_ms: float | None) -> list[str]:
    """Why the standard speedup of `candidate` over `baseline` is a draw (empty: it is not). Pure.
    A side's `host_ms` (the host time of one forward) and `flush_ms` (the flush's device time, None
    on a CPU) are judged only where measured."""
    reasons = []
    for side, stats in (("candidate", candidate), ("baseline", baseline)):
        cv = stats.std_ms / stats.mean_ms if stats.mean_ms > 0 else 0.0
        if cv >= UNSTABLE_CV:
            reasons.append(f"the {side}'s trials spread {100 * cv:.0f}% of their mean (std/mean, "
                           f"{stats.min_ms:.3g}-{stats.max_ms:.3g} ms)")
        host = stats.host_ms
        if host is None or not flush_ms or flush_ms <= 0:
            continue
        low, high = RACE_HOST_OVER_FLUSH
        if low <= host / flush_ms <= high and host >= RACE_HOST_SHARE * stats.mean_ms:
            reasons.append(f"the {side}'s forward spends {host:.3g} ms on the host against a {flush_ms:.3g} ms "
                           f"flush: how much of it hides under the flush is a race")
    return reasons


# -- the baseline timed beside every candidate (B A B) --------------------------------------------
# KernelBench's number is a mean of one run of its timer, and the baseline's was timed once per problem,
# at its preparation, under whatever ran then (a second kbv run on the machine, children starting up,
# a cold device): an H100 gave one run's ReLU baseline 0.095 ms against 0.0042 ms in every other, and
# its candidates 21x. So the baseline is timed right before and right after each candidate, in the
# same timed window, by the same timer; its figure is the mean of both timings' trials, which cancels
# a drift that moves both sides across the window. Two timings of the same forward on the same inputs,
# milliseconds apart, whose means differ by more than this share of the smaller say something moved
# under the pair: the three are timed again once (BASELINE_ATTEMPTS), and a baseline that still
# disagrees with itself marks the verdict `unstable_timing` (the same tenth as UNSTABLE_CV: a move that
# large carries a speedup across fast_p's lines).
BASELINE_AGREE = 0.10
BASELINE_ATTEMPTS = 2


def baseline_disagreement(before: TimingStats, after: TimingStats) -> str | None:
    """Why the baseline timed right `before` and right `after` the candidate cannot stand for one
    figure (their means differ by more than BASELINE_AGREE of the smaller), or None. Pure."""
    low, high = sorted((before.mean_ms, after.mean_ms))
    if low > 0 and high <= (1 + BASELINE_AGREE) * low:
        return None
    return (f"the baseline timed right before and right after the candidate disagrees with itself: "
            f"{before.mean_ms:.4g} ms and {after.mean_ms:.4g} ms (means)")


def pooled_stats(replies: list[dict[str, Any]]) -> TimingStats:
    """One side's figures from several `time` replies of the same timer: every trial of them all (the
    mean of the baseline's timings before and after the candidate), and the median host time of a
    forward over them where every reply holds one per sample."""
    return timed_stats({"samples_ms": [x for r in replies for x in r["samples_ms"]],
                        "host_ms": [h for r in replies for h in (r.get("host_ms") or [None])]})


# Above this, a problem's correctness trials wait on the host between candidates: the device is shared
# with the children (each of which holds its own inputs), and with the verified protocol's problem.
DEVICE_TRIALS_BUDGET_BYTES = 8 << 30


def prepare_standard(problem: Problem, protocol: StandardProtocol, device: torch.device,
                     plan: StandardPlan | None = None) -> StandardContext:
    """Build the reference and its outputs on KernelBench's seeds: the trials `plan` holds (on the
    device, or parked on the host), the rest left to be remade for each candidate; without a plan
    (an unknown footprint), all of them, parked on the host past DEVICE_TRIALS_BUDGET_BYTES.
    Raises ProblemRunError."""
    module = instantiate_problem(problem)
    seeds = kernelbench_trial_seeds(protocol.seed, protocol.correctness_trials)
    with rng_isolated(), torch.no_grad(), problem_code(problem.origin, "under KernelBench's seeds"):
        set_seed(protocol.seed)
        init_inputs = list(module.get_init_inputs())
        set_seed(protocol.seed)
        model = module.Model(*init_inputs)
        if isinstance(model, torch.nn.Module):
            model = model.to(device)
    held = plan.held if plan is not None else len(seeds)
    park = plan is not None and plan.home == "host"
    trials: list[tuple[list[Any], list[torch.Tensor]] | None] = []
    for index, seed in enumerate(seeds):
        if index >= held:
            trials.append(None)
            continue
        inputs, reference = _make_trial(module, model, seed, device, problem.origin)
        if plan is None and not trials and device.type == "cuda":
            park = tensor_bytes(inputs + reference) * protocol.correctness_trials > DEVICE_TRIALS_BUDGET_BYTES
        if park:
            inputs, reference = to_device(inputs, torch.device("cpu")), [r.cpu() for r in reference]
        trials.append((inputs, reference))
    with rng_isolated(), problem_code(problem.origin, "get_inputs"):
        set_seed(protocol.seed)
        timing_inputs = to_device(module.get_inputs(), device)
    return StandardContext(problem, init_inputs, trials, timing_inputs, module=module,
                           model=model if held < len(seeds) else None, seeds=seeds, device=device, plan=plan)


def _make_trial(module: Any, model: Any, seed: int, device: torch.device,
                origin: str) -> tuple[list[Any], list[torch.Tensor]]:
    """One trial on KernelBench's per-trial `seed`: its inputs, and the reference's outputs on them."""
    with rng_isolated(), torch.no_grad(), problem_code(origin, "under KernelBench's seeds"):
        set_seed(seed)
        inputs = to_device(module.get_inputs(), device)
        with precision_policy("default"):  # the process's own flags, never another lane's TF32
            return inputs, [r.detach().clone() for r in flatten_outputs(model(*inputs))]


class StandardRunner:
    """The standard protocol as the executor drives it: prepare / evaluate / release / blank."""

    name = "standard"

    def __init__(self, protocol: StandardProtocol, settings: Settings) -> None:
        self.protocol = protocol
        self.settings = settings

    def fingerprint(self) -> str:
        """The protocol's rules and how kbv times the baseline (beside every candidate), and the timings'
        conditions where they are not the default: a verdict timed on cold clocks (`--no-warm-clocks`)
        never resumes into a warmed run."""
        cold = "" if self.settings.warm_clocks else "+no-warm-clocks"
        return self.protocol.fingerprint() + "+baseline-bracketed" + cold

    def prepare(self, pair: Pair) -> StandardContext:
        """The problem's trials and timing inputs, and its baseline loaded in a child of its own (a
        spare, or one coming up while the inputs are drawn). Its memory is planned first, from its
        footprint (`kbv.memory_plan`). Raises ProblemError (ProblemTooLarge among them)."""
        with stage("prepare"):
            plan = self._plan(pair.problem)
            stack = contextlib.ExitStack()
            try:
                sb = reference_child(self.settings, f"baseline-{pair.problem.hash[:12]}", stack)
                ctx = prepare_standard(pair.problem, self.protocol, torch.device(self.settings.device), plan)
                self._load_baseline(ctx, sb)
            except BaseException:
                stack.close()
                raise
            ctx.baseline, ctx.stack = sb, stack
        return ctx

    def _plan(self, problem: Problem) -> StandardPlan | None:
        """How the problem's trials are held (None where its footprint is unknown); raises ProblemTooLarge."""
        footprint = problem_footprint(problem, self.settings.device)
        if footprint is None:
            return None
        device = torch.device(self.settings.device)
        with planning():  # what is free read, and the plan claimed, with no other lane planning meanwhile
            plan = plan_standard(footprint, self.protocol.correctness_trials,
                                 available_memory(device.type, device.index), problem.origin)
            claim_plan(plan.need)  # before a byte of it is spent: lanes that share the memory plan without it
        return plan

    def _load_baseline(self, ctx: StandardContext, sb: Sandbox) -> None:
        """Eager PyTorch with default flags, in a child without candidate code, seeded as KernelBench's."""
        timeout = self.settings.timeout_s
        try:
            sb.ready(timeout)
            sb.call({"op": "load", "source": "reference", "code": ctx.problem.code, "origin": ctx.problem.origin,
                     "init_args": ctx.init_inputs, "seed": self.protocol.seed,
                     "precision": self.protocol.precision}, timeout)
        except ChildFailure as failure:
            raise ProblemRunError(f"{ctx.problem.origin}: loading the reference failed: {failure.message}") from failure

    def blank(self, pair: Pair) -> Verdict:
        """The blank verdict; its provenance names the timing method, whatever the verdict comes to."""
        return blank_verdict(pair, self.protocol, {**self.settings.provenance,
                                                   "standard_timing": self.protocol.timer.method})

    def release(self, ctx: StandardContext) -> None:
        ctx.trials.clear()  # the tensors go now, whoever still holds the context
        ctx.timing_inputs = []
        ctx.model = None
        ctx.baseline = None
        ctx.stack.close()  # the baseline's child

    def evaluate(self, pair: Pair, ctx: StandardContext, build: Build, sb: Sandbox) -> Verdict:
        """The standard verdict of one pair in the started child `sb`. Never raises for a bad candidate;
        raises ProblemRunError where the baseline's own child fails."""
        t0 = time.monotonic()
        base = self.blank(pair)
        if build.status is not None:
            return finish_verdict(base, t0, status=build.status, message=build.message, evidence=build.evidence)
        deadline = deadline_in(self.settings.timeout_s)
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
            with stage("timing"):  # one timed window: the baseline, the candidate, the baseline
                timed = time_bracketed(lambda: self._time(sb, ctx, deadline),
                                       lambda: self._time_baseline(ctx, deadline, sb))
        except ChildFailure as failure:
            message = failure.message if failure.status is not Status.TIMEOUT else \
                timeout_message(failure.message, self.settings.timeout_s)
            return finish_verdict(base, t0, status=failure.status, message=message, evidence=failure.evidence)
        flush_ms = _finite(timed.candidate.get("flush_ms"))
        timing, unstable = _timing(timed, flush_ms, self.protocol.timer.method, self.settings)
        evidence = {**({"flush_ms": flush_ms} if flush_ms is not None else {}),
                    "baseline_bracket_ms": [[a, b] for a, b in timed.bracket_means()],
                    **({"clock_warmup": timed.warmed.evidence()} if timed.warmed is not None else {})}
        return finish_verdict(base, t0, status=Status.CORRECT, trials=tuple(trials), timing=timing,
                              categories=(Category.UNSTABLE_TIMING,) if unstable else (), evidence=evidence,
                              speedup=timing.speedups["eager"], message=f"{len(trials)}/{len(trials)} trials passed")

    def _time(self, sb: Sandbox, ctx: StandardContext, deadline: float) -> tuple[dict[str, Any], Any]:
        """KernelBench's timer on `sb`'s model over the timing inputs, after the device's clocks are
        warmed: its reply, and what warming did."""
        inputs = sb.put(ctx.timing_inputs, time_left(deadline))
        warmed = warm_before_timing(self.settings)
        reply = sb.call({"op": "time", "inputs": inputs, "config": asdict(self.protocol.timer)}, time_left(deadline))
        return reply, warmed

    def _time_baseline(self, ctx: StandardContext, deadline: float, candidate: Sandbox) -> dict[str, Any]:
        """The baseline timed as the candidate is, in its own child, while the candidate's child, which
        has run candidate code, is stopped (a thread it left behind must not load the machine under
        the baseline's timing: that would inflate the candidate's speedup). Its failure is the problem's.
        Its time is kbv's own (`parent_work`), never charged to the candidate's timeout: a large problem's
        baseline, timed twice beside a candidate on a loaded CPU, took 250 s of a 300 s pair; it has a
        timeout of its own."""
        assert ctx.baseline is not None
        try:
            with parent_work(), group_stopped(candidate.proc.pid if candidate.proc is not None else None):
                return self._time(ctx.baseline, ctx, deadline_in(self.settings.timeout_s))[0]
        except ChildFailure as failure:
            raise ProblemRunError(f"{ctx.problem.origin}: timing the reference failed: {failure.message}") from failure


@dataclass(frozen=True)
class Bracketed:
    """The candidate's `time` reply and the baseline's right before and after it, in one window; the
    earlier attempts' baseline replies where the baseline disagreed with itself; and what warming the
    clocks before the candidate's timing did."""

    candidate: dict[str, Any]
    before: dict[str, Any]
    after: dict[str, Any]
    earlier: tuple[tuple[dict[str, Any], dict[str, Any]], ...] = ()
    warmed: Any = None

    def baseline(self) -> TimingStats:
        return pooled_stats([self.before, self.after])

    def disagreement(self) -> str | None:
        return baseline_disagreement(timed_stats(self.before), timed_stats(self.after))

    def bracket_means(self) -> list[tuple[float, float]]:
        """The baseline's means before and after the candidate, every attempt's, in order."""
        pairs = [*self.earlier, (self.before, self.after)]
        return [(timed_stats(b).mean_ms, timed_stats(a).mean_ms) for b, a in pairs]


def time_bracketed(candidate: Callable[[], tuple[dict[str, Any], Any]],
                   baseline: Callable[[], dict[str, Any]], attempts: int = BASELINE_ATTEMPTS) -> Bracketed:
    """The baseline, the candidate, the baseline (`baseline()` and `candidate()` time one side each);
    all three again while the baseline disagrees with itself, up to `attempts` in all. The last
    attempt stands."""
    earlier: list[tuple[dict[str, Any], dict[str, Any]]] = []
    while True:
        before = baseline()
        reply, warmed = candidate()
        after = baseline()
        timed = Bracketed(reply, before, after, tuple(earlier), warmed)
        if timed.disagreement() is None or len(earlier) + 1 >= attempts:
            return timed
        earlier.append((before, after))


def _run_trials(sb: Sandbox, ctx: StandardContext, protocol: StandardProtocol, deadline: float,
                device: torch.device) -> list[Trial]:
    trials = []
    for index in range(len(ctx.trials)):
        inputs, references = ctx.trial(index)  # parked ones come back, ones not held are remade
        refs = sb.put(inputs, time_left(deadline))
        fields, receipt = sb.expect(references)
        reply = sb.call({"op": "forward", "inputs": refs, **fields}, time_left(deadline))
        outputs = sb.take(reply, receipt, time_left(deadline))
        comparison = _compare(reply, references, outputs, protocol.tolerance)
        trials.append(Trial("default", index, comparison.passed, comparison.max_abs_err, comparison.max_rel_err,
                            category=comparison.category, note=comparison.note or _describe_error(comparison)))
        # let this trial's tensors go before the next is made: a trial remade beside the last one's
        # reference and output held three outputs at once (KernelBench's L1/9: 4 GiB each, 20 GB in all)
        del inputs, references, refs, outputs, reply
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


def timed_stats(reply: dict[str, Any]) -> TimingStats:
    """A `time` reply's samples as stats, with the median host time of one forward where the reply
    holds a finite one per sample (the candidate's child writes it: anything else is left out)."""
    stats = TimingStats.of(reply["samples_ms"])
    host = reply.get("host_ms")
    if isinstance(host, list) and host and all(_finite(h) is not None for h in host):
        stats = replace(stats, host_ms=statistics.median(float(h) for h in host))
    return stats


def _finite(x: Any) -> float | None:
    ok = isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0
    return float(x) if ok else None


_METHOD_NAMES = {"cuda_event": "kernelbench-cuda-events", "do_bench": "kernelbench-do-bench",
                 "host_time": "kernelbench-host-time"}


def _timing(timed: Bracketed, flush_ms: float | None, method: str, settings: Settings) -> tuple[Timing, list[str]]:
    """The timing record, and why its speedup is a draw (see `unstable_timing`, `baseline_disagreement`)."""
    if settings.device_type == "cuda":
        name = _METHOD_NAMES[method]
    else:  # every method is a host clock on a CPU
        name = "host-timer" if method == "cuda_event" else f"host-timer ({method})"
    cand, baseline = timed_stats(timed.candidate), timed.baseline()
    speedup = baseline.mean_ms / cand.mean_ms if cand.mean_ms > 0 else float("inf")
    reasons = unstable_timing(cand, baseline, flush_ms)
    disagreed = timed.disagreement()
    if disagreed is not None:
        reasons.append(disagreed + f", in each of {len(timed.earlier) + 1} attempts")
    notes = (f"{Category.UNSTABLE_TIMING.value}: {'; '.join(reasons)}",) if reasons else ()
    notes += ("the baseline timed right before and right after the candidate, in the same window: "
              + ", then ".join(f"{b:.4g} and {a:.4g} ms" for b, a in timed.bracket_means()) + " (means)",)
    return Timing(method=name, statistic="mean_ms", candidate=cand, baselines={"eager": baseline},
                  speedups={"eager": speedup}, notes=notes), reasons
