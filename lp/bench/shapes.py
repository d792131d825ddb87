"""Lookahead configurations by name, as `lp.bench` and the developer tools write them:
"W15N5G15", options after dashes ("W3N3G15-L128-D14"), or "auto"."""

from __future__ import annotations

from lp.config import NUMBER_OPTIONS

LOOKAHEAD_OPTIONS = {
    "pool": ("drafts", "pool"),
    "text": ("drafts", "pool+text"),
    "chains": ("tree", False),
    "tree": ("tree", True),
    "recent": ("pool_order", "recent"),
    "frequent": ("pool_order", "frequent"),
    "context": ("pool_order", "context"),
    "lone": ("lone_matches", True),
}


def parse_lookahead(spec: str) -> dict:
    """lp's settings from a config name: "W15N5G15" -> W=15 N=5 G=15; "auto": W/N/G chosen from a
    measured step-cost curve (lp/decode/auto.py). Options follow with dashes: `-pool` (no text
    drafts), `-text` (pool and text drafts), `-chains` (no shared prefixes), `-tree`, `-recent`,
    `-frequent`, `-context` (the pool's candidate order), `-lone` (text drafts also from x0's lone
    matches), and numbers: `-L128` (steps of at most 128 tokens), `-B80` (trees of at most 80
    nodes), `-D6` (text drafts of at most 6 tokens), `-X8` (8 text drafts per step), `-C60` (the
    pool keeps 60 n-grams per first token), `-R8` (the successor table keeps each token's top 8
    next tokens; `-R0`: no recycled drafts), `-F16` (below each tree node, up to 16 tokens of the
    text after an earlier occurrence of its token); e.g. "W15N5G15-pool-chains-recent-R0" is the
    classic verification branch."""
    import re

    head, *options = str(spec).strip().split("-")
    numbers = ", ".join(f"-{letter}<{key}>" for letter, key in NUMBER_OPTIONS.items())
    words = ", ".join(f"-{word}" for word in LOOKAHEAD_OPTIONS)
    if head.lower() == "auto":
        out: dict = dict(W="auto", N="auto", G="auto")
    else:
        m = re.fullmatch(r"W(\d+)N(\d+)G(\d+)", head, flags=re.IGNORECASE)
        if not m:
            raise ValueError(
                f"lookahead config must look like W15N5G15 or auto (options: {words}, {numbers}), got {spec!r}"
            )
        out = dict(W=int(m[1]), N=int(m[2]), G=int(m[3]))
    for opt in options:
        number = re.fullmatch(rf"([{''.join(NUMBER_OPTIONS)}])(\d+)", opt, flags=re.IGNORECASE)
        if number:
            out[NUMBER_OPTIONS[number[1].upper()]] = int(number[2])
        elif opt.lower() in LOOKAHEAD_OPTIONS:
            key, value = LOOKAHEAD_OPTIONS[opt.lower()]
            out[key] = value
        else:
            raise ValueError(f"unknown lookahead option {opt!r} in {spec!r} (known: {words}, {numbers})")
    return out


def option_name(key: str, value) -> str:
    """An lp option as it is spelled in a lookahead config name (parse_lookahead)."""
    letter = next((k for k, name in NUMBER_OPTIONS.items() if name == key), None)
    if letter is not None:
        return f"{letter}{value}"
    return next(name for name, kv in LOOKAHEAD_OPTIONS.items() if kv == (key, value))
