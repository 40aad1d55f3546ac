"""The local executor: one evaluation lane on one device. Builds on a CPU pool, children started
ahead, pairs evaluated one at a time. Several lanes (one per GPU) are `kbv.executors.lanes`, which
also hands a lane only pairs whose builds are ready.

- Builds of compiled candidates run `jobs` at a time on CPU workers, cached by content hash
  (`kbv.builds.BuildPool`; lanes of one machine share one), on cores apart from the lanes' and at
  the lowest priority, or held while a pair is timed (`kbv.placement`).
- Each pair's child is started ahead (`PRESTART` pairs in advance): interpreter, torch, CUDA
  context and guards are up before the pair's turn, while its build and the problem's preparation
  run. So are reference children (`SPARES`), for the baselines of the problems its queued pairs
  will prepare (`kbv.sandbox.spares`). It starts on the build cores and moves to the lane's own before its device comes up. A child
  serves one candidate and one protocol, and is closed after it.
- Pairs are evaluated in submission order on one thread. Lanes of one device (`--pairs-per-device`)
  share its gate (`kbv.gate`): a lane holds it shared from the problem's preparation to the verdict,
  and alone for each timed window (`EXCLUSIVE_STAGES`), so one pair's untimed work overlaps another's
  and never its timing. A lane holds up to `held` prepared problems per protocol (`HELD_PER_PROTOCOL` for a run;
  more for `kbv serve`, whose requests interleave problems; the least recently used is released
  first; on a GPU with less than `FREE_SHARE_TO_HOLD` of its memory free, only the pair's own), so
  that each problem is prepared once for all its candidates even when their builds finish out of
  order. Device work of our own that could disturb a measurement (a child bringing up its CUDA
  context) waits while a pair is timed or its memory measured.
- Each verdict carries where its wall time went (`evidence["stages_s"]`, `evidence["pair_s"]`).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kbv.builds import Build, BuildPool, as_users_file, prepare_candidate
from kbv.candidates import Backend, Candidate, Pair
from kbv.errors import DeviceRoomFailure, ProblemError, ProblemRunError, RunFailure, first_line
from kbv.executors import Executor, Job, ProtocolRunner, RunState
from kbv.gate import DeviceGate, holding
from kbv.memory_plan import Need, ProblemTooLarge, claim_plan, host_available_bytes, host_total_bytes, return_cached
from kbv.placement import Quiet, enter_lane_thread, enter_starter_thread, move_process
from kbv.problems import out_of_memory
from kbv.room import Room, alone, sharing, using
from kbv.sandbox import ChildFailure, Sandbox, kill_all_children
from kbv.sandbox.spares import offering
from kbv.settings import Settings
from kbv.stages import StageClock, measuring, stage
from kbv.verdict import Status, Verdict

__all__ = ["PRESTART", "SPARES", "HELD_PER_PROTOCOL", "BuildPool", "LocalExecutor", "WarmChild", "no_code_verdict"]

PRESTART = 2  # children started ahead of their pair
# Reference children a lane keeps started ahead, for the baselines of the problems it prepares next: a
# child's start-up (its interpreter, torch, the device) was most of a small problem's preparation.
SPARES = 2
# Prepared problems a lane keeps per protocol. Two: a problem whose remaining builds finish while
# another's pairs run is not prepared again; more would hold more device memory (inputs, references
# and a baseline child each) for little.
HELD_PER_PROTOCOL = 2
# Below this share of the device's memory free, a lane keeps only the problem of the pair in hand:
# what it holds for later pairs must not leave a candidate short (an out-of-memory verdict).
FREE_SHARE_TO_HOLD = 0.25
# The stages that have the device to themselves (`kbv.gate`): what they measure is time or memory (the
# probes compare call times: a replay answers several times faster than a computed call; attribution's
# custom share is a share of the profiled kernels' device time).
EXCLUSIVE_STAGES = ("timing", "memory", "probes", "attribution")


@dataclass
class WarmChild:
    """A started child for one job, with the scratch directory it owns."""

    sandbox: Sandbox | None = None
    stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    failure: ChildFailure | None = None  # it could not be brought up
    start_s: float = 0.0

    def close(self) -> None:
        self.stack.close()


def no_code_verdict(runner: ProtocolRunner, pair: Pair) -> Verdict:
    """The verdict of a generated reply that held no code: nothing runs."""
    return replace(runner.blank(pair), status=Status.NO_CODE, message="the reply held no code block")


def _with_refusals(verdict: Verdict, build: Build, sandbox: Sandbox) -> Verdict:
    """`verdict` with what the operating system refused the candidate's children (its build's and its
    own), as their output shows: evidence that it tried to reach outside its sandbox."""
    refused = {k: v for k, v in (("build", list(build.refused)), ("child", sandbox.refused())) if v}
    if not refused:
        return verdict
    return replace(verdict, evidence={**verdict.evidence, "sandbox_refused": refused})


class LocalExecutor(Executor):
    """One lane (`lane`: its index on this machine, for its cores). `builds` and `quiet` may be
    shared with other lanes of the machine (lanes on one device share its quiet lock); a lane that
    owns its build pool shuts it down on close."""

    def __init__(self, settings: Settings, runners: dict[str, ProtocolRunner], builds: BuildPool | None = None,
                 quiet: Quiet | DeviceGate | None = None, lane: int = 0, held: int = 0, room: Room | None = None) -> None:
        self.settings = settings
        self.runners = runners
        self._own_builds = builds is None
        self._builds = builds or BuildPool(settings)
        plan = self._plan = self._builds.plan
        self._lane = lane
        self._eval = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kbv-eval",
                                        initializer=enter_lane_thread, initargs=(plan, lane))
        self._starter = ThreadPoolExecutor(max_workers=max(1, PRESTART + SPARES), thread_name_prefix="kbv-start",
                                           initializer=enter_starter_thread, initargs=(plan,))
        self._lock = threading.Lock()
        # the device's gate: held shared through each pair, exclusively while a pair is timed, its
        # memory measured or its call times compared (builds are stopped meanwhile in hold mode)
        self._quiet = quiet if isinstance(quiet, Quiet) else Quiet(quiet, self._builds.holds)
        self._held = held or HELD_PER_PROTOCOL
        # the memory the machine's lanes claim for their pairs in flight (`kbv.room`): shared by the lanes
        # of one machine, so that two pairs never plan with the same free bytes
        self._room = room or Room()
        # protocol -> {problem hash: prepared problem (or its failure)}, least recently used first
        self._contexts: dict[str, OrderedDict[str, Any]] = {}
        self._queue: list[Job] = []  # submitted, not yet evaluating
        self._warm: dict[str, Future[WarmChild]] = {}
        self._spares: list[Future[WarmChild]] = []  # reference children started ahead (`_take_spare`)
        self._current: tuple[Job, StageClock, float] | None = None  # the pair evaluating, for `state`
        self._aborted = False

    def submit(self, job: Job) -> Future[Verdict]:
        build = self._builds.start(job.pair)
        with self._lock:
            self._queue.append(job)
        self._prestart()
        self._fill_spares()
        return self._eval.submit(self._evaluate, job, build)

    # -- children ---------------------------------------------------------------------------------

    def _prestart(self) -> None:
        """Start children for the next PRESTART queued jobs that have none."""
        with self._lock:
            for job in self._queue[:PRESTART]:
                if job.key not in self._warm and not job.pair.candidate.no_code and not self._aborted:
                    self._warm[job.key] = self._starter.submit(self._start_child, job)

    def _start_child(self, job: Job) -> WarmChild:
        cand, problem = job.pair.candidate, job.pair.problem
        warm = self._bring_up(f"{job.protocol}-{cand.hash[:12]}-{problem.hash[:8]}",
                              lambda: prepare_candidate(cand, self.settings).build_dir)
        if warm.sandbox is not None and warm.sandbox.proc is not None and warm.failure is None:
            # stopped while another lane of the device times (`kbv.placement.Bystanders`), until closed
            bystanders, pgid = self._quiet.bystanders, warm.sandbox.proc.pid
            bystanders.add(self._quiet.lane, pgid)
            warm.stack.callback(bystanders.discard, self._quiet.lane, pgid)
        return warm

    def _start_spare(self) -> WarmChild:
        return self._bring_up("baseline-spare", lambda: None)

    def _bring_up(self, label: str, build_dir: Callable[[], Path | None]) -> WarmChild:
        """A child spawned on the build cores, then moved to the lane's and its device brought up."""
        warm = WarmChild()
        t0 = time.perf_counter()
        try:
            spec = warm.stack.enter_context(self.settings.child_scratch(label, build_dir()))
            warm.sandbox = warm.stack.enter_context(Sandbox(spec))  # born on the build cores
            if self._aborted:  # an interrupt came while it was spawned
                warm.close()
                raise ChildFailure(Status.CRASHED, "the run was interrupted", {})
            self._await_start(warm.sandbox)
            with self._quiet.gate.shared():  # a CUDA context coming up must not land in another pair's timing
                if self._plan.pinned:
                    assert warm.sandbox.proc is not None
                    move_process(warm.sandbox.proc.pid, self._plan.child_cpus(self._lane))
                warm.sandbox.ready(self.settings.timeout_s)
        except ChildFailure as failure:
            warm.failure = failure
        except BaseException:
            warm.close()
            raise
        warm.start_s = time.perf_counter() - t0
        return warm

    def _await_start(self, sandbox: Sandbox) -> None:
        """Wait while the spawned child imports torch (held, in hold mode, while a pair is timed)."""
        holds = self._builds.holds
        assert sandbox.proc is not None
        holds.add(sandbox.proc.pid)
        try:
            sandbox.started(self.settings.timeout_s, paused=holds.paused_s if holds.active else None)
        finally:
            holds.discard(sandbox.proc.pid)

    def _take_spare(self) -> tuple[contextlib.ExitStack, Sandbox] | None:
        """A spare reference child that is up and ready (`kbv.sandbox.spares`), another started in its
        place; None when none is ready yet (never waited for: its bring-up may need the device's gate,
        which the asking lane holds)."""
        with self._lock:
            ready = next((f for f in self._spares if f.done()), None)
            if ready is not None:
                self._spares.remove(ready)
        self._fill_spares()
        if ready is None or ready.cancelled() or ready.exception() is not None:
            return None
        warm = ready.result()
        if warm.failure is not None or warm.sandbox is None or warm.sandbox.proc is None \
                or warm.sandbox.proc.poll() is not None:  # it died while it waited
            warm.close()
            return None
        return warm.stack, warm.sandbox

    def _fill_spares(self) -> None:
        """Spares for the problems this lane's queued pairs will prepare (one baseline child each, up
        to SPARES): none for a problem the lane holds, none once nothing new is coming."""
        with self._lock:
            held = {(name, problem) for name, contexts in list(self._contexts.items()) for problem in list(contexts)}
            coming = {(job.protocol, job.pair.problem.hash) for job in self._queue if not job.pair.candidate.no_code}
            while len(self._spares) < min(SPARES, len(coming - held)) and not self._aborted:
                try:
                    self._spares.append(self._starter.submit(self._start_spare))
                except RuntimeError:  # shut down under us: an interrupt
                    return

    def _child_for(self, job: Job) -> WarmChild:
        with self._lock:
            if job in self._queue:
                self._queue.remove(job)
            fut = self._warm.pop(job.key, None)
        if fut is None:
            fut = self._starter.submit(self._start_child, job)
        self._prestart()
        return fut.result()

    # -- one pair -----------------------------------------------------------------------------------
    def _evaluate(self, job: Job, build_future: Future[Build]) -> Verdict:
        clock = StageClock(exclusive={name: self._quiet for name in EXCLUSIVE_STAGES})
        t0 = time.perf_counter()
        self._current = (job, clock, time.monotonic())
        try:
            with measuring(clock), offering(self._take_spare):
                verdict = self._judged(job, build_future, clock)
                if killed_for_others_memory(verdict):  # once more, in a fresh child, once the host has room
                    wait_for_host_memory()
                    first = verdict.evidence
                    verdict = self._judged(job, build_future, clock)
                    if killed_for_others_memory(verdict):
                        raise RunFailure(host_memory_failure(job.pair, first, verdict.evidence))
        finally:
            self._current = None
        pair_s = time.perf_counter() - t0 - clock.seconds.get("build_wait", 0.0)
        verdict = replace(verdict, evidence={**verdict.evidence, "stages_s": clock.rounded(), "pair_s": round(pair_s, 3)})
        return _naming_users_file(verdict, job.pair.candidate)

    def _judged(self, job: Job, build_future: Future[Build], clock: StageClock) -> Verdict:
        """`_evaluate_pair`; where a buffer of kbv's own found no room on the device beside a child that
        held little (`DeviceRoomFailure`: on an H100, KernelBench's L1/11 identity came out `cuda_error`
        so while the same problem's standard trials held the device), once more in a fresh child after
        every problem the lane holds is released, this pair's own preparation too: the child that found
        no room was killed to measure it, and it may be one of the preparation's baseline children,
        which every later pair of the problem would find dead. Still no room: the run's failure,
        stored and tried again when the run resumes.

        kbv's own process out of device memory in the middle of a pair, while the lane holds other
        prepared problems than the pair's (KernelBench's L1/9 identity on an H100: an 8 GiB float64
        buffer refused beside the same problem's standard trials and the problems before it, which
        the pair's preparation had found room beside): the same, once. With nothing else held it is
        the run's failure at once, as it would be again. A problem's stored failure (its preparation
        ran out of memory even after the lane let go of the rest) is raised again as it is: no retry.

        The verdict of a second attempt says so in its evidence (`retried`); its stages add up both."""
        try:
            return self._evaluate_pair(job, build_future, clock)
        except DeviceRoomFailure as exc:
            why = first_line(exc)
        except ProblemError:
            raise
        except Exception as exc:
            if not out_of_memory(exc) or not self._holds_besides(job):
                raise
            why = first_line(exc)
        # out of the handler: the failed attempt's frames, and the tensors they held, are gone
        with self._quiet.gate.shared():  # tensors freed and the cache emptied are device work: not in a window
            self._release_held(lambda contexts, problem: True)
        verdict = self._evaluate_pair(job, build_future, clock)
        return replace(verdict, evidence={**verdict.evidence, "retried": f"judged again after letting go of "
                                                                         f"every problem the lane held: {why}"})

    def _holds_besides(self, job: Job) -> bool:
        """Whether the lane holds a prepared problem other than `job`'s problem under `job`'s protocol."""
        return any(not isinstance(context, ProblemError) and (name, problem) != (job.protocol, job.pair.problem.hash)
                   for name, contexts in self._contexts.items() for problem, context in contexts.items())

    def _evaluate_pair(self, job: Job, build_future: Future[Build], clock: StageClock) -> Verdict:
        runner = self.runners[job.protocol]
        pair = job.pair
        if pair.candidate.no_code:
            with self._lock:
                if job in self._queue:
                    self._queue.remove(job)
            return no_code_verdict(runner, pair)
        with stage("build_wait"):  # the pair's child comes up meanwhile
            build = build_future.result()
        with stage("child_start"):
            warm = self._child_for(job)
        # the pair's memory claim (`kbv.room`) lasts until its child is closed
        with using(self._room, self._lane, self.settings.device):
            try:
                # the device's gate, shared from here on (a timed window takes it alone): not while waiting
                # for the build or the child, whose starter thread needs the gate too
                with holding(self._quiet.gate):
                    prepared = self._context(runner, pair)
                    if warm.failure is not None:
                        f = warm.failure
                        return replace(runner.blank(pair), status=f.status,
                                       message=f"the child could not start: {f.message}", evidence=f.evidence)
                    assert warm.sandbox is not None
                    verdict = self._maybe_skipped(runner.evaluate(pair, prepared, build, warm.sandbox), pair)
                return _with_refusals(verdict, build, warm.sandbox)
            finally:
                with self._quiet.gate.shared():  # a context torn down is device work too: not in a window
                    warm.close()
                    # another lane waits to have the memory to itself: what this one holds goes now
                    wanted = self._room.wanted(self._lane) and self._release_held(lambda contexts, problem: True)
                    self._return_device_memory(collect=wanted)

    def _return_device_memory(self, collect: bool = False) -> None:
        """Give the parent's cached, unused device memory back to the driver: the children of the next
        pair allocate from the same device, and a multi-GB problem's transients would starve them.
        `collect` (a problem released): the garbage collector runs first, for what cycles still hold."""
        if self.settings.device_type == "cuda" and collect:
            import gc

            gc.collect()
        return_cached(self.settings.device_type)

    def _maybe_skipped(self, verdict: Verdict, pair: Pair) -> Verdict:
        return skip_unrunnable(verdict, pair.candidate.backend, self.settings.device)

    def _context(self, runner: ProtocolRunner, pair: Pair) -> Any:
        """The prepared problem (up to `held` kept per protocol); a problem that failed to prepare
        fails again."""
        held = self._contexts.setdefault(runner.name, OrderedDict())
        if pair.problem.hash in held:
            held.move_to_end(pair.problem.hash)
            context = held[pair.problem.hash]
            if isinstance(context, ProblemError):
                raise type(context)(str(context))
            need = getattr(getattr(context, "plan", None), "need", None)
            if isinstance(need, Need):  # the pair will hold the problem's peak again: claimed as its plan was
                claim_plan(need)
            self._keep_device_memory(pair, context)
            return context
        while len(held) >= self._held:
            self._release(runner, held, next(iter(held)))
        failure: ProblemError | None = None
        try:
            context = self._prepare(runner, pair, held)
        except ProblemError as exc:
            # kept without its traceback, whose frames would hold the half-made problem's tensors
            failure = type(exc)(str(exc))
        except Exception as exc:
            if not out_of_memory(exc):
                raise
            failure = ProblemRunError(f"{pair.problem.origin}: too large for {self.settings.device} under the "
                                      f"{runner.name} protocol: {first_line(exc, 200)}")
        if failure is not None:
            held[pair.problem.hash] = failure
            self._return_device_memory(collect=True)
            raise type(failure)(str(failure))
        held[pair.problem.hash] = context
        self._return_device_memory()  # the preparation's transients, before the candidate's child allocates
        self._keep_device_memory(pair, context)
        return context

    def _keep_device_memory(self, pair: Pair, context: Any = None) -> None:
        """On a GPU short of free memory, release every held problem but `pair`'s (any protocol). Short:
        under FREE_SHARE_TO_HOLD of the device free, or less free than the peak that `context`'s memory
        plan holds (its `plan.need.device`). That peak counts what the preparation already holds too, so
        a large problem lets go of the others a little early, never late: on an H100, KernelBench's L1/9
        (a 40 GiB plan) ran kbv out of memory beside the problems a lane held with a quarter free."""
        if self.settings.device_type != "cuda" or not any(
                problem != pair.problem.hash for held in self._contexts.values() for problem in held):
            return
        import torch

        free, total = torch.cuda.mem_get_info(torch.device(self.settings.device))
        need = getattr(getattr(getattr(context, "plan", None), "need", None), "device", 0)
        if free >= max(FREE_SHARE_TO_HOLD * total, need if isinstance(need, int) else 0):
            return
        self._release_held(lambda contexts, problem: problem != pair.problem.hash)

    def _prepare(self, runner: ProtocolRunner, pair: Pair, held: OrderedDict[str, Any]) -> Any:
        """`runner.prepare`; out of device memory, or refused as too large for the memory available
        (`ProblemTooLarge`), once more after the other problems held (under any protocol) are released
        (a lane holds two where one fits); and still short, once more after the same problem is
        released under the other protocols too (a problem whose standard trials take half the device
        is prepared for verified in the whole of it). A retry is made only where something was
        released. Where the two protocols' plans of one problem cannot be held together, each of its
        pairs prepares it again for its protocol: slower, never a refusal. Still short while other lanes'
        pairs claim memory (`kbv.room`): once more with the memory to itself, once their pairs have ended
        and let go of what their lanes held, so that no problem is refused for the other pairs in flight
        (what an idle lane holds stays: `kbv.room`)."""
        try:
            return runner.prepare(pair)
        except Exception as exc:
            if not _short_of_memory(exc):
                raise
            error: Exception = exc
        for releasable in (lambda contexts, problem: contexts is held or problem != pair.problem.hash,
                           lambda contexts, problem: True):
            if not self._release_held(releasable):
                continue
            try:
                return runner.prepare(pair)
            except Exception as exc:
                if not _short_of_memory(exc):
                    raise
                error = exc
        if sharing():
            del error  # its frames hold the failed attempt's tensors
            with alone():
                self._release_held(lambda contexts, problem: True)
                self._return_device_memory(collect=True)
                return runner.prepare(pair)
        raise error

    def _release_held(self, releasable: Callable[[OrderedDict[str, Any], str], bool]) -> bool:
        """Release every prepared problem held (any protocol) that `releasable(contexts, problem)` picks;
        whether any went. A stored failure stays: it holds no memory, and preparing its problem again
        would fail again (its preparation let go of the rest before it failed)."""
        freed = False
        for name, contexts in self._contexts.items():
            for problem in [p for p in contexts if releasable(contexts, p) and not isinstance(contexts[p], ProblemError)]:
                freed = True
                self._release(self.runners[name], contexts, problem)
        return freed

    def _release(self, runner: ProtocolRunner, held: OrderedDict[str, Any], problem: str) -> None:
        context = held.pop(problem)
        if not isinstance(context, ProblemError):
            runner.release(context)
        self._return_device_memory(collect=True)

    # -- what it is doing ---------------------------------------------------------------------------
    def state(self) -> RunState:
        build = self._builds.state()
        current = self._current
        doing: tuple[str, ...] = ()
        if current is not None:
            job, clock, started = current
            where = clock.now()
            doing = (f"{self.settings.device}: {_pair_name(job)} {where[0]} {where[1]:.0f} s" if where
                     else f"{self.settings.device}: {_pair_name(job)} {time.monotonic() - started:.0f} s",)
        return RunState.of_builds(build, evaluating=doing)

    # -- stopping -----------------------------------------------------------------------------------
    def abort(self) -> None:
        """Stop now: nothing queued starts, and every child (builds, baselines, candidates) is killed, so
        the pair in flight ends at once. Its verdict, made from a killed child, is never stored."""
        self._aborted = True
        for pool in (self._eval, self._starter):
            pool.shutdown(wait=False, cancel_futures=True)
        self._builds.shutdown(wait=False)
        kill_all_children()

    def close(self) -> None:
        wait = not self._aborted
        for pool in (self._eval, self._starter):
            pool.shutdown(wait=wait, cancel_futures=True)
        if self._own_builds:
            self._builds.shutdown(wait=wait)
        with self._lock:
            warm, self._warm = list(self._warm.values()), {}
            spares, self._spares = self._spares, []
        for fut in warm + spares:
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                fut.result().close()
        if wait:
            for runner_name, held in list(self._contexts.items()):
                for context in held.values():
                    if not isinstance(context, ProblemError):
                        self.runners[runner_name].release(context)
            self._contexts.clear()


