"""Protocol runners: each protocol's prepare / evaluate / release, as the executor drives them."""

from __future__ import annotations

import gc
from dataclasses import dataclass
from typing import Any

import torch

from kbv.builds import Build
from kbv.candidates import Pair
from kbv.executor import BaselineCache
from kbv.protocols import StandardProtocol
from kbv.settings import Settings
from kbv.standard import (
    StandardContext,
    blank_verdict,
    evaluate_standard,
    measure_standard_baseline,
    prepare_standard,
)
from kbv.verdict import TimingStats, Verdict


@dataclass
class _Prepared:
    context: StandardContext
    baseline: TimingStats


class StandardRunner:
    name = "standard"

    def __init__(self, protocol: StandardProtocol, settings: Settings, baselines: BaselineCache | None,
                 device_fingerprint: str) -> None:
        self.protocol = protocol
        self.settings = settings
        self.baselines = baselines
        self.device_fingerprint = device_fingerprint

    def prepare(self, pair: Pair) -> _Prepared:
        context = prepare_standard(pair.problem, self.protocol, torch.device(self.settings.device))
        key = f"{pair.problem.hash}:{self.protocol.fingerprint()}:{self.device_fingerprint}:eager"
        stats = self.baselines.get_baseline(key) if self.baselines else None
        if stats is None:
            stats = measure_standard_baseline(context, self.protocol, self.settings)
            if self.baselines:
                self.baselines.put_baseline(key, pair.problem.hash, "eager", stats)
        return _Prepared(context, stats)

    def evaluate(self, pair: Pair, context: _Prepared, build: Build) -> Verdict:
        return evaluate_standard(pair, context.context, build, context.baseline, self.protocol, self.settings)

    def blank(self, pair: Pair) -> Verdict:
        return blank_verdict(pair, self.protocol, self.settings)

    def release(self, context: Any) -> None:
        del context
        release_device_memory()


def release_device_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
