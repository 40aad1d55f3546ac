#!/usr/bin/env bash
# One device session: environment, GPU tests, the examples on the full suite under both protocols,
# the soundness screens (the bundled suite, KernelBench's problems carried in .kb), the throughput and
# timing benchmarks, the GPU corpus, lanes and Ray. Every step is bounded and logged
# under $OUT; a failing step does not stop the next. Usage: bash bench/gpu_session.sh STEP...
#
# Builds: every step shares one content-hash build cache ($KBV_CACHE_DIR, the GPU tests' too).
# `prebuild` fills it in parallel in the background (wait for it with `prebuild-wait`), `pack`
# writes it to $OUT/builds.tgz, and `unpack` restores .dev/builds.tgz (carry .dev) in a later call.
# `ray-site` unpacks .dev/raysite.tar.xz (ray and its missing dependencies, as a site directory)
# onto PYTHONPATH for the `scale` step. `gpumon` logs the device's memory in use every 2 s (background),
# `hostmon` the host's available memory, its out-of-memory kills and /tmp's free space every 5 s;
# `host-memory` runs the out-of-memory tests as root there (the floor only root's capability sets).
# SCALE_OPTS picks the scaled runs, SCALE_ONE_LANE an earlier one-lane JSON to compare them with;
# KB_RESUME an earlier KernelBench screen whose finished problems are kept. `kb-sweep` runs the identity sweep
# (bench/kernelbench_sweep.py) SWEEP_CHUNK problems at a time, its JSON and page rewritten after each chunk; it
# resumes from SWEEP_RESUME (docs/kernelbench_sweep.json) or, on a warm box, the last call's; the problems that
# .dev/plans-<the card's GiB>.json (SWEEP_PLANS) refuses under verified go last. SWEEP_AGAIN=1 with SWEEP_ONLY measures
# those problems again, every other row of the resumed JSON kept (one published row remeasured: copy $OUT's JSON back).
# AUDIT_FILES picks a slice of the CUDA-L1 audit (LEVEL/FILE globs); `focus` runs the corpus pairs of FOCUS_FILES in a run of their own. `pairs` runs throughput's
# full case (both protocols, side by side) on the examples named by PAIRS_GLOB only.
# `bwrap-site` unpacks .dev/bubblewrap_*.deb (fetch it on a machine with Debian's packages:
# `apt-get download bubblewrap` into .dev/, which git ignores; carry .dev) with `dpkg -x` and puts its
# bwrap first on PATH for every later step; `bwrap-probe` says what this machine allows (user
# namespaces, bwrap as root, and the isolation kbv picks); `sandbox-bench` times a child's start-up
# with and without the sandbox on the GPU.
# `redteam` runs kbv redteam on the GPU examples (issue 36's GPU targets), its JSON in $OUT/redteam.json, on
# REDTEAM_PROBLEMS (default smoke; `full` for GPU-sized problems), REDTEAM_TRANSFORMS a comma list of them (default all),
# REDTEAM_PAIRS pairs per device (default 2);
# it resumes from /tmp/kbv-redteam/run-<problems>, so a later call on a warm box goes on where it stopped, and a fresh
# box from REDTEAM_DB (default docs/redteam_gpu_<problems>.sqlite: the database the last call brought back, sanitized
# with bench/gpu_sanitize.py and committed); the mutants are made again, and a mutant whose source changed runs again.
# `identity-children` times one identity in children of different histories (bench/identity_children.py:
# where an identity's verified time goes; IDENTITY_CHILDREN=ref,ref2,ref3,ref4,ref@noaslr,ref2@noaslr,ref3@noaslr,ref4@noaslr
# sets alike children with and without address-space layout randomisation side by side; @hash0, @moved: docs in the bench;
# IDENTITY_WARM=1 warms the device's clocks before every block, the MHz column reads them after each; `identity-clock`
# runs it cold, then warmed, each run's log and JSON under its own name); `identity-timer` then times cand and ref2 against ref with the
# verified timer itself, rechecks off, copied out only, and made on the device; `identity-eval` runs the identities through whole runs, with
# and without children started ahead and spares (bench/identity_eval.py; IDENTITY_VARIANTS=default,no-aslr: the
# children with address-space layout randomisation off, against two alike children 15% apart).
# `cold` is a cold run
# of COLD_N fresh candidates on an empty cache (bench/cold.py); `isolation` a launch-bound kernel timed
# alone and under ISOLATION_BUILDS builds per build isolation (bench/isolation.py); `builds` the build
# CPU-seconds before and after on the same candidates (bench/builds.py; no GPU work, CPU only).
# `spares` times the examples with and without spare reference children, `findings` with and without the
# findings kept from the run before (bench/prepare.py).
# COLD_PAIRS sets `cold`'s --pairs-per-device; `cold-one` then runs the same candidates one pair at a time.
# `cold-before` evaluates the candidates `cold` made with the kbv under BEFORE_SRC (a checkout of an
# earlier revision, e.g. `git archive bc9b6f1 | tar -x -C .dev/before`, carried in .dev).
# `serve-site`
# installs FastAPI, uvicorn and httpx from .dev/wheels (carry .dev; the box has no index), `serve-tests`
# runs the service's tests there, and `serve` runs bench/serve.py (a warm kbv serve against kbv eval, a
# GRPO step of 8 problems x 16 samples, SERVE_PAIRS pairs per device); its kbv eval arm stops at
# SERVE_EVAL_BUDGET and the next call continues it (the box must still be warm: its runs are in /tmp).
# `repeat` runs the same pairs REPEAT_RUNS times, each run its own process, per REPEAT_VARIANTS (bench/repeat.py: launch-bound
# and large problems, identity candidates, both protocols; REPEAT_OPTS e.g. `--standard-timing do_bench`);
# it resumes from /tmp/kbv-repeat, so a later call in the same session runs only what is left, and a fresh box
# from REPEAT_RESUME (default docs/repeat.json: commit $OUT/repeat.json there between sessions).
set -u
OUT=${OUT:-/tmp/kbv-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 OMP_WAIT_POLICY=PASSIVE KBV_CACHE_DIR=/tmp/kbv-cache
export KBV_TEST_CACHE_DIR=$KBV_CACHE_DIR RAY_USAGE_STATS_ENABLED=0
# the GPU tests' runs: a line per verdict, and what a run waits on (tests/verdict_log.py); every fixture's verdict
export KBV_RUN_LOG=${KBV_RUN_LOG:-$OUT/test-runs.log} KBV_CORPUS_LOG=${KBV_CORPUS_LOG:-$OUT/test-verdicts.jsonl}
KBV="python3 -m kbv"
# an earlier call's (or invocation's) bwrap stays on PATH: no step runs unsandboxed by accident
[ -x /tmp/bwrap-site/usr/bin/bwrap ] && export PATH=/tmp/bwrap-site/usr/bin:$PATH
# the KernelBench screen continues from the published one (docs/kernelbench_soundness.jsonl)
KB_RESUME=${KB_RESUME-docs/kernelbench_soundness.jsonl}
# the repeat bench continues from its published JSON, where a session committed one
REPEAT_RESUME=${REPEAT_RESUME-docs/repeat.json}
# the identity sweep continues from its published JSON (a warm box from its last call's, /tmp/kbv-sweep/last.json)
SWEEP_RESUME=${SWEEP_RESUME-docs/kernelbench_sweep.json}
# pytest-timeout (on the box) for the GPU test steps: seconds a test may take, its setup included
PT_TIMEOUT="--timeout=${GPU_TEST_TIMEOUT:-400} --timeout-method=thread"

step() {  # step NAME SECONDS COMMAND... (never past $DEADLINE, epoch seconds, less $RESERVE, when set)
  local name=$1 limit=$2; shift 2
  if [ -n "${DEADLINE:-}" ]; then
    local left=$(( DEADLINE - $(date +%s) - ${RESERVE:-0} ))
    [ "$left" -lt "$limit" ] && limit=$left
    if [ "$limit" -lt 10 ]; then echo "=== $name skipped: the deadline is near"; return; fi
  fi
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
    # the whole GPU suite in three device calls: a (81 s, then the compiled fixtures' max-autotune builds, past
    # 370 s into an empty cache on an H100; 163 s on 2026-12-07), b (every other file but the red team's: 387 s of
    # call 2 on 2026-12-06), c (the red team's: with it, b ran past its 565 s on an H100 on 2026-12-07, the
    # red team and attribution taking its first 390 s)
    # GPU_TEST_TIMEOUT (a: GPU_TEST_TIMEOUT_A, past the compiled fixtures' cold builds): one test (setup included)
    # that runs past it dumps every thread's stack and ends pytest,
    # where a stall would take the call (2026-12-06-e: the corpus's setup sat 500 s in one call, 119 s in the next)
    gpu-tests-a) step gpu-tests-a "${GPU_TESTS_A_LIMIT:-560}" python3 -m pytest -v -m gpu -p no:cacheprovider --durations=10 \
      --timeout="${GPU_TEST_TIMEOUT_A:-540}" --timeout-method=thread \
      ${GPU_TESTS_A:-tests/test_channel.py tests/generate tests/test_compiled.py} ;;
    gpu-tests-b) RESERVE=${RESERVE_B:-20} step gpu-tests-b "${GPU_TESTS_B_LIMIT:-570}" python3 -m pytest -v -m gpu \
      -p no:cacheprovider $PT_TIMEOUT --durations=15 tests --ignore=tests/test_channel.py --ignore=tests/generate \
      --ignore=tests/test_compiled.py --ignore=tests/redteam ;;
    gpu-tests-c) step gpu-tests-c "${GPU_TESTS_C_LIMIT:-560}" python3 -m pytest -v -m gpu -p no:cacheprovider --durations=10 \
      $PT_TIMEOUT tests/redteam ;;
    gpu-tests) step gpu-tests "${GPU_TESTS_LIMIT:-420}" python3 -m pytest -v -m gpu -p no:cacheprovider --durations=10 $PT_TIMEOUT \
      ${GPU_TESTS:-tests} ;;
    examples) step examples "${EXAMPLES_LIMIT:-480}" $KBV eval examples/ --problems full --protocol both --device cuda --run /tmp/runs/examples --timer-budget 5 --trials 1 ;;
    examples-json) step examples-json 60 $KBV report /tmp/runs/examples --format json ;;
    examples-standard) step examples-standard "${EXAMPLES_LIMIT:-200}" $KBV eval examples/ --problems full --protocol standard --device cuda --run /tmp/runs/examples-standard ;;
    examples-both-smoke) step examples-both-smoke "${SMOKE_LIMIT:-120}" $KBV eval examples/ --problems smoke --protocol both --device cuda --run /tmp/runs/examples-smoke --timer-budget 4 ;;
    reports) step reports 30 bash -c "$KBV report /tmp/runs/examples-standard --format json > $OUT/examples-standard.json; $KBV report /tmp/runs/examples-smoke --format json > $OUT/examples-smoke.json" ;;
    soundness) step soundness 300 $KBV problems check full --device cuda --all ;;
    throughput) step throughput "${THROUGHPUT_LIMIT:-300}" python3 bench/throughput.py --cases "${THROUGHPUT_CASES:-gib,full}" --device cuda --timer-budget 4 --out "$OUT/throughput.json" ;;
    pairs) rm -rf /tmp/kbv-pairs && mkdir -p /tmp/kbv-pairs && cp ${PAIRS_GLOB:-examples/2_ReLU__*} /tmp/kbv-pairs/ \
      && step pairs "${PAIRS_LIMIT:-200}" python3 bench/throughput.py --cases full --candidates /tmp/kbv-pairs \
      --device cuda --timer-budget 4 --out "$OUT/pairs.json" ;;
    identity-timer) step identity-timer "${IDENTITY_LIMIT:-240}" python3 bench/identity_children.py --device cuda \
      --only "${IDENTITY_ONLY:-L1/2_ReLU,L1/6_Softmax,L3/1_MLP}" --rounds 10 --children ref,ref2,cand \
      --timer none,copy,device --cpus "${IDENTITY_CPUS:-lane}" --out "$OUT/identity_timer.json" ;;
    identity-eval) step identity-eval "${IDENTITY_EVAL_LIMIT:-300}" python3 bench/identity_eval.py --device cuda \
      --only "${IDENTITY_ONLY:-L1/2_ReLU,L1/6_Softmax,L3/1_MLP}" --runs "${IDENTITY_RUNS:-3}" \
      --variants "${IDENTITY_VARIANTS:-default,lane}" --out "$OUT/identity_eval.json" ;;
    identity-children) step identity-children "${IDENTITY_LIMIT:-200}" python3 bench/identity_children.py --device cuda \
      --only "${IDENTITY_ONLY:-L1/2_ReLU,L1/6_Softmax,L3/1_MLP}" --rounds "${IDENTITY_ROUNDS:-20}" --cpus "${IDENTITY_CPUS:-lane}" \
      ${IDENTITY_CHILDREN:+--children $IDENTITY_CHILDREN} ${IDENTITY_WARM:+--warm-blocks} --out "$OUT/identity_children.json" ;;
    # the clock experiment: identity-children twice, on cold clocks then warmed before every block, each run's log
    # and JSON kept under its own name (identity-children-{cold,warm}.log, identity_children_{cold,warm}.json)
    identity-clock) for v in cold warm; do
        IDENTITY_WARM=$([ $v = warm ] && echo 1) OUT=$OUT DEADLINE=${DEADLINE:-} bash "$0" identity-children
        mv "$OUT/identity-children.log" "$OUT/identity-children-$v.log" 2>/dev/null
        mv "$OUT/identity_children.json" "$OUT/identity_children_$v.json" 2>/dev/null
      done ;;
    kb-soundness) kb=${KB_LIMIT:-420}
      [ -n "${DEADLINE:-}" ] && [ $(( DEADLINE - $(date +%s) )) -lt "$kb" ] && kb=$(( DEADLINE - $(date +%s) ))
      step kb-soundness "$kb" python3 bench/kernelbench_soundness.py "${KB_PROBLEMS:-.dev/kb}" --device cuda \
        --workers "${KB_WORKERS:-8}" --budget "$(( kb - 25 ))" --out "$OUT/kb-soundness.jsonl" \
        --markdown "$OUT/kernelbench_soundness.md" \
        ${KB_RESUME:+--resume $KB_RESUME} ;;
    kb-sweep) sw=${SWEEP_LIMIT:-420} resume=$SWEEP_RESUME; mkdir -p /tmp/kbv-sweep
      # the problems this card's plans refuse under verified go last (.dev/plans-<GiB>.json: bench/kernelbench_plans.py)
      gib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1 | awk '{print int($1/1024+0.5)}')
      plans=${SWEEP_PLANS-.dev/plans-$gib.json}; [ -f "$plans" ] || plans="" 
      [ -n "${DEADLINE:-}" ] && [ $(( DEADLINE - $(date +%s) )) -lt "$sw" ] && sw=$(( DEADLINE - $(date +%s) ))
      # SWEEP_RESUME= (empty) resumes from nothing, not even the warm box's last JSON
      [ -n "$resume" ] && [ ! -f "$OUT/kernelbench_sweep.json" ] && [ -f /tmp/kbv-sweep/last.json ] && resume=/tmp/kbv-sweep/last.json
      step kb-sweep "$sw" python3 bench/kernelbench_sweep.py "${KB_PROBLEMS:-.dev/kb}" --device cuda \
        --timer-budget "${SWEEP_TIMER:-2}" --budget $(( sw - 60 )) --chunk "${SWEEP_CHUNK:-8}" \
        --pairs-per-device "${SWEEP_PAIRS:-1}" --work /tmp/kbv-sweep \
        --out "$OUT/kernelbench_sweep.json" --markdown "$OUT/kernelbench_sweep.md" \
        ${resume:+--resume $resume} ${SWEEP_ONLY:+--only $SWEEP_ONLY} $([ "${SWEEP_AGAIN:-0}" = 1 ] && echo --again) ${plans:+--refused-last $plans}
      cp "$OUT/kernelbench_sweep.json" /tmp/kbv-sweep/last.json 2>/dev/null ;;
    corpus) step corpus "${CORPUS_LIMIT:-300}" python3 bench/gpu_verdicts.py corpus 4 ;;
    bench) step bench "${BENCH_LIMIT:-420}" python3 bench/timing_fidelity.py --problems full --budget "${BENCH_BUDGET:-6}" ${BENCH_ONLY:+--only $BENCH_ONLY} ;;
    prebuild) echo "=== prebuild (background)"
      ( for c in "full examples" "smoke tests/corpus/gpu"; do set -- $c
          timeout 400 python3 bench/throughput.py --warm-only --cases "$1" --candidates "$2" --device cuda --jobs 12
        done ) > "$OUT/prebuild.log" 2>&1 &
      PREBUILD=$! ;;
    prebuild-wait) t0=$(date +%s); wait "${PREBUILD:-}" 2>/dev/null
      echo "=== prebuild-wait: waited $(( $(date +%s) - t0 ))s"; tail -n 5 "$OUT/prebuild.log" ;;
    pack) step pack 60 tar -czf "$OUT/builds.tgz" -C "$(dirname "$KBV_CACHE_DIR")" "$(basename "$KBV_CACHE_DIR")/builds"
      ls -la "$OUT/builds.tgz" ;;
    unpack) [ -f .dev/builds.tgz ] && step unpack 60 tar -xzf .dev/builds.tgz -C "$(dirname "$KBV_CACHE_DIR")" ;;
    ray-site) mkdir -p /tmp/raysite && step ray-site 120 tar -xJf .dev/raysite.tar.xz -C /tmp/raysite \
      && export PYTHONPATH=$PYTHONPATH:/tmp/raysite RAY_AUTH_MODE=disabled ;;
    scale) step scale "${SCALE_LIMIT:-420}" python3 bench/throughput.py --cases full --device cuda --timer-budget 4 \
      ${SCALE_OPTS:---devices auto --executor ray} ${SCALE_ONE_LANE:+--one-lane-from $SCALE_ONE_LANE} \
      --out "$OUT/${SCALE_NAME:-scale}.json" ;;
    bwrap-site) mkdir -p /tmp/bwrap-site && step bwrap-site 60 bash -c 'dpkg -x .dev/bubblewrap_*.deb /tmp/bwrap-site' \
      && export PATH=/tmp/bwrap-site/usr/bin:$PATH ;;
    bwrap-probe) step bwrap-probe 60 bash -c 'echo "bwrap: $(command -v bwrap)"; bwrap --version;
      unshare -Ur true && echo "user namespaces: allowed" || echo "user namespaces: refused";
      bwrap --ro-bind / / --proc /proc --dev /dev --unshare-pid --unshare-net --unshare-ipc --die-with-parent true \
        && echo "bwrap as root: works" || echo "bwrap as root: refused";
      setpriv --reuid=65534 --regid=65534 --clear-groups bwrap --ro-bind / / --unshare-user --unshare-pid --unshare-net true \
        && echo "bwrap as uid 65534: works" || echo "bwrap as uid 65534: refused";
      ls -la /dev/nvidia* | head -20;
      python3 -c "from kbv.sandbox.isolation import SandboxMode, resolve; print(resolve(SandboxMode.AUTO).describe())"' ;;
    sandbox-bench) step sandbox-bench 300 python3 bench/sandbox_startup.py --device cuda --repeats "${SANDBOX_REPEATS:-6}" ;;
    cold) rm -rf /tmp/kbv-cold; step cold "${COLD_LIMIT:-580}" python3 bench/cold.py --device cuda --n "${COLD_N:-40}" \
      --timer-budget "${COLD_BUDGET:-2}" --pairs-per-device "${COLD_PAIRS:-1}" --work /tmp/kbv-cold --out "$OUT/cold.json" ;;
    cold-one) rm -rf /tmp/kbv-cold-one; step cold-one "${COLD_LIMIT:-580}" python3 bench/cold.py --device cuda \
      --candidates-from /tmp/kbv-cold/candidates --timer-budget "${COLD_BUDGET:-2}" --pairs-per-device 1 \
      --work /tmp/kbv-cold-one --out "$OUT/cold-one.json" ;;
    cold-before) rm -rf /tmp/kbv-cold-before; step cold-before "${COLD_LIMIT:-580}" env PYTHONPATH="$(realpath "${BEFORE_SRC:-.dev/before}")/src" \
      python3 bench/cold.py --device cuda --candidates-from /tmp/kbv-cold/candidates --timer-budget "${COLD_BUDGET:-2}" \
      --work /tmp/kbv-cold-before --out "$OUT/cold-before.json" ;;
    isolation) step isolation "${ISOLATION_LIMIT:-420}" python3 bench/isolation.py --device cuda \
      --builds "${ISOLATION_BUILDS:-14}" --reps "${ISOLATION_REPS:-3}" --modes "${ISOLATION_MODES:-none,pin,hold}" \
      --out "$OUT/isolation.json" ;;
    builds) step builds "${BUILDS_LIMIT:-360}" python3 bench/builds.py --kinds "${BUILDS_KINDS:-cuda_elementwise,cpp}" \
      --breakdown --out "$OUT/builds.json" ;;
    gpumon) echo "=== gpumon (background): device memory every 2 s"
      nvidia-smi --query-gpu=timestamp,memory.used,utilization.gpu --format=csv,noheader -l 2 > "$OUT/gpumem.log" 2>&1 & ;;
    hostmon) echo "=== hostmon (background): host memory and the kernel's out-of-memory kills every 5 s"
      ( while true; do echo "$(date +%T) $(awk '/MemAvailable/ {printf "avail %d MiB", $2/1024}' /proc/meminfo)" \
          "$(grep oom_kill /proc/vmstat) $(df -m /tmp | awk 'NR==2 {print "tmp free " $4 " MiB"}')"; sleep 5; done ) \
        > "$OUT/hostmem.log" 2>&1 & ;;
    host-memory) step host-memory 120 python3 -m pytest -v -p no:cacheprovider -rs tests/test_host_memory.py ;;
    # the identity test alone, its whole report kept (2026-12-06-g lost L1/2_ReLU's figure to a tail of 30 lines)
    identity-test) step identity-test "${IDENTITY_TEST_LIMIT:-150}" python3 -m pytest -q -m gpu -p no:cacheprovider -rA \
      tests/test_identity_gpu.py ;;
    shaped) step shaped "${SHAPED_LIMIT:-240}" python3 -m pytest -q -m gpu -p no:cacheprovider --durations=10 tests/test_shaped.py ${SHAPED_MORE:-} ;;
    warm-audit) echo "=== warm-audit (background)"; mkdir -p /tmp/audit/cands
      for l in ${AUDIT_LEVELS:-level1 level2 level3}; do cp -r .dev/cuda_l1/candidates/$l /tmp/audit/cands/; done
      timeout 400 nice -n 10 python3 bench/warm.py /tmp/audit/cands --problems .dev/cuda_l1/problems --device cuda --jobs ${WARM_JOBS:-12} > "$OUT/warm-audit.log" 2>&1 &
      WARM=$! ;;
    warm-wait) t0=$(date +%s); wait "${WARM:-}" 2>/dev/null; echo "=== warm-wait: waited $(( $(date +%s) - t0 ))s"; tail -n 8 "$OUT/warm-audit.log" ;;
    audit) mkdir -p "$OUT/audit" /tmp/audit/cands /tmp/kbv-audit-run  # the run stays on the box between calls
      db=${AUDIT_DB:-docs/cuda_l1_audit.sqlite}  # the published audit's run: a new session resumes it
      [ -f "$db" ] && [ ! -f /tmp/kbv-audit-run/kbv.sqlite ] && cp "$db" /tmp/kbv-audit-run/kbv.sqlite
      if [ -n "${AUDIT_FILES:-}" ]; then  # a slice: LEVEL/FILE globs under the corpus's candidates
        for f in $AUDIT_FILES; do for g in .dev/cuda_l1/candidates/$f; do
          d="/tmp/audit/cands/${g#.dev/cuda_l1/candidates/}"; mkdir -p "$(dirname "$d")"; [ -e "$d" ] || cp "$g" "$d"
        done; done
      else
        for l in ${AUDIT_LEVELS:-level1 level2 level3}; do cp -rn .dev/cuda_l1/candidates/$l /tmp/audit/cands/ 2>/dev/null; done
      fi
      step audit "${AUDIT_LIMIT:-300}" $KBV eval /tmp/audit/cands --problems .dev/cuda_l1/problems --protocol both \
        --device cuda --run /tmp/kbv-audit-run --timer-budget "${AUDIT_BUDGET:-3}"
      $KBV report /tmp/kbv-audit-run --format json > "$OUT/audit.json" 2>/dev/null
      cp /tmp/kbv-audit-run/kbv.sqlite* "$OUT/audit/" ;;
    focus) rm -rf /tmp/kbv-focus /tmp/kbv-focus-run; mkdir -p /tmp/kbv-focus  # a few corpus pairs, a run of their own
      for f in ${FOCUS_FILES:-level2/34_*}; do for g in .dev/cuda_l1/candidates/$f; do
        d="/tmp/kbv-focus/${g#.dev/cuda_l1/candidates/}"; mkdir -p "$(dirname "$d")"; cp "$g" "$d"; done; done
      step focus "${FOCUS_LIMIT:-240}" $KBV eval /tmp/kbv-focus --problems .dev/cuda_l1/problems --protocol both \
        --device cuda --run /tmp/kbv-focus-run --timer-budget "${AUDIT_BUDGET:-3}"
      $KBV report /tmp/kbv-focus-run --format json > "$OUT/focus.json" 2>/dev/null ;;
    agreement) step agreement "${AGREE_LIMIT:-300}" python3 bench/agreement.py .dev/cuda_l1/candidates \
        --problems .dev/cuda_l1/problems --kernelbench .dev/kb/src --only "${AGREE_ONLY:-L2/}" --limit "${AGREE_N:-24}" \
        --out "$OUT/agreement.json" ;;
    # the demo from two fresh checkouts at once, each with its own cache (issue 37, step 6)
    demo-pair) dp=${DEMO_PAIR_LIMIT:-420}  # the bench's own timeout inside the step's, so its table is written
      [ -n "${DEADLINE:-}" ] && [ $(( DEADLINE - $(date +%s) )) -lt "$dp" ] && dp=$(( DEADLINE - $(date +%s) ))
      if [ "$dp" -lt 90 ]; then echo "=== demo-pair skipped: the deadline is near"; else
        step demo-pair "$dp" python3 bench/demo_pair.py --device cuda --work /tmp/kbv-demo-pair \
          --timeout $(( dp - 30 )) --out "$OUT/demo_pair.json"; fi ;;
    serve-site) step serve-site 120 python3 -m pip install -q --no-index --find-links .dev/wheels \
      'fastapi>=0.110' 'uvicorn>=0.30' 'httpx>=0.27' ;;
    diag) step diag 300 python3 bench/sandbox_diag.py --device cuda ;;
    escape) step escape "${ESCAPE_LIMIT:-240}" python3 -m pytest -q -p no:cacheprovider --durations=10 \
      tests/test_escape.py tests/test_isolation.py ;;
    serve-tests) step serve-tests "${SERVE_TESTS_LIMIT:-300}" python3 -m pytest -q -p no:cacheprovider --durations=10 \
      tests/serve tests/test_client.py tests/test_reward.py ;;
    serve) mkdir -p /tmp/kbv-serve  # resumes on a warm box: the eval arm continues past SERVE_EVAL_BUDGET
      step serve "${SERVE_LIMIT:-580}" python3 bench/serve.py --device cuda --problems full --load "${SERVE_LOAD:-grpo}" \
        --pairs-per-device "${SERVE_PAIRS:-2}" --timer-budget "${SERVE_BUDGET:-2}" --eval-budget "${SERVE_EVAL_BUDGET:-500}" \
        --cache-dir "$KBV_CACHE_DIR" --workdir /tmp/kbv-serve --out /tmp/kbv-serve/serve.json ${SERVE_OPTS:-}
      cp /tmp/kbv-serve/serve.json "$OUT/serve.json" 2>/dev/null ;;
    repeat) mkdir -p /tmp/kbv-repeat  # a fresh box resumes the published results (REPEAT_RESUME, carried in the tree)
      [ -n "$REPEAT_RESUME" ] && [ -f "$REPEAT_RESUME" ] && [ ! -f /tmp/kbv-repeat/repeat.json ] \
        && cp "$REPEAT_RESUME" /tmp/kbv-repeat/repeat.json
      step repeat "${REPEAT_LIMIT:-580}" python3 bench/repeat.py --device cuda --runs "${REPEAT_RUNS:-4}" \
        --cases "${REPEAT_CASES:-launch,large}" --variants "${REPEAT_VARIANTS:-default}" \
        --timer-budget "${REPEAT_BUDGET:-3}" ${REPEAT_OPTS:-} \
        --work /tmp/kbv-repeat --out /tmp/kbv-repeat/repeat.json
      # the pairs of a run the step's limit cut short, kept for a fresh box too
      timeout 10 python3 bench/repeat.py --salvage --work /tmp/kbv-repeat --out /tmp/kbv-repeat/repeat.json
      cp /tmp/kbv-repeat/repeat.json "$OUT/repeat.json" 2>/dev/null ;;
    spares) step spares "${SPARES_LIMIT:-400}" python3 bench/prepare.py --compare spares --device cuda --problems full \
      --protocol "${SPARES_PROTOCOL:-both}" --rounds "${SPARES_ROUNDS:-2}" --timer-budget 2 --out "$OUT/spares.json" ;;
    findings) step findings "${FINDINGS_LIMIT:-400}" python3 bench/prepare.py --compare findings --device cuda \
      --problems full --protocol verified --rounds "${FINDINGS_ROUNDS:-2}" --timer-budget 2 --out "$OUT/findings.json" ;;
    redteam) mkdir -p /tmp/kbv-redteam/cands  # resumes from its run on a warm box: call it again to go on
      rt=/tmp/kbv-redteam/run-${REDTEAM_PROBLEMS:-smoke}; mkdir -p "$rt"  # a fresh box resumes from the published run
      db=${REDTEAM_DB-docs/redteam_gpu_${REDTEAM_PROBLEMS:-smoke}.sqlite}
      [ -f "$db" ] && [ ! -f "$rt/kbv.sqlite" ] && cp "$db" "$rt/kbv.sqlite" && echo "=== redteam resumes from $db"
      for n in ${REDTEAM_HONEST:-1_Matmul__cuda 2_ReLU__cuda 2_ReLU__triton 6_Softmax__triton 8_LayerNorm__triton}; do
        cp "examples/$n.py" /tmp/kbv-redteam/cands/; done
      step redteam "${REDTEAM_LIMIT:-540}" bash -c "$KBV redteam /tmp/kbv-redteam/cands --problems ${REDTEAM_PROBLEMS:-smoke} \
        --device cuda --run $rt --seed 7 --timer-budget 3 --ci-target 0.05 \
        --pairs-per-device ${REDTEAM_PAIRS:-2} \
        ${REDTEAM_TRANSFORMS:+--transforms $REDTEAM_TRANSFORMS} --fixtures $OUT/redteam-fixtures --format json > $OUT/redteam.json"
      # the run's database comes back whole (bench/gpu_sanitize.py, then commit it as the published run)
      # (only a database the run made: connecting would create an empty one, and the next call would not resume)
      [ -s "$rt/kbv.sqlite" ] && python3 -c "import sqlite3, sys; d = sqlite3.connect(f'file:{sys.argv[1]}?mode=rw', uri=True)
d.execute('PRAGMA wal_checkpoint(TRUNCATE)')" "$rt/kbv.sqlite" && cp "$rt/kbv.sqlite" "$OUT/$(basename "$db")" ;;
    bundle) tar -czf /tmp/bundle.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/bundle.tgz "$OUT/bundle.tgz"; ls -la "$OUT" ;;
    *) echo "unknown step $s" ;;
  esac
done
