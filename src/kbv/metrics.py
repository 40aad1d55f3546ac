"""Run metrics: pure functions of verdicts.

- compile rate and correct rate over all counted pairs (skipped pairs are not counted);
- fast_p (KernelBench's definition): the share of ALL counted pairs that passed AND whose speedup is
  strictly greater than p; so fast_0 equals the correct rate;
- geometric-mean speedup over passed pairs with a speedup, computed in log space (failures are
  excluded, as in KernelBench; the count it averages over is reported beside it);
- pass@k per problem with the unbiased estimator, where a problem has several samples;
- the share of passed pairs that raise peak memory: by the allocator's peak or the device-level one,
  whichever ratio to the baseline's is larger (`peak_ratios` gives both to reports);
- the pairs that pass the standard protocol and fail the verified one, by verified status.

A pair is one (problem, candidate, model, sample); it is evaluated under a protocol unless skipped
there (a backend the device cannot run). Every count of pairs (`Metrics.pairs`, the leaderboard's,
`Rejections.pairs`) counts evaluated pairs only, as KernelBench's fast_p counts every evaluated pair.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from kbv.verdict import KIND, Kind, MemoryStats, Verdict

FAST_P = (0.0, 0.5, 0.8, 1.0, 1.5, 2.0)


@dataclass(frozen=True)
class Metrics:
    pairs: int  # counted pairs (skipped ones excluded)
    skipped: int
    compiled: int
    passed: int
    compile_rate: float
    correct_rate: float
    fast_p: dict[str, float]
    geomean_speedup: float | None
    speedups_counted: int
    statuses: dict[str, int] = field(default_factory=dict)
    hacks: dict[str, int] = field(default_factory=dict)  # hack category -> number of verdicts
    memory_raising_share: float | None = None  # passed pairs whose peak (allocator or device) exceeds the baseline's


def compute_metrics(verdicts: Sequence[Verdict]) -> Metrics:
    counted = [v for v in verdicts if v.status.counted]
    n = len(counted)
    passed = [v for v in counted if v.status.passed]
    speedups = [v.speedup for v in passed if v.speedup is not None and v.speedup > 0]
    fast = {_p_label(p): (sum(1 for s in speedups if s > p) / n if n else 0.0) for p in FAST_P}
    return Metrics(
        pairs=n,
        skipped=len(verdicts) - n,
        compiled=sum(1 for v in counted if v.status.compiled),
        passed=len(passed),
        compile_rate=_ratio(sum(1 for v in counted if v.status.compiled), n),
        correct_rate=_ratio(len(passed), n),
        fast_p=fast,
        geomean_speedup=geometric_mean(speedups),
        speedups_counted=len(speedups),
        statuses=dict(Counter(v.status.value for v in verdicts)),
        hacks=dict(Counter(c.value for v in verdicts for c in v.categories if KIND[c] is Kind.HACK)),
        memory_raising_share=_memory_raising_share(passed),
    )


@dataclass(frozen=True)
class Rejections:
    """Pairs evaluated under both protocols that pass the standard one and fail the verified one."""

    pairs: int  # pairs evaluated (not skipped) under both protocols
    rejected: int
    by_status: dict[str, int]  # the verified status of each rejected pair -> pairs, most first

    def describe(self) -> str:
        """`Standard passes, verified rejects: 4 of 8 pairs (hack 1, incorrect 1, ...)`."""
        return f"Standard passes, verified rejects: {self.brief()}"

    def brief(self) -> str:
        """`4 of 8 pairs (hack 1, incorrect 1, ...)`: how many, of how many, and the verified statuses."""
        statuses = ", ".join(f"{status} {n}" for status, n in self.by_status.items())
        return f"{self.rejected} of {self.pairs} pair{'s' * (self.pairs != 1)}" + (f" ({statuses})" if statuses else "")


PairKey = tuple[str, str, str, str | None, int | None]  # problem, candidate, its hash, model, sample


def pair_key(v: Verdict) -> PairKey:
    """The pair a verdict judges, whatever the protocol."""
    return (v.problem, v.candidate, v.candidate_hash, v.model, v.sample)


def evaluated_pairs(verdicts: Iterable[Verdict]) -> int:
    """Pairs with a verdict that is not skipped, under any protocol."""
    return len({pair_key(v) for v in verdicts if v.status.counted})


def standard_passes_verified_rejects(verdicts: Iterable[Verdict]) -> Rejections | None:
    """Of the pairs evaluated under both protocols, those correct under standard and not verified,
    counted by their verified status; None where no pair was evaluated under both."""
    by_pair: dict[PairKey, dict[str, Verdict]] = defaultdict(dict)
    for v in verdicts:
        if v.status.counted:
            by_pair[pair_key(v)][v.protocol] = v
    both = [p for p in by_pair.values() if "standard" in p and "verified" in p]
    if not both:
        return None
    rejected = [p["verified"].status.value for p in both
                if p["standard"].status.passed and not p["verified"].status.passed]
    counts = sorted(Counter(rejected).items(), key=lambda kv: (-kv[1], kv[0]))
    return Rejections(pairs=len(both), rejected=len(rejected), by_status=dict(counts))


def metrics_by_group(verdicts: Sequence[Verdict]) -> dict[str, dict[str, Metrics]]:
    """{protocol: {"all": Metrics, "L1": Metrics, ...}}."""
    out: dict[str, dict[str, Metrics]] = {}
    by_protocol: dict[str, list[Verdict]] = defaultdict(list)
    for v in verdicts:
        by_protocol[v.protocol].append(v)
    for protocol, group in by_protocol.items():
        levels: dict[str, list[Verdict]] = defaultdict(list)
        for v in group:
            levels[f"L{v.level}" if v.level is not None else "L?"].append(v)
        out[protocol] = {"all": compute_metrics(group)}
        out[protocol].update({k: compute_metrics(levels[k]) for k in sorted(levels)})
    return out


def geometric_mean(values: Iterable[float]) -> float | None:
    """exp(mean(log x)) over positive finite values; None for none."""
    logs = [math.log(x) for x in values if x > 0 and math.isfinite(x)]
    return math.exp(sum(logs) / len(logs)) if logs else None


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k: 1 - C(n-c, k) / C(n, k), in the numerically stable product form."""
    if k <= 0 or n <= 0:
        raise ValueError("pass@k needs n >= 1 and k >= 1")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def pass_at_k_by_model(verdicts: Sequence[Verdict], ks: Sequence[int] = (1, 5, 10)) -> dict[str, dict[str, float]]:
    """{protocol/model: {"pass@k": mean over problems}} for models with several samples a problem."""
    groups: dict[tuple[str, str], dict[str, list[bool]]] = defaultdict(lambda: defaultdict(list))
    for v in verdicts:
        if v.status.counted and v.model is not None:
            groups[(v.protocol, v.model)][v.problem].append(v.status.passed)
    out: dict[str, dict[str, float]] = {}
    for (protocol, model), problems in sorted(groups.items()):
        n_min = min(len(s) for s in problems.values())
        if n_min < 2:
            continue
        row = {}
        for k in ks:
            if k <= n_min:
                vals = [pass_at_k(len(s), sum(s), k) for s in problems.values()]
                row[f"pass@{k}"] = sum(vals) / len(vals)
        out[f"{protocol}/{model}"] = row
    return out


