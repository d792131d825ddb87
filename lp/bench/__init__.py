"""lp's benchmark harness: `python -m lp.bench` (hydra, also under torchrun) runs a dataset
through several decoders in one run (lp lookahead, lp `mode=ar`, transformers greedy and prompt
lookup, tensor and pipeline parallelism) and reports per prompt and per category: new tokens,
steps, S, decode seconds, tokens/s, median step latency, the histogram of tokens accepted per
step, speedup against the autoregressive baseline of the same run, and whether the output
equals greedy decoding. Keys: configs/bench.yaml.

Modules: `datasets` (prompt sets, offline), `decoders` (the `BenchDecoder` interface and its
implementations), `tp` and `pp` (tensor and pipeline parallelism, applied to a baseline's own
model), `metrics` (pure functions), `report` (JSONL / CSV / table), `plots` (PNG), `runner`
(the loop), `__main__` (the hydra entry). Tools of their own: `steps` (step cost against step
tokens on a real architecture), `host` (host work per step), `project` (LP's strong scaling
projected from a real decode)."""
