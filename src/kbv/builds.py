"""The build stage: import each compiled candidate once in a sandbox child on a CPU worker, so its
C++/CUDA extensions are built before evaluation, in parallel (`--jobs`, the `BuildPool`).

Build directories are keyed by a hash of the candidate's source and the toolchain, and shared across
runs: an unchanged candidate is not rebuilt. A marker file records a finished build. Each extension
the import builds (`load_inline`, `load` of sources it writes) is recorded there by what it compiles,
and so is a build that failed inside the candidate's own try: its evaluation children import the
one or raise the other again, and never compile (`kbv.sandbox.jit_cache`; ARCHITECTURE §15).

What a build costs, and what kbv does about it (ARCHITECTURE §13, `bench/builds.py`):
- its CPU-seconds (the child, ninja and the compilers) are measured and carried in `Build.cpu_s`;
- the bindings' file reuses torch's headers precompiled once per toolchain (`kbv.pch`); the kernels'
  file is compiled with the candidate's own flags, as KernelBench compiles it;
- the pool has one thread per CPU set apart for builds, and each build's ninja gets
  `MAX_JOBS` = those CPUs / the builds in flight, so that builds x jobs never exceed the cores;
- builds run on those CPUs at the lowest priority, or are held while a pair is timed
  (`kbv.placement`).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import re
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kbv.candidates import Backend, Candidate, compiles_when_constructed
from kbv.pch import installation_key
from kbv.placement import CorePlan, Holds, current_plan, enter_build_thread
from kbv.sandbox import ChildFailure, ChildSpec, Sandbox
from kbv.settings import Settings
from kbv.verdict import Status

if TYPE_CHECKING:
    from kbv.candidates import Pair
    from kbv.problems import Problem

_MARKER = "build.json"
CANDIDATE_FILE = "candidate.py"  # a candidate's source in its build directory, whatever the user named it
# that copy as tracebacks and compilers print it: by its path, or by its bare name
_BUILD_COPY_RE = re.compile(r"(?<![\w.-])(?:[^\s\"'()<>,]*/)?" + re.escape(CANDIDATE_FILE) + r"\b")
# An import that failed for one of these reasons on a GPU-less worker is retried by the evaluator.
_FINAL_MARKERS = ("Error building extension", "SyntaxError", "IndentationError", "CalledProcessError",
                  "defines no ModelNew", "NameError", "ModuleNotFoundError")


@dataclass(frozen=True)
class Build:
    """Where a candidate lives and whether it built. `status` None means ready to evaluate."""

    candidate_path: Path
    build_dir: Path
    status: Status | None = None
    message: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0
    cached: bool = False
    refused: tuple[str, ...] = ()  # what the build child was refused (its sandbox), as its output shows
    cpu_s: float = 0.0  # CPU-seconds of the build child, its ninja and compilers (as measured when built)


# builds asked for before kbv makes the shared precompiled headers: making them costs some four
# builds' CPU-seconds, once per toolchain, and saves about half of each later build's C++ side
PCH_MIN_BUILDS = 4


@dataclass(frozen=True)
class BuildOptions:
    """How the pool runs one build."""

    ninja_jobs: int = 0  # MAX_JOBS for the build's ninja (0: torch's default, one per core)
    holds: Holds | None = None  # stop the build while a pair is timed (hold mode)


def build_key(candidate: Candidate, settings: Settings) -> str:
    import torch

    # the compiler wrapper is part of the toolchain: ninja rebuilds a directory built without it; and
    # a build's ninja file names this installation's interpreter, torch and compiler script, so
    # another installation sharing the cache builds its own
    text = "\n".join([candidate.hash, torch.__version__, str(torch.version.cuda),
                      settings.device_type, settings.cuda_arch_list or "", installation_key()]
                     + (["pch"] if settings.pch else []))
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def prepare_candidate(candidate: Candidate, settings: Settings) -> Build:
    """The build directory with `candidate.py` written into it (no compilation)."""
    build_dir = settings.cache_dir / "builds" / build_key(candidate, settings)
    build_dir.mkdir(parents=True, exist_ok=True)
    path = build_dir / CANDIDATE_FILE
    if not path.exists() or path.read_text(encoding="utf-8") != candidate.code:
        path.write_text(candidate.code, encoding="utf-8")
    return Build(candidate_path=path, build_dir=build_dir)


def as_users_file(text: str, origin: str) -> str:
    """`text` (a message or traceback about a candidate) with its build copy, by path or bare name,
    replaced by `origin`, the file the user gave. Candidates with the same source share one build,
    so only the pair knows which file it was."""
    return _BUILD_COPY_RE.sub(lambda _: origin, text)


def needs_build(candidate: Candidate) -> bool:
    return candidate.backend in (Backend.CUDA, Backend.CPP)


def build_candidate(candidate: Candidate, settings: Settings, label: str,
                    options: BuildOptions = BuildOptions(), problem: Problem | None = None) -> Build:
    """Build `candidate` (or find it built). One that compiles in its constructor rather than at
    import (`compiles_when_constructed`) is also constructed, with `problem`'s init inputs where given.
    Never raises for a bad candidate."""
    prepared = prepare_candidate(candidate, settings)
    if not needs_build(candidate):
        return prepared
    marker = prepared.build_dir / _MARKER
    with open(prepared.build_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build of a key at a time, across runs too
        if marker.exists():
            return _from_marker(prepared, marker)
        clear_stale_batons(prepared.build_dir)
        construct = problem is not None and compiles_when_constructed(candidate.code)
        result = _run_build(prepared, settings, label, options, problem if construct else None)
        if result.status in (None, Status.COMPILE_ERROR):
            marker.write_text(json.dumps({"status": result.status.value if result.status else None,
                                          "message": result.message, "evidence": result.evidence,
                                          "wall_s": result.wall_s, "cpu_s": result.cpu_s,
                                          "refused": list(result.refused)}))
        return result


def clear_stale_batons(build_dir: Path) -> list[Path]:
    """Remove the lock files torch's extension builder leaves in `build_dir` when its build is killed
    (an interrupted run): a later build of the same candidate would wait on them until its
    `--build-timeout`. Called under the build directory's own lock, with no finished build there, so
    no process is building or loading anything in it. The files removed."""
    stale = sorted(build_dir.glob("torch_extensions/*/lock"))
    for path in stale:
        path.unlink(missing_ok=True)
    return stale


def _from_marker(prepared: Build, marker: Path) -> Build:
    data = json.loads(marker.read_text())
    status = Status(data["status"]) if data.get("status") else None
    return Build(prepared.candidate_path, prepared.build_dir, status, data.get("message", ""),
                 data.get("evidence", {}), data.get("wall_s", 0.0), cached=True, cpu_s=data.get("cpu_s", 0.0),
                 refused=tuple(data.get("refused", ())))


def _run_build(prepared: Build, settings: Settings, label: str, options: BuildOptions,
               construct: Problem | None = None) -> Build:
    env = settings.compile_env()
    if options.ninja_jobs:
        env["MAX_JOBS"] = str(options.ninja_jobs)
    spec = ChildSpec(work_dir=settings.work_dir(f"build-{label}"), build_dir=prepared.build_dir,
                     device="cpu", cuda_arch_list=settings.cuda_arch_list, isolation=settings.isolation,
                     hidden=settings.private_dirs, extra_env=tuple(sorted(env.items())))
    holds = options.holds
    t0 = time.monotonic()
    cpu_s: float | None = None
    sb = Sandbox(spec, label=label)
    try:
        with sb:
            assert sb.proc is not None
            if holds is not None:
                holds.add(sb.proc.pid)  # its own process group (and session): ninja and compilers too
            try:
                cmd: dict[str, Any] = {"op": "build", "path": str(prepared.candidate_path)}
                if construct is not None:  # its constructor compiles: the build constructs it too
                    cmd["construct"] = {"code": construct.code, "origin": construct.origin}
                sb.call(cmd, settings.build_timeout_s,
                        paused=holds.paused_s if holds is not None else None)
            finally:
                cpu_s = sb.cpu_seconds()
                if holds is not None:
                    holds.discard(sb.proc.pid)
    except ChildFailure as failure:
        wall = time.monotonic() - t0
        status = failure.status
        if status in (Status.COMPILE_ERROR, Status.RUNTIME_ERROR, Status.CUDA_ERROR):
            trace = failure.evidence.get("traceback", "") + failure.message
            if not any(m in trace for m in _FINAL_MARKERS):  # retry on the device
                return Build(prepared.candidate_path, prepared.build_dir, wall_s=wall, cpu_s=cpu_s or 0.0,
                             refused=tuple(sb.refused()))
            status = Status.COMPILE_ERROR
        return Build(prepared.candidate_path, prepared.build_dir, status,
                     f"build: {failure.message}", failure.evidence, wall, cpu_s=cpu_s or 0.0, refused=tuple(sb.refused()))
    return Build(prepared.candidate_path, prepared.build_dir, wall_s=time.monotonic() - t0, cpu_s=cpu_s or 0.0,
                 refused=tuple(sb.refused()))


# -- the pool -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class BuildState:
    """What the pool is doing, for a run that says what it waits on; and what it has done."""

    running: int = 0
    queued: int = 0
    oldest: str | None = None  # the candidate of the longest-running build
    oldest_s: float = 0.0
    done: int = 0  # built in this run
    cached: int = 0  # found built
    cpu_s: float = 0.0  # CPU-seconds of the builds done in this run
    wall_s: float = 0.0  # their wall seconds, summed


class BuildPool:
    """Builds of compiled candidates, `settings.jobs` at a time on CPU threads, each content hash
    built once (and cached on disk across runs). `plan` says where builds run (by default this
    machine's plan for one lane); its `holds` stop builds while a lane times, in hold mode."""

    def __init__(self, settings: Settings, plan: CorePlan | None = None) -> None:
        self.settings = settings
        self.plan = plan or current_plan(settings.build_isolation, 1, settings.device_type)
        self.holds = Holds(self.plan.holds)
        self._workers = max(1, settings.jobs)
        self._pool = ThreadPoolExecutor(max_workers=self._workers, thread_name_prefix="kbv-build",
                                        initializer=enter_build_thread, initargs=(self.plan,))
        self._futures: dict[str, Future[Build]] = {}
        self._lock = threading.Lock()
        self._queued: dict[str, str] = {}  # key -> candidate name, submitted and not started
        self._running: dict[str, tuple[str, float]] = {}  # key -> (candidate name, started)
        self._done = self._cached = 0
        self._cpu_s = self._wall_s = 0.0

    def start(self, pair: Pair) -> Future[Build]:
        return self.build(pair.candidate, pair.problem)

    def build(self, cand: Candidate, problem: Problem | None = None) -> Future[Build]:
        """The candidate's build (started now, or the one started before for the same content hash);
        `problem`, the one it is paired with, for a candidate that compiles when constructed."""
        if cand.no_code or not needs_build(cand):
            done: Future[Build] = Future()
            done.set_result(prepare_candidate(cand, self.settings) if not cand.no_code else None)  # type: ignore[arg-type]
            return done
        key = build_key(cand, self.settings)
        with self._lock:
            if key not in self._futures:
                if self.settings.pch and len(self._futures) + 1 == PCH_MIN_BUILDS:
                    self._pool.submit(self._warm_headers)
                self._queued[key] = cand.name
                self._futures[key] = self._pool.submit(self._build, cand, key, problem)
            return self._futures[key]

    def _warm_headers(self) -> None:
        """The shared precompiled headers, made by kbv itself (`kbv.pch.warm`) once enough builds are
        asked for to repay them; builds that start before they are made compile without."""
        from kbv.pch import warm

        if not any((d / "ok").exists() for d in (self.settings.cache_dir / "pch").glob("*")):
            warm(self.settings.cache_dir, self.settings.cuda_arch_list, self.settings.build_timeout_s)

    def _build(self, cand: Candidate, key: str, problem: Problem | None) -> Build:
        with self._lock:
            self._queued.pop(key, None)
            self._running[key] = (cand.name, time.monotonic())
            jobs = self._ninja_jobs()
        try:
            build = build_candidate(cand, self.settings, key[:12], BuildOptions(jobs, self.holds), problem)
        finally:
            with self._lock:
                self._running.pop(key, None)
        with self._lock:
            if build.cached:
                self._cached += 1
            else:
                self._done += 1
                self._cpu_s += build.cpu_s
                self._wall_s += build.wall_s
        return build

    def _ninja_jobs(self) -> int:
        """A build's share of the build CPUs: the CPUs over the builds in flight (this one counted),
        at most 4 (a load_inline build has two files to compile)."""
        in_flight = min(self._workers, len(self._running) + len(self._queued))
        return max(1, min(4, self.plan.build_cpus // max(1, in_flight)))

    def state(self) -> BuildState:
        now = time.monotonic()
        with self._lock:
            oldest = min(self._running.values(), key=lambda r: r[1], default=None)
            return BuildState(len(self._running), len(self._queued), oldest[0] if oldest else None,
                              now - oldest[1] if oldest else 0.0, self._done, self._cached,
                              round(self._cpu_s, 2), round(self._wall_s, 2))

    def progress_of(self, pair: Pair) -> str | None:
        """Where the pair's build is ("running 40 s", "queued behind 3", "done"); None without one."""
        if pair.candidate.no_code or not needs_build(pair.candidate):
            return None
        key = build_key(pair.candidate, self.settings)
        with self._lock:
            if key in self._running:
                return f"running {time.monotonic() - self._running[key][1]:.0f} s"
            if key in self._queued:
                ahead = list(self._queued).index(key)
                return f"queued behind {ahead}" if ahead else "queued, next to start"
            return "done" if key in self._futures else None

    def shutdown(self, wait: bool) -> None:
        self._pool.shutdown(wait=wait, cancel_futures=True)
