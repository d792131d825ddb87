#!/usr/bin/env bash
# The W / N scaling law: S against log W for several N (G = W), every config on the same
# prompts in ONE run (plus hf-greedy for the exactness and speedup columns). S does not depend
# on the hardware, so this can run on any machine; on a GPU the speedups are meaningful too.
# Writes OUT/run/ (rows.jsonl, summary.csv, ...) and OUT/scaling_law.{png,csv}.
#
#   launch/scaling_law.sh                           # defaults: llama2-7b-chat, MT-Bench
#   MODEL=smollm2-135m DATASET=spec_bench PER_CATEGORY=2 WS="1 2 4 8 16" NS="3 5 7" launch/scaling_law.sh
#
# Knobs (besides those of launch/_bench_lib.sh): WS, NS, RANKS (one number, default 1), OUT.
source "$(dirname "$0")/_bench_lib.sh"
MODEL="${MODEL:-llama2-7b-chat}"
DATASET="${DATASET:-mt_bench}"
WS="${WS:-1 2 4 8 16 32}"
NS="${NS:-3 4 5 7}"
RANKS="${RANKS:-1}"
OUT="${OUT:-results/bench/scaling_law}"
grid=()
for N in $NS; do for W in $WS; do grid+=("W${W}N${N}G${W}"); done; done
bench "$RANKS" "$OUT/run" "decoders=[hf-greedy,lp]" "lookahead=[$(IFS=,; echo "${grid[*]}")]" "tag=scaling_law"
"$PYTHON" -m lp.bench.plots scaling-law "$OUT/run" --out "$OUT" \
  --title "S vs log W (G = W): ${MODEL}, ${DATASET}, ${MAX_NEW_TOKENS} tokens"
