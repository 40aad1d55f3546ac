"""One Triton and one CUDA fixture under the sandbox, standard protocol, with every line of their
errors: what a failing GPU test hides behind its assertion. Also what the machine's compilers are and
what a sandboxed child sees of them. Usage: python3 bench/sandbox_diag.py [--device cuda]"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ("1_Matmul__triton_tf32.py", "5_Sigmoid__cuda_raw_workspace.py")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    for var in ("CC", "CXX", "CUDA_HOME", "PATH"):
        print(f"{var}={os.environ.get(var, '')}")
    for exe in ("gcc", "g++", "c++", "nvcc"):
        found = shutil.which(exe)
        print(f"{exe}: {found} -> {os.path.realpath(found) if found else '-'}")
    from kbv.sandbox.isolation import toolchain_paths
    print("toolchain prefixes bound:", toolchain_paths(dict(os.environ)))
    with tempfile.TemporaryDirectory() as tmp:
        cands = Path(tmp) / "candidates"
        cands.mkdir()
        for name in FIXTURES:
            shutil.copy(ROOT / "tests" / "corpus" / "gpu" / name, cands / name)
        done = subprocess.run([sys.executable, "-m", "kbv", "eval", str(cands), "--problems", "smoke",
                               "--protocol", "standard", "--device", args.device, "--run", f"{tmp}/run",
                               "--cache-dir", f"{tmp}/cache", "--format", "json"],
                              capture_output=True, text=True, timeout=400)
        print("kbv eval rc", done.returncode, done.stderr[-2000:])
        try:
            verdicts = json.loads(done.stdout)["verdicts"]
        except (ValueError, KeyError):
            print(done.stdout[-4000:])
            return 1
        for v in verdicts:
            print(f"--- {v['candidate']}: {v['status']} {v.get('speedup')}")
            if v["status"] not in ("correct", "verified"):
                print(v["message"][:3000])
                print((v.get("evidence") or {}).get("stderr_tail", "")[-4000:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
