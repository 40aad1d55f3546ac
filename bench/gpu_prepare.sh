#!/usr/bin/env bash
# Before a GPU session, on this (internet-connected) machine: fill .dev/ (git-ignored, carried with
# `carry: [".dev"]`) with what the GPU box cannot fetch itself, since nothing outside it can be reached:
#   .dev/kb/           KernelBench's problems and its evaluator (agreement, the soundness page)
#   .dev/cuda_l1/      the CUDA-L1 corpus (the false-positive audit)
#   .dev/*.deb         bubblewrap, for the sandbox (`bwrap-site`)
#   .dev/wheels/       FastAPI, uvicorn and what they need beyond the box's image (`serve-site`)
#   .dev/before/       kbv at BEFORE (default bc9b6f1) for the before/after benches (`cold-before`)
#   .dev/plans-*.json  the memory plans of KernelBench's problems for an H100 and an H200 (80, 140 and 141
#                      GiB), so that `kb-sweep` takes the problems the card refuses last (needs PYTHON with
#                      torch: default .venv/bin/python, `make install`; skipped with a line where it has none)
# Usage: bash bench/gpu_prepare.sh [SHARED_DIR]   (default ../shared)
set -euo pipefail
cd "$(dirname "$0")/.."
shared=${1:-../shared}
mkdir -p .dev/kb .dev/cuda_l1 .dev/wheels
cp -r "$shared"/kernelbench/level1 "$shared"/kernelbench/level2 "$shared"/kernelbench/level3 "$shared"/kernelbench/src .dev/kb/
cp -r "$shared"/corpora/cuda_l1_h100/problems "$shared"/corpora/cuda_l1_h100/candidates "$shared"/corpora/cuda_l1_h100/index.jsonl .dev/cuda_l1/
ls .dev/bubblewrap_*.deb >/dev/null 2>&1 || (cd .dev && apt-get download bubblewrap)
# the box's python3 is 3.12 (KINDS.md); its image has httpx, anyio, h11, idna, click, typing-extensions
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .dev/wheels fastapi uvicorn starlette pydantic pydantic-core annotated-types typing-inspection \
  annotated-doc opentelemetry-api typing-extensions
rm -rf .dev/before && mkdir -p .dev/before && git archive "${BEFORE:-bc9b6f1}" | tar -x -C .dev/before
py=${PYTHON:-.venv/bin/python}
if "$py" -c "import torch" 2>/dev/null; then
  for gib in 80 140 141; do  # about a minute each, on the meta device
    # made again with REPLAN=1 (the memory plan's code or .dev/kb changed)
    [ -f ".dev/plans-$gib.json" ] && [ "${REPLAN:-0}" != 1 ] || PYTHONPATH=src "$py" bench/kernelbench_plans.py .dev/kb --device-gib "$gib" \
      --host-gib 128 --out ".dev/plans-$gib.json" | tail -n 1
  done
else
  echo "no memory plans made: $py has no torch (make install, or PYTHON=...); kb-sweep will take the problems in order"
fi
du -sh .dev
