"""lp's benchmark harness: `python -m lp.bench` (hydra, also under torchrun) runs a dataset
through several decoders in one run (lp lookahead, lp `mode=ar`, transformers greedy and prompt
lookup, tensor and pipeline parallelism) and reports per prompt and per category: new tokens,
steps, S, decode seconds, tokens/s, median step latency, the histogram of tokens accepted per
step, speedup against the autoregressive baseline of the same run, and whether the output
equals greedy decoding. Keys: configs/bench.yaml.

Modules: `settings` (the keys, checked), `datasets` (prompt sets, offline), `interface` (what
every decoder implements and returns), `decoders` (lp's own, and building the list), `baselines`
(transformers greedy and prompt lookup, tensor and pipeline parallelism: `tp`, `pp`), `recycling`
(the Token Recycling baseline), `references` (cached greedy references), `sweep` (the budget
sweep, `python -m lp.bench.sweep`: S against step tokens), `shapes`
(lookahead configurations by name), `metrics` (pure functions), `report` (JSONL / CSV / table),
`plots` (PNG), `runner` (the loop), `__main__` (the hydra entry). Developer tools (step costs,
host work, the strong-scaling projection) live outside the package, in tools/."""
