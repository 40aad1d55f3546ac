"""KernelBench's own soundness: `kbv problems check` over KernelBench's level 1-3 problems, on the GPU.

For each problem: can a trivial candidate (identity, zeros, ones, the mean, uninitialised memory, the
reference at another input) pass the whole verified protocol, does the output ignore an input, is the
reference nondeterministic? Each problem runs in a process of its own (`--workers` at a time, with a
per-problem time limit), so one that is too large for the device, or hangs, gets its line and the
run goes on. The screens share the device's memory by their inputs' and weights' size (read from a
draw on the meta device), smallest first; one of unknown size runs alone. Prints a table of the flagged problems and the counts; writes one JSON line a problem.

    PYTHONPATH=src python3 bench/kernelbench_soundness.py PROBLEMS_DIR --device cuda --workers 6 --out ks.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def check_one(path: str, level: int | None, device: str, seed: int) -> dict[str, Any]:
    """The soundness report of one problem file (in this process)."""
    import torch

    from kbv.detect.soundness import check_problem
    from kbv.errors import KbvError, UnsoundProblemError
    from kbv.problems import load_problem_file, out_of_memory
    from kbv.protocols.verified.prepare import prepare_trials
    from kbv.protocols.verified.rules import PROTOCOL_VERSION, VerifiedProtocol

    t0 = time.monotonic()
    record: dict[str, Any] = {"file": path, "level": level, "protocol": PROTOCOL_VERSION}
    try:
        problem = load_problem_file(Path(path), level)
        record["problem"] = problem.key
        prepared = prepare_trials(problem, VerifiedProtocol(), torch.device(device), seed.to_bytes(16, "big"),
                                  sensitivity=True)
        report = check_problem(prepared, VerifiedProtocol())
        record.update(flags=list(report.flags), notes=list(report.notes), calibration=report.calibration,
                      calibration_notes=report.calibration_notes, drawn=list(report.drawn),
                      outcome="unsound" if report.unjudgeable else "flagged" if report.flags else "sound")
    except Exception as exc:
        if out_of_memory(exc):  # PyTorch's or the driver's: too large for the device
            record.update(outcome="too large", reason=f"out of device memory: {str(exc).splitlines()[0][:160]}")
        elif isinstance(exc, UnsoundProblemError):  # no input distribution applies: nothing to judge
            record.update(outcome="unsound", flags=[str(exc).split(": ", 1)[-1][:300]], notes=[])
        elif isinstance(exc, KbvError):  # the problem's own code failed
            record.update(outcome="cannot run", reason=str(exc)[:300])
        else:
            raise
    record["seconds"] = round(time.monotonic() - t0, 2)
    return record


GIB = 1 << 30


def footprint_bytes(path: Path) -> int | None:
    """The bytes of one set of the problem's inputs and its model's parameters and buffers, from a
    draw on the meta device (nothing is allocated); None when that cannot be known (a problem that
    moves its inputs to a device itself, say)."""
    import torch

    from kbv.inputs import tensor_bytes
    from kbv.problems import instantiate_problem, load_problem_file

    try:
        module = instantiate_problem(load_problem_file(path, _level(path)))
        with torch.device("meta"):
            init = list(module.get_init_inputs())
            inputs = list(module.get_inputs())
            model = module.Model(*init)
        weights = [*model.parameters(), *model.buffers()] if isinstance(model, torch.nn.Module) else []
        return tensor_bytes([*inputs, *weights])
    except Exception:  # noqa: BLE001 - any failure here only means "unknown": the problem runs alone
        return None


def device_capacity(device: str) -> int:
    """The bytes the screens may take together: 90% of the device's free memory (of the host's
    available memory on CPU)."""
    if device.startswith("cuda"):
        import torch

        free, _ = torch.cuda.mem_get_info()
        return int(free * 0.9)
    return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") * 0.9)


def memory_need(nbytes: int | None, capacity: int) -> int:
    """The memory one screen is given: its inputs and weights in fp32 and in float64 (the truth),
    with their outputs, a few times over (the trials, the trivial candidates), plus a context; all
    of the device when the footprint is unknown or larger."""
    if nbytes is None:
        return capacity
    return min(capacity, 8 * nbytes + 2 * GIB)


def _level(path: Path) -> int | None:
    name = path.parent.name.lower().removeprefix("level").removeprefix("_")
    return int(name) if name.isdigit() else None


def run_all(files: list[Path], args: argparse.Namespace, kept: Sequence[dict[str, Any]] = ()) -> list[dict[str, Any]]:
    """Screen `files`; `kept` (an earlier run's records) are written to `--out` first, so that a run
    cut short loses nothing of them."""
    from kbv.protocols.verified.rules import PROTOCOL_VERSION

    lock = threading.Lock()
    records: list[dict[str, Any]] = []
    out = open(args.out, "w", encoding="utf-8") if args.out else None
    if out:
        out.writelines(json.dumps(r) + "\n" for r in kept)
        out.flush()
    deadline = time.monotonic() + args.budget

    def one(path: Path) -> None:
        left = deadline - time.monotonic()
        if left < 5:
            rec = {"file": str(path), "outcome": "not run", "reason": "the run's time budget was spent"}
        else:
            cmd = [sys.executable, __file__, "--one", str(path), "--device", args.device, "--seed", str(args.seed)]
            try:
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=min(args.timeout, left))
                line = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
                said = (done.stderr.strip().splitlines() or [""])[-1][:300]
                rec = json.loads(line) if line.startswith("{") else {
                    "file": str(path), "outcome": "crashed",
                    "reason": f"exit code {done.returncode}" + (f": {said}" if said else
                                                               " (killed: out of host memory?)" * (done.returncode < 0))}
            except subprocess.TimeoutExpired:
                rec = {"file": str(path), "outcome": "timed out", "reason": f"no answer within {args.timeout:.0f} s"}
        rec.setdefault("problem", f"L{_level(path)}/{path.stem}")
        rec.setdefault("protocol", PROTOCOL_VERSION)  # a timeout or a crash of these rules, not of older ones
        with lock:
            records.append(rec)
            if out:
                out.write(json.dumps(rec) + "\n")
                out.flush()
            print(f"[{len(records)}/{len(files)}] {rec['problem']:60s} {rec['outcome']:11s} "
                  f"{'; '.join(rec.get('flags', [])) or rec.get('reason', '')}"[:220], flush=True)

    # memory-aware: smallest first (the most problems inside a time budget); each screen waits for
    # its memory, so big ones do not run each other out of device memory, and a smaller one that
    # fits goes ahead of a big one that waits
    capacity = device_capacity(args.device)
    need = {f: memory_need(footprint_bytes(f), capacity) for f in files}
    pending = sorted(files, key=lambda f: need[f])
    free = capacity
    with ThreadPoolExecutor(max_workers=args.workers) as pool:
        running: dict[Future[None], Path] = {}
        while pending or running:
            for f in list(pending):
                if len(running) >= args.workers:
                    break
                if need[f] <= free or not running:
                    pending.remove(f)
                    free -= need[f]
                    running[pool.submit(one, f)] = f
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for fut in done:
                free += need[running.pop(fut)]
                fut.result()
    # a problem that ran out of device memory beside others is tried again alone, while time remains
    crowded = [r for r in records if r["outcome"] == "too large"] if args.workers > 1 else []
    for rec in crowded:
        records.remove(rec)
        one(Path(rec["file"]))
    if out:
        out.close()
    return records


def print_table(records: list[dict[str, Any]]) -> None:
    order = sorted(records, key=lambda r: r["problem"])
    print("\nFlagged problems (a flag: a trivial candidate passes every distribution, an input is ignored, "
          "or the reference is nondeterministic):")
    for r in order:
        if r["outcome"] in ("unsound", "flagged"):
            print(f"  {r['problem']:60s} {'; '.join(r['flags'])}")
    print("\nProblems not screened:")
    for r in order:
        if r["outcome"] not in ("sound", "unsound", "flagged"):
            print(f"  {r['problem']:60s} {r['outcome']}: {r.get('reason', '')}"[:200])
    kinds = {"trivial": "passes on every distribution", "ignores an input": "does not depend on input",
             "nondeterministic": "nondeterministic", "other inputs": "output at other inputs passes"}
    print("\nCounts:")
    for outcome in ("sound", "flagged", "unsound", "too large", "timed out", "cannot run", "crashed", "not run"):
        print(f"  {outcome:12s} {sum(1 for r in records if r['outcome'] == outcome)}")
    for label, needle in kinds.items():
        print(f"  flag {label:18s} {sum(1 for r in records if any(needle in f for f in r.get('flags', [])))}")


def write_markdown(records: list[dict[str, Any]], path: Path, command: str, device: str) -> None:
    """The soundness table as a page: per problem, sound or flagged and why (or why not screened)."""
    order = sorted(records, key=lambda r: (_level_of(r["problem"]), _id_of(r["problem"]), r["problem"]))
    counts = {o: sum(1 for r in records if r["outcome"] == o) for o in dict.fromkeys(r["outcome"] for r in order)}
    lines = ["# KernelBench's problems under kbv's soundness screen", "",
             "Each of KernelBench's level 1-3 problems (v0.1 sizes) through `kbv problems check`, with the "
             "parameters that a problem initialises to a constant drawn per weight seed (GroupNorm's and "
             "BatchNorm's affine, zeroed biases: the `drawn` column). A problem is `unsound` when a trivial "
             "candidate (identity, zeros, ones, the output's mean, uninitialised memory, the reference at another "
             "input) passes every input distribution that judges anything, when no distribution gives an output "
             "worth computing or judges anything (the baseline's own error comparable to the output), or when its "
             "reference is nondeterministic: every candidate's verified verdict is then `unsound_problem`. It is "
             "`flagged` when its output ignores an input (still judged). What passes on some distributions only "
             "is a note.", "",
             f"Regenerate (on {device}): `{command}`", "",
             *_sweep_paragraph(records),
             "Counts: " + ", ".join(f"{n} {o}" for o, n in counts.items()), "",
             "| problem | outcome | by | drawn | why |", "| --- | --- | --- | --- | --- |"]
    for r in order:
        why = "; ".join(r.get("flags", [])) if r["outcome"] in FINAL else r.get("reason", "")
        notes = "; ".join(r.get("notes", []))
        if r["outcome"] == "sound" and notes:
            why = f"notes: {notes}"
        drawn = ", ".join(r.get("drawn", [])) or "-"
        by = "sweep" if r.get("source") == "sweep" else "check" if r["outcome"] != "not run" else "-"
        lines.append(f"| {r['problem']} | {r['outcome']} | {by} | {drawn.replace('|', '/')[:200]} "
                     f"| {why.replace('|', '/')[:400]} |")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def _sweep_paragraph(records: list[dict[str, Any]]) -> list[str]:
    """What the page owes a reader about the rows made from the KernelBench sweep (none: nothing)."""
    swept = [r for r in records if r.get("source") == "sweep" and r["outcome"] != "not run"]
    if not swept:
        return []
    devices = ", ".join(f"{d} ({n} rows)" for d, n in Counter(r.get("device") or "?" for r in swept).items())
    protocols = ", ".join(sorted({r.get("protocol") or "a protocol these rows do not record" for r in swept}))
    return [f"{len(swept)} rows (`by` sweep) come from the KernelBench identity sweep (docs/kernelbench_sweep.md), "
            f"made on {devices} under {protocols}: the verified protocol runs this screen while preparing each "
            "problem, less the per-input sensitivity test (so an ignored input is not flagged there), and the "
            "identity's verdict says what it found (`no_custom_kernel`: sound; `unsound_problem`: unsound; a "
            "refusal: too large for that card). Rows `by` check ran `kbv problems check` under these rules. "
            "Render the page from both without a device: `PYTHONPATH=src python3 bench/kernelbench_soundness.py "
            "--render-only --from-sweep docs/kernelbench_sweep.json --resume docs/kernelbench_soundness.jsonl "
            f"--markdown docs/kernelbench_soundness.md --device \"{swept[0].get('device') or 'cuda'}\"`", ""]


def _level_of(key: str) -> int:
    head = key.split("/", 1)[0].removeprefix("L")
    return int(head) if head.isdigit() else 0


def _id_of(key: str) -> int:
    head = key.split("/", 1)[-1].split("_", 1)[0]
    return int(head) if head.isdigit() else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("problems", nargs="?", default="../shared/kernelbench")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per problem")
    ap.add_argument("--budget", type=float, default=1e9, help="seconds for the whole run")
    ap.add_argument("--only", default="", help="comma-separated substrings of file names")
    ap.add_argument("--out", default=None)
    ap.add_argument("--resume", default=None,
                    help="an earlier --out: its problems that were screened (sound, unsound, cannot run) are "
                         "kept, the rest run again")
    ap.add_argument("--markdown", default=None, help="write the per-problem table as a Markdown page here")
    ap.add_argument("--render-only", action="store_true",
                    help="with --markdown and --resume or --from-sweep: write the page from them, screen nothing")
    ap.add_argument("--from-sweep", default=None, metavar="SWEEP_JSON",
                    help="bench/kernelbench_sweep.py's JSON: its verified identity verdicts say what the "
                         "protocol's own screen found, for the problems no screen here covers")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        path = Path(args.one)
        print(json.dumps(check_one(str(path), _level(path), args.device, args.seed)))
        return 0
    sweep: dict[str, dict[str, Any]] = {}
    if args.from_sweep:
        try:
            sweep = from_sweep(Path(args.from_sweep))
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            print(f"error: --from-sweep {args.from_sweep}: not a sweep's JSON ({exc})", file=sys.stderr)
            return 2
    if args.render_only:
        if not ((args.resume or args.from_sweep) and args.markdown):
            print("error: --render-only needs --markdown FILE and --resume JSONL or --from-sweep JSON", file=sys.stderr)
            return 2
        if args.resume and not Path(args.resume).is_file():
            print(f"error: {args.resume} is not a file of screened problems", file=sys.stderr)
            return 2
        every = merged(last_records(Path(args.resume)) if args.resume else {}, sweep)
        print_table(every)
        write_markdown(every, Path(args.markdown), _command(args), _device_name(args.device))
        return 0
    root = Path(args.problems)
    if not root.is_dir():
        print(f"error: {root} is not a directory of KernelBench problems", file=sys.stderr)
        return 2
    files = sorted(p for p in root.rglob("*.py") if p.parent.name.lower().startswith("level"))
    if args.only:
        files = [f for f in files if any(s in f.name for s in args.only.split(","))]
    keys = {f"L{_level(f)}/{f.stem}" for f in files}
    kept = {k: r for k, r in screened(Path(args.resume)).items() if k in keys} if args.resume else {}
    files = [f for f in files if f"L{_level(f)}/{f.stem}" not in kept]
    if kept:
        print(f"{len(kept)} problems screened by {args.resume} are kept; {len(files)} to screen", flush=True)
    records = run_all(files, args, list(kept.values()))
    every = merged({r["problem"]: r for r in [*kept.values(), *records]}, sweep)
    print_table(every)
    if args.markdown:
        write_markdown(every, Path(args.markdown), _command(args), _device_name(args.device))
    return 0


def _command(args: argparse.Namespace) -> str:
    """The command that regenerates the page, without this machine's paths."""
    return (f"PYTHONPATH=src python3 bench/kernelbench_soundness.py KERNELBENCH_DIR --device cuda "
            f"--workers {args.workers} --timeout {args.timeout:g} --out kb-soundness.jsonl "
            f"--markdown docs/kernelbench_soundness.md [--resume kb-soundness.jsonl]")


def _device_name(device: str) -> str:
    """The GPU's name (a device, e.g. cuda), or `device` itself where it names one (--render-only
    on another machine: --device "NVIDIA H200")."""
    if device.startswith("cuda"):
        import torch

        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else device
    return "a CPU" if device == "cpu" else device


FINAL = ("sound", "flagged", "unsound", "cannot run")  # outcomes a rerun would not change


def screened(path: Path) -> dict[str, dict[str, Any]]:
    """Problem key -> its last record in an earlier run's JSONL, for those with a final outcome under
    this protocol's rules (a record of other rules is screened again)."""
    from kbv.protocols.verified.rules import PROTOCOL_VERSION

    return {k: r for k, r in last_records(path).items()
            if r["outcome"] in FINAL and r.get("protocol") == PROTOCOL_VERSION}


# the protocol of sweep rows written before the sweep recorded it (2026-12-07): the sweep began after
# kbv-verified-1.6, and 1.7 changed nothing of the screen, so they are 1.7's; a later protocol leaves them
SWEEP_ROWS_BEFORE_THE_FIELD = "kbv-verified-1.7"
SCREENED = ("sound", "flagged", "unsound")  # what a screen found: the outcomes that stand over a sweep's


def from_sweep(path: Path) -> dict[str, dict[str, Any]]:
    """Problem key -> a record made from a row of `bench/kernelbench_sweep.py`'s JSON: the verified
    protocol screens every problem while preparing it (the trivial battery, determinism, the output at
    other inputs), so the sweep's identity verdict says what the screen found, without the per-input
    sensitivity test that only `kbv problems check` runs (so never `flagged` for an ignored input).
    `no_custom_kernel` is sound (its screen flags, if any, kept), `unsound_problem` unsound, a refusal
    too large for the device that made it; a row not judged yet, or judged under other rules, is not
    run. Raises ValueError on a file that is not a sweep's."""
    from kbv.protocols.verified.rules import PROTOCOL_VERSION

    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
        raise ValueError("no list of rows")
    out: dict[str, dict[str, Any]] = {}
    for row in data["rows"]:
        if not isinstance(row, dict) or not isinstance(row.get("problem"), str):
            raise ValueError(f"a row that names no problem: {str(row)[:80]}")
        ver = row.get("verified") if isinstance(row.get("verified"), dict) else {}
        status, device = ver.get("status"), str(row.get("device") or "")
        protocol = str(ver.get("protocol") or SWEEP_ROWS_BEFORE_THE_FIELD).split("+")[0]  # 1.7+tf32: the policy
        record: dict[str, Any] = {"problem": row["problem"], "source": "sweep", "device": device,
                                  "protocol": protocol, "flags": [], "notes": [], "drawn": []}
        if status == "no_custom_kernel":
            flags = [str(f) for f in ver.get("flags") or []]
            record.update(outcome="flagged" if flags else "sound", flags=flags,
                          notes=[str(n) for n in ver.get("problem_notes") or []])
        elif status == "unsound_problem":
            record.update(outcome="unsound", flags=[str(ver.get("message", ""))[:300]])
        elif row.get("outcome") == "refused":
            record.update(outcome="too large", reason=f"{row.get('why', '')} ({device})"[:400])
        else:
            record.update(outcome="not run", reason=str(row.get("why") or f"verified {status or 'missing'}"))
        if protocol != PROTOCOL_VERSION and record["outcome"] != "not run":
            record.update(outcome="not run", flags=[], notes=[],
                          reason=f"swept under {protocol} only ({record['outcome']})")
        out[row["problem"]] = record
    return out


def merged(screens: dict[str, dict[str, Any]], sweep: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One record a problem. A check's record of other rules (or of none: a record its parent wrote
    before records named their rules) is no verdict of these: not run, saying what it was. Then what a
    check under these rules screened (it ran the sensitivity test too), else what the sweep found, else
    the check's other outcomes (too large, timed out, crashed), else why neither ran."""
    from kbv.protocols.verified.rules import PROTOCOL_VERSION

    out: dict[str, dict[str, Any]] = {}
    for key in dict.fromkeys([*screens, *sweep]):
        check, swept = screens.get(key), sweep.get(key)
        if check is not None and check["outcome"] != "not run" and check.get("protocol") != PROTOCOL_VERSION:
            check = {**check, "outcome": "not run", "flags": [], "notes": [],
                     "reason": f"screened under {check.get('protocol') or 'older rules'} only ({check['outcome']})"}
        if check is not None and check["outcome"] in SCREENED:
            out[key] = check
        elif swept is not None and swept["outcome"] != "not run":
            out[key] = swept
        elif check is not None and check["outcome"] != "not run":
            out[key] = check
        else:
            reasons = [r["reason"] for r in (swept, check) if r is not None and r.get("reason")]
            out[key] = {**(swept or check or {}), "outcome": "not run", "reason": "; ".join(reasons)}
    return list(out.values())


def last_records(path: Path) -> dict[str, dict[str, Any]]:
    """Problem key -> its last record in an earlier run's JSONL."""
    last: dict[str, dict[str, Any]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:  # a blank line, or the last one of a run that was killed
            continue
        if isinstance(rec, dict) and "problem" in rec:
            last[rec["problem"]] = rec
    return last


if __name__ == "__main__":
    sys.exit(main())