# A child the kernel's out-of-memory killer ended, whose own peak was under this share of the host's
# memory, was killed for memory that others took: kbv makes every child the killer's first choice, so
# an honest one of 200 MB goes before a neighbour's 23 GB process (`kbv.sandbox.oom`).
OTHERS_MEMORY_SHARE = 0.25
HOST_MEMORY_WAIT_S = 30.0  # how long a retry waits for the host's available memory to come back


def _short_of_memory(exc: BaseException) -> bool:
    """Out of device memory, or refused as too large for the memory available."""
    return out_of_memory(exc) or isinstance(exc, ProblemTooLarge)


def killed_for_others_memory(verdict: Verdict) -> bool:
    """Whether `verdict` is a child killed by the out-of-memory killer while its own memory was small
    next to the host's (pure, but for the host's total, read once)."""
    ev = verdict.evidence
    peak = ev.get("child_peak_rss_bytes")
    if verdict.status is not Status.CRASHED or not ev.get("host_oom_kills") or not isinstance(peak, int):
        return False
    return peak < OTHERS_MEMORY_SHARE * host_total_bytes()


def wait_for_host_memory(timeout_s: float = HOST_MEMORY_WAIT_S) -> None:
    """Until a tenth of the host's memory is available again, or `timeout_s` passes."""

    deadline = time.monotonic() + timeout_s
    while host_available_bytes() < 0.1 * host_total_bytes() and time.monotonic() < deadline:
        time.sleep(0.5)


