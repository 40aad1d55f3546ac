"""Build CPU-seconds per candidate, before and after kbv's cheaper builds, on the same candidates.
Prints a table; writes JSON.

- before: kbv's build as it was (bc9b6f1): no shared header, ninja's own -j;
- after: kbv's build now: the bindings file reuses torch/extension.h precompiled once (`kbv.pch`),
  ninja gets the pool's MAX_JOBS; `after-cold` is the first pass on an empty cache, which also makes
  the precompiled header(s) (their cost is the difference to `after`).
Each pass builds every candidate from scratch, one at a time (so CPU-seconds are not inflated by
other builds), through `kbv.builds.build_candidate` in its sandbox child: the figure is that child's
CPU-seconds with its ninja and compilers (`Build.cpu_s`). The candidates are the templates of
`bench/templates.py` (KernelBench-style load_inline CUDA, and C++) and `examples/2_ReLU__cuda.py`;
each pass gives them a new salt (a constant in the source), which changes their hash, not their cost.

`--breakdown` runs each build's ninja commands again one at a time and says where the CPU-seconds
went: the bindings file (`main.cpp`), the kernels' file (`cuda.cu`, by nvcc phase: preprocessing,
cudafe++ and cicc, which parse the host code, ptxas for the device code, the host compile), the link.

On a machine whose torch has no CUDA, `--emulate-cuda` builds the CUDA candidates all the same
(`bench/cudaemu`: nvcc's toolkit for CUDA_HOME; the link fails, the compiles are measured) for
`--arch` (default 9.0, an H200). Without it, only the C++ candidates are built there.

    PYTHONPATH=src python3 bench/builds.py --out builds.json                       # GPU machine
    PYTHONPATH=src python3 bench/builds.py --emulate-cuda --breakdown --kinds cuda_elementwise,cpp
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from templates import VARIANTS, Variant  # noqa: E402

PASSES = ("before", "after-cold", "after")
DEFAULT_KINDS = ("cuda_elementwise", "cuda_reduction", "cuda_softmax", "cuda_matmul", "example_cuda", "cpp")


def candidates(kinds: list[str], salt: int) -> list[tuple[str, str, str]]:
    """(name, kind, code) of one candidate per kind (two for C++: an elementwise loop and a sum)."""
    out = []
    for kind in kinds:
        if kind == "example_cuda":
            code = (ROOT / "examples" / "2_ReLU__cuda.py").read_text()
            out.append(("2_ReLU__cuda (examples)", kind, f"# salt {salt}\n{code}"))
            continue
        picks: list[Variant] = [v for v in VARIANTS if v.kind == kind]
        if kind == "cpp":
            picks = [picks[0], picks[-1]]
        for v in picks[:2 if kind == "cpp" else 1]:
            out.append((f"{v.problem}__{kind}", kind, v.template.substitute(kind=kind, salt=salt, **v.fields)))
    return out


def run_pass(name: str, cands: list[tuple[str, str, str]], cache: Path, args: argparse.Namespace,
             index: int = 0) -> list[dict[str, Any]]:
    from kbv.builds import BuildOptions, build_candidate
    from kbv.candidates import Candidate
    from kbv.settings import Settings

    settings = Settings(device="cpu", run_dir=cache.parent / f"run-{name}", cache_dir=cache, jobs=1,
                        cuda_arch_list=args.arch, pch=name != "before")
    jobs = 0 if name == "before" else max(1, min(4, len(os.sched_getaffinity(0))))  # the pool's, one build in flight
    rows = []
    for label, kind, code in cands:
        cand = Candidate(code=code, name=label, origin=f"{label}.py", problem_ref=label.split("__")[0])
        t0 = time.monotonic()
        build = build_candidate(cand, settings, f"{name}-{index + len(rows)}", BuildOptions(ninja_jobs=jobs))
        row = {"pass": name, "candidate": label, "kind": kind, "cpu_s": round(build.cpu_s, 2),
               "wall_s": round(time.monotonic() - t0, 2), "status": build.status.value if build.status else "built",
               "build_dir": str(build.build_dir)}
        if build.status is not None:
            row["message"] = build.message[:200]
        print(f"  {name:10s} {label:32s} {row['cpu_s']:7.1f} CPU-s {row['wall_s']:7.1f} s  {row['status']}", flush=True)
        rows.append(row)
    return rows


def _cpu_of(cmd: str, cwd: Path, env: dict[str, str]) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(["bash", "-c", cmd], cwd=cwd, env=env, capture_output=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _nvcc_phases(cmd: str, cwd: Path, env: dict[str, str]) -> list[tuple[str, float]]:
    """CPU-seconds of each step nvcc runs for `cmd` (its --dryrun list, run one at a time)."""
    listing = subprocess.run(["bash", "-c", cmd + " --dryrun"], cwd=cwd, env=env, capture_output=True, text=True)
    steps, lines = [], [ln[3:] for ln in (listing.stdout + listing.stderr).splitlines() if ln.startswith("#$ ")]
    prelude = []
    for line in lines:
        name = line.split("=", 1)[0]
        if "=" in line and name.isidentifier() and " " not in name:  # nvcc's own variables
            prelude.append(f"export {line}")
            continue
        tool = os.path.basename(shlex.split(line)[0].replace('"', "")) if line.strip() else "?"
        label = {"gcc": "host compile" if " -c " in line else "preprocess"}.get(tool, tool)
        if tool in ("rm",):
            continue
        steps.append((f"  cuda.cu: {label}", round(_cpu_of("\n".join(prelude + [line]), cwd, env), 2)))
    return steps


def breakdown(build_dir: Path, env: dict[str, str]) -> list[tuple[str, float]]:
    """(step, CPU-seconds) of the build's ninja commands run again one at a time; nvcc by step."""
    ext_dirs = [d for d in (build_dir / "torch_extensions").iterdir() if (d / "build.ninja").exists()]
    if not ext_dirs:
        return []
    ext = ext_dirs[0]
    commands = subprocess.run(["ninja", "-t", "commands"], cwd=ext, capture_output=True, text=True).stdout.splitlines()
    steps = []
    for cmd in commands:
        is_nvcc = "nvcc" in shlex.split(cmd)[0]
        target = "link" if " -shared " in f" {cmd} " else ("cuda.cu" if is_nvcc else "main.cpp")
        steps.append((target, round(_cpu_of(cmd, ext, env), 2)))
        if is_nvcc:
            steps += _nvcc_phases(cmd, ext, env)
    return steps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kinds", default=",".join(DEFAULT_KINDS), help=f"of {', '.join(DEFAULT_KINDS)}")
    parser.add_argument("--passes", default=",".join(PASSES))
    parser.add_argument("--arch", default=None, help="TORCH_CUDA_ARCH_LIST (default: this GPU's, else 9.0)")
    parser.add_argument("--emulate-cuda", action="store_true", help="build CUDA candidates with a torch that has no CUDA")
    parser.add_argument("--breakdown", action="store_true", help="where each build's CPU-seconds go")
    parser.add_argument("--work", default=None, help="scratch directory (default: a new temporary one)")
    parser.add_argument("--out", default=None, help="write the figures as JSON")
    args = parser.parse_args()

    import torch

    has_cuda = torch.version.cuda is not None
    if args.emulate_cuda and not has_cuda:
        os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT / "bench" / "cudaemu"), os.environ.get("PYTHONPATH", "")])
        os.environ.setdefault("NVCC_APPEND_FLAGS", "-DC10_USING_CUSTOM_GENERATED_MACROS")  # for --breakdown's reruns
    if args.arch is None:
        args.arch = (".".join(map(str, torch.cuda.get_device_capability())) if torch.cuda.is_available() else "9.0")
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    if not has_cuda and not args.emulate_cuda:
        kinds = [k for k in kinds if k == "cpp"]
        print("torch has no CUDA here: C++ candidates only (--emulate-cuda builds the CUDA ones too)")
    work = Path(args.work or tempfile.mkdtemp(prefix="kbv-builds-"))
    passes = [p.strip() for p in args.passes.split(",") if p.strip()]
    rows: list[dict[str, Any]] = []
    salt = int(time.time())
    caches = {"before": work / "cache-before", "after-cold": work / "cache-after", "after": work / "cache-after"}
    if "after-cold" in passes:  # first: it makes the precompiled headers that `after` uses
        rows += run_pass("after-cold", candidates(kinds, salt), caches["after-cold"], args)
    # before and after alternate candidate by candidate, so that both see the machine alike
    for i in range(len(candidates(kinds, 0))):
        for k, name in enumerate(p for p in ("before", "after") if p in passes):
            cand = candidates(kinds, salt + 1000 * (k + 1))[i]  # a salt of its own in each pass
            rows += run_pass(name, [cand], caches[name], args, index=i)
    steps = {}
    if args.breakdown:
        from kbv.settings import Settings

        for row in rows:
            if row["pass"] in ("before", "after") and row["status"] in ("built", "compile_error"):
                env = dict(os.environ)
                # as a build child's: kbv importable (for the compiler wrapper) from any directory
                env["PYTHONPATH"] = os.pathsep.join(str(Path(x).resolve()) for x in
                                                    [str(ROOT / "src")] + env.get("PYTHONPATH", "").split(os.pathsep) if x)
                if row["pass"] == "after":
                    env.update(Settings(device="cpu", run_dir=work, cache_dir=work / "cache-after").compile_env())
                steps[(row["pass"], row["candidate"])] = breakdown(Path(row["build_dir"]), env)
    report(rows, steps, work)
    if args.out:
        Path(args.out).write_text(json.dumps({"rows": rows, "breakdown": {f"{p}|{c}": s for (p, c), s in steps.items()},
                                              "arch": args.arch, "torch": torch.__version__}, indent=1))
    return 0


