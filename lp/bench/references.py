"""Greedy references cached in a JSON file: transformers' greedy output of a prompt, computed once
and kept beside the results that are checked against it (`tools.exactness`, `lp.bench.sweep`).
An entry is keyed by the prompt's token ids and `max_new_tokens` (`key`)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path


def key(ids: list[int], max_new_tokens: int) -> str:
    """The cache key of a prompt's reference: a hash of its ids and `max_new_tokens`."""
    return hashlib.sha1(json.dumps([list(ids), max_new_tokens]).encode()).hexdigest()[:16]


class References:
    """The references of one file (`{key: {"output_ids": [...], "max_new_tokens": n, ...}}`);
    `put` writes the file, so an interrupted run keeps what it computed."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.entries: dict[str, dict] = json.loads(self.path.read_text()) if self.path.exists() else {}

    def get(self, ids: list[int], max_new_tokens: int) -> list[int] | None:
        entry = self.entries.get(key(ids, max_new_tokens))
        return None if entry is None else entry["output_ids"]

    def put(self, ids: list[int], max_new_tokens: int, output_ids: list[int], **info) -> None:
        self.entries[key(ids, max_new_tokens)] = {
            **info,
            "max_new_tokens": max_new_tokens,
            "prompt_len": len(ids),
            "output_ids": list(output_ids),
        }
        part = self.path.with_name(self.path.name + ".part")
        part.write_text(json.dumps(self.entries))
        part.replace(self.path)  # whole or not at all: a run stopped mid-write keeps the last file
