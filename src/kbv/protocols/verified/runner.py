"""The verified protocol, one pipeline, read top to bottom.

Per problem (`VerifiedRunner.prepare`, once for all its candidates):
    1. prepare_trials   calibration, hidden trials, truth              (prepare.py)
       screen           the soundness screen                            (detect/soundness.py)
       prepare_timing   timing pool, baseline children, their memory    (prepare.py)
Per candidate (`VerifiedRunner.evaluate`, in its own started child):
    2. correctness      every hidden trial, integrity, guards           (correctness.py)
    3. probes           late inputs, in-place reuse                     (correctness.py)
    4. memory           from the first call on, before any profiler     (sandbox/memory.py)
    5. attribution      whose kernels ran, the ghost replay             (detect/attribution.py)
    6. timing           interleaved with the live baselines, replay probe, bounds (timer.py, detect/)
Then `judge(records)`: the status, categories and message, as a pure function of what each stage found.
A stage runs only while the candidate is still in the running; a child that fails ends the pipeline.
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from kbv.builds import Build
from kbv.candidates import Pair
from kbv.clocks import warm_before_timing
from kbv.compare import judge_outputs
from kbv.detect.attribution import Attribution, attribute, missing_custom_work
from kbv.detect.caches import replayed_timing
from kbv.detect.speed import impossible_speed
from kbv.distributions import DISTRIBUTIONS
from kbv.errors import UnsoundProblemError
from kbv.footprint import Footprint, footprint_record, problem_footprint
from kbv.ledger import bounded
from kbv.memory_plan import VerifiedPlan, available_memory, claim_plan, plan_verified, planning, return_cached
from kbv.inputs import tensor_bytes
from kbv.protocols import blank_verdict
from kbv.protocols.verified.correctness import CorrectnessResult, check_correctness, run_probes
from kbv.protocols.verified.prepare import (
    PreparedProblem,
    UnsoundProblem,
    memory_stats,
    prepare_timing,
    drop_distributions,
    prepare_trials,
    spawn_baselines,
)
from kbv.protocols.verified.rules import (
    ATTRIBUTION_SET,
    BASELINES,
    DRAW_CONSTANT_PARAMETERS,
    REPLAY_PROBES,
    VerifiedProtocol,
)
from kbv.protocols.verified.timer import (
    SpeedResult,
    TimerConfig,
    TimingPool,
    check_redrawn,
    input_sums,
    load_pool,
    measure_speed,
)
from kbv.protocols.verified.findings import Findings, FindingsCache, findings_key
from kbv.provenance import device_fingerprint, device_state
from kbv.sandbox import ChildFailure, Sandbox
from kbv.settings import Settings, deadline_in, time_left, timeout_message
from kbv.stages import stage
from kbv.verdict import KIND, Category, Kind, MemoryStats, Status, Timing, Verdict, finish_verdict


@dataclass
class Records:
    """What the stages of one candidate found; `judge` reads nothing else."""

    build: Build | None = None  # a build that failed
    failure: ChildFailure | None = None  # the child crashed, hung or raised
    correctness: CorrectnessResult | None = None
    memory: MemoryStats | None = None
    attribution: Attribution | None = None
    speed: SpeedResult | None = None
    findings: list[tuple[Category, str]] = field(default_factory=list)  # timing-stage detectors


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
                 settings: Settings, secret: bytes, time_unattributed: bool = False) -> None:
        unknown = [b for b in baselines if b not in BASELINES]
        if unknown:
            raise ValueError(f"unknown baseline(s) {unknown}; expected {sorted(BASELINES)}")
        self.protocol = protocol
        self.timer = timer
        self.baseline_names = baselines
        self.settings = settings
        self.secret = secret
        self.copy_gbps: float | None = None  # the device's copy bandwidth, measured once by a baseline child
        # what preparing a problem found, for its next preparation under the same secret and device
        self.findings = FindingsCache(settings.cache_dir / "findings")
        # benches only (`EvalConfig.time_unattributed`): a no_custom_kernel candidate is timed all the
        # same, for its figures; its status stands and it gets no speedup
        self.time_unattributed = time_unattributed

    def fingerprint(self) -> str:
        """The protocol's rules, its timer and its baselines: what a stored verdict must match to be reused."""
        extra = f"{self.timer}{self.baseline_names}"
        bench = "+time-unattributed" if self.time_unattributed else ""  # never resumed into a plain run
        cold = "" if self.settings.warm_clocks else "+no-warm-clocks"  # timed on cold clocks: likewise
        return self.protocol.fingerprint() + hashlib.sha256(extra.encode()).hexdigest()[:8] + bench + cold

    # -- 1. prepare ------------------------------------------------------------------------------
    def prepare(self, pair: Pair) -> PreparedProblem | UnsoundProblem:
        """The problem prepared for its candidates, or an `UnsoundProblem` when none of them can be
        judged (each then gets an `unsound_problem` verdict). Its memory is planned first, from its
        footprint (`kbv.memory_plan`); its reference calls are counted and bounded by
        `--prepare-timeout` (`kbv.ledger`). Raises ProblemError (ProblemTooLarge, PreparationTimeout
        among them)."""
        key = findings_key(pair.problem.hash, self.fingerprint(), self.secret,
                           device_fingerprint(self.settings.provenance))
        known = self.findings.get(key)
        with stage("prepare"):
            t0 = time.monotonic()
            if known is not None and known.unsound is not None:  # kept without the path it was found at
                reason = f"{pair.problem.origin}: {known.unsound}"
                return UnsoundProblem(reason, flags=(reason,))
            footprint = problem_footprint(pair.problem, self.settings.device)
            plan = self._plan(pair.problem, footprint)
            ledger = bounded(pair.problem.origin, self.name, self.settings.prepare_limit_s)
            stack, children = spawn_baselines(pair.problem, self.baseline_names, self.settings)
            try:
                prepared = prepare_trials(pair.problem, self.protocol, torch.device(self.settings.device), self.secret,
                                          known.calibration() if known is not None else None, plan=plan,
                                          footprint=footprint, screen=known.screen() if known is not None else None,
                                          ledger=ledger)
            except UnsoundProblemError as exc:
                stack.close()
                self.findings.put(key, Findings({}, {}, unsound=str(exc).removeprefix(f"{pair.problem.origin}: ")))
                return UnsoundProblem(str(exc), flags=(str(exc),))
            except BaseException:
                stack.close()
                raise
            prepared.stack.enter_context(stack)
            try:
                found = prepared.screen
                assert found is not None
                if known is None:  # the calibration as made, before the screen's distributions leave it
                    self.findings.put(key, Findings.of(prepared.calibration, found))
                drop_distributions(prepared, found.inapplicable)
                prepared.flags, prepared.screen_notes = found.flags, found.notes
                prepared.unjudgeable = found.unjudgeable
                if prepared.unjudgeable:
                    prepared.close()
                    return UnsoundProblem(f"{pair.problem.origin}: {'; '.join(prepared.unjudgeable)}",
                                          prepared.flags, prepared.screen_notes, dict(prepared.calibration.variants),
                                          dict(prepared.calibration.notes))
                with ledger.doing("timing", step="timing pool and baselines"):
                    prepare_timing(prepared, self.protocol, self.timer, self.settings, children)
                with stage("timing"):
                    self._measure_copy_bandwidth(prepared)
            except BaseException:
                prepared.close()  # the baseline children and every tensor, now
                raise
            ledger.deadline = None  # bounds preparation only: a trial remade for a candidate is not preparation
            prepared.preparation = {**ledger.summary(), "seconds": round(time.monotonic() - t0, 3),
                                    "findings_kept": known is not None, **prepared.host_hold.record(),
                                    "memory": plan.describe() if plan is not None else "footprint unknown",
                                    **({"footprint": footprint_record(footprint)} if footprint is not None else {})}
        return prepared

    def _plan(self, problem: Any, footprint: Footprint | None) -> VerifiedPlan | None:
        """How the problem's memory is held (None where its footprint is unknown); raises ProblemTooLarge."""
        if footprint is None:
            return None
        device = torch.device(self.settings.device)
        trials = len(DISTRIBUTIONS) * self.protocol.trials_per_distribution
        with planning():  # what is free read, and the plan claimed, with no other lane planning meanwhile
            plan = plan_verified(footprint, trials, available_memory(device.type, device.index),
                                 self.timer.pool_budget_bytes, problem.origin, len(self.baseline_names))
            claim_plan(plan.need)  # before a byte of it is spent: lanes that share the memory plan without it
        return plan

    def release(self, prepared: PreparedProblem | UnsoundProblem) -> None:
        prepared.close()

    def _measure_copy_bandwidth(self, prepared: PreparedProblem) -> None:
        """What the device's DRAM can move, for the impossible-speed bound (CUDA only: a CPU's caches
        are too large and too shared for the flush to make inputs cold)."""
        if self.copy_gbps is not None or self.settings.device_type != "cuda" or not prepared.baselines:
            return
        nbytes = max(256 << 20, 2 * self.settings.flush_bytes(self.timer.flush_factor))
        reply = next(iter(prepared.baselines.values())).call({"op": "bandwidth", "bytes": nbytes},
                                                             self.settings.timeout_s)
        self.copy_gbps = float(reply["gbps"])

    def blank(self, pair: Pair) -> Verdict:
        return blank_verdict(pair, self.protocol, self.settings.provenance)

    # -- 2-6. one candidate ----------------------------------------------------------------------
    def evaluate(self, pair: Pair, prepared: PreparedProblem | UnsoundProblem, build: Build, sb: Sandbox) -> Verdict:
        t0 = time.monotonic()
        from kbv.scan import scan_source

        if isinstance(prepared, UnsoundProblem):
            return self._unsound(pair, prepared, build, t0)
        base = replace(self.blank(pair), flags=prepared.flags, findings=tuple(scan_source(pair.candidate.code)),
                       evidence={"calibration": prepared.calibration.variants,
                                 "calibration_notes": prepared.calibration.notes,
                                 "problem_notes": list(prepared.screen_notes),
                                 "preparation": prepared.preparation,
                                 **({"time_unattributed": True} if self.time_unattributed else {})})
        records = Records()
        calls, rechecks = prepared.ledger.total, prepared.recheck_calls
        if build.status is not None:
            records.build = build
        else:
            try:
                self._run(sb, prepared, pair, build, records, deadline_in(self.settings.timeout_s))
            except ChildFailure as failure:
                records.failure = failure
        # the reference's calls made for this candidate: trials the plan did not keep, timed outputs rechecked
        base.evidence["reference_calls"] = prepared.ledger.total - calls
        base.evidence["recheck_calls"] = prepared.recheck_calls - rechecks
        return finish_verdict(base, t0, **judge(records, prepared, self.protocol, self.settings, self.copy_gbps,
                                                base.evidence))

    def _unsound(self, pair: Pair, unsound: UnsoundProblem, build: Build, t0: float) -> Verdict:
        """A candidate of a problem no verdict can judge: `unsound_problem` (a build that failed keeps
        its own status), the screen's reason as the message, no speedup. Its code never runs."""
        from kbv.scan import scan_source

        base = replace(self.blank(pair), flags=unsound.flags, findings=tuple(scan_source(pair.candidate.code)),
                       evidence={"calibration": unsound.calibration, "calibration_notes": unsound.calibration_notes,
                                 "problem_notes": list(unsound.notes)})
        if build.status is not None:
            return finish_verdict(base, t0, status=build.status, message=build.message,
                                  evidence={**base.evidence, **build.evidence})
        return finish_verdict(base, t0, status=Status.UNSOUND_PROBLEM, message=unsound.reason[:400])

    def _run(self, sb: Sandbox, prepared: PreparedProblem, pair: Pair, build: Build, records: Records,
             deadline: float) -> None:
        load = {"op": "load", "source": "candidate", "path": str(build.candidate_path),
                "init_args": prepared.init_inputs, "precision": self.protocol.precision,
                # the candidate's constants of the kinds the reference drew, and no other (`kbv.weights`)
                "draw_constants": [[list(shape), zero, rank] for shape, zero, rank in prepared.reference.kinds]
                if DRAW_CONSTANT_PARAMETERS else False}
        with stage("correctness"):
            records.correctness = check_correctness(sb, prepared, self.protocol, load, deadline)
        if not records.correctness.categories:
            run_probes(sb, prepared, self.protocol, deadline, records.correctness)
        prepared.trials[-1].release()
        if not records.correctness.passed:
            return
        return_cached(self.settings.device_type)  # the judging's transients: the child's sets come next
        load_pool(sb, prepared.pool, self.settings.flush_bytes(self.timer.flush_factor), time_left(deadline))
        with stage("memory"):
            records.memory = memory_stats(sb.call({"op": "memory"}, time_left(deadline)))
        with stage("attribution"):
            records.attribution = self._attribute(sb, prepared, deadline)
        if missing_custom_work(records.attribution, self.protocol.min_custom_share) is not None \
                and not self.time_unattributed:
            return
        return_cached(self.settings.device_type)  # the ghost's truth and the outputs taken back
        with stage("timing"):
            records.speed = self._time(sb, prepared, deadline)
        return_cached(self.settings.device_type)  # the rechecks' reference calls, before the probes' sets
        with stage("probes"):
            records.findings.append(self._replay_probe(sb, prepared, deadline, records.speed.window_costs_ms))
        if self.copy_gbps and "candidate" in records.speed.stats and "candidate" not in records.speed.too_short:
            records.findings.append(impossible_speed(_min_dram_bytes(prepared, self.settings.l2_bytes),
                                                     records.speed.stats["candidate"].median_ms, self.copy_gbps))

    def _attribute(self, sb: Sandbox, prepared: PreparedProblem, deadline: float) -> Attribution:
        """Attribution on fresh inputs, and the ghost replay judged against the truth: an output
        that is still right with the candidate's own launches suppressed never needed them."""
        device = torch.device(self.settings.device)
        t = time.perf_counter()
        groups = [prepared.draw(ATTRIBUTION_SET + k, "replay", device) for k in range(3)]  # warm, profiled, ghost
        refs = iter(sb.put([x for g in groups for x in g], time_left(deadline)))
        take = [[next(refs) for _ in group] for group in groups]
        ghost_sums = input_sums(groups[2])
        del groups  # the child has them: the ghost's set is drawn again for its truth (`kbv.memory_plan`)
        return_cached(device.type)  # else the parent's cache keeps the three sets beside the child's copies
        fields, receipt = sb.expect(prepared.output_like)
        parent = {"inputs": time.perf_counter() - t}
        t = time.perf_counter()
        reply = sb.call({"op": "attribution", "warm_inputs": take[0], "inputs": take[1], "ghost_inputs": take[2],
                         "ghost_outputs": fields}, time_left(deadline))
        parent["child"] = time.perf_counter() - t
        if reply.get("ghost") == "ran":
            t = time.perf_counter()
            outs = sb.take({**reply, "copied": reply.get("ghost_copied")}, receipt, time_left(deadline))
            right = False
            if outs is not None:
                ghosted = prepared.draw(ATTRIBUTION_SET + 2, "replay", device)
                check_redrawn(ghosted, ghost_sums, "the ghost replay's input set")
                ev = prepared.evaluate(ghosted)
                del ghosted
                right = judge_outputs(outs, ev.truth, ev.baseline_err, self.protocol.tolerance).passed
            reply["ghost"] = "unchanged" if right else "changed"
            parent["ghost_truth"] = time.perf_counter() - t
        reply["seconds"] = {**_child_seconds(reply.get("seconds"), self.settings.timeout_s),
                            **{k: round(v, 4) for k, v in parent.items()}}
        try:
            return attribute(reply, self.settings.device_type)
        except (ValueError, TypeError, OverflowError, KeyError, AttributeError) as exc:  # a forged reply
            sb.kill()
            raise ChildFailure(Status.CRASHED, f"malformed attribution reply: {type(exc).__name__}: {exc}"[:300],
                               sb.evidence()) from None

    def _time(self, sb: Sandbox, prepared: PreparedProblem, deadline: float) -> SpeedResult:
        def check(index: int, outputs: list[torch.Tensor]) -> str | None:
            ev = prepared.pool_truth(index)
            j = judge_outputs(outputs, ev.truth, ev.baseline_err, self.protocol.tolerance)
            return None if j.passed else f"pool entry {index}: error {j.worst.norm if j.worst else float('nan'):.2e}"

        warmed = warm_before_timing(self.settings)
        speed = measure_speed(sb, prepared.baselines, self.timer, len(prepared.pool), check, prepared.output_like,
                              deadline)
        return speed if warmed is None else replace(speed, notes=speed.notes + (warmed.describe(),),
                                                   clock_warmup=warmed.evidence())

    def _replay_probe(self, sb: Sandbox, prepared: PreparedProblem, deadline: float,
                      costs: tuple[float, float] | None) -> tuple[Category, str] | None:
        device = torch.device(self.settings.device)
        pairs: list[Any] = []
        for k in range(REPLAY_PROBES):  # a probe at a time: two input sets in hand, never six
            probed, fresh = prepared.draw(k, "replay", device), prepared.draw(REPLAY_PROBES + k, "replay", device)
            refs = iter(sb.put(probed + fresh, time_left(deadline)))
            handed = [[next(refs) for _ in s] for s in (probed, fresh)]
            del probed, fresh
            return_cached(device.type)
            reply = sb.call({"op": "replay", "sets": handed[:1], "fresh": handed[1:], "costs": costs},
                            time_left(deadline))
            got = reply.get("pairs")
            if not (isinstance(got, list) and got and isinstance(got[0], list) and len(got[0]) <= 3
                    and all(isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t)
                            for t in got[0])):
                sb.kill()
                raise ChildFailure(Status.CRASHED, f"malformed replay reply: {str(got)[:120]}", sb.evidence())
            pairs.append([float(t) for t in got[0]])
        return replayed_timing(pairs)


