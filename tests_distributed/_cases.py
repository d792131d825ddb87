"""The batched API cases: which (architecture, prompt, N, W, G) run at which world size."""

from __future__ import annotations

from pathlib import Path

from helpers import ARCHS

WORLD_SIZES = (1, 2, 3, 4)
# (N, W, G): lookahead + verification, and the same windows without verification (G=0).
CONFIGS = ((2, 5, 5), (3, 3, 3), (5, 7, 7), (2, 5, 0), (3, 3, 0), (5, 7, 0))
# Prompts with repetition: the pool is seeded from them, and the tiny models revisit n-grams.
PROMPTS = (
    [10, 20, 30, 40, 50] * 6 + [17, 18],
    [50, 7, 7, 90, 31, 40, 50, 7, 7, 90, 31, 40, 50],
    [5],  # a one-token prompt: nothing to prefill, no prompt n-grams
)
EOS_MODEL = "llama_eos"  # llama's weights with an extra EOS id that its greedy output hits mid-way
MAX_NEW = 32
COLLECTIVE_TIMEOUT_S = 60
MISMATCH_IDS = ("mismatch/prompt", "mismatch/W")


def prompt_index(arch: str, world_size: int) -> int:
    """One of the two main prompts per (arch, world size), alternating, so every (arch, prompt)
    pair is checked at two world sizes while each launch stays small (launch time is the budget)."""
    return (ARCHS.index(arch) + world_size) % 2


def _case(arch: str, p: int, cfg: tuple[int, int, int] | str) -> tuple[str, str, int, dict]:
    if cfg == "ar":
        return f"{arch}/p{p}/ar", arch, p, {"mode": "ar", "max_new_tokens": MAX_NEW}
    N, W, G = cfg
    return f"{arch}/p{p}/N{N}W{W}G{G}", arch, p, {"N": N, "W": W, "G": G, "max_new_tokens": MAX_NEW}


def cases(world_size: int) -> list[tuple[str, str, int, dict]]:
    """(task id, model, prompt index, settings) of the exactness cases at one world size: every
    architecture x every config; plain autoregressive mode on one architecture; early stop at
    an EOS (which can fall inside a multi-token acceptance); a one-token prompt."""
    out = [_case(arch, prompt_index(arch, world_size), cfg) for arch in ARCHS for cfg in CONFIGS]
    arch = ARCHS[world_size % len(ARCHS)]
    out.append(_case(arch, prompt_index(arch, world_size), "ar"))
    out += [_case(EOS_MODEL, 0, cfg) for cfg in ((2, 5, 5), (5, 7, 7), (3, 3, 0))]
    out.append(_case(ARCHS[(world_size + 1) % len(ARCHS)], 2, (3, 3, 3)))
    return out


def api_spec(models: dict[str, Path], world_size: int) -> dict:
    tasks = [{"id": cid, "model": arch, "prompt": PROMPTS[p], "settings": s} for cid, arch, p, s in cases(world_size)]
    if world_size > 1:
        base = {"model": ARCHS[0], "prompt": PROMPTS[0], "settings": {"N": 3, "W": 3, "G": 3, "max_new_tokens": 8}}
        last = str(world_size - 1)
        tasks += [
            dict(base, id="mismatch/prompt", per_rank={"1": {"prompt": PROMPTS[1]}}),
            dict(base, id="mismatch/W", per_rank={last: {"settings": dict(base["settings"], W=4)}}),
            dict(base, id="mismatch/recovered"),  # the group still works after a mismatch
        ]
    return {"models": {k: str(v) for k, v in models.items()}, "timeout_s": COLLECTIVE_TIMEOUT_S, "tasks": tasks}


def completed(launch, docs: list[dict], world_size: int) -> list[dict]:
    """Assert that a batched API launch finished on every rank; return the rank documents."""
    assert launch.returncode == 0, f"API launch on {world_size} ranks failed:\n{launch.describe()}"
    for r, doc in enumerate(docs):
        assert doc.get("done"), f"rank {r} did not finish: {doc.get('crash')}\n{launch.describe()}"
        assert doc["world_size"] == world_size
    return docs
