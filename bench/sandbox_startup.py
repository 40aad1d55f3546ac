"""A child's start-up with and without the sandbox, side by side.

    python bench/sandbox_startup.py [--device cpu|cuda] [--repeats 8]

For each isolation (`--sandbox off`, and the strongest this machine has), starts a child `--repeats`
times, alternating, and times two things: spawned until its first answer (`hello`: the interpreter,
torch, the device and the guards up), and its process started (`Sandbox.start`: bwrap's namespaces and
mounts, the directories given to the child). Prints the medians and the difference, one table. The
target: the sandbox costs at most 100 ms a child.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from kbv.sandbox import ChildSpec, Sandbox  # noqa: E402
from kbv.sandbox.isolation import Isolation, SandboxMode, resolve  # noqa: E402


def start_once(root: Path, isolation: Isolation, device: str, k: int) -> tuple[float, float]:
    """(seconds to `start`, seconds to the first answer) of one child."""
    spec = ChildSpec(work_dir=root / f"work-{k}", build_dir=root / "build", device=device, isolation=isolation,
                     parent_device=device if device != "cpu" else None, hidden=(root,))
    t0 = time.perf_counter()
    sb = Sandbox(spec)
    sb.start()
    started = time.perf_counter() - t0
    try:
        sb.call({"op": "hello"}, 300)
        return started, time.perf_counter() - t0
    finally:
        sb.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", help="cpu, or cuda (the child's device is cuda:0)")
    parser.add_argument("--repeats", type=int, default=8)
    args = parser.parse_args()
    device = "cuda:0" if args.device.startswith("cuda") else "cpu"
    sandboxed = resolve(SandboxMode.AUTO)
    levels = {"off": resolve(SandboxMode.OFF), sandboxed.level.value: sandboxed}
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in levels}
    with tempfile.TemporaryDirectory(prefix="kbv-startup-") as tmp:
        root = Path(tmp)
        for name, iso in levels.items():  # one of each first: caches (page cache, the probe) warm
            start_once(root, iso, device, 0)
        for k in range(1, args.repeats + 1):
            for name, iso in levels.items():  # alternating, so drift hits both alike
                times[name].append(start_once(root, iso, device, k))
    print(sandboxed.describe())
    print(f"{'child start-up (' + device + ', median of ' + str(args.repeats) + ')':<42}"
          f"{'start ms':>10}{'to hello ms':>14}")
    medians = {}
    for name in levels:
        start = statistics.median(t[0] for t in times[name]) * 1e3
        hello = statistics.median(t[1] for t in times[name]) * 1e3
        medians[name] = (start, hello)
        print(f"{name:<42}{start:>10.1f}{hello:>14.1f}")
    if sandboxed.level.value != "off":
        off, on = medians["off"], medians[sandboxed.level.value]
        print(f"{'difference (' + sandboxed.level.value + ' - off)':<42}{on[0] - off[0]:>+10.1f}{on[1] - off[1]:>+14.1f}")


if __name__ == "__main__":
    main()
