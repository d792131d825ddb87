#!/usr/bin/env bash
# Runs lp.bench.sweep as parallel processes on one machine and joins them into one table:
#   bash launch/sweep.sh OUT [KEY=VALUE ...]
# One process per group of lp step sizes (SIZE_GROUPS) and one per baseline (BASELINES), each in
# its own folder OUT/parts/NAME (log.txt beside its rows), all started together: for a many-core
# CPU (device=cpu threads=1). On one GPU run one process instead: processes time-slice a GPU
# (sixteen on an H100 made each step 4 to 9 times slower: results/gpu/h100-2026-11-26b). Each part
# starts from OUT/references.json where it exists (the greedy references, e.g. computed once on a
# CPU with `sizes=[] baselines=[]`) and computes what it lacks. Then the parts' rows are joined
# into OUT/rows.jsonl and one run that decodes nothing (`decode=false`) writes OUT/sweep.json,
# sweep.md and sweep.png. KEY=VALUE go to every process (dataset, per_category, device, threads,
# ...); `sizes`, `configs`, `baselines`, `out` and `resume` are this script's. Exit status: 1 if a
# part failed, 0 if every part ended or was stopped at PART_LIMIT (the table joins what each wrote).
# Knobs: PYTHON; SIZE_GROUPS (default "11,16 32,64,128 256,512,1024": the sizes of a group run in
# one process, one after the other; SIZE:CONFIG gives a size a config other than W=auto's ladder's,
# in a group to every size or to none: "1024:W3N3G15-B1008 128:W2N3G15-B114"); BASELINES (default
# "token-recycling hf-prompt-lookup"; empty: none); PART_LIMIT (seconds a part may run: one
# stopped keeps the prompts it finished, and the table counts those).
set -fuo pipefail  # -f: a group's words are sizes and configs, never globs
(($#)) || { echo "usage: launch/sweep.sh OUT [KEY=VALUE ...]" >&2; exit 2; }
OUT="$1"
shift
PYTHON="${PYTHON:-python3}"
SIZE_GROUPS="${SIZE_GROUPS-11,16 32,64,128 256,512,1024}"
BASELINES="${BASELINES-token-recycling hf-prompt-lookup}"
mkdir -p "$OUT/parts"
pids=()
names=()
csv() { local IFS=,; echo "$*"; }
# part NAME KEY=VALUE...: one sweep process in the background, its folder seeded with the references
part() {
  local name="$1" dir="$OUT/parts/$1"
  shift
  mkdir -p "$dir"
  [[ -f "$OUT/references.json" ]] && cp "$OUT/references.json" "$dir/"
  ${PART_LIMIT:+timeout -k 5 "$PART_LIMIT"} "$PYTHON" -m lp.bench.sweep "$@" progress=false resume=true "out=$dir" \
    >"$dir/log.txt" 2>&1 &
  pids+=($!)
  names+=("$name")
}
for group in $SIZE_GROUPS; do
  sizes=() configs=()
  for item in ${group//,/ }; do
    sizes+=("${item%%:*}")
    [[ "$item" == *:* ]] && configs+=("${item#*:}")
  done
  ((${#configs[@]} == 0 || ${#configs[@]} == ${#sizes[@]})) \
    || { echo "launch/sweep.sh: group $group: give a config to every size or to none" >&2; exit 2; }
  if ((${#configs[@]})); then
    part "lp-${group//[,:]/-}" "$@" "sizes=[$(csv "${sizes[@]}")]" "configs=[$(csv "${configs[@]}")]" "baselines=[]"
  else
    part "lp-${group//,/-}" "$@" "sizes=[$(csv "${sizes[@]}")]" "baselines=[]"
  fi
done
for b in $BASELINES; do
  part "$b" "$@" "sizes=[]" "baselines=[$b]"
done
((${#pids[@]})) || { echo "launch/sweep.sh: no part to run (SIZE_GROUPS and BASELINES empty)" >&2; exit 2; }
trap 'kill "${pids[@]}" 2>/dev/null' INT TERM  # a stopped script stops its parts
t0=$SECONDS
failed=0
for i in "${!pids[@]}"; do
  if wait "${pids[$i]}"; then rc=0; else rc=$?; fi
  if ((rc == 124)) && [[ -n "${PART_LIMIT:-}" ]]; then
    state="stopped at its ${PART_LIMIT} s limit"
  else
    state="exit $rc"
    ((rc == 0)) || failed=1
  fi
  echo "launch/sweep.sh: ${names[$i]} $state (log: $OUT/parts/${names[$i]}/log.txt; all parts so far: $((SECONDS - t0)) s)"
done
trap - INT TERM
rows=()
for name in "${names[@]}"; do
  [[ -f "$OUT/parts/$name/rows.jsonl" ]] && rows+=("$OUT/parts/$name/rows.jsonl")
done
cat /dev/null "${rows[@]}" >"$OUT/rows.jsonl"  # this run's parts only
# the references every part used, joined (each part keeps what it computed in its own file)
"$PYTHON" -c 'import json, os, sys; fs = [f for f in sys.argv[1:] if os.path.exists(f)]
if fs: json.dump({k: v for f in fs for k, v in json.load(open(f)).items()}, open(sys.argv[1], "w"))' \
  "$OUT/references.json" "${rows[@]/%rows.jsonl/references.json}" || failed=1
"$PYTHON" -m lp.bench.sweep "$@" "sizes=[]" "baselines=[]" progress=false decode=false "out=$OUT" || failed=1
exit $failed
