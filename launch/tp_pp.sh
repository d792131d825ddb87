#!/usr/bin/env bash
# LP against tensor and pipeline parallelism: per rank count P, one run with autoregressive
# decoding (hf-greedy, rank 0, the speedup baseline), tp (tensor parallel greedy decoding,
# TP_IMPL=dtensor: torch parallelize_module, or hf: transformers' tp_plan="auto") and pp (layers
# split over the P ranks, send/recv between them). Writes OUT/ws{P}/ and OUT/tp_pp.{png,csv};
# with STRONG (the OUT of launch/strong_scaling.sh) also OUT/lp_tp_pp.{png,csv}, LP's runs
# next to these.
#
#   launch/tp_pp.sh                                 # GPU defaults: codellama-7b, HumanEval, 1-8 ranks
#   MODEL=smollm2-135m DATASET=spec_bench PER_CATEGORY=2 RANKS="1 2 4" \
#     STRONG=results/bench/cpu_lp_tp_pp/strong OUT=results/bench/cpu_lp_tp_pp/tp_pp launch/tp_pp.sh  # CPU
#
# Knobs (besides those of launch/_bench_lib.sh): RANKS, TP_IMPL, DECODERS (default
# hf-greedy,tp,pp), STRONG, OUT. A decoder that cannot run at some P (e.g. tp[hf] when the head
# counts do not divide by P) gets rows with status "unsupported: ..." and "n/a" on the plot.
source "$(dirname "$0")/_bench_lib.sh"
MODEL="${MODEL:-codellama-7b}"
DATASET="${DATASET:-humaneval}"
RANKS="${RANKS:-1 2 4 8}"
TP_IMPL="${TP_IMPL:-dtensor}"
DECODERS="${DECODERS:-hf-greedy,tp,pp}"
OUT="${OUT:-results/bench/tp_pp}"
runs=()
for P in $RANKS; do
  bench "$P" "$OUT/ws$P" "decoders=[${DECODERS}]" "tp_impl=${TP_IMPL}" "tag=tp_pp_ws${P}"
  runs+=("$OUT/ws$P")
done
"$PYTHON" -m lp.bench.plots strong-scaling "${runs[@]}" --out "$OUT" --name tp_pp \
  --title "TP (${TP_IMPL}) and PP: ${MODEL}, ${DATASET}"
if [[ -n "${STRONG:-}" ]]; then
  lp_runs=()
  for P in $RANKS; do [[ -f "$STRONG/ws$P/rows.jsonl" ]] && lp_runs+=("$STRONG/ws$P"); done
  "$PYTHON" -m lp.bench.plots strong-scaling "${lp_runs[@]}" "${runs[@]}" --out "$OUT" --name lp_tp_pp \
    --kinds lp,tp,pp --title "LP vs TP vs PP: ${MODEL}, ${DATASET}"
fi
