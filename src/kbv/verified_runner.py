"""The verified protocol, driven for the executor: prepare a problem once (hidden trials, baseline
children holding the timing pool), then judge each candidate (correctness, timing, memory)."""

from __future__ import annotations

import time
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import torch

from kbv.attribution import Attribution, attribute, missing_custom_work
from kbv.builds import Build
from kbv.candidates import Pair
from kbv.compare import allowed_error, measure_error, within
from kbv.distributions import draw_inputs, trial_seed
from kbv.errors import ProblemRunError
from kbv.problems import instantiate_problem
from kbv.provenance import device_state
from kbv.runners import release_device_memory
from kbv.sandbox import ChildFailure, Sandbox, SharedArena
from kbv.settings import Settings, time_left
from kbv.speed import SpeedResult, TimerConfig, impossible_speed, load_pool, measure_speed, pool_size
from kbv.verdict import KIND, Category, Kind, MemoryStats, Status, Timing, Verdict
from kbv.verified import (
    CorrectnessResult,
    VerifiedContext,
    VerifiedProtocol,
    check_candidate,
    prepare_verified,
)

REPLAY_PROBES = 3
ATTRIBUTION_SET = 100  # fresh input sets 100-102: warm-up, the profiled forward, the ghost replay
REPLAY_MIN_MS = 0.05  # below this, launch overhead dominates and the probe says nothing
REPLAY_RATIO = 0.3
BASELINES = {"eager-tf32": ("tf32", False), "eager-fp32": ("fp32", False), "compile": ("tf32", True)}


@dataclass
class Prepared:
    ctx: VerifiedContext
    pool: list[list[Any]]  # timing input sets (device tensors)
    pool_truth: Callable[[int], Any]  # the reference evaluation of a pool entry (made on demand)
    output_like: list[torch.Tensor]  # the outputs' shapes and dtypes (meta tensors)
    fresh: Callable[[int], list[Any]]  # input set k of the replay probes, never in the pool
    evaluate: Callable[[list[Any]], Any]  # the reference evaluation of any input set (the child's weights)
    baselines: dict[str, Sandbox]
    baseline_memory: MemoryStats | None
    stack: ExitStack
    arena: SharedArena
    notes: dict[str, Any] = field(default_factory=dict)


def status_of(categories: list[Category] | tuple[Category, ...]) -> Status:
    """The verdict's status from what was found: hack > integrity > wrong > attribution > verified."""
    kinds = {KIND[c] for c in categories}
    for kind, status in ((Kind.HACK, Status.HACK), (Kind.INTEGRITY, Status.INTEGRITY_VIOLATION),
                         (Kind.WRONG, Status.INCORRECT), (Kind.ATTRIBUTION, Status.NO_CUSTOM_KERNEL)):
        if kind in kinds:
            return status
    return Status.VERIFIED


