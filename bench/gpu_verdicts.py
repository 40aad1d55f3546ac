"""Evaluate GPU fixtures and print each verdict the moment it is stored (a device call cut short
still reports what finished). Usage: python3 bench/gpu_verdicts.py timing|corpus [budget_s]"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from kbv.api import EvalConfig, evaluate  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def timing_fixtures(tmp: Path) -> tuple[Path, Path]:
    fx = ROOT / "tests" / "gpu_fixtures"
    kernel = (fx / "honest_triton.py").read_text().split("class ModelNew")[0]
    (tmp / "p" / "level1").mkdir(parents=True)
    (tmp / "p" / "level1" / "1_Matmul.py").write_text((fx / "problem_matmul.py").read_text())
    (tmp / "c").mkdir()
    for f in sorted(fx.glob("*.py")):
        if f.name != "problem_matmul.py":
            src = f.read_text().replace("from honest_triton_kernel import matmul\n", kernel)
            (tmp / "c" / f"1_Matmul__{f.stem}.py").write_text(src)
    return tmp / "c", tmp / "p"


def show(done: int, total: int, v) -> None:
    if v is None:
        return
    mem = (f" peak={v.memory.peak_bytes >> 20}MiB dev_peak={(v.memory.device_peak_bytes or 0) >> 20}MiB"
           f" raw={(v.memory.device_raw_bytes or 0) >> 20}MiB" if v.memory else "")
    ms = f" median={v.timing.candidate.median_ms:.4f}ms" if v.timing else ""
    print(f"[{done}/{total}] {v.protocol} {v.candidate} {v.status.value} {[c.value for c in v.categories]}"
          f" speedup={v.speedup}{ms}{mem} :: {v.message[:160]}", flush=True)


def main() -> int:
    which = sys.argv[1]
    budget = float(sys.argv[2]) if len(sys.argv) > 2 else 5.0
    tmp = Path(tempfile.mkdtemp())
    if which == "timing":
        cands, problems, protocol = *timing_fixtures(tmp), "verified"
    else:
        cands, problems, protocol = ROOT / "tests" / "corpus" / "gpu", "smoke", "both"
    evaluate(EvalConfig(candidates=str(cands), problems=str(problems), protocol=protocol, device="cuda",
                        run_dir=str(tmp / "run"), seed=7, timer_budget_s=budget, ci_target=0.02, timeout_s=240),
             progress=show)
    return 0


if __name__ == "__main__":
    sys.exit(main())
