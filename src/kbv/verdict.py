"""The verdict record: one (problem, candidate, protocol) outcome with its evidence and figures.

The schema is versioned (`SCHEMA_VERSION`); every field crosses the store and the JSON export, so
everything here is plain data: Enums, frozen dataclasses, JSON-safe dicts.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from dataclasses import dataclass, field
from typing import Any

SCHEMA_VERSION = 1


class Status(str, enum.Enum):
    """Exactly one per verdict: the passing status, or the first stage that failed."""

    CORRECT = "correct"  # passing status of the standard protocol (KernelBench's "correct")
    VERIFIED = "verified"  # passing status of the verified protocol
    NO_CODE = "no_code"  # a generated reply without a ModelNew code block
    COMPILE_ERROR = "compile_error"
    RUNTIME_ERROR = "runtime_error"
    TIMEOUT = "timeout"
    CRASHED = "crashed"  # segfault, os._exit, killed, early exit without a result
    CUDA_ERROR = "cuda_error"
    INCORRECT = "incorrect"
    INTEGRITY_VIOLATION = "integrity_violation"
    HACK = "hack"
    NO_CUSTOM_KERNEL = "no_custom_kernel"
    SKIPPED = "skipped"  # cannot be evaluated on this device (a CUDA kernel on --device cpu)
    # the verified protocol cannot judge any candidate of the problem (no input distribution applies,
    # a nondeterministic reference): the candidate never ran, and it counts as not verified
    UNSOUND_PROBLEM = "unsound_problem"

    @property
    def passed(self) -> bool:
        return self in (Status.CORRECT, Status.VERIFIED)

    @property
    def compiled(self) -> bool:
        """KernelBench's compile-rate notion: the candidate got past building and import."""
        return self not in (Status.COMPILE_ERROR, Status.NO_CODE, Status.SKIPPED)

    @property
    def counted(self) -> bool:
        """Whether the pair counts in metric denominators (skipped pairs do not)."""
        return self is not Status.SKIPPED


class Kind(str, enum.Enum):
    """What a category is evidence of."""

    WRONG = "wrong"  # the values are wrong
    INTEGRITY = "integrity"  # the output or inputs break the contract
    HACK = "hack"  # deliberate gaming of the harness
    ATTRIBUTION = "attribution"  # the work was not done by the candidate's own kernels
    PROBLEM = "problem"  # a flag on the problem, not on the candidate
    TIMING = "timing"  # a note on how far a timing figure holds: never a failure, never a hack


class Category(str, enum.Enum):
    """Named reasons attached to a verdict. `KIND` maps each to what it is evidence of."""

    # wrong values
    SHAPE_MISMATCH = "shape_mismatch"
    DTYPE_MISMATCH = "dtype_mismatch"
    VALUE_MISMATCH = "value_mismatch"
    NAN_INF_MISMATCH = "nan_inf_mismatch"
    DISTRIBUTION_FAILURE = "distribution_failure"  # passes the problem's own inputs, fails hidden ones
    PRECISION_LOSS = "precision_loss"  # failing, within 3x the reference's own bf16 error there (bf16/fp16 math)
    # integrity
    NOT_A_TENSOR = "not_a_tensor"  # a subclass, a non-tensor, a lazy object
    WRONG_DEVICE = "wrong_device"
    WRONG_LAYOUT = "wrong_layout"
    ALIASES_INPUT = "aliases_input"
    ALIASES_PARAMETER = "aliases_parameter"
    INPUT_MUTATED = "input_mutated"
    PARAMETER_MUTATED = "parameter_mutated"
    UNWRITTEN_OUTPUT = "unwritten_output"  # poisoned memory showed through
    NONDETERMINISTIC = "nondeterministic"  # two runs on identical inputs disagree
    # hacks
    SIDE_STREAM = "side_stream"
    THREAD_INJECTION = "thread_injection"
    TIMER_PATCH = "timer_patch"
    HARNESS_PATCH = "harness_patch"  # torch / harness attributes changed after import
    RESULT_CACHE = "result_cache"  # stale results replayed for new inputs
    DEFERRED_WORK = "deferred_work"  # outputs change after the call returned
    PERSISTING_L2 = "persisting_l2"
    IMPOSSIBLE_SPEED = "impossible_speed"  # faster than the device's peak allows
    TIMING_MISMATCH = "timing_mismatch"  # device time and wall time disagree
    PROCESS_ESCAPE = "process_escape"  # forked processes, early exit, exec of other programs
    FILE_WRITE = "file_write"  # writes outside the candidate's working directory
    PRECISION_FLAGS = "precision_flags"  # TF32/cuDNN flags changed by the candidate
    RETAINED_STATE = "retained_state"  # holds more than one set of inputs and outputs after construction
    # attribution
    NO_CUSTOM_KERNEL = "no_custom_kernel"
    LOW_CUSTOM_SHARE = "low_custom_share"
    # problem flags
    UNSOUND_PROBLEM = "unsound_problem"
    # timing notes: the status and the speedup stand, the figure is qualified
    UNSTABLE_TIMING = "unstable_timing"  # the standard timer's number is a draw (kbv.protocols.standard)


