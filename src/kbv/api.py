"""The public Python surface: `evaluate` a set of candidates, `load_report` of a run.

    from kbv.api import EvalConfig, evaluate, load_report
    result = evaluate(EvalConfig(candidates="examples/", problems="smoke", device="cpu"))
    for v in result.verdicts:
        print(v.problem, v.candidate, v.status.value, v.speedup)

The CLI is a thin layer over these two functions. `open_session` is the run underneath `evaluate`:
its store, protocol runners and executor, open for pairs submitted over its life (`kbv serve` keeps
one open for as long as it serves).
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import re
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from kbv.builds import Build
from kbv.candidates import Candidate, Pair, Pairing, Unpaired, load_candidates, unpaired_lines
from kbv.errors import ProblemError, UnsoundProblemError, UsageError
from kbv.executors import Executor, Job, ProtocolRunner, RunState
from kbv.memory_plan import host_available_bytes
from kbv.metrics import Metrics, metrics_by_group, pass_at_k_by_model
from kbv.gate import DeviceGate, synchronizer
from kbv.placement import Bystanders, CorePlan, Quiet, current_plan, lane_settings, off_lanes, parse_isolation
from kbv.problems import Problem, key_order, load_problems, out_of_memory
from kbv.provenance import collect_provenance, device_fingerprint
from kbv.sandbox.isolation import SandboxMode, check_strict
from kbv.sandbox.isolation import resolve as resolve_isolation
from kbv.settings import Settings, cuda_arch_list, default_cache_dir, resolve_device, resolve_devices
from kbv.store import Store, open_store, pair_key
from kbv.verdict import ProblemFailure, Verdict

PROTOCOL_CHOICES = ("standard", "verified", "both")
PROTOCOL_ORDER = ("standard", "verified")  # "both" runs them in this order, and reports list them so
EXECUTOR_CHOICES = ("local", "ray")
MAX_PAIRS_PER_DEVICE = 8


@dataclass(frozen=True)
class EvalConfig:
    """Everything `evaluate` needs. Paths are strings as the user gave them."""

    candidates: str
    problems: str = "smoke"
    protocol: str = "standard"  # standard | verified | both
    device: str = "auto"
    devices: str | None = None  # local lanes, one per device: auto | 0,1,3 | cpu,cpu (None: `device` alone)
    # pairs each device evaluates at once: their untimed work overlaps, their timed windows take turns
    # (`kbv.gate`); each is a lane of its own, with its own CPUs where lanes are pinned
    pairs_per_device: int = 1
    executor: str = "local"  # local | ray
    ray_address: str | None = None  # auto | HOST:PORT | ray://HOST:PORT; None: a running local Ray, else a new one
    run_dir: str | None = None  # default: kbv-runs/<candidates name>
    seed: int | None = None  # the verified protocol's secret seed (random when None)
    timeout_s: float = 300.0
    prepare_timeout_s: float = 0.0  # preparing one problem under one protocol (0: timeout_s)
    build_timeout_s: float = 900.0
    jobs: int = 0  # parallel builds; 0 = one per CPU set apart for builds (as memory allows)
    build_isolation: str = "auto"  # how builds keep out of timings: auto | pin | hold | none (kbv.placement)
    pch: bool = True  # builds share precompiled torch headers (kbv.pch)
    tolerance: float = 1e-2  # the standard protocol's atol = rtol
    standard_timing: str = "cuda_event"  # the standard protocol's timer: cuda_event | do_bench | host_time
    warm_clocks: bool = True  # warm a GPU's clocks before every timed window (kbv.clocks); off: benches of its effect
    cache_dir: str | None = None  # builds; default $KBV_CACHE_DIR or ~/.cache/kbv
    precision: str = "tf32"  # the verified baseline's float32 policy: tf32 | fp32
    baselines: tuple[str, ...] = ("eager-tf32",)  # timed under the verified protocol
    trials: int = 2  # verified trials per distribution
    ci_target: float = 0.01  # verified timer: relative CI half-width to reach
    timer_budget_s: float = 30.0  # verified timer: wall-clock cap per pair
    min_custom_share: float = 0.0  # verified: least share of time in the candidate's own kernels
    sandbox: str = "auto"  # strict | auto | off: how children are isolated (kbv.sandbox.isolation)
    keep_problems: int = 0  # prepared problems a local lane keeps per protocol (0: the lane's default, 2)
    # benches only (bench/repeat.py): the verified protocol times a no_custom_kernel candidate all the
    # same; its status and (absent) speedup stand, its verdict says it was timed, and it never resumes
    # into a run without the setting
    time_unattributed: bool = False


@dataclass(frozen=True)
class RunStats:
    """Where an invocation's wall time went, for the pairs it evaluated.

    The lanes' busy share is the seconds lanes spent in pairs (from taking a pair to its verdict,
    less any wait for its build: each verdict's `pair_s`), over the wall time times the lanes. It is
    the share of time the device had a pair, not its own utilisation (kernels running), which is
    lower. The floor is what no schedule can beat: the larger of the builds' CPU-seconds over the
    CPUs and the pairs' seconds over the lanes. The longest load is the pair whose lane spent the
    most seconds importing and constructing the candidate (its verdict's `load` stage): with its
    extensions built in the build phase, seconds; more says that something compiled on the lane."""

    wall_s: float  # from the first submission to the last verdict
    first_verdict_s: float | None
    pairs: int
    pair_s: float
    lanes: int
    builds: int  # built in this run
    builds_cached: int
    build_cpu_s: float
    cpus: int
    longest_load_s: float = 0.0  # the most seconds one pair's lane spent loading (`stages_s["load"]`)
    longest_load: str = ""  # that pair: problem, candidate and protocol
    prepare_s: float = 0.0  # seconds lanes spent preparing problems (every pair's `stages_s["prepare"]`)
    prepared: int = 0  # problems prepared under the verified protocol (their evidence's `preparation`)
    prepare_calls: int = 0  # the reference calls those preparations made (`kbv.ledger`)

    @property
    def pairs_per_min(self) -> float:
        return 60.0 * self.pairs / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def busy_share(self) -> float:
        return self.pair_s / (self.wall_s * self.lanes) if self.wall_s > 0 else 0.0

    @property
    def floor_s(self) -> float:
        return max(self.build_cpu_s / max(1, self.cpus), self.pair_s / max(1, self.lanes))

    def describe(self) -> str:
        first = f"{self.first_verdict_s:.1f} s" if self.first_verdict_s is not None else "-"
        return (f"wall {self.wall_s:.1f} s (floor {self.floor_s:.1f} s) · first verdict {first} · "
                f"{self.pairs_per_min:.1f} pairs/min · builds {self.builds} ({self.build_cpu_s:.0f} CPU-s), "
                f"{self.builds_cached} cached · lanes busy {100 * self.busy_share:.0f}%"
                + (f" · longest load {self.longest_load_s:.1f} s ({self.longest_load})" if self.longest_load else "")
                + (f" · preparation {self.prepare_s:.0f} s ({100 * self.prepare_s / max(self.pair_s, 1e-9):.0f}% of "
                   f"the lanes' time)" if self.prepare_s else "")
                + (f", verified {self.prepare_calls} reference calls for {self.prepared} problems"
                   if self.prepared else ""))


@dataclass(frozen=True)
class RunResult:
    run_dir: Path
    verdicts: tuple[Verdict, ...]  # this invocation's pairs, evaluated now or resumed, in report_order
    evaluated: int
    resumed: int
    unpaired: tuple[Unpaired, ...]
    problem_failures: tuple[ProblemFailure, ...]
    stats: RunStats | None = None


@dataclass(frozen=True)
class Report:
    run_dir: Path
    verdicts: tuple[Verdict, ...]
    metrics: dict[str, dict[str, Metrics]]
    pass_at_k: dict[str, dict[str, float]] = field(default_factory=dict)
    problem_failures: tuple[ProblemFailure, ...] = ()  # standing: pairs of them have no verdict yet

    def to_dict(self) -> dict[str, Any]:
        return {
            "run": str(self.run_dir),
            "verdicts": [v.to_dict() for v in self.verdicts],
            "metrics": {p: {g: asdict(m) for g, m in groups.items()} for p, groups in self.metrics.items()},
            "pass_at_k": self.pass_at_k,
            "problem_failures": [asdict(f) for f in self.problem_failures],
        }


# (done, total, what just finished: a verdict, a pair whose problem failed, or None at the start)
ProgressFn = Callable[[int, int, "Verdict | ProblemFailure | None"], None]
NoticeFn = Callable[[str, bool], None]  # (one line, whether it is a warning)
WatchFn = Callable[[RunState, float], None]  # (what the run is doing, seconds since the last verdict)
PairedFn = Callable[[Pairing], None]  # the candidates' pairing, before the run starts
WATCH_EVERY_S = 1.0


def evaluate(config: EvalConfig, progress: ProgressFn | None = None, executor: Executor | None = None,
             watch: WatchFn | None = None, notice: NoticeFn | None = None,
             paired: PairedFn | None = None) -> RunResult:
    """Evaluate every (problem, candidate) pair, resuming from the run's store.

    `progress` is called for each stored verdict (and each pair whose problem failed); `watch`, every
    WATCH_EVERY_S while none lands, with what the run is doing; `notice` hears the isolation children
    run under, once, before anything runs (a warning when it is not full); `paired` hears the
    pairing (its unpaired candidates with their reasons) before that. Where no candidate pairs,
    raises UsageError with the first reasons. Raises UsageError /
    ProblemLoadError / CandidateSourceError for bad input, and SandboxUnavailable (a UsageError) under
    `sandbox="strict"` where full isolation cannot be had; a bad candidate is a verdict. A problem
    whose own code fails is reported in `problem_failures`; the run goes on.
    """
    check_config(config)
    protocols = _protocols(config.protocol)
    problems = load_problems(config.problems)
    pairing = load_candidates(config.candidates, problems)
    if not pairing.pairs:
        reasons = "; ".join(line.removesuffix(".") for line in unpaired_lines(pairing.unpaired, 3))
        raise UsageError(f"No candidate pairs with a problem of '{config.problems}' "
                         f"({len(pairing.unpaired)} unpaired): {reasons}")
    if paired is not None:
        paired(pairing)
    with open_session(config, executor, notice) as session:
        jobs, resumed, keys = _jobs(pairing.pairs, protocols, session)
        try:
            evaluated, failures, stats = _run_jobs(jobs, session.executor, session.store, progress, len(resumed),
                                                   watch)
        except BaseException:  # an interrupt: stop at once; every verdict stored so far stays stored
            session.executor.abort()
            raise
        verdicts = tuple(sorted(session.store.verdicts_of(keys), key=report_order))  # however they completed
    return RunResult(session.settings.run_dir, verdicts, evaluated, len(resumed), pairing.unpaired,
                     tuple(failures.values()), stats)


@dataclass(frozen=True)
class RunSession:
    """One open run: where it runs, its store (the only writer is whoever holds the session), one
    runner per protocol, and the executor pairs are submitted to. Made by `open_session`."""

    settings: Settings
    store: Store
    runners: dict[str, ProtocolRunner]
    executor: Executor
    protocols: tuple[str, ...]  # those `runners` has, in `config.protocol`'s order
    # (protocol fingerprint, device fingerprint) by protocol: fixed for the session, and costly to
    # recompute for every request of `kbv serve`
    fingerprints: dict[str, tuple[str, str]] = field(default_factory=dict)

    def key(self, pair: Pair, protocol: str) -> str:
        """The resume key of `pair` under `protocol`: a verdict stored under it is this pair's."""
        c = pair.candidate
        rules, device = self.fingerprints.get(protocol) or (self.runners[protocol].fingerprint(),
                                                             device_fingerprint(self.settings.provenance))
        return pair_key(pair.problem.hash, c.hash, c.name, c.model, c.sample, rules, device)

    def job(self, pair: Pair, protocol: str) -> Job:
        return Job(pair, protocol, self.key(pair, protocol))


@contextlib.contextmanager
def open_session(config: EvalConfig, executor: Executor | None = None,
                 notice: NoticeFn | None = None) -> Iterator[RunSession]:
    """The run of `config` (`config.candidates` is not read): its settings, its store with this
    invocation recorded, its runners, and `executor` or one made for `config` (closed on exit; the
    holder aborts it first on an interrupt). `notice` hears the isolation its children get, before
    anything runs. The calling thread keeps off the lanes' CPUs while the session is open. Raises
    UsageError (SandboxUnavailable under --sandbox strict) and StoreError."""
    check_config(config)
    protocols = _protocols(config.protocol)
    local = executor is not None or config.executor == "local"
    devices = _devices(config) if local else ()  # under Ray, a worker says what its device is
    secret = _secret(config)
    with contextlib.ExitStack() as stack:
        cluster, probe = (None, None) if local else _connect(config, stack)
        devices = (probe["device"],) if probe else devices
        settings = _settings(config, devices[0], probe, len(devices))
        if notice is not None:
            line = str(settings.provenance.get("sandbox", ""))
            notice(f"sandbox: {line}", settings.provenance.get("sandbox_level") != "bwrap")
        store = stack.enter_context(open_store(settings.run_dir))
        store.record_invocation(asdict(config), settings.provenance)
        runners = _runners(config, settings, secret)
        if executor is None:
            executor = _executor(config, settings, devices, runners, store, secret, cluster)
            stack.callback(executor.close)  # before the store closes: a closing lane may still finish a pair
        stack.enter_context(off_lanes(executor.plan))  # this thread too keeps off the timed CPUs
        device = device_fingerprint(settings.provenance)
        yield RunSession(settings, store, runners, executor, protocols,
                         {name: (runner.fingerprint(), device) for name, runner in runners.items()})


def warm_builds(config: EvalConfig, candidates: Sequence[Candidate] | None = None) -> list[Build]:
    """Build every compiled candidate of `config` (or only `candidates`) into the build cache, as a run's
    build pool would (`config.jobs` at a time, where the machine's plan puts builds), and evaluate
    nothing: a later run with the same cache finds them built. The builds, a failed one with its status.
    Raises UsageError and the loading errors."""
    from kbv.builds import BuildPool, needs_build

    check_config(config)
    settings = _settings(config, _devices(config)[0])
    problems: dict[Candidate, Problem | None] = {}
    if candidates is None:
        for pair in load_candidates(config.candidates, load_problems(config.problems)).pairs:
            problems.setdefault(pair.candidate, pair.problem)
    else:
        problems = dict.fromkeys(candidates)
    pool = BuildPool(settings)
    try:
        futures = [pool.build(c, p) for c, p in problems.items() if needs_build(c) and not c.no_code]
        return [f.result() for f in futures]
    finally:
        pool.shutdown(wait=True)


def load_report(run_dir: str | Path) -> Report:
    """Every verdict of a run with its metrics, in `report_order` (whatever the order they were
    stored in), and its standing problem failures in problem order. Raises StoreError when there is
    no run."""
    with open_store(Path(run_dir), create=False) as store:
        verdicts = tuple(sorted(_latest(store.verdicts()), key=report_order))
        failures = tuple(sorted(store.problem_failures(), key=lambda f: (key_order(f.problem), _rank(f.protocol))))
    return Report(Path(run_dir), verdicts, metrics_by_group(verdicts), pass_at_k_by_model(verdicts), failures)


def report_order(v: Verdict) -> tuple[Any, ...]:
    """The order every report lists verdicts in: the problems' order (level, problem id, name), then
    candidate, model and sample, then protocol (standard before verified)."""
    return (key_order(v.problem), v.candidate, v.model or "", -1 if v.sample is None else v.sample,
            _rank(v.protocol))


def _rank(protocol: str) -> tuple[int, str]:
    return (PROTOCOL_ORDER.index(protocol) if protocol in PROTOCOL_ORDER else len(PROTOCOL_ORDER), protocol)


def _latest(verdicts: list[Verdict]) -> tuple[Verdict, ...]:
    """The newest verdict of each (problem, candidate, model, sample, protocol): a candidate edited
    and evaluated again replaces its earlier verdict in the report (the store keeps both)."""
    latest: dict[tuple[Any, ...], Verdict] = {}
    for v in verdicts:  # in write order
        key = (v.problem, v.candidate, v.model, v.sample, v.protocol)
        latest.pop(key, None)
        latest[key] = v
    return tuple(latest.values())


def _protocols(choice: str) -> tuple[str, ...]:
    if choice not in PROTOCOL_CHOICES:
        raise UsageError(f"Unknown protocol '{choice}': expected standard, verified or both.")
    return PROTOCOL_ORDER if choice == "both" else (choice,)


def check_config(config: EvalConfig) -> None:
    """Every option of `config`, whatever the protocol, before anything prints or starts: a
    UsageError in one line for the first that cannot be honoured. `evaluate`, `open_session` and
    `kbv serve` call it first."""
    _protocols(config.protocol)
    _check_numbers(config)
    from kbv.protocols.standard import check_timing_method

    check_timing_method(config.standard_timing)
    parse_isolation(config.build_isolation)
    SandboxMode.parse(config.sandbox)
    _check_verified_choices(config)
    _check_executor(config)
    _check_directories(config)


def _check_numbers(config: EvalConfig) -> None:
    """The numbers `kbv eval` and `kbv serve` take; NaN and infinity fail every rule."""
    c = config
    rules = (
        (0 < c.timeout_s < math.inf, f"--timeout {c.timeout_s:g}: expected a positive number of seconds."),
        (0 < c.build_timeout_s < math.inf,
         f"--build-timeout {c.build_timeout_s:g}: expected a positive number of seconds."),
        (0 <= c.prepare_timeout_s < math.inf,
         f"--prepare-timeout {c.prepare_timeout_s:g}: expected a positive number of seconds."),
        (c.jobs >= 0, f"--jobs {c.jobs}: expected 0 (one per CPU set apart for builds) or more."),
        (c.keep_problems >= 0, f"--keep-problems {c.keep_problems}: expected 1 or more (a lane holds at least "
                               "the problem it evaluates)."),
        (1 <= c.pairs_per_device <= MAX_PAIRS_PER_DEVICE,
         f"--pairs-per-device {c.pairs_per_device}: expected 1 to {MAX_PAIRS_PER_DEVICE}."),
        (0 < c.tolerance < 1, f"--tolerance {c.tolerance:g}: expected a number between 0 and 1 "
                              "(KernelBench uses 1e-2 or 1e-4)."),
        (c.trials >= 1, f"--trials {c.trials}: expected 1 or more."),
        (0 < c.ci_target < 1, f"--ci-target {c.ci_target:g}: expected a number between 0 and 1."),
        (0 < c.timer_budget_s < math.inf,
         f"--timer-budget {c.timer_budget_s:g}: expected a positive number of seconds."),
        (0 <= c.min_custom_share <= 1, f"--min-custom-share {c.min_custom_share:g}: expected a share from 0 to 1."),
        (c.seed is None or -(1 << 127) <= c.seed < 1 << 127, f"--seed {c.seed}: expected a 128-bit integer."),
    )
    for ok, message in rules:
        if not ok:
            raise UsageError(message)


def _check_verified_choices(config: EvalConfig) -> None:
    from kbv.protocols.verified.rules import BASELINES

    if config.precision not in ("tf32", "fp32"):
        raise UsageError(f"Unknown precision '{config.precision}': expected tf32 or fp32.")
    unknown = [b for b in config.baselines if b not in BASELINES]
    if unknown or not config.baselines:
        raise UsageError(f"Unknown baseline(s) {', '.join(unknown) or '(none)'}: expected {', '.join(BASELINES)}.")


def _check_executor(config: EvalConfig) -> None:
    if config.executor not in EXECUTOR_CHOICES:
        raise UsageError(f"Unknown executor '{config.executor}': expected local or ray.")
    if config.executor == "ray" and config.pairs_per_device != 1:
        raise UsageError("--pairs-per-device is for the local executor; under --executor ray, Ray places each pair on a GPU.")
    if config.executor == "ray" and config.devices is not None:
        raise UsageError("--devices is for the local executor; under --executor ray, Ray places each pair on a GPU.")
    if config.executor == "local" and config.ray_address is not None:
        raise UsageError("--ray-address needs --executor ray.")
    if config.devices is not None and config.device.strip().lower() != "auto":
        raise UsageError("Give --device or --devices, not both.")


def _secret(config: EvalConfig) -> bytes:
    """The verified protocol's secret: made here, by the parent (the driver), and nowhere else."""
    return config.seed.to_bytes(16, "big", signed=True) if config.seed is not None else os.urandom(32)


def _devices(config: EvalConfig) -> tuple[str, ...]:
    """The local lanes' devices: `--devices`, else the one `--device`; each `--pairs-per-device` times
    (lanes of one device share its gate, `_lanes`)."""
    devices = resolve_devices(config.devices) if config.devices is not None else (resolve_device(config.device),)
    return tuple(d for d in devices for _ in range(config.pairs_per_device))


def _connect(config: EvalConfig, stack: contextlib.ExitStack) -> tuple[Any, dict[str, Any]]:
    """Under --executor ray: the cluster (disconnected when `stack` closes) and what a worker said
    about its device (`kbv.executors.ray.RayCluster.probe`)."""
    from kbv.executors.ray import connect

    cluster = stack.enter_context(connect(config.ray_address))
    return cluster, cluster.probe(config.device, config.timeout_s)


def _executor(config: EvalConfig, settings: Settings, devices: tuple[str, ...], runners: dict[str, ProtocolRunner],
              store: Store, secret: bytes, cluster: Any) -> Executor:
    if cluster is not None:
        from kbv.executors.ray import RayExecutor

        return RayExecutor(cluster, settings, runners, RunnerRecipe(replace(config, seed=None)), secret)
    return _lanes(config, settings, devices, runners, store, secret)


def _lanes(config: EvalConfig, settings: Settings, devices: tuple[str, ...], runners: dict[str, ProtocolRunner],
           store: Store, secret: bytes) -> Executor:
    """One lane per device (a device named twice has two), with its own runners (one secret for all),
    one build pool, and one gate per distinct device (`kbv.gate`: its lanes' untimed work overlaps, their
    timed windows take turns); where builds run, and each lane's own cores, from the machine's
    `CorePlan`. Lanes must be alike: a verdict's resume key names the device model."""
    from kbv.builds import BuildPool
    from kbv.executors.lanes import LanesExecutor
    from kbv.executors.local import LocalExecutor
    from kbv.room import Room

    plan = _plan(config, settings, len(devices))
    builds = BuildPool(settings, plan)
    gates: dict[str, tuple[DeviceGate, Bystanders]] = {}

    def quiet(device: str, lane: int) -> Quiet:
        gate, bystanders = gates.setdefault(device, (DeviceGate(synchronizer(device)), Bystanders()))
        return Quiet(gate, builds.holds, bystanders, lane)

    settings.provenance["build_isolation"] = plan.describe()
    held = config.keep_problems  # 0: the lane's own default
    first = _lane_settings(settings, plan, 0)
    # the runners spawn the reference children of their baselines: with the lane's settings, so that
    # those children go where the lane's candidates go (the session's runners are the run's settings)
    mine = runners if first is settings else _runners(config, first, secret)
    room = Room()  # the machine's memory, claimed by every lane's pairs in flight (`kbv.room`)
    lanes = [LocalExecutor(first, mine, builds, quiet(settings.device, 0), lane=0, held=held, room=room)]
    for i, device in enumerate(devices[1:], start=1):
        lane = _lane_settings(replace(settings, device=device,
                                      provenance={**collect_provenance(device), **_run_record(settings)}), plan, i)
        if device_fingerprint(lane.provenance) != device_fingerprint(settings.provenance):
            builds.shutdown(wait=False)
            raise UsageError(f"--devices {config.devices}: {devices[0]} is a {settings.provenance.get('device_name')}, "
                             f"{device} a {lane.provenance.get('device_name')}; evaluate different models in separate runs.")
        lane.provenance["build_isolation"] = plan.describe()
        lanes.append(LocalExecutor(lane, _runners(config, lane, secret), builds, quiet(device, i), lane=i,
                                   held=held, room=room))
    return LanesExecutor(lanes, builds)


def _plan(config: EvalConfig, settings: Settings, lanes: int) -> CorePlan:
    return current_plan(config.build_isolation, lanes, settings.device_type)


def _lane_settings(settings: Settings, plan: CorePlan, lane: int) -> Settings:
    """A lane's settings: the children it times run on its children's CPUs, with as many OpenMP
    threads (they import torch on the build cores, where OpenMP would count those)."""
    return lane_settings(settings, plan, lane)


@dataclass(frozen=True)
class RunnerRecipe:
    """How a Ray worker makes this run's protocol runners: the config's rules, never its seed; the
    secret travels apart, as a task argument of its own (see `kbv.executors.ray`)."""

    config: EvalConfig

    def make(self, settings: Settings, secret: bytes) -> dict[str, ProtocolRunner]:
        return _runners(self.config, settings, secret)


def _directories(config: EvalConfig) -> tuple[tuple[str, Path], ...]:
    """(option, path) of the run's directory and the build cache, given or default."""
    return (("--run", Path(config.run_dir) if config.run_dir else Path("kbv-runs") / _slug(config.candidates)),
            ("--cache-dir", Path(config.cache_dir) if config.cache_dir else default_cache_dir()))


def _check_directories(config: EvalConfig) -> None:
    """--run and --cache-dir before anything is said (`check_directory`)."""
    for option, path in _directories(config):
        check_directory(option, path)


def check_directory(option: str, path: Path) -> None:
    """A directory an option names, where it or the nearest folder above it exists: a file in the way
    (or one that cannot be looked at) is a UsageError now. The directory itself is made when used."""
    try:
        if (path.exists() or path.is_symlink()) and not path.is_dir():
            raise UsageError(f"{option} {path}: exists and is not a directory.")
        above = next((p for p in path.absolute().parents if p.exists()), None)
    except OSError as exc:
        raise UsageError(f"{option} {path}: cannot be looked at: {exc.strerror or exc}") from exc
    if above is not None and not above.is_dir():
        raise UsageError(f"{option} {path}: cannot create the directory: {above} is not a directory.")


def _settings(config: EvalConfig, device: str, probe: dict[str, Any] | None = None, lanes: int = 1) -> Settings:
    (_, run_dir), (_, cache) = directories = _directories(config)
    # builds run here only for local lanes (under Ray, on the workers, one a task)
    device_type = "cuda" if device.startswith("cuda") else "cpu"
    jobs = config.jobs or auto_jobs(current_plan(config.build_isolation, lanes, device_type))
    for option, path in directories:
        check_directory(option, path)
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"{option} {path}: cannot create the directory: {exc.strerror or exc}") from exc
    # under Ray the device is a worker's: it described itself (`probe`); this machine may have no GPU
    arch = probe["cuda_arch_list"] if probe else cuda_arch_list(device)
    provenance = dict(probe["provenance"]) if probe else collect_provenance(device)
    mode = SandboxMode.parse(config.sandbox)
    # under Ray a worker's children are isolated as the worker can: it said how (`probe`)
    isolation = None if probe else resolve_isolation(mode, (run_dir.resolve(), cache.resolve()))
    if probe:
        check_strict(mode, probe["sandbox"])
    provenance.update(isolation.record() if isolation else probe["sandbox"])
    provenance["warm_clocks"] = config.warm_clocks
    return Settings(device=device, run_dir=run_dir.resolve(), cache_dir=cache.resolve(),
                    timeout_s=config.timeout_s, build_timeout_s=config.build_timeout_s, jobs=jobs,
                    prepare_timeout_s=config.prepare_timeout_s,
                    cuda_arch_list=arch, provenance=provenance, sandbox=mode.value, isolation=isolation,
                    pch=config.pch, build_isolation=config.build_isolation, warm_clocks=config.warm_clocks)


