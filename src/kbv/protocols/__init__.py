"""Protocols: named, versioned sets of evaluation rules. Every verdict records which one made it.

- `kbv.protocols.standard`: KernelBench's protocol, reproduced (one module, read top to bottom);
- `kbv.protocols.verified`: this project's protocol (a package: rules, prepare, correctness, timer,
  runner), whose detectors are the pure rules of `kbv.detect`.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any

from kbv.verdict import Status, Verdict

if TYPE_CHECKING:
    from kbv.candidates import Pair


def fingerprint(rules: dict[str, Any]) -> str:
    """Hash of every rule of a protocol: results under different rules never mix on resume."""
    return hashlib.sha256(json.dumps(rules, sort_keys=True, default=str).encode()).hexdigest()[:16]


def blank_verdict(pair: Pair, protocol: Any, provenance: dict[str, Any]) -> Verdict:
    """The verdict record of `pair` under `protocol` before anything ran (a runtime error until said otherwise)."""
    p, c = pair.problem, pair.candidate
    return Verdict(problem=p.key, problem_hash=p.hash, level=p.level, candidate=c.name, candidate_hash=c.hash,
                   protocol=protocol.name, protocol_version=protocol.version, status=Status.RUNTIME_ERROR,
                   provenance=provenance, model=c.model, sample=c.sample)
