"""Result caches and constant outputs: rules over output fingerprints and the replay probe's timings.

A trial's fingerprint is None where it has no output of the kernel's own to compare: none was
delivered (a wrong dtype, shape or type), or the poison under it shows. The rules compare real
outputs only: placeholders for missing ones are all alike, and would make any candidate a constant."""

from __future__ import annotations

import math

import hashlib
from collections.abc import Sequence

import torch

from kbv.protocols.verified.rules import REPLAY_MIN_MS, REPLAY_RATIO
from kbv.verdict import Category

Fingerprint = tuple[int, int]


def output_fingerprint(outputs: Sequence[torch.Tensor]) -> Fingerprint:
    """A content hash of outputs (their first 4 MiB each, and their shapes)."""
    h = hashlib.sha256()
    for o in outputs:
        head = o.detach().contiguous().reshape(-1).view(torch.uint8)[: 1 << 22]  # 4 MiB tell outputs apart
        h.update(head.cpu().numpy().tobytes())
        h.update(str(tuple(o.shape)).encode())
    d = h.digest()
    return int.from_bytes(d[:8], "big"), int.from_bytes(d[8:16], "big")


def replayed_output(trials: Sequence[tuple[Fingerprint | None, bool]]) -> tuple[Category, str] | None:
    """A failing trial whose output is identical to an earlier trial's passing output (other inputs)
    was replayed, not computed. `trials` are (fingerprint, passed) in trial order."""
    for i, (fp, passed) in enumerate(trials):
        if fp is not None and not passed and any(fp == earlier and ok for earlier, ok in trials[:i]):
            return Category.RESULT_CACHE, f"trial {i} returned the output of an earlier trial with other inputs"
    return None


def constant_output(trials: Sequence[tuple[Fingerprint | None, bool]]) -> tuple[Category, str] | None:
    """Identical failing outputs for every input that got one: the output does not depend on its
    input (a hard-coded constant, not lost precision)."""
    real = [(fp, ok) for fp, ok in trials if fp is not None]
    failing = [fp for fp, ok in real if not ok]
    if len(failing) >= 2 and len({fp for fp, _ in real}) == 1:
        return Category.VALUE_MISMATCH, "the same output for every input: it does not depend on its input"
    return None


def replayed_timing(pairs: Sequence[Sequence[float]]) -> tuple[Category, str] | None:
    """The replay probe: each fresh input set called twice in a row unchanged, then another fresh set
    once right after, (first, second, fresh) ms. An honest kernel takes as long the second time (the
    L2 is flushed between); a cache answers at once, and must compute the fresh set. A second call
    that is fast because the machine was warmer (threads awake, a busy machine's first call
    descheduled) is as fast on the fresh set, and says nothing."""
    if not pairs:
        return None

    def median(i: int) -> float:
        return sorted(p[i] if len(p) > i else math.inf for p in pairs)[len(pairs) // 2]

    first, again, fresh = median(0), median(1), median(2)
    if first > REPLAY_MIN_MS and again < REPLAY_RATIO * first and again < REPLAY_RATIO * fresh:
        return (Category.RESULT_CACHE, f"a second call on the same unchanged inputs took {again:.3f} ms "
                                       f"against {first:.3f} ms for the first: the result was replayed")
    return None
