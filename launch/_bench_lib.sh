# Shared by the benchmark launch scripts (sourced, not run). Environment knobs:
#   PYTHON, TORCHRUN          interpreters (default: python / torchrun next to it)
#   MODEL                     a configs/model name (smollm2-135m, codellama-7b, ...) or a model path
#   DATASET, PROMPTS          lp.bench dataset (spec_bench, mt_bench, humaneval, gsm8k, jsonl) [+ file]
#   PER_CATEGORY, LIMIT       prompts per category / in total ("" = all)
#   MAX_NEW_TOKENS            new tokens per prompt
#   CORES                     CPU cores to share between ranks (default: nproc); on CPU each rank
#                             gets CORES/P threads and rank-0-only baselines get all CORES
#   DEVICE                    auto | cpu | cuda
#   EXTRA                     extra hydra overrides, appended to every lp.bench command
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python}"
if [[ -z "${TORCHRUN:-}" ]]; then
  TORCHRUN="$(dirname "$(command -v "$PYTHON")")/torchrun"
  [[ -x "$TORCHRUN" ]] || TORCHRUN="$PYTHON -m torch.distributed.run"
fi
CORES="${CORES:-$(nproc)}"
DEVICE="${DEVICE:-auto}"
MAX_NEW_TOKENS="${MAX_NEW_TOKENS:-128}"
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}" TRANSFORMERS_OFFLINE="${TRANSFORMERS_OFFLINE:-1}"

on_gpu() {  # true when lp.bench will run on CUDA
  [[ "$DEVICE" == cuda* ]] && return 0
  [[ "$DEVICE" == cpu ]] && return 1
  "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"
}

model_arg() {  # hydra override selecting $MODEL
  if [[ -f "configs/model/${MODEL}.yaml" ]]; then echo "model=${MODEL}"; else echo "model.name=${MODEL}"; fi
}

# bench P OUT_DIR [overrides...]: one lp.bench run on P ranks (plain python for P=1).
bench() {
  local P="$1" out="$2"; shift 2
  local args=("$(model_arg)" "dataset=${DATASET}" "max_new_tokens=${MAX_NEW_TOKENS}" "device=${DEVICE}"
              "out_dir=${out}")
  [[ -n "${PROMPTS:-}" ]] && args+=("prompts=${PROMPTS}")
  [[ -n "${PER_CATEGORY:-}" ]] && args+=("per_category=${PER_CATEGORY}")
  [[ -n "${LIMIT:-}" ]] && args+=("limit=${LIMIT}")
  local threads=""
  if ! on_gpu; then
    threads=$(( CORES / P )); (( threads >= 1 )) || threads=1
    args+=("threads=${threads}" "local_threads=${CORES}")
  fi
  args+=("$@")
  # shellcheck disable=SC2206
  args+=(${EXTRA:-})
  mkdir -p "$out"
  echo "=== $P rank(s)${threads:+, $threads thread(s) each}: lp.bench ${args[*]}" | tee "$out/command.txt"
  local omp=()
  [[ -n "$threads" ]] && omp=("OMP_NUM_THREADS=${threads}")
  # a failed run fails the script (set -e, pipefail)
  if [[ "$P" == 1 ]]; then
    env "${omp[@]}" "$PYTHON" -m lp.bench "${args[@]}" 2>&1 | tee "$out/log.txt"
  else
    # shellcheck disable=SC2086
    env "${omp[@]}" $TORCHRUN --standalone --nproc_per_node "$P" -m lp.bench "${args[@]}" 2>&1 | tee "$out/log.txt"
  fi
}

# lookahead_for P CONFIGS: the "P:W..N..G.." entry of CONFIGS for P ranks
lookahead_for() {
  local P="$1" c
  for c in $2; do [[ "${c%%:*}" == "$P" ]] && { echo "${c#*:}"; return 0; }; done
  echo "no lookahead config for $P ranks in '$2'" >&2; return 1
}
