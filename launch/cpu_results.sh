#!/usr/bin/env bash
# The CPU results: the default model (SmolLM2-135M, fp32) on Spec-Bench, >= 8 prompts per
# category, 128 new tokens. Run it on a quiet machine (timings!). Writes under OUT
# (default results/bench/cpu):
#   decoders/   one process: hf-greedy (baseline), lp-ar, lp at LOOKAHEAD (lp[auto] is lp's
#               default, W/N/G chosen from a measured step-cost curve), prompt lookup; per
#               category lp's S next to prompt lookup's S, tokens/s and speedup of each decoder,
#               and `outside fwd`: the share of lp's decode time spent outside the model forward
#               (summary.csv, table.txt with what lp[auto] chose, categories.png)
#   strong/     strong scaling of lp on 1, 2, 4 gloo ranks, W and G grown with the ranks
#   tp_pp/      tp and pp on the same rank counts, and lp_tp_pp.png (LP against TP and PP)
#
#   launch/cpu_results.sh                                        # the full run
#   PER_CATEGORY=1 SCALING_PER_CATEGORY=1 MAX_NEW_TOKENS=8 OUT=/tmp/cpu_smoke launch/cpu_results.sh   # smoke
#
# Knobs: PER_CATEGORY (8), SCALING_PER_CATEGORY (2: the 3 x 2 multi-rank runs are the slow
# part), MAX_NEW_TOKENS (128), LOOKAHEAD ("auto,W5N3G5,W7N5G7"), RANKS ("1 2 4"), SCALING_CONFIGS
# ("1:W5N3G5 2:W10N3G10 4:W20N3G20"), CORES (nproc), MODEL (smollm2-135m), OUT, plus those of
# launch/_bench_lib.sh.
export MODEL="${MODEL:-smollm2-135m}" DATASET="${DATASET:-spec_bench}" DEVICE="${DEVICE:-cpu}"
source "$(dirname "$0")/_bench_lib.sh"
export MAX_NEW_TOKENS CORES
OUT="${OUT:-results/bench/cpu}"
LOOKAHEAD="${LOOKAHEAD:-auto,W5N3G5,W7N5G7}"
RANKS="${RANKS:-1 2 4}"
SCALING_CONFIGS="${SCALING_CONFIGS:-1:W5N3G5 2:W10N3G10 4:W20N3G20}"
PER_CATEGORY="${PER_CATEGORY:-8}"
SCALING_PER_CATEGORY="${SCALING_PER_CATEGORY:-2}"
mkdir -p "$OUT"

# 1. every decoder on one process (all CORES threads), >= 8 prompts per category
PER_CATEGORY="$PER_CATEGORY" bench 1 "$OUT/decoders" \
  "decoders=[hf-greedy,lp-ar,lp,hf-prompt-lookup]" "lookahead=[${LOOKAHEAD}]" "tag=cpu_decoders"
sed -n '/^decoder /,$p' "$OUT/decoders/log.txt" | grep -v '^lp.bench:' > "$OUT/decoders/table.txt" || true
# what W=auto chose, per prompt, and why (its first reason)
"$PYTHON" - "$OUT/decoders/rows.jsonl" >> "$OUT/decoders/table.txt" <<'PY'
import collections, json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
auto = [r for r in rows if r.get("auto")]
shapes = collections.Counter(f"{r['lp_mode']} W={r['W']} N={r['N']} G={r['G']}" for r in auto)
print("\nlp[auto] chose: " + ", ".join(f"{k} ({v} prompts)" for k, v in shapes.most_common()))
for r in auto[:1] + auto[-1:]:
    print(f"  prompt {r['id']}: {r['auto']}")
PY

# 2. strong scaling of lp (gloo), 3. tp and pp on the same rank counts, LP vs TP vs PP
PER_CATEGORY="$SCALING_PER_CATEGORY" RANKS="$RANKS" CONFIGS="$SCALING_CONFIGS" OUT="$OUT/strong" \
  "$(dirname "$0")/strong_scaling.sh"
PER_CATEGORY="$SCALING_PER_CATEGORY" RANKS="$RANKS" STRONG="$OUT/strong" OUT="$OUT/tp_pp" \
  "$(dirname "$0")/tp_pp.sh"
echo "lp.bench: CPU results in $OUT" >&2
