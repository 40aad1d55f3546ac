"""How faithful is the verified timer? Prints a table (GPU; runs on CPU too, where the figures mean less).

(a) repeatability: the reference timed as if it were a candidate against the eager-tf32 baseline
    (true speedup 1.0), twice per problem: the absolute difference of the two speedups;
(b) the eager-tf32 baseline's median under kbv's timer against `triton.testing.do_bench` (median, its
    own L2 flush) in this process on the same problem;
(c) the TF32 effect: a Triton `tl.dot` matmul (TF32 by default) against eager-fp32 and eager-tf32;
(d) the timer's wall time per pair;
(e) what the timed window's own costs are (GPU): the eager-tf32 reference timed in this process by
    kbv's window as it is (the quickest launch and the synchronise's return taken out) and with
    them left in (the window before they were), each against do_bench's median.

    PYTHONPATH=src python3 bench/timing_fidelity.py [--problems full] [--budget 10]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from kbv.api import EvalConfig, evaluate  # noqa: E402
from kbv.distributions import VARIANTS, draw_inputs  # noqa: E402
from kbv.problems import instantiate_problem, load_problems  # noqa: E402
from kbv.precision import precision_policy  # noqa: E402
from kbv.protocols.verified.timer import TimerConfig, load_pool, measure_speed  # noqa: E402
from kbv.sandbox import ChildSpec, Sandbox  # noqa: E402
from kbv.stats import StopRule  # noqa: E402

PROBLEMS = ("L1/1_Matmul", "L1/2_ReLU", "L1/6_Softmax", "L1/8_LayerNorm", "L1/10_Conv2d", "L2/1_Gemm_BiasAdd_ReLU",
            "L3/1_MLP")


def reference_child(root: Path, problem, device: str, name: str) -> Sandbox:
    spec = ChildSpec(work_dir=root / name, build_dir=root / "build", device="cuda:0" if device != "cpu" else "cpu",
                     parent_device="cuda:0" if device != "cpu" else None)
    sb = Sandbox(spec)
    sb.start()
    sb.call({"op": "load", "source": "reference", "code": problem.code, "origin": problem.origin,
             "init_args": list(instantiate_problem(problem).get_init_inputs()), "seed": 1, "precision": "tf32"}, 600)
    return sb


def repeatability(problem, device: str, config: TimerConfig, root: Path) -> dict:
    module = instantiate_problem(problem)
    pool = [draw_inputs(module, VARIANTS["default"][0], 100 + k, torch.device(device)) for k in range(2)]
    l2 = torch.cuda.get_device_properties(0).L2_cache_size if device != "cpu" else 0
    cand, base = reference_child(root, problem, device, "cand"), reference_child(root, problem, device, "base")
    try:
        for sb in (cand, base):
            load_pool(sb, pool, 2 * l2, 600)
        like = [torch.empty(0)]
        runs = [measure_speed(cand, {"eager-tf32": base}, config, len(pool), lambda i, o: None, like,
                              time.monotonic() + 300) for _ in range(2)]
    finally:
        cand.close()
        base.close()
    s = [r.speedups.get("eager-tf32", float("nan")) for r in runs]  # none where too short to time
    return {"problem": problem.key, "base_ms": runs[0].stats["eager-tf32"].median_ms, "s1": s[0], "s2": s[1],
            "diff_pct": abs(s[0] - s[1]) * 100, "timer_s": statistics.mean(r.timer_s for r in runs)}


def do_bench_ms(problem, device: str) -> float | None:
    if device == "cpu":
        return None
    import triton.testing

    module = instantiate_problem(problem)
    torch.manual_seed(1)
    model = module.Model(*module.get_init_inputs()).to(device)
    inputs = draw_inputs(module, VARIANTS["default"][0], 100, torch.device(device))
    with precision_policy("tf32"), torch.no_grad():
        return float(triton.testing.do_bench(lambda: model(*inputs), warmup=200, rep=500, return_mode="median"))


WINDOWS = ("kbv", "costs kept")  # the window as it is; with its own costs left in (the window before)


def window_parts(problem, device: str, calls: int = 200) -> dict | None:
    """Median ms of the reference under each window of WINDOWS, and do_bench's, in this process."""
    if device == "cpu":
        return None
    from kbv.sandbox.timers import Clock, Window, measure_window_costs, time_block

    module = instantiate_problem(problem)
    torch.manual_seed(1)
    model = module.Model(*module.get_init_inputs()).to(device)
    pool = [draw_inputs(module, VARIANTS["default"][0], 200 + k, torch.device(device)) for k in range(2)]
    flush = torch.empty(2 * torch.cuda.get_device_properties(0).L2_cache_size // 4, dtype=torch.int32, device=device)
    clock = Clock(torch.device(device))
    out = {}
    with precision_policy("tf32"), torch.no_grad():
        for args in pool * 5:
            model(*args)
        costs = measure_window_costs(clock)
        out["launch_us"], out["sync_us"] = costs.launch * 1e3, costs.sync * 1e3
        for name, window in zip(WINDOWS, (Window(flush, costs), Window(flush, None))):
            out[name] = statistics.median(time_block(clock, model, pool, 0, calls, window).device_ms)
    out["do_bench"] = do_bench_ms(problem, device)
    return out


def tf32_effect(suite: str, device: str, root: Path, budget: float) -> dict:
    cands = root / "tf32"
    cands.mkdir(exist_ok=True)
    src = Path(__file__).parent / "candidates" / "1_Matmul__triton_tf32.py"
    (cands / src.name).write_text(src.read_text())
    result = evaluate(EvalConfig(candidates=str(cands), problems=suite, protocol="verified", device=device,
                                 run_dir=str(root / "tf32-run"), baselines=("eager-tf32", "eager-fp32"),
                                 timer_budget_s=budget, seed=3))
    v = result.verdicts[0]
    sp = v.timing.speedups if v.timing else {}
    return {"status": v.status.value, "vs_fp32": sp.get("eager-fp32"), "vs_tf32": sp.get("eager-tf32"),
            "message": v.message}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--problems", default="full")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--budget", type=float, default=10.0)
    ap.add_argument("--only", default=",".join(PROBLEMS), help="comma-separated problem keys")
    args = ap.parse_args()
    device = "cuda:0" if args.device.startswith("cuda") else "cpu"
    problems = {p.key: p for p in load_problems(args.problems)}
    config = TimerConfig(stop=StopRule(target=0.01, max_time_s=args.budget))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for key in args.only.split(","):
            row = repeatability(problems[key], device, config, root)
            row["do_bench_ms"] = do_bench_ms(problems[key], device)
            row["window"] = window_parts(problems[key], device)
            rows.append(row)
            print(f"  {key}: base {row['base_ms']:.4f} ms, do_bench {row['do_bench_ms']}, speedups "
                  f"{row['s1']:.4f} / {row['s2']:.4f}, timer {row['timer_s']:.1f} s", flush=True)
        tf32 = tf32_effect(args.problems, args.device, root, args.budget)
    print("\n(a) repeatability, (b) baseline vs do_bench, (d) timer time  [reference vs itself: true speedup 1.0]")
    print(f"{'problem':28} {'kbv base ms':>11} {'do_bench ms':>11} {'ratio':>6} {'speedup 1':>9} {'speedup 2':>9} "
          f"{'|diff| %':>8} {'timer s':>7}")
    for r in rows:
        db = r["do_bench_ms"]
        ratio = f"{r['base_ms'] / db:6.3f}" if db else "     -"
        print(f"{r['problem']:28} {r['base_ms']:11.4f} {db if db else float('nan'):11.4f} {ratio} {r['s1']:9.4f} "
              f"{r['s2']:9.4f} {r['diff_pct']:8.2f} {r['timer_s']:7.1f}")
    big = [r["diff_pct"] for r in rows if r["base_ms"] > 0.05]
    if big:
        print(f"median |diff| for kernels above 50 us: {statistics.median(big):.2f} %  (goal < 1 %)")
    print("\n(c) TF32 effect: a Triton tl.dot matmul (TF32) on L1/1_Matmul")
    print(f"  verdict {tf32['status']}: speedup vs eager-fp32 {tf32['vs_fp32']}, vs eager-tf32 {tf32['vs_tf32']}")
    windows = [r for r in rows if r.get("window")]
    if windows:
        print("\n(e) the window's parts: the reference's median ms in this process, and its ratio to do_bench")
        print(f"{'problem':28} {'do_bench':>9} {'launch us':>9} {'sync us':>7} " + " ".join(f"{n:>19}" for n in WINDOWS))
        for r in windows:
            w = r["window"]
            cells = " ".join(f"{w[n]:9.4f} ({w[n] / w['do_bench']:6.3f}x)" for n in WINDOWS)
            print(f"{r['problem']:28} {w['do_bench']:9.4f} {w['launch_us']:9.1f} {w['sync_us']:7.1f} {cells}")
        big = [r for r in windows if r["window"]["do_bench"] >= 0.05]
        if big:
            worst = max(abs(r["base_ms"] / r["window"]["do_bench"] - 1) for r in big)
            print(f"the verified baseline (a) against do_bench, kernels of 50 us or more: worst {worst * 100:.1f} % "
                  "(goal <= 2 %)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
