"""The GPU's clocks before a timed window (parent side, on the pair's device).

An idle H200 sits at 345 MHz. Under load its SM clock climbs to about 1980 MHz within a fraction of a
second, and falls again when the device idles. A launch-bound pair leaves the device idle most of the
time, so whatever clock the device happened to be at became part of its number; and the standard
timer's race (the forward's host path against the L2 flush's device time) moves with the clock that
the flush runs at. The same pair gave numbers up to 4x apart from run to run.

Before every timed window, `warm_clocks` keeps the device busy with work of its own (matrix products
on two buffers it makes and frees) until NVML reads the SM clock at `STEADY_FRACTION` of its maximum,
or steady over `STEADY_SPAN_MS` once DVFS has had `SETTLE_MS` to act (a power or thermal cap
below the maximum), and never longer than `max_ms`. Without NVML (nvidia-ml-py) it keeps the device
busy for `FALLBACK_MS` and says that the clocks were not read. On a CPU it does nothing.

It changes no setting of the device (clocks are never locked: the machine is not ours to configure);
it only makes every timed window start from the same state.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import torch

from kbv.provenance import nvml_session

if TYPE_CHECKING:
    from kbv.settings import Settings

STEADY_FRACTION = 0.9  # of the maximum SM clock: boosted
STEADY_SPAN_MS = 50.0  # readings over this long within STEADY_SPREAD of each other: settled below the maximum
STEADY_READS = 4  # at least this many in the span
STEADY_SPREAD = 0.02
SETTLE_MS = 100.0  # before which a steady reading is the idle clock, not a settled one
MAX_MS = 600.0  # the most a warm-up may take
FALLBACK_MS = 150.0  # busy time when the clocks cannot be read
BUSY_N = 2048  # the busy work's matrices (2 x 16 MiB of float32)
BUSY_CALLS = 4  # products between two readings


@dataclass(frozen=True)
class ClockWarmup:
    """What one warm-up did: the SM clock read before and after (MHz; None where NVML is missing),
    the clock the device boosts to (its maximum, or a lower application clock), and how long the
    device was kept busy (ms)."""

    sm_mhz_before: int | None
    sm_mhz: int | None
    max_mhz: int | None
    warmed_ms: float

    def describe(self) -> str:
        if self.sm_mhz is None:
            return f"device kept busy {self.warmed_ms:.0f} ms before timing (its clocks could not be read)"
        top = f" of {self.max_mhz}" if self.max_mhz else ""
        return (f"device clocks warmed before timing: SM {self.sm_mhz_before} -> {self.sm_mhz} MHz{top} "
                f"in {self.warmed_ms:.0f} ms")

    def evidence(self) -> dict[str, Any]:
        return {k: (round(v, 1) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def clocks_settled(readings: Sequence[tuple[float, int]], max_mhz: int | None) -> bool:
    """Whether a warm-up that has read `readings` ((ms of load so far, SM clock MHz), oldest first)
    may stop: the last reading is boosted (at least STEADY_FRACTION of `max_mhz`), or, once SETTLE_MS
    of load have passed, every reading of the last STEADY_SPAN_MS (at least STEADY_READS of them)
    agrees within STEADY_SPREAD: the device holds a lower clock under load, as a power or thermal cap
    makes it. A span, not a count: a clock that climbs in steps holds each step for a few readings."""
    if not readings:
        return False
    now, last = readings[-1]
    if max_mhz and last >= STEADY_FRACTION * max_mhz:
        return True
    if now < SETTLE_MS or readings[0][0] > now - STEADY_SPAN_MS:
        return False
    span = [mhz for t, mhz in readings if t >= now - STEADY_SPAN_MS]
    return len(span) >= STEADY_READS and max(span) - min(span) <= STEADY_SPREAD * max(span)


def warm_before_timing(settings: Settings) -> ClockWarmup | None:
    """`warm_clocks` on the run's device where the run warms clocks (`--warm-clocks`, the default)."""
    return warm_clocks(settings.device) if settings.warm_clocks else None


def warm_clocks(device: str, max_ms: float = MAX_MS) -> ClockWarmup | None:
    """Keep CUDA `device` busy until its SM clock is boosted or settled (see module docstring), at most
    `max_ms`; None on a CPU, or where the device has no room for the busy work. Reading the clocks is
    best effort: any NVML failure falls back to a fixed busy time."""
    if not device.startswith("cuda"):
        return None
    dev = torch.device(device)
    buffers: list[torch.Tensor] = []

    def busy() -> None:
        if not buffers:
            buffers.extend((torch.ones((BUSY_N, BUSY_N), device=dev), torch.empty((BUSY_N, BUSY_N), device=dev)))
        a, b = buffers
        for _ in range(BUSY_CALLS):
            torch.mm(a, a, out=b)
        torch.cuda.synchronize(dev)

    try:
        with contextlib.ExitStack() as stack:
            return keep_busy(busy, sm_reader(device, stack), max_ms)
    except torch.OutOfMemoryError:  # a problem that fills the device (buffers, cuBLAS's workspace): as it is
        return None
    finally:  # nothing of the warm-up stays cached in this process while a child times on the device
        buffers.clear()
        torch.cuda.empty_cache()


def sm_reader(device: str, stack: contextlib.ExitStack) -> Callable[[], tuple[int, int]] | None:
    """A function returning (SM clock, the clock it boosts to) in MHz for `device`, or None without
    NVML. The boost target is the maximum SM clock, or the application clock where one is set lower
    (the device then boosts to that, and no warm-up would reach the maximum)."""
    try:
        pynvml, handle = stack.enter_context(nvml_session(device))
        top = int(pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM))
        int(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM))  # readable at all
    except Exception:  # nvidia-ml-py missing, or NVML refused: not known
        return None
    with contextlib.suppress(Exception):
        applied = int(pynvml.nvmlDeviceGetApplicationsClock(handle, pynvml.NVML_CLOCK_SM))
        top = applied if 0 < applied < top else top
    return lambda: (int(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)), top)


def keep_busy(busy: Callable[[], None], read: Callable[[], tuple[int, int]] | None, max_ms: float) -> ClockWarmup:
    """Run `busy` (a burst of device work that returns when it is done) until `read` (the SM clock and
    its maximum, MHz) says the clocks have settled, or `max_ms` (FALLBACK_MS without `read`) has passed."""
    t0 = time.perf_counter()
    before, top = _read(read) or (None, None)
    if before is None:
        read = None
    limit = max_ms if read is not None else min(FALLBACK_MS, max_ms)
    readings: list[tuple[float, int]] = []
    while True:
        busy()
        elapsed = (time.perf_counter() - t0) * 1e3
        now = _read(read)
        if now is not None:
            readings.append((elapsed, now[0]))
            if clocks_settled(readings, top):
                break
        elif read is not None:  # NVML stopped answering: the fixed busy time, the clocks unknown
            read, readings, before, top = None, [], None, None
            limit = min(FALLBACK_MS, max_ms)
        if elapsed >= limit:
            break
    return ClockWarmup(before, readings[-1][1] if readings else None, top, elapsed)


def _read(read: Callable[[], tuple[int, int]] | None) -> tuple[int, int] | None:
    """One reading, or None where there is no reader or it fails (NVML can refuse at any time)."""
    if read is None:
        return None
    try:
        return read()
    except Exception:
        return None