def report(rows: list[dict[str, Any]], steps: dict[tuple[str, str], list[tuple[str, float]]], work: Path) -> None:
    by = {(r["pass"], r["candidate"]): r for r in rows}
    names = list(dict.fromkeys(r["candidate"] for r in rows))
    print(f"\n{'candidate':34s} {'kind':17s} {'before':>8s} {'after':>8s} {'ratio':>6s} {'after-cold':>10s}   (CPU-s)")
    total = {p: 0.0 for p in PASSES}
    for name in names:
        cells = {p: by.get((p, name)) for p in PASSES}
        for p, r in cells.items():
            total[p] += r["cpu_s"] if r else 0.0
        b, a, c = (cells[p]["cpu_s"] if cells[p] else None for p in ("before", "after", "after-cold"))
        ratio = f"{a / b:.2f}" if a and b else "-"
        kind = next(r["kind"] for r in cells.values() if r)
        print(f"{name:34s} {kind:17s} {_f(b):>8s} {_f(a):>8s} {ratio:>6s} {_f(c):>10s}")
    ratio = f"{total['after'] / total['before']:.2f}" if total["before"] and total["after"] else "-"
    print(f"{'all':34s} {'':17s} {total['before']:8.1f} {total['after']:8.1f} {ratio:>6s} {total['after-cold']:10.1f}")
    pch = work / "cache-after" / "pch"
    variants = [d for d in pch.iterdir() if (d / "ok").exists()] if pch.exists() else []
    if variants:
        sizes = [(d / "torch" / "extension.h.gch").stat().st_size / 2**30 for d in variants]
        print(f"precompiled headers: {len(variants)} variant(s), {sum(sizes):.2f} GiB on disk; made once per "
              f"toolchain and flag set, in the after-cold pass ({total['after-cold'] - total['after']:.0f} CPU-s more)")
    failed = [r for r in rows if r["status"] != "built"]
    for r in failed:
        print(f"  note: {r['pass']} {r['candidate']}: {r['status']}: {r.get('message', '')[:160]}")
    for (p, name), parts in steps.items():
        print(f"\nwhere the CPU-seconds of {name} ({p}) go, run again one step at a time:")
        for step, cpu in parts:
            print(f"  {step:40s} {cpu:8.2f}")


def _f(x: float | None) -> str:
    return f"{x:.1f}" if x is not None else "-"


if __name__ == "__main__":
    sys.exit(main())
