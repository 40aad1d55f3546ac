"""bench/kernelbench_plans.py: each problem's memory plan on a machine of a given size, traced on the
meta device with nothing allocated: a small problem holds every trial, one too large for the device is
refused under verified with its figures, and the counts say how many a card can judge."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from sources import RELU_PROBLEM, write_tree

ROOT = Path(__file__).resolve().parents[1]


def _plans(*args: str) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p)
    return subprocess.run([sys.executable, str(ROOT / "bench" / "kernelbench_plans.py"), *args],
                          env={**os.environ, "PYTHONPATH": path}, capture_output=True, text=True, timeout=300)


def test_a_small_problem_is_held_and_one_too_large_for_the_card_is_refused_with_its_figures(tmp_path: Path) -> None:
    big = RELU_PROBLEM.replace("torch.randn(16, 256)", "torch.randn(1 << 15, 1 << 16)")  # 8 GiB of input
    tree = write_tree(tmp_path / "KernelBench", {"level1/19_ReLU.py": RELU_PROBLEM, "level1/20_Big.py": big})
    out = tmp_path / "plans.json"
    done = _plans(str(tree), "--device-gib", "80", "--host-gib", "128", "--out", str(out))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    rows = {r["problem"]: r for r in json.loads(out.read_text())["rows"]}
    assert rows["L1/19_ReLU"]["outcome"] == "held"
    assert rows["L1/20_Big"]["outcome"] == "refused" and "GiB of device memory" in rows["L1/20_Big"]["verified"]
    assert "2 problems on 80 GiB of device memory" in done.stdout and "1 refused" in done.stdout
    # the same problem on a card twice the size is judged, its truth held
    bigger = _plans(str(tree), "--device-gib", "400", "--only", "L1/20")
    assert bigger.returncode == 0 and "1 refused" not in bigger.stdout.split("under standard")[0]


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    missing = _plans(str(tmp_path / "nowhere"))
    assert missing.returncode == 2 and missing.stderr.startswith("error: ") and "Traceback" not in missing.stderr
    negative = _plans(str(tmp_path), "--device-gib", "-1")
    assert negative.returncode == 2 and "must be positive" in negative.stderr
