"""Lookahead configurations by name, as `lp.bench` and the developer tools write them:
"W15N5G15", options after dashes ("W8N5G15-B88"), or "auto"."""

from __future__ import annotations

from lp.config import NUMBER_OPTIONS

LOOKAHEAD_OPTIONS = {
    "pool": ("drafts", "pool"),
    "text": ("drafts", "pool+text"),
    "chains": ("tree", False),
    "tree": ("tree", True),
    "recent": ("order", "recent"),
    "frequent": ("order", "frequent"),
    "context": ("order", "context"),
}


def parse_lookahead(spec: str) -> dict:
    """lp's settings from a config name: "W15N5G15" -> W=15 N=5 G=15; "auto": W/N/G chosen from a
    measured step-cost curve (lp/decode/auto.py). Options follow with dashes: `-pool` (no text
    drafts), `-text` (pool and text drafts), `-chains` (no shared prefixes), `-tree`, `-recent`,
    `-frequent`, `-context` (pool candidate order), `-B80`
    (budget: 80 verification tokens), `-D6` (text drafts of at most 6 tokens), `-T8` (8 text
    drafts per step), `-P60` (the pool keeps 60 n-grams per first token), `-R8` (the successor
    table keeps each token's top 8 next tokens; `-R0`: no recycled drafts), `-L11` (steps of at
    most 11 tokens: the tree gets what the pending tokens leave of them, up to the budget), `-M1`
    (text drafts also from x0's lone matches), `-F16` (below each tree node, up to 16 tokens of
    the text after an earlier occurrence of its token, the one matching the node's path longest); e.g.
    "W15N5G15-pool-chains-recent-R0" is the classic verification branch."""
    import re

    head, *options = str(spec).strip().split("-")
    if head.lower() == "auto":
        out: dict = dict(W="auto", N="auto", G="auto")
    else:
        m = re.fullmatch(r"W(\d+)N(\d+)G(\d+)", head, flags=re.IGNORECASE)
        if not m:
            raise ValueError(
                f"lookahead config must look like W15N5G15 or auto (options: -pool, -text, "
                f"-chains, -tree, -recent, -frequent, -context, -B<budget>, -D<draft length>, "
                f"-T<text drafts>, -P<pool size>, -R<successors>, -L<step limit>, -M<text match>, -F<follow>), "
                f"got {spec!r}"
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
            raise ValueError(
                f"unknown lookahead option {opt!r} in {spec!r} (known: pool, text, chains, tree, recent, "
                f"frequent, context, B<n>, D<n>, T<n>, P<n>, R<n>, L<n>, M<n>, F<n>)"
            )
    return out


def option_name(key: str, value) -> str:
    """An lp option as it is spelled in a lookahead config name (parse_lookahead)."""
    letter = next((k for k, name in NUMBER_OPTIONS.items() if name == key), None)
    if letter is not None:
        return f"{letter}{value}"
    return next(name for name, kv in LOOKAHEAD_OPTIONS.items() if kv == (key, value))
