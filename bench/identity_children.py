"""Where an identity's time goes: the same Model timed in children that went through different
histories, side by side, round by round (bench for issue 37's identities under 1.00 on a GPU).

Each child is a real kbv child (the sandbox a run uses), loaded as the reference (`ref...`, the
problem's code at TF32, as a baseline is made) or as a candidate file (`cand...`, ModelNew = Model),
then taken through some of what a candidate goes through before it is timed: `forward` (a
correctness call), `checked` (correctness's trials as they run: each twice over poisoned memory, the
first checked), `memory` (the memory measurement), `attribution` (the profiler and the ghost
replay); then every child warms up as a profiled one, as the timer has it. `ref` and `ref2` are
alike (the control: what two alike children differ by); `ref3`, `ref4`... are more of them. A name
with `@noaslr` after it is that child with address-space layout randomisation off: where alike
children differ by their own layout, `ref2@noaslr`... agree with `ref@noaslr` and `ref2`... do not
agree with `ref`. `@hash0` is that child with Python's string hashing fixed (PYTHONHASHSEED=0, where
each child otherwise draws its own seed, and with it its dicts' layout and probe chains). `@moved` is
that child with its buffers placed again before each of its blocks: the pool handed over anew behind 0
to 4 extra copies of its sets (which it times as well: the same work), then the model loaded again (its
weights allocated while the last ones are still held, so that with the caching allocator's exact-size
reuse they most likely swap between two places, where the pool's sets move among several). Suffixes
combine in any order (`ref2@moved@noaslr`). Where alike children differ by where their buffers sit on
the device, `@moved` children agree with each other more than fixed ones do (each samples several
placements), and their rounds spread more than a fixed child's (2026-12-06-f:
layout randomisation and string hashing ruled out, the spread in the device stream's own time). A GPU
question: on this CPU box a `@moved` child's calls come out up to twice as slow as a fixed child's (its
host memory mapped anew each time), which says nothing about a device's caching allocator:

    PYTHONPATH=src python3 bench/identity_children.py --device cuda --only L1/2_ReLU,L1/6_Softmax \
        --children ref,ref2,ref3,ref4,ref@noaslr,ref2@noaslr,ref3@noaslr,ref4@noaslr,ref@hash0,ref2@hash0

Then every child times blocks of calls on the same pool, in turn, for `--rounds` rounds, each block
followed by the window's own costs probed in that child. Per child: the median whole window
(begin -> done, nothing taken out), the call's own stream (begin -> end), the host's time, the
probed launch and synchronise, `ref`'s whole window over its own, the slowest round's median over
the quickest's (`rounds`), and the device's SM clock read through NVML just after each block (`MHz`: its
median and its least; the JSON keeps each round's median and the clock before and after each block).
The rounds of every child spread about 2x on an H100 (2026-12-06-g), `@moved` or not, with nothing here
warming the clocks: `--warm-blocks` warms them before every block as the timer does before its window,
so that a child's spread from the clock falling on a launch-bound, mostly idle device shows as the
difference between a run with it and one without. With `--timer`, each child is
then timed against `ref` by the verified protocol's own timer (`measure_speed`: ABBA blocks, the
window's costs taken out), its rechecks off, copied out only, or made on the device, with nothing else
of a run around it: where these come out at
1.00 and a run's identities do not, what differs is the run around the timer. `--cpus lane` (the
default) places the children and this process as a run's lane does (`kbv.placement`: the children on
one CPU of the lane, the driving thread on the other); `--cpus none` leaves them where they start.
Prints a table; `--out` writes JSON.

    PYTHONPATH=src python3 bench/identity_children.py --device cuda --problems smoke --only L1/2_ReLU,L1/6_Softmax
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch

import kbv.sandbox.parent as sandbox_parent
from kbv.clocks import sm_reader, warm_clocks
from kbv.placement import current_plan, enter_lane_thread
from kbv.problems import find_problem, instantiate_problem, load_problems
from kbv.protocols.verified.rules import SENTINEL
from kbv.protocols.verified.timer import load_pool
from kbv.sandbox import ChildSpec, Sandbox

CALL_S = 300.0
CHECKED_TRIALS = 10  # the verified protocol's hidden trials (5 distributions x 2)


def _spec(root: Path, name: str, device: str, cpus: tuple[int, ...] = (),
          env: tuple[tuple[str, str], ...] = ()) -> ChildSpec:
    (root / name).mkdir(parents=True, exist_ok=True)
    return ChildSpec(work_dir=root / name / "work", build_dir=root / name / "build", device=device,
                     parent_device=device if device.startswith("cuda") else None, cpus=cpus, extra_env=env)


def _inputs(module: Any, seed: int, device: torch.device) -> list[Any]:
    torch.manual_seed(seed)
    return [x.to(device) if isinstance(x, torch.Tensor) else x for x in module.get_inputs()]


def _forward(sb: Sandbox, inputs: list[Any], like: list[torch.Tensor], **flags: Any) -> None:
    refs = sb.put(inputs, CALL_S)
    fields, receipt = sb.expect(like)
    reply = sb.call({"op": "forward", "inputs": refs, **fields, **flags}, CALL_S)
    sb.take(reply, receipt, CALL_S)


def _checked(sb: Sandbox, module: Any, device: torch.device, like: list[torch.Tensor]) -> None:
    """What the verified protocol's correctness does to a candidate's child: each trial run twice
    over differently poisoned memory (the allocator's cache grown and filled), the first run checked
    and its inputs and outputs kept (`kbv.protocols.verified.correctness._run_trial`)."""
    for k in range(CHECKED_TRIALS):
        inputs = _inputs(module, 300 + k, device)
        _forward(sb, inputs, like, poison=float("nan"), checks=True, keep=True)
        _forward(sb, inputs, like, poison=SENTINEL)


def _attribution(sb: Sandbox, sets: list[list[Any]], like: list[torch.Tensor]) -> None:
    refs = iter(sb.put([x for s in sets for x in s], CALL_S))
    take = [[next(refs) for _ in s] for s in sets]
    fields, receipt = sb.expect(like)
    reply = sb.call({"op": "attribution", "warm_inputs": take[0], "inputs": take[1], "ghost_inputs": take[2],
                     "ghost_outputs": fields}, CALL_S)
    if reply.get("ghost") == "ran":
        sb.take({**reply, "copied": reply.get("ghost_copied")}, receipt, CALL_S)


HISTORIES = {  # child -> (source, the steps it goes through before its warm-up)
    "ref": ("reference", ("memory",)),
    "ref2": ("reference", ("memory",)),
    "ref+attr": ("reference", ("memory", "attribution")),
    "cand-bare": ("candidate", ()),
    "cand-fwd": ("candidate", ("forward",)),
    "cand-fwd-mem": ("candidate", ("forward", "memory")),
    "cand-checked": ("candidate", ("checked",)),  # correctness's poisoned, checked runs alone
    "cand": ("candidate", ("forward", "memory", "attribution")),
}


NO_ASLR = "@noaslr"  # a child name's suffix: it runs with address-space layout randomisation off
HASH0 = "@hash0"  # a child name's suffix: its Python hashes strings with seed 0 (PYTHONHASHSEED)
MOVED = "@moved"  # a child name's suffix: its pool and model placed again before each block (`place_again`)
SUFFIXES = (NO_ASLR, HASH0, MOVED)


def modifiers(name: str) -> tuple[str, set[str]]:
    """A child's name split into its base and its suffixes (SUFFIXES, in any order)."""
    found: set[str] = set()
    while True:
        for suffix in SUFFIXES:
            if name.endswith(suffix) and suffix not in found:
                found.add(suffix)
                name = name.removesuffix(suffix)
                break
        else:
            return name, found


def history(name: str) -> tuple[str, tuple[str, ...]]:
    """A child's (source, steps): HISTORIES' own, `refN` (N > 2) one more alike reference child, and
    either with any of SUFFIXES after it. Raises KeyError for any other name."""
    base, _ = modifiers(name)
    if re.fullmatch(r"ref[3-9]|ref[1-9][0-9]", base):
        return HISTORIES["ref"]
    return HISTORIES[base]


def _known(name: str) -> bool:
    try:
        history(name)
    except KeyError:
        return False
    return True


def make_children(children: dict[str, Sandbox], problem: Any, root: Path, device: str, pool: list[list[Any]],
                  module: Any, like: list[torch.Tensor], init: list[Any], names: list[str],
                  cpus: tuple[int, ...] = ()) -> dict[str, dict[str, Any]]:
    """Start `names`' children into `children` (the caller closes them, whatever happens); returns each
    child's load command."""
    loads: dict[str, dict[str, Any]] = {}
    identity = re.sub(r"\bModel\b", "ModelNew", problem.code)
    dev = torch.device(device)
    for name in names:
        source, steps = history(name)
        mods = modifiers(name)[1]
        env = (("PYTHONHASHSEED", "0"),) if HASH0 in mods else ()
        sb = Sandbox(_spec(root, name, device, cpus, env), label=name)
        children[name] = sb
        sandbox_parent.CHILD_ASLR = NO_ASLR not in mods
        try:
            sb.start()
        finally:
            sandbox_parent.CHILD_ASLR = True
        sb.ready(CALL_S)
        if source == "reference":
            loads[name] = {"op": "load", "source": "reference", "code": problem.code, "origin": problem.origin,
                           "init_args": init, "seed": 1, "precision": "tf32"}
        else:
            path = root / name / "build" / f"{problem.name}__identity.py"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(identity)
            loads[name] = {"op": "load", "source": "candidate", "path": str(path), "init_args": init, "seed": 1,
                           "precision": "tf32"}
        sb.call(loads[name], CALL_S)
        if "forward" in steps:
            _forward(sb, _inputs(module, 101, dev), like)
        if "checked" in steps:
            _checked(sb, module, dev, like)
        load_pool(sb, pool, 0, CALL_S)
        if "memory" in steps:
            sb.call({"op": "memory"}, CALL_S)
        if "attribution" in steps:
            _attribution(sb, [_inputs(module, 200 + k, dev) for k in range(3)], like)
        sb.call({"op": "warmup", "ms": 100.0, "profiled": True}, CALL_S)
    return loads


def place_again(sb: Sandbox, pool: list[list[Any]], load: dict[str, Any], rng: random.Random) -> None:
    """A MOVED child's buffers placed again: the pool handed over anew behind 0 to 4 extra copies of its
    own sets (timed as well: the same work on the same inputs), then the model loaded again, its
    weights allocated while the last ones are still held, then a short warm-up as a profiled child."""
    extra = rng.randrange(5)
    load_pool(sb, [pool[k % len(pool)] for k in range(extra)] + pool, 0, CALL_S)
    sb.call(load, CALL_S)
    sb.call({"op": "warmup", "ms": 100.0, "profiled": True}, CALL_S)


def measure(children: dict[str, Sandbox], rounds: int, block: int, pool: list[list[Any]],
            loads: dict[str, dict[str, Any]], seed: int = 0, read_mhz: Callable[[], int] | None = None,
            warm: Callable[[], object] | None = None) -> dict[str, dict[str, Any]]:
    """Each child's medians over `rounds` rounds of a block each, in turn. `read_mhz` (the device's SM
    clock, MHz) is read just before and just after each block; `warm` (kbv.clocks) runs before each."""
    got: dict[str, dict[str, list[float]]] = {n: {"whole": [], "stream": [], "host": [], "launch": [], "sync": [],
                                                  "rounds": [], "mhz_before": [], "mhz_after": []} for n in children}
    names = list(children)
    moved = [n for n in names if MOVED in modifiers(n)[1]]
    pool_len = len(pool)
    rng = random.Random(seed)
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            if name in moved:
                place_again(children[name], pool, loads[name], rng)
            g = got[name]
            if warm is not None:
                warm()
            if read_mhz is not None:
                g["mhz_before"].append(read_mhz())
            reply = children[name].call({"op": "time_block", "start": (r * block) % pool_len, "n": block,
                                         "probe_costs": True}, CALL_S)
            if read_mhz is not None:
                g["mhz_after"].append(read_mhz())
            g["whole"] += [x * 1e3 for x in reply["device_ms"]]
            g["stream"] += [x * 1e3 for x in reply["stream_ms"]]
            g["host"] += [x * 1e3 for x in reply["host_ms"]]
            costs = reply.get("window_costs_ms") or [float("nan"), float("nan")]
            g["launch"].append(costs[0] * 1e3)
            g["sync"].append(costs[1] * 1e3)
            g["rounds"].append(statistics.median(g["whole"][-block:]))
    for name in moved:  # the plain pool again, so that a later --timer's pool indices are the parent's
        load_pool(children[name], pool, 0, CALL_S)
    per_round = ("rounds", "mhz_before", "mhz_after")
    return {n: {k: statistics.median(v) for k, v in g.items() if v and k not in per_round}
               | {"round_spread": max(g["rounds"]) / min(g["rounds"])}
               | {f"{k}_each": [round(x, 1) for x in g[k]] for k in per_round if g[k]}
            for n, g in got.items()}


def clock_said(figures: dict[str, dict[str, Any]]) -> str | None:
    """Whether the clock moves the rounds: the correlation, over every child's blocks, between a block's
    median whole window and the SM clock read just after it (strongly negative: slower blocks ran on a
    lower clock), with the clock's least and greatest reading; None where the clock was not read."""
    pairs = [(t, mhz) for f in figures.values() for t, mhz in zip(f.get("rounds_each", ()), f.get("mhz_after_each", ()))]
    if len(pairs) < 3:
        return None
    clocks = [mhz for _, mhz in pairs]
    if min(clocks) == max(clocks):
        return f"clock {clocks[0]:.0f} MHz after every one of {len(pairs)} blocks: it does not move the rounds"
    r = statistics.correlation([t for t, _ in pairs], clocks)
    return (f"block median vs clock after it: r = {r:+.2f} over {len(pairs)} blocks, "
            f"clock {min(clocks):.0f} to {max(clocks):.0f} MHz")


def timed_pairs(children: dict[str, Sandbox], pool: list[list[Any]], like: list[torch.Tensor], model: Any,
                recheck: str) -> list[dict[str, Any]]:
    """The verified protocol's own timer (`measure_speed`) between these children, nothing else running:
    each candidate-history child and `ref2` against `ref`. `recheck`: "device", the parent makes each
    rechecked output's truth on the device as the protocol does (the reference, float64), between
    blocks; "copy", the outputs are copied out of the candidate's blocks as the protocol does but pass
    unchecked; "none", no output is copied out (`rechecks_per_block=0`)."""
    from kbv.protocols.verified.timer import TimerConfig, measure_speed

    def check(index: int, outputs: list[torch.Tensor]) -> str | None:
        if recheck == "device":
            with torch.no_grad():
                truth = model.double()(*[x.double() if torch.is_tensor(x) and x.is_floating_point() else x
                                         for x in pool[index]])
            truth = truth if isinstance(truth, (list, tuple)) else [truth]
            ok = all(torch.allclose(o.double(), t, atol=5e-2, rtol=5e-2) for o, t in zip(outputs, truth))
            return None if ok else f"pool entry {index} differs"
        return None

    rows = []
    for name in [n for n in children if n != "ref"]:
        config = TimerConfig(rechecks_per_block=0 if recheck == "none" else 1)
        speed = measure_speed(children[name], {"eager-tf32": children["ref"]}, config, len(pool), check,
                              like, time.monotonic() + CALL_S)
        lo, hi = speed.speedup_ci.get("eager-tf32", (float("nan"), float("nan")))
        rows.append({"child": name, "recheck": recheck, "speedup": speed.speedups.get("eager-tf32"),
                     "ci": [lo, hi], "candidate_ms": speed.stats["candidate"].median_ms,
                     "baseline_ms": speed.stats["eager-tf32"].median_ms, "window_costs_ms": speed.window_costs_ms,
                     "too_short": list(speed.too_short), "findings": [why for _, why in speed.findings]})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--problems", default="smoke")
    ap.add_argument("--only", default="L1/2_ReLU,L1/6_Softmax,L3/1_MLP")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--block", type=int, default=10)
    ap.add_argument("--pool", type=int, default=8)
    ap.add_argument("--children", default=",".join(HISTORIES), help="which of: " + ", ".join(HISTORIES))
    ap.add_argument("--timer", default="off",
                    help="then time each child against ref with the verified timer itself (measure_speed), once "
                         "per recheck mode named (comma-separated): none (no output copied out), copy (copied "
                         "out, unchecked), device (checked on the device in the parent, as the protocol does)")
    ap.add_argument("--cpus", default="lane", choices=("lane", "none"),
                    help="lane: the children on one CPU of a lane and this process on the other, as a run "
                         "places them; none: where they start")
    ap.add_argument("--warm-blocks", action="store_true",
                    help="warm the device's clocks (kbv.clocks, as the timer does before its window) before every "
                         "block (off: never): where alike children time apart because the clock falls while "
                         "launch-bound blocks leave the device idle, they agree with it on")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    modes = [m for m in args.timer.split(",") if m and m != "off"]
    if any(m not in ("none", "copy", "device") for m in modes):
        ap.error("--timer: expected off, or some of none, copy, device")
    names = [n for n in args.children.split(",") if n]
    if "ref" not in names or not all(map(_known, names)):
        ap.error(f"--children must name ref and only these: {', '.join(HISTORIES)}, ref3... (more alike "
                 f"reference children), each with any of {NO_ASLR} (that child without address-space "
                 f"layout randomisation), {HASH0} (its string hashing seeded 0) and {MOVED} (its buffers "
                 "placed again before each block) after it, in any order")
    device = args.device if args.device != "cuda" else "cuda:0"
    cpus: tuple[int, ...] = ()
    if args.cpus == "lane":
        plan = current_plan("pin", 1, "cuda")
        if plan.pinned:
            enter_lane_thread(plan, 0)
            cpus = tuple(sorted(plan.child_cpus(0)))
    print(f"children on CPUs {list(cpus) or 'as started'}")
    problems = load_problems(args.problems)
    rows: list[dict[str, Any]] = []
    head = f"{'problem':28s} {'child':18s} {'whole us':>9s} {'stream us':>9s} {'host us':>8s} {'launch':>7s} {'sync':>7s} {'vs ref':>7s} {'rounds':>7s} {'MHz':>11s}"
    print(head)
    print("-" * len(head))
    for key in [k for k in args.only.split(",") if k]:
        problem = find_problem(problems, key)
        module = instantiate_problem(problem)
        dev = torch.device(device)
        pool = [_inputs(module, 1000 + k, dev) for k in range(args.pool)]
        init = list(module.get_init_inputs())
        torch.manual_seed(1)
        model = module.Model(*init).to(dev)
        with torch.no_grad():
            out = model(*pool[0])
        like = [o.detach().to("meta") for o in (out if isinstance(out, (list, tuple)) else [out])]
        del out
        timers: list[dict[str, Any]] = []
        with tempfile.TemporaryDirectory(prefix="kbv-identity-") as tmp:
            children: dict[str, Sandbox] = {}
            try:
                loads = make_children(children, problem, Path(tmp), device, pool, module, like, init, names, cpus)
                with ExitStack() as nvml:
                    reader = sm_reader(device, nvml) if device.startswith("cuda") else None
                    read_mhz = (lambda: reader()[0]) if reader is not None else None
                    warm = (lambda: warm_clocks(device)) if args.warm_blocks else None
                    figures = measure(children, args.rounds, args.block, pool, loads, read_mhz=read_mhz, warm=warm)
                for recheck in modes:
                    timers += timed_pairs(children, pool, like, model, recheck)
            finally:
                for sb in children.values():
                    sb.close()
        ref = figures["ref"]["whole"]
        for name, f in figures.items():
            rows.append({"problem": problem.key, "child": name, "warm_blocks": args.warm_blocks,
                         **{k: v if isinstance(v, list) else round(v, 4 if k == "round_spread" else 2) for k, v in f.items()},
                         "ratio": round(ref / f["whole"], 4)})
            after = f.get("mhz_after_each")  # the clock just after each block: its median, and its least
            mhz = f"{statistics.median(after):5.0f} {min(after):5.0f}" if after else f"{'-':>11s}"
            print(f"{problem.key[:28]:28s} {name:18s} {f['whole']:9.1f} {f['stream']:9.1f} {f['host']:8.1f} "
                  f"{f['launch']:7.1f} {f['sync']:7.1f} {ref / f['whole']:7.3f} {f['round_spread']:7.3f} {mhz}",
                  flush=True)
        said = clock_said(figures)
        if said:
            print(f"{problem.key[:28]:28s} {said}", flush=True)
        for t in timers:
            rows.append({"problem": problem.key, "timer": True, **t})
            print(f"{problem.key[:28]:28s} timer {t['child']:>13s} vs ref, rechecks {t['recheck']:6s}: "
                  f"{t['speedup'] if t['speedup'] is None else round(t['speedup'], 3)} "
                  f"[{t['ci'][0]:.3f}, {t['ci'][1]:.3f}] cand {t['candidate_ms'] * 1e3:.1f} us, "
                  f"ref {t['baseline_ms'] * 1e3:.1f} us {' '.join(t['findings'])[:120]}", flush=True)
        del model
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
