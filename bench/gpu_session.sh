#!/usr/bin/env bash
# One device session: environment, GPU tests, the examples on the full suite under both protocols,
# the soundness screens (the bundled suite, KernelBench's problems carried in .kb), the throughput and
# timing benchmarks, the GPU corpus. Every step is bounded and logged
# under $OUT; a failing step does not stop the next. Usage: bash bench/gpu_session.sh STEP...
set -u
OUT=${OUT:-/tmp/kbv-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 OMP_WAIT_POLICY=PASSIVE KBV_CACHE_DIR=/tmp/kbv-cache
KBV="python3 -m kbv"

step() {  # step NAME SECONDS COMMAND...
  local name=$1 limit=$2; shift 2
  local t0=$(date +%s)
  echo "=== $name (limit ${limit}s)"
  timeout --kill-after=10 "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "=== $name rc=$rc wall=$(( $(date +%s) - t0 ))s"
  tail -n 40 "$OUT/$name.log"
}

for s in "$@"; do
  case $s in
    env) step env 20 bash -c 'nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu,memory.used --format=csv; python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name(0))"; df -h /dev/shm' ;;
    gpu-tests) step gpu-tests "${GPU_TESTS_LIMIT:-420}" python3 -m pytest -q -m gpu -p no:cacheprovider --durations=10 ${GPU_TESTS:-tests} ;;
    examples) step examples "${EXAMPLES_LIMIT:-480}" $KBV eval examples/ --problems full --protocol both --device cuda --run /tmp/runs/examples --timer-budget 5 --trials 1 ;;
    examples-json) step examples-json 60 $KBV report /tmp/runs/examples --format json ;;
    examples-standard) step examples-standard "${EXAMPLES_LIMIT:-200}" $KBV eval examples/ --problems full --protocol standard --device cuda --run /tmp/runs/examples-standard ;;
    examples-both-smoke) step examples-both-smoke "${SMOKE_LIMIT:-120}" $KBV eval examples/ --problems smoke --protocol both --device cuda --run /tmp/runs/examples-smoke --timer-budget 4 ;;
    reports) step reports 30 bash -c "$KBV report /tmp/runs/examples-standard --format json > $OUT/examples-standard.json; $KBV report /tmp/runs/examples-smoke --format json > $OUT/examples-smoke.json" ;;
    soundness) step soundness 300 $KBV problems check full --device cuda --all ;;
    throughput) step throughput "${THROUGHPUT_LIMIT:-300}" python3 bench/throughput.py --cases "${THROUGHPUT_CASES:-gib,full}" --device cuda --timer-budget 4 --out "$OUT/throughput.json" ;;
    kb-soundness) step kb-soundness "${KB_LIMIT:-420}" python3 bench/kernelbench_soundness.py "${KB_PROBLEMS:-.kb}" --device cuda --workers "${KB_WORKERS:-8}" --budget "$(( ${KB_LIMIT:-420} - 20 ))" --out "$OUT/kb-soundness.jsonl" ;;
    corpus) step corpus "${CORPUS_LIMIT:-300}" python3 bench/gpu_verdicts.py corpus 4 ;;
    bench) step bench "${BENCH_LIMIT:-420}" python3 bench/timing_fidelity.py --problems full --budget "${BENCH_BUDGET:-6}" ${BENCH_ONLY:+--only $BENCH_ONLY} ;;
    *) echo "unknown step $s" ;;
  esac
done
