"""One pair through KernelBench's own evaluator, in this process: the oracle `bench/agreement.py` holds
kbv's standard protocol against. Prints one JSON object on its last line of stdout.

    python3 bench/kernelbench_oracle.py --kernelbench KB/src --problem P.py --candidate C.py \
        --build-dir DIR [--build-only] [--device 0]

`--kernelbench` is the directory that holds KernelBench's `kernelbench` package (never copied into kbv:
see ../shared/kernelbench/README.md). Its modules import openai, litellm, pydantic and dotenv at the top,
which an evaluation never uses: where one is missing, a stand-in with the one name used is put on
sys.path first. `--build-only` runs KernelBench's own pre-compile (`build_compile_cache`, CPU only,
safe to run many at once); the evaluation itself is `eval_kernel_against_ref` as KernelBench's batch
scripts call it (seed 42, 5 correctness trials, 100 timed trials, CUDA events), with the reference
timed the same way in the same process (its excessive-speedup check).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
import traceback
from pathlib import Path

STAND_INS = {
    "openai": "class OpenAI:\n    def __init__(self, *a, **k):\n        raise RuntimeError('stand-in')\n",
    "litellm": "def completion(*a, **k):\n    raise RuntimeError('stand-in')\n",
    "dotenv": "def load_dotenv(*a, **k):\n    return False\n",
    # KernelExecResult is a pydantic model: keyword construction over class-level defaults
    "pydantic": ("import copy\n"
                 "class BaseModel:\n"
                 "    def __init__(self, **kw):\n"
                 "        for klass in reversed(type(self).__mro__):\n"
                 "            for name in getattr(klass, '__annotations__', {}):\n"
                 "                if hasattr(klass, name):\n"
                 "                    setattr(self, name, copy.copy(getattr(klass, name)))\n"
                 "        for k, v in kw.items():\n"
                 "            setattr(self, k, v)\n"),
}


def install_stand_ins() -> list[str]:
    """Put a stand-in module for each of STAND_INS that does not import on sys.path; their names."""
    missing = [name for name in STAND_INS if importlib.util.find_spec(name) is None]
    if missing:
        root = Path(tempfile.mkdtemp(prefix="kb-stand-ins-"))
        for name in missing:
            (root / f"{name}.py").write_text(STAND_INS[name])
        sys.path.insert(0, str(root))
    return missing


def backend_of(code: str) -> str:
    """KernelBench's `backend` argument: triton candidates are imported from a file, others exec'd."""
    return "triton" if ("import triton" in code or "from triton" in code) and "load_inline" not in code else "cuda"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kernelbench", required=True, help="the directory holding KernelBench's `kernelbench` package")
    ap.add_argument("--problem", required=True)
    ap.add_argument("--candidate", required=True)
    ap.add_argument("--build-dir", required=True)
    ap.add_argument("--build-only", action="store_true")
    ap.add_argument("--device", type=int, default=0)
    args = ap.parse_args()
    sys.path.insert(0, str(Path(args.kernelbench).resolve()))
    stand_ins = install_stand_ins()
    ref_src = Path(args.problem).read_text(encoding="utf-8")
    cand_src = Path(args.candidate).read_text(encoding="utf-8")
    out: dict = {"stand_ins": stand_ins}
    try:
        from kernelbench import eval as kb_eval

        if args.build_only:
            ok, _, error = kb_eval.build_compile_cache(cand_src, False, args.build_dir)
            out.update(built=bool(ok), error=str(error)[:500] if error else None)
        else:
            import torch

            result = kb_eval.eval_kernel_against_ref(
                ref_src, cand_src, seed_num=42, num_correct_trials=5, num_perf_trials=100,
                measure_performance=True, build_dir=args.build_dir, device=torch.device("cuda", args.device),
                backend=backend_of(cand_src))
            if result is None:  # KernelBench's "lock file error, please retry"
                out.update(status="retry")
            else:
                meta = result.metadata or {}
                out.update(compiled=bool(result.compiled), correctness=bool(result.correctness),
                           runtime_ms=float(result.runtime), ref_runtime_ms=float(result.ref_runtime),
                           errors={k: str(v)[:300] for k, v in meta.items() if "error" in k})
    except Exception as exc:  # the oracle's own failure: said, never taken for a verdict
        out.update(oracle_error=f"{type(exc).__name__}: {exc}"[:500], traceback=traceback.format_exc()[-2000:])
    sys.stdout.flush()
    print("\n" + json.dumps(out, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
