"""bench/kernelbench_soundness.py renders KernelBench's soundness table from what the device runs made:
`kbv problems check` records under the current rules, and the KernelBench sweep's identity verdicts
(the verified protocol screens every problem while preparing it). A record of older rules counts as
not run; a refusal says which card refused it; a bad sweep file is one line and exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from kbv.protocols.verified.rules import PROTOCOL_VERSION, VerifiedProtocol

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "kernelbench_soundness.py"
H100 = "NVIDIA H100 80GB HBM3"


def _render(*args: str) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p)
    return subprocess.run([sys.executable, str(SCRIPT), "--render-only", *args],
                          env={**os.environ, "PYTHONPATH": path}, capture_output=True, text=True, timeout=120)


def _row(problem: str, outcome: str, verified: dict, why: str = "") -> dict:
    return {"problem": problem, "outcome": outcome, "why": why, "device": H100,
            "standard": {"status": "correct"}, "verified": verified}


def test_the_sweep_and_the_checks_make_one_table_and_older_rules_count_as_not_run(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep.json"
    sweep.write_text(json.dumps({"rows": [
        _row("L1/1_Matmul", "judged", {"status": "no_custom_kernel", "flags": [],
                                        "protocol": VerifiedProtocol().version,
                                        "problem_notes": ["passes on signed only: zeros"]}),
        # a row of other rules says nothing of these; its problem's check timed out under older ones
        _row("L1/3_Old", "judged", {"status": "no_custom_kernel", "flags": [], "protocol": "kbv-verified-1.2+tf32"}),
        # not judged by the sweep, and a check of older rules: not run, with both reasons
        _row("L1/4_Slow", "failed", {"status": "failed"}, why="ran past its 300 s (--prepare-timeout) in truth"),
        _row("L1/2_Mean", "judged", {"status": "unsound_problem", "message": "zeros passes every distribution"}),
        _row("L1/19_ReLU", "refused", {"status": "failed"}, why="too large for this machine: needs about 90 GiB"),
        _row("L2/5_Conv", "missing", {"status": "missing"}, why="not evaluated yet"),
        _row("L3/1_MLP", "judged", {"status": "no_custom_kernel", "flags": []}),
    ]}))
    screens = tmp_path / "ks.jsonl"
    screens.write_text("\n".join(json.dumps(r) for r in [
        # a check under these rules stands over the sweep (it ran the per-input sensitivity test too)
        {"problem": "L3/1_MLP", "outcome": "flagged", "flags": ["does not depend on input 2"], "notes": [],
         "protocol": PROTOCOL_VERSION},
        # one under older rules is no verdict of these: the sweep's stands, and where there is none, not run
        {"problem": "L1/1_Matmul", "outcome": "unsound", "flags": ["old"], "protocol": "kbv-verified-1.2"},
        {"problem": "L3/9_ResNet", "outcome": "sound", "flags": [], "protocol": "kbv-verified-1.2"},
        {"problem": "L1/3_Old", "outcome": "timed out", "reason": "no answer within 120 s"},  # written by the parent
        {"problem": "L1/4_Slow", "outcome": "too large", "reason": "out of device memory",
         "protocol": "kbv-verified-1.2"},
    ]) + "\n")
    page = tmp_path / "ks.md"
    done = _render("--from-sweep", str(sweep), "--resume", str(screens), "--markdown", str(page), "--device", H100)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = {line.split(" | ")[0].removeprefix("| "): line.split(" | ")[1:] for line in page.read_text().splitlines()
            if line.startswith("| L")}
    assert rows["L1/1_Matmul"][:2] == ["sound", "sweep"] and "passes on signed only" in rows["L1/1_Matmul"][3]
    assert rows["L1/2_Mean"][:2] == ["unsound", "sweep"] and "zeros passes" in rows["L1/2_Mean"][3]
    assert rows["L1/19_ReLU"][:2] == ["too large", "sweep"] and H100 in rows["L1/19_ReLU"][3]
    assert rows["L2/5_Conv"][0] == "not run"
    assert rows["L3/1_MLP"][:2] == ["flagged", "check"] and "input 2" in rows["L3/1_MLP"][3]
    assert rows["L3/9_ResNet"][0] == "not run" and "kbv-verified-1.2" in rows["L3/9_ResNet"][3]
    assert rows["L1/3_Old"][0] == "not run" and "swept under kbv-verified-1.2 only (sound)" in rows["L1/3_Old"][3]
    assert rows["L1/4_Slow"][0] == "not run" and "--prepare-timeout" in rows["L1/4_Slow"][3] \
        and "screened under kbv-verified-1.2 only (too large)" in rows["L1/4_Slow"][3]
    text = page.read_text()
    assert "Counts: " in text and "3 rows (`by` sweep)" in text and f"{H100} (3 rows)" in text


def test_a_sweep_file_that_is_not_one_is_a_one_line_error(tmp_path: Path) -> None:
    bad = tmp_path / "sweep.json"
    for text in ("{not json", "[]", "{}", json.dumps({"rows": [{"verified": {}}]})):
        bad.write_text(text)
        done = _render("--from-sweep", str(bad), "--markdown", str(tmp_path / "ks.md"))
        assert done.returncode == 2 and done.stderr.startswith("error: --from-sweep"), (text, done.stderr[-500:])
        assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    # a row whose verified entry is not an object is a row not judged, never a crash
    bad.write_text(json.dumps({"rows": [{"problem": "L1/1_M", "verified": "x"}]}))
    done = _render("--from-sweep", str(bad), "--markdown", str(tmp_path / "ks.md"))
    assert done.returncode == 0 and "| L1/1_M | not run |" in (tmp_path / "ks.md").read_text(), done.stderr[-500:]
    alone = _render("--from-sweep", str(tmp_path / "missing.json"))
    assert alone.returncode == 2 and "Traceback" not in alone.stderr
