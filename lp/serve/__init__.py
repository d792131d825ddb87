"""`python -m lp.serve`: lp behind an OpenAI-compatible HTTP API, on one process or across ranks
(docs/serving.md). Rank 0 serves HTTP (`app`) and decodes requests one at a time with the other
ranks (`engine`), to which it hands each request once (`channel`)."""
