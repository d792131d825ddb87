#!/usr/bin/env bash
# lp against transformers on this machine, one process, side by side on every prompt:
# transformers' greedy `generate` (the baseline), lp `mode=ar`, and lp with its default
# configuration (W/N/G auto: chosen from a measured step-cost curve, lp/auto.py), and, for
# reference, lp at a fixed lookahead shape. Default: the embedded model on Spec-Bench's MT-Bench
# prompts, 128 new tokens. Run it on a quiet machine (timings!). Writes OUT (default
# results/bench/cpu_speed): rows.jsonl, summary.csv, table.txt (tokens/s, speedup, S, exactness,
# and `outside fwd`: the share of lp's decode time spent outside the model forward).
#
#   launch/cpu_speed.sh                                   # the full run
#   LIMIT=2 MAX_NEW_TOKENS=16 OUT=/tmp/speed launch/cpu_speed.sh   # smoke
#
# Knobs: CATEGORIES ([mt_bench]), LIMIT (all), LOOKAHEAD ("auto,W5N3G5"), plus those of
# launch/_bench_lib.sh.
export MODEL="${MODEL:-smollm2-135m}" DATASET="${DATASET:-spec_bench}" DEVICE="${DEVICE:-cpu}"
source "$(dirname "$0")/_bench_lib.sh"
OUT="${OUT:-results/bench/cpu_speed}"
CATEGORIES="${CATEGORIES:-[mt_bench]}"
LOOKAHEAD="${LOOKAHEAD:-auto,W5N3G5}"
bench 1 "$OUT" "decoders=[hf-greedy,lp-ar,lp]" "lookahead=[${LOOKAHEAD}]" "categories=${CATEGORIES}" \
  "tag=cpu_speed"
sed -n '/^decoder /,$p' "$OUT/log.txt" | grep -v '^lp.bench:' > "$OUT/table.txt" || true
# what W=auto chose, per prompt, and why (its first reason)
"$PYTHON" - "$OUT/rows.jsonl" >> "$OUT/table.txt" <<'PY'
import collections, json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
auto = [r for r in rows if r.get("auto")]
shapes = collections.Counter(f"{r['lp_mode']} W={r['W']} N={r['N']} G={r['G']}" for r in auto)
print("\nlp[auto] chose: " + ", ".join(f"{k} ({v} prompts)" for k, v in shapes.most_common()))
for r in auto[:1] + auto[-1:]:
    print(f"  prompt {r['id']}: {r['auto']}")
PY
cat "$OUT/table.txt"
echo "lp.bench: results in $OUT" >&2
