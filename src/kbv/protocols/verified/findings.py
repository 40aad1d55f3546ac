"""What preparing a problem found, kept across preparations: the calibration (which variant of each
distribution applies, and why) and the soundness screen's findings (`kbv.detect.soundness.Screen`).

A problem is prepared once per lane while the lane holds it. A lane that let it go (a service that
sees more problems than a lane keeps, `--keep-problems`), another lane of the same run, and a later
run with the same secret (`--seed`) prepare it again; with these findings they skip the calibration
and the screen (the reference run on calibration inputs, run twice more and at other inputs on every
distribution), which come out the same for the same problem, rules, secret and device.

Safe to keep: a record holds only names of distributions and variants and sentences about them, no
seed, input, weight or output. Its key is a one-way hash of the problem's content hash, the
protocol's fingerprint, the secret and the device's fingerprint, so it says nothing of the secret
either. Records lie under the build cache's directory in `findings/`, made readable by kbv's user
alone (a degraded sandbox's child runs as another user), one JSON file a key, written atomically;
one that cannot be read is not there.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kbv.detect.soundness import Screen
from kbv.distributions import Calibration

FORMAT = 1  # the record's layout; part of the key


@dataclass(frozen=True)
class Findings:
    """The calibration, and either the screen's findings or why no distribution applies (`unsound`)."""

    variants: dict[str, str | None]
    calibration_notes: dict[str, str]
    flags: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    unjudgeable: tuple[str, ...] = ()
    inapplicable: dict[str, str] = field(default_factory=dict)
    unsound: str | None = None

    @classmethod
    def of(cls, calibration: Calibration, screen: Screen) -> Findings:
        """The record of a calibration (before the screen's distributions are dropped from it) and a screen."""
        return cls(dict(calibration.variants), dict(calibration.notes), screen.flags, screen.notes,
                   screen.unjudgeable, dict(screen.inapplicable))

    def calibration(self) -> Calibration:
        """A fresh Calibration (preparation drops distributions from it: the record stays as it is)."""
        return Calibration(dict(self.variants), dict(self.calibration_notes))

    def screen(self) -> Screen:
        return Screen(self.flags, self.notes, self.unjudgeable, dict(self.inapplicable))


def findings_key(problem_hash: str, protocol_fingerprint: str, secret: bytes, device_fingerprint: str) -> str:
    """The record's name: a one-way hash of everything its findings depend on."""
    text = f"kbv-findings-{FORMAT}|{problem_hash}|{protocol_fingerprint}|{device_fingerprint}|".encode()
    return hashlib.sha256(text + secret).hexdigest()[:40]


class FindingsCache:
    """Records under `root` (made on first write, mode 0700)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def get(self, key: str) -> Findings | None:
        try:
            data = json.loads((self.root / f"{key}.json").read_text())
            return Findings(**{**data, **{k: tuple(data[k]) for k in ("flags", "notes", "unjudgeable")}})
        except (OSError, ValueError, TypeError, KeyError):
            return None  # absent, or not a record of this layout: prepared anew

    def put(self, key: str, findings: Findings) -> None:
        """Write the record; a cache that cannot be written is skipped (the next preparation redoes it)."""
        try:
            self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd, tmp = tempfile.mkstemp(dir=self.root, prefix=f".{key}.")  # mode 0600
        except OSError:
            return
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(asdict(findings), f)
            os.replace(tmp, self.root / f"{key}.json")
        except OSError:
            Path(tmp).unlink(missing_ok=True)
