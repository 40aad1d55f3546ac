"""The answer to one evaluation request, as the service sends it and the client reads it.

    {"problem": "L1/2_ReLU", "protocol": "verified", "status": "verified", "speedup": 1.42,
     "reward": 1.72, "reward_rule": {"name": "kernelbench-rl", "version": 1}, "cached": false,
     "verdict": {<the stored verdict>}}

`status`, `speedup` and `reward` are those of the deciding verdict: the verified one when the request
asked for `verified` or `both`, else the standard one. Under `both`, `"standard"` holds the standard
protocol's `{"status", "speedup", "verdict"}` beside it. `cached` is true when every verdict came
from the store and nothing ran for this request.

The service (`kbv.serve.service`) makes them and the client (`kbv.client`) reads them: it lives
beside both, so that the client needs nothing of the service.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from kbv.reward_rules import RewardRule
from kbv.verdict import Verdict


@dataclass(frozen=True)
class Answer:
    problem: str  # the problem's key
    protocol: str  # as asked: standard | verified | both
    verdicts: dict[str, Verdict]  # by protocol: one, or both
    reward: float
    reward_rule: str
    reward_version: int
    cached: bool
    # the verdicts as the store holds them (`Verdict.to_dict`), by protocol, where they came from it:
    # sent as they are (making them again from the records is most of a cached answer's cost)
    stored: dict[str, dict[str, Any]] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(cls, problem: str, protocol: str, verdicts: dict[str, Verdict], rule: RewardRule,
           cached: bool, stored: dict[str, dict[str, Any]] | None = None) -> Answer:
        """The answer for `verdicts`, rewarded by `rule` on the deciding one."""
        deciding = verdicts.get("verified") or verdicts["standard"]
        return cls(problem, protocol, dict(verdicts), rule.reward(deciding), rule.name, rule.version, cached,
                   dict(stored or {}))

    @property
    def verdict(self) -> Verdict:
        """The deciding verdict: the verified one where there is one."""
        return self.verdicts.get("verified") or self.verdicts["standard"]

    @property
    def status(self) -> str:
        return self.verdict.status.value

    @property
    def speedup(self) -> float | None:
        return self.verdict.speedup

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "problem": self.problem, "protocol": self.protocol, "status": self.status, "speedup": _finite(self.speedup),
            "reward": self.reward, "reward_rule": {"name": self.reward_rule, "version": self.reward_version},
            "cached": self.cached, "verdict": self._verdict_dict(self.verdict)}
        if len(self.verdicts) > 1:
            standard = self.verdicts["standard"]
            out["standard"] = {"status": standard.status.value, "speedup": _finite(standard.speedup),
                               "verdict": self._verdict_dict(standard)}
        return out

    def _verdict_dict(self, verdict: Verdict) -> dict[str, Any]:
        return self.stored.get(verdict.protocol) or verdict.to_dict()

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Answer:
        """Inverse of `to_dict`. Raises KeyError, TypeError or ValueError for anything else."""
        verdict = Verdict.from_dict(data["verdict"])
        verdicts = {verdict.protocol: verdict}
        if data.get("standard"):
            verdicts["standard"] = Verdict.from_dict(data["standard"]["verdict"])
        rule = data["reward_rule"]
        return cls(str(data["problem"]), str(data["protocol"]), verdicts, float(data["reward"]), str(rule["name"]),
                   int(rule["version"]), bool(data["cached"]))

    def record(self, keys: list[str]) -> dict[str, Any]:
        """What the store keeps of it (`kbv.store.Store.put_answer`): its verdicts' `keys`, not the
        verdicts, which are stored apart, once."""
        return {"problem": self.problem, "candidate_hash": self.verdict.candidate_hash, "protocol": self.protocol,
                "keys": list(keys),
                "status": self.status, "reward": self.reward, "reward_rule": self.reward_rule,
                "reward_version": self.reward_version, "cached": self.cached}


def _finite(value: float | None) -> float | None:
    """JSON has no infinities: a speedup that is not finite is sent as null (the verdict says why)."""
    return value if value is None or math.isfinite(value) else None