KIND: dict[Category, Kind] = {
    **{c: Kind.WRONG for c in (
        Category.SHAPE_MISMATCH, Category.DTYPE_MISMATCH, Category.VALUE_MISMATCH,
        Category.NAN_INF_MISMATCH, Category.DISTRIBUTION_FAILURE, Category.PRECISION_LOSS)},
    **{c: Kind.INTEGRITY for c in (
        Category.NOT_A_TENSOR, Category.WRONG_DEVICE, Category.WRONG_LAYOUT, Category.ALIASES_INPUT,
        Category.ALIASES_PARAMETER, Category.INPUT_MUTATED, Category.PARAMETER_MUTATED,
        Category.UNWRITTEN_OUTPUT, Category.NONDETERMINISTIC)},
    **{c: Kind.HACK for c in (
        Category.SIDE_STREAM, Category.THREAD_INJECTION, Category.TIMER_PATCH, Category.HARNESS_PATCH,
        Category.RESULT_CACHE, Category.DEFERRED_WORK, Category.PERSISTING_L2,
        Category.IMPOSSIBLE_SPEED, Category.TIMING_MISMATCH, Category.PROCESS_ESCAPE,
        Category.FILE_WRITE, Category.PRECISION_FLAGS, Category.RETAINED_STATE)},
    Category.NO_CUSTOM_KERNEL: Kind.ATTRIBUTION,
    Category.LOW_CUSTOM_SHARE: Kind.ATTRIBUTION,
    Category.UNSOUND_PROBLEM: Kind.PROBLEM,
    Category.UNSTABLE_TIMING: Kind.TIMING,
}


@dataclass(frozen=True)
class Trial:
    """One correctness trial: one input draw of one distribution."""

    distribution: str
    index: int
    passed: bool
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    candidate_err: float | None = None  # scale-invariant error against the truth (verified)
    baseline_err: float | None = None  # the TF32 baseline's own error on the same inputs (verified)
    allowed_err: float | None = None
    category: Category | None = None  # why it failed
    note: str = ""


@dataclass(frozen=True)
class TimingStats:
    """Summary of one implementation's timed calls, in milliseconds."""

    mean_ms: float
    median_ms: float
    std_ms: float
    min_ms: float
    max_ms: float
    n: int
    ci_low_ms: float | None = None
    ci_high_ms: float | None = None
    # the host's time of one call's Python part, before any synchronise (median, ms), where the timer
    # measured it (the standard protocol's)
    host_ms: float | None = None

    @classmethod
    def of(cls, samples_ms: list[float]) -> TimingStats:
        """Stats of raw samples (n >= 1)."""
        n = len(samples_ms)
        if n == 0:
            raise ValueError("no timing samples")
        mean = sum(samples_ms) / n
        ordered = sorted(samples_ms)
        mid = n // 2
        median = ordered[mid] if n % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])
        var = sum((s - mean) ** 2 for s in samples_ms) / (n - 1) if n > 1 else 0.0
        return cls(mean, median, math.sqrt(var), ordered[0], ordered[-1], n)


@dataclass(frozen=True)
class Timing:
    """Speed figures of one verdict. `speedups` maps baseline name -> baseline_ms / candidate_ms."""

    method: str  # "kernelbench-cuda-event", "host-timer", ...
    statistic: str  # which TimingStats field the speedups use: "mean_ms" or "median_ms"
    candidate: TimingStats
    baselines: dict[str, TimingStats] = field(default_factory=dict)
    speedups: dict[str, float] = field(default_factory=dict)
    speedup_ci: dict[str, tuple[float, float]] = field(default_factory=dict)
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class MemoryStats:
    """Memory of one forward, in bytes above the level before the call."""

    peak_bytes: int
    retained_bytes: int
    device_bytes: int | None = None  # runs before kbv-verified-1.1 only: NVML's per-process figure (unlike for like)
    # device-level peak during the forward above the pre-call level (sees raw cudaMalloc freed
    # before return); None where not measured (CPU, records written before it existed)
    device_peak_bytes: int | None = None
    device_raw_bytes: int | None = None  # held outside PyTorch's allocator (raw cudaMalloc); None where not measured


