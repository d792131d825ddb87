"""Load test of `lp.serve` beside other servers of the same model on the same machine, one run:
many concurrent streaming chat clients (the openai client's async API), closed loop.

    python -m tools.serve_load [--clients 1,4,16,32] [--requests 32] [--max-tokens 64]
        [--servers lp,lp-ar,hf-cb] [--server KEY=VALUE ...] [--out DIR]
    python -m tools.serve_load --soak 1000 [--out DIR]

Servers, each started here on a free port of 127.0.0.1 and stopped (SIGTERM) before the next:
  lp      `python -m lp.serve` with its defaults (W=auto: the step's budget gives drafts where they
          pay) and the `--server` keys;
  lp-ar   the same with `mode=ar`: plain batched decoding;
  hf-cb   transformers' `serve --continuous-batching` on the model's local directory, its KV bounded
          by `--cb-num-blocks` (unbounded it asks for more memory than such a machine has).
Per server, after one warm-up request: for each client count c, c clients send requests one after
another (each its next when its last is answered) until `--requests` (at least c) are answered;
`--rounds` times, the servers in turn (the order reversed each round: a slow spell of a shared
machine touches every server), each level's figures the median of its rounds;
prompt i of a level is PROMPTS[i mod 8], chat, greedy, `--max-tokens` new tokens. A 429 is retried
after `--retry-s`. Per request: the time to first token (from the attempt the server took, its
queue and prefill included) and the time between tokens after the first; per level: their medians
and 95th percentiles, the aggregate tokens/s (all tokens over the level's wall time), lp's S.
Every lp answer must be the text the same server gave that prompt at one client (exactness under
batching); hf-cb's agreement with lp's is reported.

The machine's weight-read floor (its measured copy bandwidth over the bytes one token's forward
reads) is measured and reported beside the one-client rates.

`--soak N` sends N requests of random lengths (1 to 128 new tokens, 16 clients), a quarter of them
dropped by their client after a few events, to one lp server, in four parts, and checks that the
drained server holds no KV page and that its memory, read after each part, grows no further in the
second half and no more in all than its draft memory does (the texts it keeps by design, bounded).

Writes OUT/summary.json, OUT/summary.md, OUT/requests.jsonl and OUT/load.png (soak: OUT/soak.json,
OUT/soak.md), with the commands, the device (the CPU's model name) and the date.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import random
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import openai

from lp.engine.kernel_choice import cpu_name

PROMPTS = [
    "Write a short story about a robot learning to paint.",
    "Explain how a hash table works.",
    "List five tips for writing clean Python code.",
    "Translate to French: The weather is nice today and we will go to the park.",
    "What is the difference between a list and a tuple in Python?",
    "Summarize the plot of Romeo and Juliet in three sentences.",
    "Write a haiku about the ocean.",
    "Give a recipe for pancakes.",
]
RETRY_S = 0.5  # a client's wait after a 429
QUARTERS = 4  # parts of a soak, the server's memory read after each
SERVERS = ("lp", "lp-ar", "hf-cb")


@dataclass
class Record:
    """One request: its client and prompt, answer and times (seconds, time.perf_counter)."""

    client: int
    prompt: int
    text: str = ""
    completion_tokens: int = 0
    steps: int = 0
    finish_reason: str | None = None
    rejected: int = 0  # 429 answers before it was taken
    start: float = 0.0  # the first attempt
    queued: float = 0.0  # the attempt the server took
    events: list[float] = field(default_factory=list)  # each streamed event with text
    error: str | None = None

    @property
    def ttft(self) -> float | None:
        return self.events[0] - self.queued if self.events else None

    @property
    def tbt(self) -> float | None:
        """The mean time between tokens after the first (None: fewer than two)."""
        if self.completion_tokens < 2 or not self.events:
            return None
        return (self.events[-1] - self.events[0]) / (self.completion_tokens - 1)


def messages(prompt: int) -> list[dict]:
    return [{"role": "user", "content": PROMPTS[prompt % len(PROMPTS)]}]


async def one(
    client: openai.AsyncOpenAI, record: Record, model: str, settings: dict, retry_s: float, drop_after: int = 0
) -> None:
    """Stream one request; retry while the queue is full (429); `drop_after`: leave after that many
    events (a client that disconnects)."""
    record.start = time.perf_counter()
    while True:
        record.queued = time.perf_counter()
        try:
            stream = await client.chat.completions.create(
                model=model,
                messages=messages(record.prompt),
                stream=True,
                stream_options={"include_usage": True},
                **settings,
            )
            async for chunk in stream:
                if chunk.usage is not None:
                    record.completion_tokens = chunk.usage.completion_tokens
                    record.steps = (chunk.usage.model_extra or {}).get("steps", 0)
                for choice in chunk.choices:
                    if choice.delta.content:
                        record.events.append(time.perf_counter())
                        record.text += choice.delta.content
                    record.finish_reason = choice.finish_reason or record.finish_reason
                if drop_after and len(record.events) >= drop_after:
                    await stream.close()
                    record.error = "dropped by its client"
                    return
            return
        except openai.RateLimitError:
            record.rejected += 1
            await asyncio.sleep(retry_s)


async def load(
    url: str,
    model: str,
    *,
    clients: int,
    requests: int,
    settings: dict,
    deadline_s: float,
    retry_s: float = RETRY_S,
    api_key: str = "none",
    drop: float = 0.0,
    seed: int = 0,
) -> tuple[list[Record], float]:
    """`clients` concurrent clients sending `requests` requests in all, each its next when its last
    is answered (request i: prompt i); with `drop`, that share of them left by their client after
    1 to 4 events. The records (a request that failed or ran out of time says so in `error`) and
    the wall time."""
    http = openai.DefaultAsyncHttpxClient(limits=httpx.Limits(max_connections=clients + 8))
    records = [Record(-1, i) for i in range(requests)]
    rng = random.Random(seed)
    drops = [rng.randint(1, 4) if rng.random() < drop else 0 for _ in range(requests)]
    lengths = [rng.randint(1, 128) for _ in range(requests)] if drop else None
    todo = iter(range(requests))
    t0 = time.perf_counter()
    async with openai.AsyncOpenAI(
        base_url=url + "/v1", api_key=api_key, max_retries=0, timeout=deadline_s, http_client=http
    ) as client:

        async def worker(c: int) -> None:
            for i in todo:
                records[i].client = c
                own = settings if lengths is None else {**settings, "max_tokens": lengths[i]}
                try:
                    await one(client, records[i], model, own, retry_s, drops[i])
                except Exception as e:  # noqa: BLE001 - recorded, the load goes on
                    records[i].error = f"{type(e).__name__}: {e}"

        tasks = [asyncio.ensure_future(worker(c)) for c in range(clients)]
        done, pending = await asyncio.wait(tasks, timeout=deadline_s)
        for task in pending:
            task.cancel()
        for r in records:
            if not r.events and r.error is None:
                r.error = f"not answered within {deadline_s} s"
    return records, time.perf_counter() - t0


def wrong(records: list[Record], refs: dict[int, Record]) -> list[str]:
    """Every request not answered completely and as its reference, one line each."""
    bad = []
    for r in records:
        ref = refs.get(r.prompt % len(PROMPTS))
        if r.error or ref is None or r.text != ref.text or r.completion_tokens != ref.completion_tokens:
            bad.append(f"request {r.prompt}: {r.error or 'its answer differs from the reference'}")
    return bad


def percentiles(values: list[float]) -> dict[str, float] | None:
    """Median and 95th percentile (nearest rank); None without values."""
    if not values:
        return None
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, max(0, -(-95 * len(ordered) // 100) - 1))]
    return {"median": statistics.median(ordered), "p95": p95}


def summarize(records: list[Record], wall_s: float) -> dict:
    """A level's figures over its answered requests."""
    done = [r for r in records if r.error is None and r.events]
    tokens, steps = sum(r.completion_tokens for r in done), sum(r.steps for r in done)
    return {
        "requests": len(records),
        "answered": len(done),
        "errors": sorted({r.error for r in records if r.error}),
        "ttft_s": percentiles([r.ttft for r in done]),
        "tbt_s": percentiles([r.tbt for r in done if r.tbt is not None]),
        "rejected_429": sum(r.rejected for r in records),
        "S": tokens / steps if steps else None,
        "tokens": tokens,
        "wall_s": wall_s,
        "tokens_per_s": tokens / wall_s if wall_s else 0.0,
    }


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (from /proc)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def running(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie is not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def rss_mib(pid: int) -> float:
    """A process's resident memory (VmRSS), MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_command(kind: str, port: int, keys: list[str], model_dir: str, cb_blocks: int) -> list[str]:
    """The command line that starts server `kind` on `port` (hf-cb: `cb_blocks` KV blocks of 64 tokens)."""
    if kind == "hf-cb":
        transformers = str(Path(sys.executable).with_name("transformers"))
        return [
            transformers, "serve", "--continuous-batching", "--cb-num-blocks", str(cb_blocks), "--cb-block-size", "64",
            "--device", "cpu", "--dtype", "float32", "--host", "127.0.0.1", "--port", str(port), model_dir,
        ]  # fmt: skip
    mode = ["mode=ar"] if kind == "lp-ar" else []
    return [sys.executable, "-m", "lp.serve", "host=127.0.0.1", f"port={port}", *mode, *keys]


def start_server(cmd: list[str], port: int, log: Path, ready: str = "/health") -> tuple[subprocess.Popen, str]:
    """Start `cmd` (its output appended to `log`) and wait until `ready` answers 200: its process and URL."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as out:
        proc = subprocess.Popen(cmd, start_new_session=True, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 900
    while time.time() < deadline and proc.poll() is None:
        try:
            if httpx.get(url + ready, timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise SystemExit(f"the server did not start: {shlex.join(cmd)}")


def stop_server(proc: subprocess.Popen) -> list[int]:
    """SIGTERM the server and wait for it; the processes it started that still run."""
    started = [proc.pid, *descendants(proc.pid)]
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(120)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(30)
    time.sleep(1)
    return [p for p in started if running(p)]


def weight_read_floor(model_dir: str) -> dict:
    """The machine's copy bandwidth (bytes read and written a second, over 1 GiB: past the caches)
    and the bytes one token's forward reads (tools/steps.py), and their ratio: the most tokens/s
    one sequence could decode here."""
    import torch
    from transformers import AutoModelForCausalLM

    from tools.steps import copy_bandwidth, weight_bytes

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    bandwidth = copy_bandwidth(torch.device("cpu"), mib=1024, reps=10)  # past the caches: bytes read + written
    read = weight_bytes(model)[1]
    return {"copy_gb_s": bandwidth / 1e9, "bytes_per_token": read, "floor_tokens_per_s": bandwidth / read}


def run_server(kind: str, args, model_dir: str, levels: list[int]) -> dict:
    """One server: started, warmed up, loaded at each client count, stopped."""
    port = _free_port()
    cmd = server_command(kind, port, args.server, model_dir, args.cb_blocks)
    proc, url = start_server(cmd, port, args.out / f"server-{kind}.log")
    model = model_dir if kind == "hf-cb" else args.model
    settings = {"max_tokens": args.max_tokens, "temperature": 0}
    out: dict = {"command": shlex.join(cmd), "levels": {}}
    try:
        asyncio.run(load(url, model, clients=1, requests=1, settings=settings, deadline_s=args.deadline_s))
        for clients in levels:
            records, wall = asyncio.run(
                load(
                    url,
                    model,
                    clients=clients,
                    requests=max(args.requests, clients),
                    settings=settings,
                    deadline_s=args.deadline_s,
                    retry_s=args.retry_s,
                )
            )
            level = summarize(records, wall)
            level["records"] = [asdict(r) | {"ttft": r.ttft, "tbt": r.tbt} for r in records]
            out["levels"][clients] = level
            print(f"serve_load: {kind}, {clients} clients: {_line(level)}", file=sys.stderr, flush=True)
        if kind != "hf-cb":
            out["health"] = httpx.get(url + "/health").json()
    finally:
        out["survivors"] = stop_server(proc)
    return out


def _line(level: dict) -> str:
    ms = lambda d: f"{1e3 * d['median']:.0f} ms" if d else "-"  # noqa: E731
    return (
        f"{level['tokens_per_s']:.1f} tokens/s, TTFT median {ms(level['ttft_s'])}, TBT median {ms(level['tbt_s'])}, "
        f"{level['answered']}/{level['requests']} answered, {level['rejected_429']} 429s"
    )


def median_of(runs: list[dict]) -> dict:
    """One server's rounds as one: each level's figures their median over the rounds (every
    round's kept in `rounds`), its records all of theirs."""
    out = {"command": runs[0]["command"], "levels": {}, "survivors": sorted({p for r in runs for p in r["survivors"]})}
    out["health"] = runs[-1].get("health")
    for clients in runs[0]["levels"]:
        each = [r["levels"][clients] for r in runs]
        level = {k: statistics.median(lv[k] for lv in each) for k in ("tokens_per_s", "wall_s")}
        for k in ("ttft_s", "tbt_s"):
            parts = [lv[k] for lv in each if lv[k]]
            level[k] = {q: statistics.median(p[q] for p in parts) for q in ("median", "p95")} if parts else None
        S = [lv["S"] for lv in each if lv["S"]]
        level["S"] = statistics.median(S) if S else None
        for k in ("requests", "answered", "rejected_429", "tokens"):
            level[k] = sum(lv[k] for lv in each)
        level["errors"] = sorted({e for lv in each for e in lv["errors"]})
        level["rounds"] = [{k: lv[k] for k in ("tokens_per_s", "ttft_s", "tbt_s", "S", "rejected_429")} for lv in each]
        level["records"] = [rec for lv in each for rec in lv["records"]]
        out["levels"][clients] = level
    return out


def check(servers: dict, levels: list[int]) -> dict:
    """Every lp answer against the answers its server gave at one client; hf-cb's agreement with lp's."""
    refs: dict[str, dict[int, Record]] = {}
    for kind, s in servers.items():
        first = s["levels"][levels[0]]["records"]
        refs[kind] = {r["prompt"] % len(PROMPTS): _record(r) for r in first if r["error"] is None}
    out = {}
    for kind, s in servers.items():
        records = [_record(r) for level in s["levels"].values() for r in level["records"]]
        if kind == "hf-cb":
            lp = refs.get("lp", {})
            same = sum(r.text == lp[r.prompt % len(PROMPTS)].text for r in records if r.prompt % len(PROMPTS) in lp)
            out[kind] = {"same_text_as_lp": same, "requests": len(records)}
        else:
            out[kind] = {"wrong": wrong(records, refs[kind]), "requests": len(records)}
    return out


def _record(d: dict) -> Record:
    return Record(**{k: v for k, v in d.items() if k not in ("ttft", "tbt")})


def report(doc: dict) -> str:
    """summary.md: what ran, where, the figures side by side."""
    levels, servers = doc["levels"], doc["servers"]
    ms = lambda d: f"{1e3 * d['median']:.0f} / {1e3 * d['p95']:.0f}" if d else "-"  # noqa: E731
    lines = [
        "# lp.serve under load, beside transformers' continuous batching",
        "",
        f"- command: `{doc['command']}`",
        f"- device: {doc['device']} ({doc['cores']} cores, load average {doc['load_average'][0]} at the start, "
        f"{doc['load_average'][1]} at the end); date: {doc['date']}",
        f"- load: chat, greedy, {doc['max_tokens']} new tokens a request, closed loop: each client sends its next "
        f"request when its last is answered, at least {doc['requests']} requests a level; {doc['rounds']} rounds of "
        "every server in turn, each figure the median of its rounds (the sums: answered, 429s)",
        f"- weight-read floor: copy {doc['floor']['copy_gb_s']:.1f} GB/s over "
        f"{doc['floor']['bytes_per_token'] / 1e6:.0f} MB a token = {doc['floor']['floor_tokens_per_s']:.1f} tokens/s "
        "for one sequence",
    ]
    lines += [f"- {kind}: `{s['command']}`" for kind, s in servers.items()]
    lines += ["", "| clients | server | tokens/s | TTFT ms median / p95 | TBT ms median / p95 | S | 429s | answered |"]
    lines += ["|---:|---|---:|---:|---:|---:|---:|---:|"]
    for clients in levels:
        for kind, s in servers.items():
            lv = s["levels"][str(clients)] if str(clients) in s["levels"] else s["levels"][clients]
            S = f"{lv['S']:.2f}" if lv["S"] else "-"
            lines.append(
                f"| {clients} | {kind} | {lv['tokens_per_s']:.1f} | {ms(lv['ttft_s'])} | {ms(lv['tbt_s'])} | {S} | "
                f"{lv['rejected_429']} | {lv['answered']}/{lv['requests']} |"
            )
    lines += ["", "Ratios in this run:", ""]
    for clients in levels:
        rate = {k: (s["levels"].get(str(clients)) or s["levels"][clients])["tokens_per_s"] for k, s in servers.items()}
        parts = []
        if "lp" in rate and "hf-cb" in rate and rate["hf-cb"]:
            parts.append(f"lp / hf-cb {rate['lp'] / rate['hf-cb']:.2f}x")
        if "lp" in rate and "lp-ar" in rate and rate["lp-ar"]:
            parts.append(f"lp / lp-ar {rate['lp'] / rate['lp-ar']:.2f}x")
        if clients == 1 and "lp" in rate:
            parts.append(f"lp at {rate['lp'] / doc['floor']['floor_tokens_per_s']:.0%} of the weight-read floor")
        lines.append(f"- {clients} client{'s' if clients > 1 else ''}: " + ", ".join(parts))
    lines += ["", "Exactness under batching (every lp answer against its server's answer at one client):", ""]
    for kind, c in doc["check"].items():
        if "wrong" in c:
            lines.append(f"- {kind}: {c['requests'] - len(c['wrong'])}/{c['requests']} identical")
        else:
            lines.append(f"- {kind}: {c['same_text_as_lp']}/{c['requests']} with lp's text (its own greedy decoding)")
    lines += ["", f"Processes left after each server's stop: {doc['survivors']}", ""]
    return "\n".join(lines)


def plot(doc: dict, path: Path) -> None:
    """Aggregate tokens/s and the median time to first token against the clients, per server."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for kind, s in doc["servers"].items():
        xs = [int(c) for c in s["levels"]]
        a.plot(xs, [lv["tokens_per_s"] for lv in s["levels"].values()], marker="o", label=kind)
        ttft = [(x, lv["ttft_s"]["median"]) for x, lv in zip(xs, s["levels"].values()) if lv["ttft_s"]]
        b.plot([x for x, _ in ttft], [t for _, t in ttft], marker="o", label=kind)
    a.axhline(doc["floor"]["floor_tokens_per_s"], color="grey", ls=":", label="one sequence's weight-read floor")
    for ax, name in ((a, "aggregate tokens/s"), (b, "time to first token, median (s)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent streaming clients")
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
    b.set_yscale("log")
    a.legend()
    fig.suptitle(f"SmolLM2-135M, {doc['device']}, {doc['max_tokens']} new tokens a chat request")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def soak(args, model_dir: str) -> int:
    """`--soak N`: random lengths and disconnects against one lp server, in QUARTERS parts; its KV
    and memory after each."""
    port = _free_port()
    cmd = server_command("lp", port, args.server, model_dir, args.cb_blocks)
    proc, url = start_server(cmd, port, args.out / "server-soak.log")
    settings = {"temperature": 0}
    records, wall, rss, held = [], 0.0, [], []
    try:
        first, _ = asyncio.run(
            load(url, args.model, clients=16, requests=64, settings=settings, deadline_s=args.deadline_s, drop=0.25)
        )
        time.sleep(2)
        idle = rss_mib(proc.pid)
        t0 = time.perf_counter()
        for q in range(QUARTERS):
            part = load(
                url,
                args.model,
                clients=16,
                requests=args.soak // QUARTERS,
                settings=settings,
                deadline_s=args.deadline_s,
                drop=0.25,
                seed=1 + q,
            )
            done, seconds = asyncio.run(part)
            records, wall = records + done, wall + seconds
            time.sleep(2)
            rss.append(rss_mib(proc.pid))
            held.append(httpx.get(url + "/health").json()["draft_memory_mib"])
        health = httpx.get(url + "/health").json()
    finally:
        survivors = stop_server(proc)
    dropped = sum(r.error == "dropped by its client" for r in records)
    failed = [r.error for r in records if r.error and r.error != "dropped by its client"]
    doc = {
        "command": "python -m tools.serve_load " + shlex.join(sys.argv[1:]),
        "server": shlex.join(cmd),
        "device": cpu_name(),
        "date": datetime.date.today().isoformat(),
        "requests": len(records),
        "dropped_by_client": dropped,
        "failed": failed,
        "tokens": sum(r.completion_tokens or len(r.events) for r in records),
        "seconds": round(wall, 1),
        "rss_mib_after_a_first_round": round(idle, 1),
        "rss_mib_after_each_quarter": [round(r, 1) for r in rss],
        "draft_memory_mib_after_each_quarter": held,
        "draft_memory_tokens_after": health["draft_memory_tokens"],
        "kv_pages_held_after": health["kv_pages_held"],
        "decoding_after": health["decoding"],
        "queued_after": health["queued"],
        "served": health["served"],
        "survivors": survivors,
        "first_round": len(first),
        "elapsed_s": round(time.perf_counter() - t0, 1),
    }
    # no leak: the second half adds nothing beyond noise (what a bounded cache, such as the draft
    # memory, holds is reached by then), and the whole soak nothing beyond the draft memory's growth
    half = rss[QUARTERS // 2 - 1]
    grown = rss[-1] - idle - (held[-1] - held[0] if held else 0)
    flat = rss[-1] <= half * 1.02 + 16
    ok = not failed and doc["kv_pages_held_after"] == 0 and not survivors and flat and grown <= idle * 0.05 + 16
    doc["ok"] = ok
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "soak.json").write_text(json.dumps(doc, indent=1) + "\n")
    md = [
        "# lp.serve soak: random lengths and disconnects",
        "",
        f"- command: `{doc['command']}`; server: `{doc['server']}`",
        f"- device: {doc['device']}; date: {doc['date']}",
        f"- {doc['requests']} requests (1 to 128 new tokens, 16 clients), {dropped} dropped by their client after "
        f"1 to 4 events, {len(failed)} failed; {doc['tokens']} tokens in {doc['seconds']} s",
        f"- after the drain: {doc['kv_pages_held_after']} KV pages held, {doc['decoding_after']} sequences in the "
        f"batch, {doc['queued_after']} queued; the draft memory holds {doc['draft_memory_tokens_after']} tokens",
        f"- server memory (VmRSS): {doc['rss_mib_after_a_first_round']} MiB after a first drained round of 64; "
        f"after each quarter of the soak {', '.join(f'{r:.1f}' for r in rss)} MiB, of which the draft memory's "
        f"arrays {', '.join(f'{h:.1f}' for h in held)} MiB",
        f"- growth beyond the draft memory's: {grown:.1f} MiB; second half: {rss[-1] - half:+.1f} MiB",
        f"- processes left after the stop: {survivors}",
        f"- verdict: {'no leak' if ok else 'CHECK FAILED'}",
        "",
    ]
    (args.out / "soak.md").write_text("\n".join(md))
    print("\n".join(md))
    return 0 if ok else 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", default="1,4,16,32", help="client counts, comma separated")
    ap.add_argument("--requests", type=int, default=32, help="requests a level at least (and at least its clients)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--servers", default=",".join(SERVERS), help=f"of {', '.join(SERVERS)}")
    ap.add_argument("--server", nargs="*", default=[], help="lp.serve keys of the lp servers")
    ap.add_argument("--model", default="smollm2-135m", help="the lp model name; hf-cb serves its local directory")
    ap.add_argument("--cb-blocks", type=int, default=128, help="hf-cb's KV blocks of 64 tokens (--cb-num-blocks)")
    ap.add_argument("--rounds", type=int, default=2, help="runs of every server, in turn")
    ap.add_argument("--retry-s", type=float, default=RETRY_S)
    ap.add_argument("--deadline-s", type=float, default=3600)
    ap.add_argument("--soak", type=int, default=0, help="requests of the soak (random lengths, disconnects)")
    ap.add_argument("--out", type=Path, default=Path("results/serve/load"))
    args = ap.parse_args()
    from lp import models

    model_dir = str(models.fetch(args.model))
    if args.soak:
        sys.exit(soak(args, model_dir))
    levels = [int(c) for c in args.clients.split(",")]
    kinds = [k for k in args.servers.split(",") if k]
    if unknown := set(kinds) - set(SERVERS):
        raise SystemExit(f"--servers: unknown {sorted(unknown)}; known: {', '.join(SERVERS)}")
    start_load = os.getloadavg()[0]
    floor = weight_read_floor(model_dir)
    rounds: dict[str, list[dict]] = {kind: [] for kind in kinds}
    for r in range(args.rounds):
        for kind in kinds if r % 2 == 0 else kinds[::-1]:
            rounds[kind].append(run_server(kind, args, model_dir, levels))
    servers = {kind: median_of(runs) for kind, runs in rounds.items()}
    doc = {
        "command": "python -m tools.serve_load " + shlex.join(sys.argv[1:]),
        "device": cpu_name(),
        "date": datetime.date.today().isoformat(),
        "cores": os.cpu_count(),
        "load_average": [round(start_load, 1), round(os.getloadavg()[0], 1)],
        "max_tokens": args.max_tokens,
        "requests": args.requests,
        "rounds": args.rounds,
        "levels": levels,
        "floor": floor,
        "servers": servers,
        "survivors": {k: s["survivors"] for k, s in servers.items()},
    }
    doc["check"] = check(servers, levels)
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "requests.jsonl", "w") as f:
        for kind, s in servers.items():
            for clients, level in s["levels"].items():
                for r in level.pop("records"):
                    f.write(json.dumps({"server": kind, "clients": clients} | r) + "\n")
    doc = json.loads(json.dumps(doc))  # the levels keyed as JSON keys them
    (args.out / "summary.json").write_text(json.dumps(doc, indent=1) + "\n")
    (args.out / "summary.md").write_text(report(doc))
    plot(doc, args.out / "load.png")
    print(report(doc))
    bad = any(c.get("wrong") for c in doc["check"].values()) or any(doc["survivors"].values())
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
