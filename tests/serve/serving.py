"""A `kbv serve` in a process of its own, as a user starts it, on a free port; candidate sources the
service tests send."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
READY_TIMEOUT_S = 180.0


def kbv_env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]), **extra}


@dataclass
class Served:
    proc: subprocess.Popen[str]
    url: str
    run_dir: Path
    stderr: Path

    def stop(self, timeout_s: float = 60.0) -> int:
        """SIGTERM, then the exit code (SIGKILL after `timeout_s`: a test must never leave it)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise

    def errors(self) -> str:
        return self.stderr.read_text(errors="replace")


def start(root: Path, *args: str, env: dict[str, str] | None = None) -> Served:
    """`kbv serve --port 0 --device cpu --run ROOT/run ARGS`, once its ready line is out."""
    run_dir, stderr = root / "run", root / "serve.err"
    command = [sys.executable, "-m", "kbv", "serve", "--port", "0", "--device", "cpu", "--run", str(run_dir), *args]
    with open(stderr, "w") as err:
        proc = subprocess.Popen(command, env=env or kbv_env(), stdout=subprocess.PIPE, stderr=err, text=True)
    assert proc.stdout is not None
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline and proc.poll() is None:
        ready, _, _ = select.select([proc.stdout], [], [], 0.5)
        if ready:
            line = proc.stdout.readline()
            if line.startswith("kbv serve: http://"):
                return Served(proc, line.split()[2], run_dir, stderr)
    proc.kill()
    proc.wait()
    raise AssertionError(f"kbv serve did not come up: {stderr.read_text(errors='replace')[-2000:]}")


def torch_candidate(body: str, note: str = "") -> str:
    """A torch-level ModelNew whose forward(x) returns `body`; `note` makes the source (and its
    content hash, so its pair) distinct."""
    return (f"import torch\nimport torch.nn as nn\n\n# {note}\n\nclass ModelNew(nn.Module):\n"
            f"    def forward(self, x):\n        return {body}\n")


HONEST = torch_candidate("torch.relu(x)", "honest")
WRONG = torch_candidate("x * 0.5", "wrong")  # not ReLU on any input
HANGS = ("import time\nimport torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n"
         "    def forward(self, x):\n        time.sleep(3600)\n        return torch.relu(x)\n")
KILLS_ITSELF = ("import os\nimport signal\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n"
                "    def forward(self, x):\n        os.kill(os.getpid(), signal.SIGKILL)\n")