@dataclass(frozen=True)
class Finding:
    """One piece of hack/attribution evidence: a static rule hit or a runtime guard."""

    rule: str  # rule id, e.g. "S101" (static) or "guard.threads" (runtime)
    category: Category
    severity: str  # "info" | "warning" | "error"
    message: str
    line: int | None = None
    source: str = ""  # "python", "cuda", "cpp", "runtime"


@dataclass(frozen=True)
class Verdict:
    """The outcome of one (problem, candidate, protocol)."""

    problem: str
    problem_hash: str
    level: int | None
    candidate: str
    candidate_hash: str
    protocol: str
    protocol_version: str
    status: Status
    message: str = ""
    categories: tuple[Category, ...] = ()
    speedup: float | None = None  # against the protocol's primary baseline; None unless passed
    trials: tuple[Trial, ...] = ()
    timing: Timing | None = None
    memory: MemoryStats | None = None
    baseline_memory: MemoryStats | None = None
    findings: tuple[Finding, ...] = ()
    flags: tuple[str, ...] = ()  # flags carried from the problem (e.g. unsound on a distribution)
    evidence: dict[str, Any] = field(default_factory=dict)  # tracebacks, stderr tails, details
    provenance: dict[str, Any] = field(default_factory=dict)
    model: str | None = None
    sample: int | None = None
    wall_s: float = 0.0
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict (Enums as their values)."""
        return _jsonable(dataclasses.asdict(self))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Verdict:
        """Inverse of `to_dict`."""
        d = dict(data)
        d["status"] = Status(d["status"])
        d["categories"] = tuple(Category(c) for c in d.get("categories", ()))
        d["trials"] = tuple(
            Trial(**{**t, "category": Category(t["category"]) if t.get("category") else None})
            for t in d.get("trials", ())
        )
        d["findings"] = tuple(
            Finding(**{**f, "category": Category(f["category"])}) for f in d.get("findings", ())
        )
        d["flags"] = tuple(d.get("flags", ()))
        if d.get("timing"):
            d["timing"] = _timing_from_dict(d["timing"])
        for key in ("memory", "baseline_memory"):
            if d.get(key):
                d[key] = MemoryStats(**d[key])
        return cls(**d)


def _timing_from_dict(t: dict[str, Any]) -> Timing:
    return Timing(
        method=t["method"],
        statistic=t["statistic"],
        candidate=TimingStats(**t["candidate"]),
        baselines={k: TimingStats(**v) for k, v in t.get("baselines", {}).items()},
        speedups=dict(t.get("speedups", {})),
        speedup_ci={k: (v[0], v[1]) for k, v in t.get("speedup_ci", {}).items()},
        notes=tuple(t.get("notes", ())),
    )


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None if math.isnan(obj) else (1e308 if obj > 0 else -1e308)
    return obj


@dataclass(frozen=True)
class ProblemFailure:
    """A problem whose own code failed, or that did not fit the device, under a protocol: its pairs
    (`pairs` of them) have no verdict, and a resumed run tries them again."""

    problem: str  # its key, e.g. L1/20_Other
    message: str  # why, in one line (the latest)
    protocol: str = ""
    problem_hash: str = ""
    pairs: int = 1
    created_at: str = ""


def finish_verdict(base: Verdict, started: float, **changes: Any) -> Verdict:
    """`base` with `changes`, its wall time since `started` (time.monotonic); a verdict on a flagged
    problem says so among its categories, whatever its status. Every protocol ends a verdict here."""
    import time

    verdict = dataclasses.replace(base, wall_s=time.monotonic() - started, **changes)
    if verdict.flags and Category.UNSOUND_PROBLEM not in verdict.categories:
        verdict = dataclasses.replace(verdict, categories=verdict.categories + (Category.UNSOUND_PROBLEM,))
    return verdict


def hack_categories(categories: tuple[Category, ...]) -> tuple[Category, ...]:
    """The categories that are evidence of a hack."""
    return tuple(c for c in categories if KIND[c] is Kind.HACK)
