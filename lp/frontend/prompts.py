"""Reading prompts: one string, or a JSONL file whose lines hold `prompt`, or `turns` whose
first item is used (MT-Bench / Spec-Bench format)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from lp.errors import LPError


@dataclass(frozen=True)
class Prompt:
    id: str | int
    text: str
    category: str | None = None


def read_jsonl(path: str | Path, limit: int | None = None) -> list[Prompt]:
    """Parse a prompts file; a bad line is an error that names the file and line."""
    if limit is not None and limit < 1:
        raise LPError(f"limit must be >= 1, got {limit}")
    p = Path(path)
    if not p.is_file():
        raise LPError(f"prompts file not found: {path}")
    prompts: list[Prompt] = []
    with p.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                # json's messages that end in " at" expect the position after them
                raise LPError(f"{path}:{n}: malformed JSON at column {e.colno}: {e.msg.removesuffix(' at')}") from None
            text = row.get("prompt") if isinstance(row, dict) else None
            if text is None and isinstance(row, dict) and isinstance(row.get("turns"), list) and row["turns"]:
                text = row["turns"][0]
            if not isinstance(text, str) or not text:
                raise LPError(f"{path}:{n}: a line needs a non-empty 'prompt' or 'turns'")
            pid = row.get("id", row.get("question_id", len(prompts)))
            prompts.append(Prompt(pid, text, row.get("category")))
            if limit is not None and len(prompts) >= limit:
                break
    if not prompts:
        raise LPError(f"no prompts in {path}")
    return prompts
