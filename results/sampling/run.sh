#!/usr/bin/env bash
# S (tokens per step) of exact sampling vs greedy on Spec-Bench, default model, W=5 N=3 G=5,
# 128 new tokens, world size 1. prompts.jsonl holds the first 2 prompts of each category group
# (round robin); t=0.7 ran on the first 8, t=1.0 on the first 6 (one per group). S only: the machine was shared.
set -euo pipefail
cd "$(dirname "$0")/../.."
run() { python -m lp.generate prompts=results/sampling/prompts.jsonl W=5 N=3 G=5 max_new_tokens=128 \
          seed=0 quiet=true "$@"; }
# run temperature=0.7 out=results/sampling/t0.7.jsonl   (ran first, 8 of the 12 prompts before it was stopped to free the CPU)
run temperature=1.0 limit=6 out=results/sampling/t1.0.jsonl

