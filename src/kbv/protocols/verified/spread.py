"""The verified speedup and its interval: the ratio of the medians, the bootstrap's interval over the
calls, widened by what two alike processes differ by, which no resampling of one process's calls can
show (`process_spread`). Pure functions of the timer's figures (`kbv.protocols.verified.timer`)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from kbv.sandbox.timers import WindowCosts
from kbv.stats import bootstrap_ratio_ci, median

# What a bootstrap over one process's calls cannot see: two alike processes time the same call apart by
# an offset that holds for their whole lives (their launch paths, where their buffers sit). Measured on
# H100s, as standard deviations of one side's figure from process to process: alike reference children of
# L1/2_ReLU and L1/6_Softmax, every block at 1980 MHz, differed in their whole windows by 0.2-0.8 us on
# windows whose costs taken out were 31 us (docs/gpu/2026-12-07), and by up to 4 us where those costs
# were 48-53 us (2026-12-06-f, -g); L3/1_MLP's, whose calls hold a launch path of several ops that the
# device waits on (about 125 us of its 157 us windows), by 3-4 us, about 2.5% of their windows (18 us
# once, with one child 227 us against 166-199). 36 of KernelBench's identities, milliseconds long, came
# out 0.989-1.011 with 7 of 25 bootstrap intervals leaving 1.00 out; L3/1_MLP's verified identity came
# out 0.957 [0.934, 0.982] while the host's share was the window's costs alone (docs/gpu/2026-12-07-b).
PROCESS_SPREAD = 0.005  # of a side's median (device-bound calls)
PROCESS_SPREAD_HOST = 0.025  # of the host's share of a side's windows (`host_share`)
PROCESS_Z = 1.96  # the interval's level (95%), as the bootstrap's
MAX_LOG_WIDTH = 50.0  # an interval's end at most e^50 from its figure: never an overflow, whatever a side says


def host_share(costs: WindowCosts | None, launch_ms: Sequence[float], stream_ms: Sequence[float],
               whole_ms: Sequence[float]) -> float | None:
    """The host's share of one side's windows (ms): the window's costs taken out of every call, or,
    where the call's own launch path held the device longer than the quickest launch does, the
    synchronise's return and that launch path. Per call, the launch path is the host's time to the
    call's return (`launch_ms`), no more than the device spent in the call's stream (`stream_ms`):
    the median over calls. The share is never more than the side's median whole window
    (`whole_ms`), which the parent's wall clock bounds, so a child that reports more widens nothing
    further. The figure cannot tell the device waiting on the host from the host waiting on the
    device: a call that synchronises inside (an `.item()`) counts its stream as host time, a wider
    interval, never a narrower one. None without costs (a CPU: the host's share is the whole figure,
    which the processes' share of it covers). Pure."""
    if costs is None:
        return None
    total = costs.launch + costs.sync
    paths = [min(a, b) for a, b in zip(launch_ms, stream_ms) if math.isfinite(a) and math.isfinite(b)]
    windows = [w for w in whole_ms if math.isfinite(w)]
    if not paths or not windows:
        return total
    return max(total, min(costs.sync + median(paths), median(windows)))


def process_spread(median_ms: float, host_ms: float | None) -> float:
    """A side's figure's relative standard deviation from one alike process to another (see
    PROCESS_SPREAD): a share of the figure itself, and one of the host's share of its windows
    (`host_share`; None where none is known, as on a CPU), whose offset stays in what is left once the
    window's costs are taken out. Pure."""
    absolute = math.hypot(PROCESS_SPREAD * median_ms, PROCESS_SPREAD_HOST * (host_ms or 0.0))
    return absolute / max(median_ms, 1e-12)


def widen(speedup: float, ci: tuple[float, float], spread: float) -> tuple[float, float]:
    """The bootstrap interval `ci` around `speedup` with the processes' relative spread `spread` (a
    log-scale half-width) added to each side of it in quadrature; `ci` as it is where `speedup` is no
    positive figure (a ratio of subtraction artefacts never reaches here: `too_short_to_time`). Pure."""
    if not (math.isfinite(speedup) and speedup > 0 and math.isfinite(spread)):
        return ci
    lo, hi = ci
    down = math.hypot(max(math.log(speedup / lo), 0.0), spread) if lo > 0 else MAX_LOG_WIDTH
    up = math.hypot(max(math.log(hi / speedup), 0.0), spread) if hi > 0 else spread
    return speedup * math.exp(-min(down, MAX_LOG_WIDTH)), speedup * math.exp(min(up, MAX_LOG_WIDTH))


def process_note(host_ms: Mapping[str, float | None]) -> str:
    """What the speedup's interval holds besides the calls' own spread (for the timing notes), with
    each side's host share (`host_share`) where one is known."""
    known = {name: ms for name, ms in host_ms.items() if ms}
    shares = ", ".join(f"{name} {ms * 1e3:.1f} us" for name, ms in known.items())
    host = (f" and {PROCESS_SPREAD_HOST:.1%} of the host's share of its windows (the synchronise's return "
            f"and the call's launch path, at least the window's costs: {shares})" if known else "")
    return (f"the speedup's interval holds what alike processes differ by as well: {PROCESS_SPREAD:.1%} of each "
            f"side's time{host} (standard deviations, per side)")


def judge_speedups(candidate_ms: Sequence[float], baselines_ms: Mapping[str, Sequence[float]], charge: float,
                   too_short: set[str], host_ms: Mapping[str, float | None] | None = None,
                   ) -> tuple[dict[str, float], dict[str, tuple[float, float]]]:
    """Per baseline, median(baseline) / median(candidate) / `charge` and its interval, where both sides
    have samples and neither is in `too_short` (a ratio of what is left once the window's costs are
    taken out of calls shorter than their jitter is an artefact: 0, or huge). The interval is the
    bootstrap's over the calls, widened by what alike processes differ by (`process_spread` of each
    side; `host_ms` the host's share of each side's windows by name, "candidate" for the
    candidate's): the candidate and a baseline each live in one process, and an identity's bootstrap
    interval left 1.00 out by 7-12% on an H100. Pure."""
    speedups: dict[str, float] = {}
    cis: dict[str, tuple[float, float]] = {}
    if not candidate_ms or "candidate" in too_short:
        return speedups, cis
    host = host_ms or {}
    candidate = median(candidate_ms)
    for name, samples in baselines_ms.items():
        if not samples or name in too_short:
            continue
        baseline = median(samples)
        speedup = baseline / max(candidate, 1e-9) / charge
        speedups[name] = speedup
        lo, hi = bootstrap_ratio_ci(samples, candidate_ms)
        spread = PROCESS_Z * math.hypot(process_spread(candidate, host.get("candidate")),
                                        process_spread(baseline, host.get(name)))
        cis[name] = widen(speedup, (lo / charge, hi / charge), spread)
    return speedups, cis
