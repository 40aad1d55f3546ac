"""bench/kernelbench_sweep.py on a CPU: each problem's own Model as its candidate, under both protocols,
on a KernelBench-shaped tree; a small problem is judged (standard correct, verified no_custom_kernel
with its time against the baseline), one too large for the machine is refused with its figures; the
JSON keeps both, and a resumed sweep keeps them without evaluating anything."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from sources import RELU_PROBLEM, write_tree

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "kernelbench_sweep.py"


def _sweep(*args: str) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p)
    return subprocess.run([sys.executable, str(SCRIPT), *args], env={**os.environ, "PYTHONPATH": path},
                          capture_output=True, text=True, timeout=900)


def test_a_small_problem_is_judged_and_a_huge_one_refused_and_a_resumed_sweep_keeps_both(tmp_path: Path) -> None:
    huge = RELU_PROBLEM.replace("torch.randn(16, 256)", "torch.randn(1 << 20, 1 << 16)")  # 256 GiB
    tree = write_tree(tmp_path / "KernelBench", {"level1/19_ReLU.py": RELU_PROBLEM, "level1/20_Huge.py": huge,
                                                  "level2/1_Other.py": RELU_PROBLEM})
    out, page = tmp_path / "sweep.json", tmp_path / "sweep.md"
    args = [str(tree), "--device", "cpu", "--only", "L1/19,L1/20", "--work", str(tmp_path / "work"),
            "--timer-budget", "0.5", "--seed", "3", "--out", str(out), "--markdown", str(page)]
    first = _sweep(*args)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    rows = {r["problem"]: r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == {"L1/19_ReLU", "L1/20_Huge"}  # --only: level 2 is not swept
    small, large = rows["L1/19_ReLU"], rows["L1/20_Huge"]
    assert small["outcome"] == "judged" and small["standard"]["status"] == "correct"
    assert small["verified"]["status"] == "no_custom_kernel" and small["verified"]["ratio"] > 0
    assert small["verified"]["prepare_calls"] > 0
    assert large["outcome"] == "refused" and "GiB of host memory" in large["why"]
    assert "| L1/20_Huge | 256 GiB |" in page.read_text()
    again = _sweep(*args, "--resume", str(out))
    assert again.returncode == 0 and "2 problems kept" in again.stdout and "[1/" not in again.stdout
