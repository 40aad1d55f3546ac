"""What preparing a problem found, kept for its next preparation (kbv.protocols.verified.findings):
a second run with the same secret, device and rules skips the calibration and the soundness screen
and gives the same verdicts; another secret prepares anew; a record holds nothing of the secret or
of the draws; a record that cannot be read is no record."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sources import write_tree

import kbv.protocols.verified.prepare as prepare
import kbv.protocols.verified.runner as runner
from kbv.api import EvalConfig, evaluate
from kbv.detect.soundness import Screen, ScreenTally
from kbv.distributions import Calibration
from kbv.protocols.verified.findings import Findings, FindingsCache, findings_key
from kbv.verdict import Status

HEADER = "import torch\nimport torch.nn as nn\n"
INPUTS = "\ndef get_inputs():\n    return [torch.rand(8, 64)]\ndef get_init_inputs():\n    return []\n"
# exp(x / 1000) is 1 up to a few ulps on `small` inputs: a note of the screen's, on a sound problem
EXP_SCALED = HEADER + "class Model(nn.Module):\n    def forward(self, x):\n        return torch.exp(x * 1e-3)\n" + INPUTS
EXP_OWN = HEADER + "class ModelNew(nn.Module):\n    def forward(self, x):\n        return torch.exp(x / 1000.0)\n"
EXP_WRONG = HEADER + "class ModelNew(nn.Module):\n    def forward(self, x):\n        return torch.exp(x / 999.0)\n"
# an output that is zero whatever the input: no distribution applies
ALL_ZERO = HEADER + "class Model(nn.Module):\n    def forward(self, x):\n        return x * 0.0\n" + INPUTS
ZERO_OWN = HEADER + "class ModelNew(nn.Module):\n    def forward(self, x):\n        return torch.zeros_like(x)\n"


def _tree(tmp_path: Path, problem: str, name: str, candidates: dict[str, str]) -> tuple[Path, Path]:
    return (write_tree(tmp_path / "problems", {f"level2/{name}.py": problem}),
            write_tree(tmp_path / "cands", {f"{name}__{label}.py": code for label, code in candidates.items()}))


def _run(tmp_path: Path, problems: Path, cands: Path, run: str, seed: int) -> dict[str, object]:
    result = evaluate(EvalConfig(candidates=str(cands), problems=str(problems), protocol="verified", device="cpu",
                                 run_dir=str(tmp_path / run), cache_dir=str(tmp_path / "cache"), seed=seed,
                                 timer_budget_s=0.5, ci_target=0.2))
    return {v.candidate.split("__")[-1]: v for v in result.verdicts}


def _seen(v: object) -> tuple[object, ...]:
    """What a verdict says that preparation decides."""
    ev = v.evidence  # type: ignore[attr-defined]
    return (v.status, v.categories, v.flags, ev.get("calibration"), ev.get("calibration_notes"),  # type: ignore[attr-defined]
            ev.get("problem_notes"))


def test_a_second_run_with_the_same_secret_skips_calibration_and_screen_and_judges_the_same(tmp_path, monkeypatch):
    problems, cands = _tree(tmp_path, EXP_SCALED, "98_ExpScaled", {"own": EXP_OWN, "wrong": EXP_WRONG})
    first = _run(tmp_path, problems, cands, "run-1", seed=7)
    assert first["own"].status is Status.NO_CUSTOM_KERNEL and first["wrong"].status is Status.INCORRECT
    assert any("passes on small" in n for n in first["own"].evidence["problem_notes"])
    records = list((tmp_path / "cache" / "findings").glob("*.json"))
    assert len(records) == 1

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("prepared anew though its findings were kept")

    with monkeypatch.context() as m:
        m.setattr(prepare, "choose_variant", never)
        m.setattr(ScreenTally, "add", never)
        second = _run(tmp_path, problems, cands, "run-2", seed=7)
    assert {k: _seen(v) for k, v in second.items()} == {k: _seen(v) for k, v in first.items()}
    assert second["own"].evidence["preparation"]["findings_kept"] is True
    assert second["own"].evidence["preparation"]["by_purpose"].get("screen", 0) == 0

    screens = []
    real = ScreenTally.add
    monkeypatch.setattr(ScreenTally, "add", lambda *a, **k: screens.append(1) or real(*a, **k))
    other = _run(tmp_path, problems, cands, "run-3", seed=8)  # another secret: another draw, screened anew
    assert 1 <= len(screens) <= 5 and other["wrong"].status is Status.INCORRECT  # a distribution at a time
    assert len(list((tmp_path / "cache" / "findings").glob("*.json"))) == 2


def test_a_problem_no_distribution_applies_to_is_unsound_again_without_a_child(tmp_path, monkeypatch):
    problems, cands = _tree(tmp_path, ALL_ZERO, "97_AllZero", {"zeros": ZERO_OWN})
    first = _run(tmp_path, problems, cands, "run-1", seed=7)["zeros"]
    assert first.status is Status.UNSOUND_PROBLEM and "no input distribution applies" in first.message

    def no_child(*args: object, **kwargs: object) -> None:
        raise AssertionError("a baseline child started for a problem known to be unsound")

    monkeypatch.setattr(runner, "spawn_baselines", no_child)
    again = _run(tmp_path, problems, cands, "run-2", seed=7)["zeros"]
    assert again.status is Status.UNSOUND_PROBLEM and again.message == first.message
    # the same problem elsewhere: its message names where it is now
    moved = tmp_path / "moved"
    moved.mkdir()
    problems.rename(moved / "problems")
    elsewhere = _run(tmp_path, moved / "problems", cands, "run-3", seed=7)["zeros"]
    assert elsewhere.status is Status.UNSOUND_PROBLEM
    assert elsewhere.message.startswith(str(moved / "problems" / "level2" / "97_AllZero.py") + ": no input")
    assert elsewhere.message.split(": ", 1)[1][:120] == first.message.split(": ", 1)[1][:120]  # (both cut at 400)


def test_a_record_holds_only_names_and_sentences_and_its_key_nothing_of_the_secret(tmp_path):
    secret = bytes(range(32))
    key = findings_key("abc123", "kbv-verified-1.4", secret, "dev0")
    assert secret.hex() not in key and len(key) == 40
    # everything the findings depend on is in the key
    assert len({key, findings_key("abc124", "kbv-verified-1.4", secret, "dev0"),
                findings_key("abc123", "kbv-verified-1.5", secret, "dev0"),
                findings_key("abc123", "kbv-verified-1.4", secret[::-1], "dev0"),
                findings_key("abc123", "kbv-verified-1.4", secret, "dev1")}) == 5
    calibration = Calibration({"default": "problem", "large": None}, {"large": "not applicable: overflow"})
    screen = Screen(("a flag",), ("ones passes on small only",), (), {"small": "the baseline's own error is 2e-1"})
    cache = FindingsCache(tmp_path / "findings")
    cache.put(key, Findings.of(calibration, screen))
    got = cache.get(key)
    assert got is not None and got.screen() == screen
    assert got.calibration() == calibration and got.calibration() is not got.calibration()  # fresh each time
    record = tmp_path / "findings" / f"{key}.json"
    assert record.stat().st_mode & 0o077 == 0 and (tmp_path / "findings").stat().st_mode & 0o077 == 0
    values = json.loads(record.read_text())
    strings = json.dumps(values)
    assert all(not isinstance(v, (int, float)) or isinstance(v, bool) for v in _leaves(values)), strings


def _leaves(x: object) -> list[object]:
    if isinstance(x, dict):
        return [leaf for v in x.values() for leaf in _leaves(v)]
    if isinstance(x, list):
        return [leaf for v in x for leaf in _leaves(v)]
    return [x]


@pytest.mark.parametrize("text", ["{not json", '{"variants": {}}', '["a", "list"]', ""])
def test_a_record_that_cannot_be_read_is_no_record(tmp_path, text):
    (tmp_path / "findings").mkdir()
    (tmp_path / "findings" / "k.json").write_text(text)
    assert FindingsCache(tmp_path / "findings").get("k") is None


def test_a_cache_that_cannot_be_written_is_skipped(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    FindingsCache(blocked / "findings").put("k", Findings({}, {}, unsound="x"))  # no raise
    assert FindingsCache(blocked / "findings").get("k") is None