def _child_seconds(said: Any, most: float) -> dict[str, float]:
    """The child's own account of where attribution's seconds went: its word only, so at most 8
    finite figures within the pair's time limit, under short names; anything else is dropped."""
    if not isinstance(said, dict):
        return {}
    out = {}
    for k, v in list(said.items())[:8]:
        if isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool) \
                and 0.0 <= v <= most:  # NaN fails both comparisons; a huge int fails the second
            out[f"child_{k}"[:40]] = round(float(v), 4)
    return out


def _min_dram_bytes(prepared: PreparedProblem, l2_bytes: int) -> int:
    """Bytes a call cannot avoid moving through DRAM: every input tensor (cold after the flush) and
    the part of the outputs larger than L2."""
    pool = prepared.pool
    inputs = pool.set_bytes if isinstance(pool, TimingPool) else tensor_bytes(pool[0])
    outputs = tensor_bytes(prepared.output_like)
    return inputs + max(outputs - l2_bytes, 0)


# -- judge --------------------------------------------------------------------------------------

def judge(records: Records, prepared: PreparedProblem, protocol: VerifiedProtocol, settings: Settings,
          copy_gbps: float | None, evidence: dict[str, Any]) -> dict[str, Any]:
    """The verdict's fields from what the stages found (pure: records in, fields out)."""
    if records.build is not None:
        b = records.build
        return {"status": b.status, "message": b.message, "evidence": {**evidence, **b.evidence}}
    c = records.correctness
    ev = {**evidence}
    if c is not None:
        ev.update({"state_loaded": c.state_loaded, "integrity": c.integrity, "hacks": c.hacks, "notes": c.notes})
    trials = tuple(c.trials) if c is not None else ()
    if records.failure is not None:
        f = records.failure
        cats = (Category.PROCESS_ESCAPE,) if f.evidence.get("returncode") == 0 else ()
        message = timeout_message(f.message, settings.timeout_s) if f.status is Status.TIMEOUT else f.message
        return {"status": f.status, "message": message, "categories": cats, "trials": trials,
                "evidence": {**ev, **f.evidence}}
    assert c is not None
    if not c.passed:
        cats = tuple(c.all_categories())
        failed = sorted({t.distribution for t in c.trials if not t.passed})
        first = next((t for t in c.trials if not t.passed), None)
        notes = list(c.notes) + [f"{k}: {v}" for k, v in {**c.integrity, **c.hacks}.items()]
        message = (f"failed on {', '.join(failed)}: {first.note}" if first else "; ".join(notes)) or "failed"
        return {"status": status_of(cats), "categories": cats, "trials": trials, "message": message[:400],
                "evidence": {**ev, "notes": notes}}
    a = records.attribution
    if a is not None:
        ev["attribution"] = _attribution_evidence(a)
        lacking = missing_custom_work(a, protocol.min_custom_share)
        if lacking is not None:
            timed: dict[str, Any] = {}
            if records.speed is not None:  # `time_unattributed` (a bench's setting): the figures, never a speedup
                t = _timing(records.speed, prepared, settings)
                if records.speed.clock_warmup:
                    ev["clock_warmup"] = records.speed.clock_warmup
                timed["timing"] = replace(t, notes=t.notes + (
                    "timed though no custom kernel counts (time_unattributed, a bench setting): no speedup",))
            return {"status": Status.NO_CUSTOM_KERNEL, "categories": (lacking[0],), "trials": trials,
                    "message": lacking[1], "memory": records.memory, "baseline_memory": prepared.baseline_memory,
                    "evidence": ev, **timed}
    speed = records.speed
    assert speed is not None
    found = list(speed.findings) + [f for f in records.findings if f]
    cats = tuple(dict.fromkeys(c_ for c_, _ in found))
    status = status_of(cats)
    timing = _timing(speed, prepared, settings)
    ev.update({"timing_findings": [f"{c_.value}: {why}" for c_, why in found], "copy_gbps": copy_gbps,
               "device_state": device_state(settings.device),
               **({"clock_warmup": speed.clock_warmup} if speed.clock_warmup else {})})
    message = ("verified on " + ", ".join(prepared.calibration.applicable()) if status is Status.VERIFIED
               else "; ".join(why for _, why in found))
    if status is Status.VERIFIED and speed.charge > 1.0:
        message += f"; timed at its wall clock, {speed.charge:.2f}x what it reported"
    if status is Status.VERIFIED and protocol.primary_baseline not in speed.speedups and speed.too_short:
        message += (f"; no speedup: the {' and the '.join(speed.too_short)}'s calls were too short to time "
                    "against the window's own costs")
    return {"status": status, "categories": cats, "trials": trials, "timing": timing, "memory": records.memory,
            "baseline_memory": prepared.baseline_memory, "message": message[:400], "evidence": ev,
            "speedup": speed.speedups.get(protocol.primary_baseline) if status is Status.VERIFIED else None}