class VerifiedRunner:
    name = "verified"

    def __init__(self, protocol: VerifiedProtocol, timer: TimerConfig, baselines: tuple[str, ...],
                 settings: Settings, secret: bytes) -> None:
        unknown = [b for b in baselines if b not in BASELINES]
        if unknown:
            raise ValueError(f"unknown baseline(s) {unknown}; expected {sorted(BASELINES)}")
        self.protocol = protocol
        self.timer = timer
        self.baseline_names = baselines
        self.settings = settings
        self.secret = secret
        self.copy_gbps: float | None = None  # the device's copy bandwidth, measured once by a baseline child

    # -- prepare / release ----------------------------------------------------------------------
    def prepare(self, pair: Pair) -> Prepared:
        device = torch.device(self.settings.device)
        ctx = prepare_verified(pair.problem, self.protocol, device, self.secret)
        pool, truth, like, fresh, evaluate = self._pool(ctx, device)
        stack = ExitStack()
        arena = stack.enter_context(SharedArena())
        try:
            baselines = {name: self._baseline_child(stack, arena, ctx, name, pool) for name in self.baseline_names}
            memory = self._baseline_memory(baselines)
            self._measure_copy_bandwidth(baselines)
        except ChildFailure as failure:
            stack.close()
            raise ProblemRunError(f"{pair.problem.origin}: the baseline failed: {failure.message}") from failure
        except BaseException:
            stack.close()
            raise
        return Prepared(ctx, pool, truth, like, fresh, evaluate, baselines, memory, stack, arena)

    def release(self, prepared: Any) -> None:
        prepared.stack.close()
        del prepared
        release_device_memory()

    def _pool(self, ctx: VerifiedContext, device: torch.device
              ) -> tuple[list[list[Any]], Callable[[int], Any], list[Any], Callable[[int], list[Any]],
                         Callable[[list[Any]], Any]]:
        """Timing inputs drawn round-robin from every applicable distribution: a kernel that bypasses
        work on the problem's own (often degenerate) inputs is timed on realistic ones too."""
        module = instantiate_problem(ctx.problem)
        dists = ctx.calibration.applicable()

        def draw(k: int, purpose: str = "timing") -> list[Any]:
            dist = dists[k % len(dists)]
            return draw_inputs(module, ctx.calibration.variant(dist), trial_seed(self.secret, ctx.problem.hash,
                                                                               f"{purpose}/{dist}", k), device)

        first = draw(0)
        per_set = sum(x.numel() * x.element_size() for x in first if isinstance(x, torch.Tensor))
        l2 = int(self.settings.provenance.get("l2_cache_bytes") or (32 << 20))
        n = max(pool_size(per_set, l2, self.timer), len(dists))
        pool = [first] + [draw(k) for k in range(1, n)]
        model = ctx.reference.build(ctx.trials[-1].weight_seed)
        like = [torch.empty(o.shape, dtype=o.dtype, device="meta")
                for o in ctx.reference.baseline_outputs(model, pool[0])]
        memo: dict[int, Any] = {}

        def truth(index: int) -> Any:
            if index not in memo:
                memo.clear()  # one evaluation at a time: they can be GBs each
                memo[index] = ctx.reference.evaluate(model, pool[index])
            return memo[index]

        return pool, truth, like, lambda k: draw(k, "replay"), lambda inputs: ctx.reference.evaluate(model, inputs)

    def _baseline_child(self, stack: ExitStack, arena: SharedArena, ctx: VerifiedContext, name: str,
                        pool: list[list[Any]]) -> Sandbox:
        policy, compiled = BASELINES[name]
        spec = stack.enter_context(self.settings.child_scratch(f"baseline-{name}-{ctx.problem.hash[:10]}"))
        sb = stack.enter_context(Sandbox(spec))
        timeout = self.settings.timeout_s
        sb.call({"op": "load", "source": "reference", "code": ctx.problem.code, "origin": ctx.problem.origin,
                 "init_args": ctx.init_inputs, "seed": ctx.trials[-1].weight_seed, "precision": policy,
                 "compile": compiled}, timeout)
        load_pool(sb, arena, pool, self._flush_bytes(), timeout)
        sb.call({"op": "warmup", "ms": self.timer.warmup_ms}, timeout)
        return sb

    def _baseline_memory(self, baselines: dict[str, Sandbox]) -> MemoryStats | None:
        primary = baselines.get(self.protocol.primary_baseline) or next(iter(baselines.values()), None)
        if primary is None:
            return None
        return MemoryStats(**_memory_fields(primary.call({"op": "memory"}, self.settings.timeout_s)))

    def _measure_copy_bandwidth(self, baselines: dict[str, Sandbox]) -> None:
        """What the device's DRAM can move, for the impossible-speed bound (CUDA only: a CPU's caches
        are too large and too shared for the flush to make inputs cold)."""
        if self.copy_gbps is not None or self.settings.device_type != "cuda" or not baselines:
            return
        nbytes = max(256 << 20, 2 * self._flush_bytes())
        reply = next(iter(baselines.values())).call({"op": "bandwidth", "bytes": nbytes}, self.settings.timeout_s)
        self.copy_gbps = float(reply["gbps"])

    def _min_dram_bytes(self, prepared: Prepared) -> int:
        """Bytes a call cannot avoid moving through DRAM: every input tensor (cold after the flush) and
        the part of the outputs larger than L2."""
        inputs = sum(x.numel() * x.element_size() for x in prepared.pool[0] if isinstance(x, torch.Tensor))
        outputs = sum(o.numel() * o.element_size() for o in prepared.output_like)
        l2 = int(self.settings.provenance.get("l2_cache_bytes") or (64 << 20))
        return inputs + max(outputs - l2, 0)

    def _flush_bytes(self) -> int:
        if self.settings.device_type != "cuda":
            return 0
        l2 = int(self.settings.provenance.get("l2_cache_bytes") or (64 << 20))
        return int(self.timer.flush_factor * l2)

    # -- one candidate --------------------------------------------------------------------------
    def blank(self, pair: Pair) -> Verdict:
        p, c = pair.problem, pair.candidate
        return Verdict(problem=p.key, problem_hash=p.hash, level=p.level, candidate=c.name, candidate_hash=c.hash,
                       protocol=self.protocol.name, protocol_version=self.protocol.version,
                       status=Status.RUNTIME_ERROR, provenance=self.settings.provenance, model=c.model,
                       sample=c.sample)

    def evaluate(self, pair: Pair, prepared: Prepared, build: Build) -> Verdict:
        t0 = time.monotonic()
        ctx = prepared.ctx
        from kbv.scan import scan_source

        base = replace(self.blank(pair), flags=ctx.flags, findings=tuple(scan_source(pair.candidate.code)),
                       evidence={"calibration": ctx.calibration.variants, "calibration_notes": ctx.calibration.notes,
                                 "problem_notes": list(ctx.screen_notes)})
        if build.status is not None:
            return _done(base, t0, status=build.status, message=build.message,
                         evidence={**base.evidence, **build.evidence})
        deadline = t0 + self.settings.timeout_s
        label = f"verify-{pair.candidate.hash[:12]}-{pair.problem.hash[:8]}"
        try:
            with self.settings.child_scratch(label, build.build_dir) as spec, SharedArena() as arena, Sandbox(spec) as sb:
                load = {"op": "load", "source": "candidate", "path": str(build.candidate_path),
                        "init_args": ctx.init_inputs, "precision": self.protocol.precision}
                result = check_candidate(sb, arena, ctx, self.protocol, load, deadline)
                if not result.passed:
                    return self._failed(base, t0, result)
                load_pool(sb, arena, prepared.pool, self._flush_bytes(), time_left(deadline))
                attribution = self._attribute(sb, arena, prepared, pair, deadline)
                base = replace(base, evidence={**base.evidence, "attribution": _attribution_evidence(attribution)})
                lacking = missing_custom_work(attribution, self.protocol.min_custom_share)
                if lacking is not None:
                    return _done(base, t0, status=Status.NO_CUSTOM_KERNEL, categories=(lacking[0],),
                                 trials=tuple(result.trials), message=lacking[1])
                speed, memory = self._measure(sb, arena, prepared, deadline)
        except ChildFailure as failure:
            cats = (Category.PROCESS_ESCAPE,) if failure.evidence.get("returncode") == 0 else ()
            return _done(base, t0, status=failure.status, message=failure.message, categories=cats,
                         evidence={**base.evidence, **failure.evidence})
        return self._judged(base, t0, result, speed, memory, prepared)

    def _attribute(self, sb: Sandbox, arena: SharedArena, prepared: Prepared, pair: Pair,
                   deadline: float) -> Attribution:
        """Attribution on fresh inputs, and the ghost replay judged against the truth: an output
        that is still right with the candidate's own launches suppressed never needed them."""
        warm, profiled, ghosted = (prepared.fresh(ATTRIBUTION_SET + k) for k in range(3))
        buffers = [arena.empty(t.shape, t.dtype) for t in prepared.output_like]
        reply = sb.call({"op": "attribution", "warm_inputs": arena.handles(warm), "inputs": arena.handles(profiled),
                         "ghost_inputs": arena.handles(ghosted), "ghost_outputs": [h for _, h in buffers]},
                        time_left(deadline))
        if reply.get("ghost") == "ran":
            right = bool(reply.get("ghost_copied"))
            if right:
                ev = prepared.evaluate(ghosted)
                right = all(within(measure_error(t, b), allowed_error(e, self.protocol.tolerance))
                            for (b, _), t, e in zip(buffers, ev.truth, ev.baseline_err))
            reply["ghost"] = "unchanged" if right else "changed"
        return attribute(reply, pair.candidate.code, self.settings.device_type)

    def _measure(self, sb: Sandbox, arena: SharedArena, prepared: Prepared,
                 deadline: float) -> tuple[SpeedResult, MemoryStats]:
        like = prepared.output_like

        def check(index: int, outputs: list[torch.Tensor]) -> str | None:
            ev = prepared.pool_truth(index)
            for out, truth, base_err in zip(outputs, ev.truth, ev.baseline_err):
                err = measure_error(truth, out)
                if not within(err, allowed_error(base_err, self.protocol.tolerance)):
                    return f"pool entry {index}: error {err.norm:.2e}"
            return None

        speed = measure_speed(sb, prepared.baselines, arena, self.timer, len(prepared.pool), check, like, deadline)
        extra = [self._replay_probe(sb, arena, prepared, deadline)]
        if self.copy_gbps and "candidate" in speed.stats:
            extra.append(impossible_speed(self._min_dram_bytes(prepared), speed.stats["candidate"].median_ms,
                                          self.copy_gbps))
        found = tuple(f for f in extra if f)
        if found:
            speed = replace(speed, findings=speed.findings + found)
        memory = MemoryStats(**_memory_fields(sb.call({"op": "memory"}, max(deadline - time.monotonic(), 1))))
        return speed, memory

    def _replay_probe(self, sb: Sandbox, arena: SharedArena, prepared: Prepared,
                      deadline: float) -> tuple[Category, str] | None:
        """New inputs, each called twice in a row unchanged: an honest kernel takes as long the second
        time (the L2 is flushed between); a result cache answers at once."""
        sets = [arena.handles(prepared.fresh(k)) for k in range(REPLAY_PROBES)]
        pairs = sb.call({"op": "replay", "sets": sets}, time_left(deadline))["pairs"]
        first = sorted(p[0] for p in pairs)[len(pairs) // 2]
        again = sorted(p[1] for p in pairs)[len(pairs) // 2]
        if first > REPLAY_MIN_MS and again < REPLAY_RATIO * first:
            return (Category.RESULT_CACHE, f"a second call on the same unchanged inputs took {again:.3f} ms "
                                           f"against {first:.3f} ms for the first: the result was replayed")
        return None

    def _failed(self, base: Verdict, t0: float, result: CorrectnessResult) -> Verdict:
        cats = tuple(result.categories)
        failed = sorted({t.distribution for t in result.trials if not t.passed})
        notes = list(result.notes) + [f"{k}: {v}" for k, v in {**result.integrity, **result.hacks}.items()]
        first = next((t for t in result.trials if not t.passed), None)
        message = (f"failed on {', '.join(failed)}: {first.note}" if first else "; ".join(notes)) or "failed"
        return _done(base, t0, status=status_of(cats), categories=cats,
                     trials=tuple(result.trials), message=message[:400],
                     evidence={**base.evidence, "integrity": result.integrity, "hacks": result.hacks,
                               "notes": notes, "state_loaded": result.state_loaded})

    def _judged(self, base: Verdict, t0: float, result: CorrectnessResult, speed: SpeedResult,
                memory: MemoryStats, prepared: Prepared) -> Verdict:
        cats = tuple(dict.fromkeys(c for c, _ in speed.findings))
        timing = Timing(method="kbv-interleaved-" + ("events" if self.settings.device_type == "cuda" else "host"),
                        statistic="median_ms", candidate=speed.stats["candidate"],
                        baselines={k: v for k, v in speed.stats.items() if k != "candidate"},
                        speedups=speed.speedups, speedup_ci=speed.speedup_ci,
                        notes=(f"{speed.rechecked} timed outputs rechecked", f"timer {speed.timer_s:.1f} s")
                        + speed.notes)
        status = status_of(cats)
        evidence = {**base.evidence, "state_loaded": result.state_loaded,
                    "timing_findings": [f"{c.value}: {why}" for c, why in speed.findings],
                    "copy_gbps": self.copy_gbps,
                    "device_state": device_state(self.settings.device)}
        message = ("verified on " + ", ".join(prepared.ctx.calibration.applicable()) if status is Status.VERIFIED
                   else "; ".join(why for _, why in speed.findings))
        if status is Status.VERIFIED and speed.charge > 1.0:
            message += f"; timed at its wall clock, {speed.charge:.2f}x what it reported"
        return _done(base, t0, status=status, categories=cats,
                     trials=tuple(result.trials), timing=timing, memory=memory,
                     baseline_memory=prepared.baseline_memory, message=message[:400], evidence=evidence,
                     speedup=speed.speedups.get(self.protocol.primary_baseline) if status is Status.VERIFIED else None)


def _attribution_evidence(a: Attribution) -> dict[str, Any]:
    top = sorted(a.kernels, key=lambda k: -k[1])[:10]
    return {"custom_launches": a.custom_launches, "custom_share": round(a.custom_share, 4), "ghost_replay": a.ghost,
            "launches": a.launches, "kernels": [{"name": n, "us": round(us, 2), "custom": c} for n, us, c in top]}


def _memory_fields(reply: dict[str, Any]) -> dict[str, Any]:
    return {k: reply.get(k) for k in ("peak_bytes", "retained_bytes", "device_bytes")}


def _done(base: Verdict, t0: float, **changes: Any) -> Verdict:
    """The verdict, timed; one on a flagged problem says so among its categories, whatever its status."""
    verdict = replace(base, wall_s=time.monotonic() - t0, **changes)
    if verdict.flags and Category.UNSOUND_PROBLEM not in verdict.categories:
        verdict = replace(verdict, categories=verdict.categories + (Category.UNSOUND_PROBLEM,))
    return verdict


