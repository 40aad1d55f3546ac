"""The CUDA-L1 false-positive audit as a page: per pair, the claimed speedup, both protocols' verdicts,
the verified categories, and for every verified verdict that is not `verified` the cause that its
kernel's code bears out (read by a person and kept in a review file), or the verdict's own message
marked as not yet read.

    kbv report RUN --format json > audit.json
    python3 bench/audit_table.py audit.json --index CUDA_L1/index.jsonl \
        --review docs/cuda_l1_audit_review.json --out docs/cuda_l1_audit.md

The review file maps a problem key (L2/23_Conv3d_GroupNorm_Mean) to one line. The audit's run
database (docs/cuda_l1_audit.sqlite) is what the next GPU session resumes (`AUDIT_DB` in
bench/gpu_session.sh).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any


def load_claims(index: Path) -> dict[str, float | None]:
    """Problem key (L<level>/<id>_<name>) -> the speedup its authors claimed."""
    claims = {}
    for line in index.read_text(encoding="utf-8").splitlines():
        if line.strip():
            rec = json.loads(line)
            claims[f"L{rec['level']}/{rec['problem_id']}_{rec['problem_name']}"] = rec.get("claimed_speedup")
    return claims


def table_rows(verdicts: list[dict[str, Any]], claims: dict[str, float | None],
               review: dict[str, str]) -> list[list[str]]:
    by_pair: dict[str, dict[str, dict[str, Any]]] = {}
    for v in verdicts:
        by_pair.setdefault(v["problem"], {})[v["protocol"]] = v
    rows = []
    for problem in sorted(by_pair, key=_order):
        pair = by_pair[problem]
        standard, verified = pair.get("standard"), pair.get("verified")
        claim = claims.get(problem)
        reason = "-"
        if verified is not None and verified["status"] != "verified":
            reason = review.get(problem) or f"not yet read against the code: {verified['message'][:160]}"
        rows.append([problem, f"{claim:.2f}x" if claim else "-", _said(standard), _said(verified),
                     ", ".join(verified["categories"]) if verified else "-", reason])
    return rows


def _said(v: dict[str, Any] | None) -> str:
    if v is None:
        return "not run"
    return f"{v['status']} {v['speedup']:.2f}x" if v.get("speedup") else v["status"]


def _order(key: str) -> tuple[int, int, str]:
    level, rest = key.split("/", 1)
    head = rest.split("_", 1)[0]
    return int(level.removeprefix("L")), int(head) if head.isdigit() else 0, key


def summary(rows: list[list[str]], versions: list[str]) -> list[str]:
    """What the table adds up to: verified statuses, how many flags were read, how many not borne out."""
    statuses = Counter(row[3].split(" ")[0] for row in rows)
    flagged = [row for row in rows if row[3] != "not run" and not row[3].startswith("verified")]
    read = [row for row in flagged if not row[5].startswith("not yet read")]
    untrue = [row for row in read if "NOT borne out" in row[5] or "untrue" in row[5]]
    said = ", ".join(f"{n} {s}" for s, n in statuses.most_common())
    return [f"Verified statuses: {said}. Flags read against the code: {len(read)} of {len(flagged)}; "
            f"a status or category the code does not bear out: {len(untrue)} (each a bug of kbv's, fixed as the "
            f"reason says). Protocol of the stored verdicts: {', '.join(versions) or '-'}.", ""]


def write_page(rows: list[list[str]], total: int, out: Path, versions: list[str] | None = None) -> None:
    lines = ["# CUDA-L1's kernels under kbv: the false-positive audit", "",
             "Every kernel of the CUDA-L1 corpus (191 RL-generated kernels for KernelBench v0, with the speedups "
             "their authors claimed on an H100) through both protocols on an H200, under the bubblewrap sandbox. "
             "Each verified verdict that is not `verified` was read against the kernel's code: the last column "
             "says what the code shows. A flag the code does not bear out is a bug of kbv's.", "",
             f"Pairs run so far: {len(rows)} of {total}. Regenerate: `bash bench/gpu_session.sh bwrap-site audit` "
             "on the GPU (it resumes from docs/cuda_l1_audit.sqlite), then `python3 bench/audit_table.py`.", "",
             *summary(rows, versions or []),
             "| problem | claimed | standard | verified | categories | reason (read from the code) |",
             "| --- | --- | --- | --- | --- | --- |"]
    lines += ["| " + " | ".join(c.replace("|", "/") for c in row) + " |" for row in rows]
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("report", type=Path, help="`kbv report RUN --format json` of the audit's run")
    ap.add_argument("--index", type=Path, required=True, help="the corpus's index.jsonl (claimed speedups)")
    ap.add_argument("--review", type=Path, required=True, help="JSON: problem key -> the cause read from the code")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    try:
        report = json.loads(args.report.read_text(encoding="utf-8"))
        claims = load_claims(args.index)
        review = json.loads(args.review.read_text(encoding="utf-8")) if args.review.exists() else {}
    except (OSError, ValueError, KeyError) as exc:
        print(f"audit_table: {exc}", file=sys.stderr)
        return 2
    rows = table_rows(report["verdicts"], claims, review)
    versions = sorted({v["protocol_version"] for v in report["verdicts"] if v["protocol"] == "verified"})
    write_page(rows, len(claims), args.out, versions)
    for row in rows:
        print(" | ".join(row)[:200])
    return 0


if __name__ == "__main__":
    sys.exit(main())
