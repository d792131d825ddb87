#!/usr/bin/env bash
# Strong scaling of Lookahead Parallelism: the same prompts on 1, 2, 4, 8 ranks, W and G grown
# with the ranks (the DGX use: torchrun --nproc_per_node 8 -m lp.generate model=codellama-7b
# W=60 N=5 G=60). Every run also measures autoregressive decoding (hf-greedy, rank 0) for its
# speedup and exactness columns. Writes OUT/ws{P}/ (rows.jsonl, summary.csv, ...) and
# OUT/strong_scaling.{png,csv}.
#
#   launch/strong_scaling.sh                       # GPU defaults: codellama-7b, HumanEval
#   RANKS="1 2 4" CONFIGS="1:W5N3G5 2:W10N3G10 4:W20N3G20" MODEL=smollm2-135m DATASET=spec_bench \
#     PER_CATEGORY=2 OUT=results/bench/cpu_lp_tp_pp/strong launch/strong_scaling.sh        # CPU, gloo
#
# Knobs (besides those of launch/_bench_lib.sh): RANKS, CONFIGS ("P:WxNyGz ..."), DECODERS
# (default hf-greedy,lp; add tp,pp to measure them in the same runs), OUT.
source "$(dirname "$0")/_bench_lib.sh"
MODEL="${MODEL:-codellama-7b}"
DATASET="${DATASET:-humaneval}"
RANKS="${RANKS:-1 2 4 8}"
CONFIGS="${CONFIGS:-1:W15N5G15 2:W30N5G30 4:W45N5G45 8:W60N5G60}"
DECODERS="${DECODERS:-hf-greedy,lp}"
OUT="${OUT:-results/bench/strong_scaling}"
runs=()
for P in $RANKS; do
  cfg="$(lookahead_for "$P" "$CONFIGS")"
  bench "$P" "$OUT/ws$P" "decoders=[${DECODERS}]" "lookahead=[${cfg}]" "tag=strong_ws${P}"
  runs+=("$OUT/ws$P")
done
"$PYTHON" -m lp.bench.plots strong-scaling "${runs[@]}" --out "$OUT" \
  --title "Strong scaling: ${MODEL}, ${DATASET}, W and G grown with ranks"