def _timing(speed: SpeedResult, prepared: PreparedProblem, settings: Settings) -> Timing:
    dists = ", ".join(dict.fromkeys(prepared.pool_distributions))
    left_out = [d for d in prepared.calibration.applicable() if d not in prepared.pool_distributions]
    notes = (f"{speed.rechecked} timed outputs rechecked", f"timer {speed.timer_s:.1f} s",
             f"timed on {len(prepared.pool)} input sets drawn from {dists}"
             + (f" (not {', '.join(left_out)}: the pool's memory budget)" if left_out else "")
             + f"; models hold {prepared.timing_weights}")
    return Timing(method="kbv-interleaved-" + ("events" if settings.device_type == "cuda" else "host"),
                  statistic="median_ms", candidate=speed.stats["candidate"],
                  baselines={k: v for k, v in speed.stats.items() if k != "candidate"},
                  speedups=speed.speedups, speedup_ci=speed.speedup_ci, notes=notes + speed.notes)


def _attribution_evidence(a: Attribution) -> dict[str, Any]:
    top = sorted(a.kernels, key=lambda k: -k[1])[:10]
    return {"custom_launches": a.custom_launches, "custom_share": round(a.custom_share, 4), "ghost_replay": a.ghost,
            "launches": a.launches, "kernels": [{"name": n, "us": round(us, 2), "custom": c} for n, us, c in top],
            "seconds": a.seconds}