RAISES_RATIO = 1.1  # a peak more than 10% ...
RAISES_SLACK_BYTES = 1 << 20  # ... and 1 MiB above the baseline's raises peak memory


def peak_ratios(memory: MemoryStats | None, baseline_memory: MemoryStats | None) -> dict[str, float | None]:
    """{"peak_ratio": the allocator's peak over the baseline's, "device_peak_ratio": the device-level peak
    over the baseline's}. None where either side lacks the figure (CPU, older records, -1 for not
    measured) or the baseline's is zero while the candidate's is not; 1.0 when both are zero."""
    if memory is None or baseline_memory is None:
        return {"peak_ratio": None, "device_peak_ratio": None}
    return {"peak_ratio": _peak_ratio(memory.peak_bytes, baseline_memory.peak_bytes),
            "device_peak_ratio": _peak_ratio(memory.device_peak_bytes, baseline_memory.device_peak_bytes)}


def raises_peak_memory(memory: MemoryStats, baseline_memory: MemoryStats) -> bool:
    """Whether the candidate's peak exceeds the baseline's by more than 10% and 1 MiB, by the allocator's
    figure or by the device-level one where both sides have it: the larger of the two ratios decides, so
    a workspace taken with raw cudaMalloc (invisible to the allocator) raises peak memory too."""
    pairs = [(memory.peak_bytes, baseline_memory.peak_bytes),
             (memory.device_peak_bytes, baseline_memory.device_peak_bytes)]
    return any(c is not None and b is not None and c >= 0 and b >= 0 and c > b * RAISES_RATIO + RAISES_SLACK_BYTES
               for c, b in pairs)


def _peak_ratio(candidate: int | None, baseline: int | None) -> float | None:
    if candidate is None or baseline is None or candidate < 0 or baseline < 0:
        return None
    if baseline == 0:
        return 1.0 if candidate == 0 else None
    return candidate / baseline


def _memory_raising_share(passed: Sequence[Verdict]) -> float | None:
    measured = [v for v in passed if v.memory is not None and v.baseline_memory is not None]
    if not measured:
        return None
    raising = [v for v in measured if raises_peak_memory(v.memory, v.baseline_memory)]
    return len(raising) / len(measured)


def _ratio(a: int, b: int) -> float:
    return a / b if b else 0.0


def _p_label(p: float) -> str:
    return f"fast_{p:g}"