def _run_record(settings: Settings) -> dict[str, Any]:
    """What every lane's provenance shares with the first lane's beyond its own device: the sandbox
    and whether clocks are warmed."""
    return {k: settings.provenance[k] for k in ("sandbox", "sandbox_level", "warm_clocks") if k in settings.provenance}



BUILD_MEMORY_BYTES = 3 << 30  # the peak of one build with MAX_JOBS=1 (cicc on torch/extension.h: 3.1 GB)


def auto_jobs(plan: CorePlan) -> int:
    """Parallel builds by default: one per CPU set apart for builds, as far as memory holds them."""
    return max(1, min(plan.build_cpus, host_available_bytes() // BUILD_MEMORY_BYTES))


def _slug(path: str) -> str:
    name = Path(path.rstrip("/")).name or "run"
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name)


def _runners(config: EvalConfig, settings: Settings, secret: bytes) -> dict[str, Any]:
    """One runner per protocol, on `settings.device`."""
    from kbv.protocols.standard import StandardProtocol, StandardRunner
    from kbv.sandbox.timers import StandardTimerConfig

    standard = StandardProtocol(tolerance=config.tolerance, timer=StandardTimerConfig(method=config.standard_timing))
    runners: dict[str, Any] = {"standard": StandardRunner(standard, settings)}
    if "verified" in _protocols(config.protocol):
        runners["verified"] = _verified_runner(config, settings, secret)
    return runners


def _verified_runner(config: EvalConfig, settings: Settings, secret: bytes) -> Any:
    """The verified protocol's runner, of a `config` already checked (`check_config`)."""
    from kbv.protocols.verified.rules import VerifiedProtocol
    from kbv.protocols.verified.runner import VerifiedRunner
    from kbv.protocols.verified.timer import TimerConfig
    from kbv.stats import StopRule

    baselines = tuple(dict.fromkeys(config.baselines))
    primary = f"eager-{config.precision}"
    if primary not in baselines:
        baselines = (primary,) + baselines
    protocol = VerifiedProtocol(trials_per_distribution=config.trials, precision=config.precision,
                                min_custom_share=config.min_custom_share)
    timer = TimerConfig(stop=StopRule(target=config.ci_target, max_time_s=config.timer_budget_s))
    settings.provenance["verified_secret_sha256"] = hashlib.sha256(secret).hexdigest()[:16]
    if config.seed is not None:
        settings.provenance["verified_seed"] = config.seed
    return VerifiedRunner(protocol, timer, baselines, settings, secret, time_unattributed=config.time_unattributed)


def _jobs(pairs: tuple[Pair, ...], protocols: tuple[str, ...],
          session: RunSession) -> tuple[list[Job], list[str], list[str]]:
    """The jobs to run, the keys already stored (resumed), and every key in problem order."""
    done = session.store.keys()
    jobs, resumed, keys = [], [], []
    order = sorted(pairs, key=lambda p: p.problem.order)
    for pair in order:
        for protocol in protocols:
            job = session.job(pair, protocol)
            (resumed.append(job.key) if job.key in done else jobs.append(job))
            keys.append(job.key)
    return jobs, resumed, keys


def _run_jobs(jobs: list[Job], executor: Executor, store: Store, progress: ProgressFn | None,
              already: int, watch: WatchFn | None = None) -> tuple[int, dict[str, ProblemFailure], RunStats]:
    total = len(jobs) + already
    if progress:
        progress(already, total, None)
    clock = _RunClock()
    futures = {executor.submit(job): job for job in jobs}
    failures: dict[str, ProblemFailure] = {}
    stored = 0

    def idle() -> None:
        if watch is not None:
            watch(executor.state(), clock.since_verdict_s())

    # as they complete (several lanes, a cluster); results are joined to their job by key, never by order
    for done, fut in enumerate(_as_completed(list(futures), idle), start=already + 1):
        job = futures[fut]
        try:
            verdict = fut.result()
        except ProblemError as exc:
            problem = job.pair.problem
            failure = ProblemFailure(problem.key, str(exc), job.protocol, problem.hash)
            failures.setdefault(problem.key, failure)
            store.put_problem_failure(job.key, failure)
            if progress:
                progress(done, total, failure)
            continue
        store.put_verdict(job.key, verdict)
        stored += 1
        clock.verdict(verdict)
        if progress:
            progress(done, total, verdict)
    return stored, failures, clock.stats(executor)


class _RunClock:
    """The wall clock of a run's evaluations: first verdict, last verdict, the pairs' seconds."""

    def __init__(self) -> None:
        self.t0 = self.last = time.monotonic()
        self.first: float | None = None
        self.pairs = 0
        self.pair_s = 0.0
        self.longest_load: tuple[float, str] = (0.0, "")
        self.prepare_s = 0.0
        self.prepared: dict[tuple[str, str], int] = {}  # (problem, protocol) -> its preparation's reference calls

    def verdict(self, verdict: Verdict) -> None:
        self.last = time.monotonic()
        self.first = self.first if self.first is not None else self.last - self.t0
        self.pairs += 1
        self.pair_s += float(verdict.evidence.get("pair_s", verdict.wall_s) or 0.0)
        stages = verdict.evidence.get("stages_s") or {}
        load_s = float(stages.get("load", 0.0) or 0.0)
        if load_s > self.longest_load[0]:
            self.longest_load = (load_s, f"{verdict.problem} × {verdict.candidate}, {verdict.protocol}")
        self.prepare_s += float(stages.get("prepare", 0.0) or 0.0)
        prep = verdict.evidence.get("preparation")
        if isinstance(prep, dict) and isinstance(prep.get("calls"), int) and (verdict.problem, verdict.protocol) not in self.prepared:
            self.prepared[(verdict.problem, verdict.protocol)] = prep["calls"]

    def since_verdict_s(self) -> float:
        return time.monotonic() - self.last

    def stats(self, executor: Executor) -> RunStats:
        state = executor.state()
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        return RunStats(wall_s=round(self.last - self.t0, 3), first_verdict_s=self.first, pairs=self.pairs,
                        pair_s=round(self.pair_s, 3), lanes=max(1, executor.lanes), builds=state.builds_done,
                        builds_cached=state.builds_cached, build_cpu_s=state.build_cpu_s, cpus=cpus,
                        longest_load_s=round(self.longest_load[0], 3), longest_load=self.longest_load[1],
                        prepare_s=round(self.prepare_s, 3), prepared=len(self.prepared),
                        prepare_calls=sum(self.prepared.values()))


def _as_completed(futures: list[Future[Verdict]], idle: Callable[[], None] | None = None) -> Iterator[Future[Verdict]]:
    """`futures` as they complete; those done together in submission order. `idle` is called every
    WATCH_EVERY_S while none completes."""
    order = {fut: i for i, fut in enumerate(futures)}
    pending = set(futures)
    while pending:
        done, pending = wait(pending, timeout=WATCH_EVERY_S if idle else None, return_when=FIRST_COMPLETED)
        if not done and idle is not None:
            idle()
        yield from sorted(done, key=order.__getitem__)


def check_problems(spec: str, device: str = "auto", seed: int | None = None,
                   trials: int = 2, precision: str = "tf32") -> list[Any]:
    """`SoundnessReport` of every problem in `spec` (the battery of `kbv.soundness`), in order.
    A problem whose own code fails yields a report flagged with the failure."""
    import torch

    from kbv.detect.soundness import SoundnessReport, check_problem
    from kbv.protocols.verified.prepare import prepare_trials
    from kbv.protocols.verified.rules import VerifiedProtocol

    dev = torch.device(resolve_device(device))
    protocol = VerifiedProtocol(trials_per_distribution=max(2, trials), precision=precision)
    secret = seed.to_bytes(16, "big", signed=True) if seed is not None else os.urandom(32)
    reports = []
    for problem in load_problems(spec):
        try:
            prepared = prepare_trials(problem, protocol, dev, secret, sensitivity=True)
            reports.append(check_problem(prepared, protocol))
        except UnsoundProblemError as exc:  # runs, but no candidate can be judged
            reports.append(SoundnessReport(problem.key, {}, {}, (str(exc),)))
        except ProblemError as exc:
            reports.append(SoundnessReport(problem.key, {}, {}, (f"cannot run: {exc}",)))
        except Exception as exc:
            if not out_of_memory(exc):
                raise
            reports.append(SoundnessReport(problem.key, {}, {}, (f"too large for this device: {str(exc)[:160]}",)))
        finally:
            prepared = None
            if dev.type == "cuda":
                torch.cuda.empty_cache()
    return reports