def host_memory_failure(pair: Pair, first: dict[str, Any], second: dict[str, Any]) -> str:
    """The run failure's message: twice killed for memory others took, with the figures."""
    from kbv.footprint import format_bytes

    peaks = ", ".join(format_bytes(int(ev.get("child_peak_rss_bytes", 0))) for ev in (first, second))
    return (f"{pair.problem.origin}: the host ran out of memory twice while {pair.candidate.name} ran, and the "
            f"kernel's out-of-memory killer ended its child (which held at most {peaks} of "
            f"{format_bytes(host_total_bytes())}): memory others took, not the candidate's doing; no verdict is "
            f"stored, and the pair is tried again when the run resumes")


def _pair_name(job: Job) -> str:
    return f"{job.pair.problem.key}/{job.pair.candidate.name} {job.protocol}"


def _naming_users_file(verdict: Verdict, candidate: Candidate) -> Verdict:
    """The verdict with its message and traceback naming the candidate's own file (its origin),
    never the copy in the build directory that the child imported."""
    trace = verdict.evidence.get("traceback")
    evidence = verdict.evidence if not isinstance(trace, str) else \
        {**verdict.evidence, "traceback": as_users_file(trace, candidate.origin)}
    return replace(verdict, message=as_users_file(verdict.message, candidate.origin), evidence=evidence)


def skip_unrunnable(verdict: Verdict, backend: Backend, device: str) -> Verdict:
    """A candidate whose backend `device` cannot run, and which failed to build or run there, is
    `skipped` rather than counted as a failure (a CUDA kernel on --device cpu), with one short line
    that says why (`a cuda candidate cannot run on cpu (no CUDA device)`): the build's error (an
    OSError about CUDA_HOME, its traceback) is what that reason looks like, so it goes to the
    evidence (`skipped_failure`), never into the message. One that ran (a silent fallback to
    PyTorch, say) keeps its verdict."""
    failed = verdict.status in (Status.COMPILE_ERROR, Status.RUNTIME_ERROR, Status.CUDA_ERROR)
    why = backend.cannot_run_because("cuda" if device.startswith("cuda") else "cpu")
    if not failed or why is None:
        return verdict
    failure = {"status": verdict.status.value, "message": verdict.message}
    return replace(verdict, status=Status.SKIPPED, categories=(),
                   message=f"a {backend.value} candidate cannot run on {device} ({why})",
                   evidence={**verdict.evidence, "skipped_failure": failure})
