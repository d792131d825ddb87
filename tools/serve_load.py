"""Load test of `lp.serve`: many concurrent streaming clients (the openai client's async API)
against one server, every answer checked against the same prompt's answer alone.

    python -m tools.serve_load [--clients 32] [--prompts 8] [--max-tokens 64]
        [--server KEY=VALUE ...] [--url URL --model NAME] [--out DIR]

Without `--url` it starts `python -m lp.serve` itself (on a free port of 127.0.0.1, with the
`--server` keys), waits for /health, and stops it at the end (SIGTERM), checking that no process
it started outlived it. First each of the `--prompts` prompts (chat, greedy) is streamed alone,
one after another: the references, and the times of a request that waits for no other. Then
`--clients` clients start at once, client i streaming prompt i mod `--prompts`; a 429 (the queue
is full) is retried after `--retry-s`. Every answer must equal its reference, text and token count.

Per request: the time to first token, from the attempt the server queued (the FIFO queue's wait
is in it), and the time between tokens after the first ((last event - first event) / (tokens -
1)); their medians and 95th percentiles over the requests, alone and under the load; the 429s; the
most requests queued at once (/health); lp's S (tokens per step, from `usage`); the machine's
load average (other processes share its cores). Writes `OUT/summary.json`, `OUT/summary.md` and
`OUT/requests.jsonl` with the command, the device (the CPU's model name) and the date.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
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


@dataclass
class Record:
    """One request of the load: its prompt, answer and times (seconds, time.perf_counter)."""

    client: int
    prompt: int
    text: str = ""
    completion_tokens: int = 0
    steps: int = 0
    finish_reason: str | None = None
    rejected: int = 0  # 429 answers before it was queued
    start: float = 0.0  # the first attempt
    queued: float = 0.0  # the attempt the server queued
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


async def one(client: openai.AsyncOpenAI, record: Record, model: str, settings: dict, retry_s: float) -> None:
    """Stream one request; retry while the queue is full (429)."""
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
                    record.completion_tokens, record.steps = chunk.usage.completion_tokens, chunk.usage.steps
                for choice in chunk.choices:
                    if choice.delta.content:
                        record.events.append(time.perf_counter())
                        record.text += choice.delta.content
                    record.finish_reason = choice.finish_reason or record.finish_reason
            return
        except openai.RateLimitError:
            record.rejected += 1
            await asyncio.sleep(retry_s)


async def load(
    url: str,
    model: str,
    *,
    clients: int,
    prompts: int,
    settings: dict,
    deadline_s: float,
    retry_s: float = RETRY_S,
    api_key: str = "none",
) -> list[Record]:
    """`clients` concurrent streaming requests (client i: prompt i mod `prompts`), all within
    `deadline_s`; their records (a request that failed or ran out of time says so in `error`)."""
    http = openai.DefaultAsyncHttpxClient(limits=httpx.Limits(max_connections=clients + 8))
    records = [Record(i, i % prompts) for i in range(clients)]
    async with openai.AsyncOpenAI(
        base_url=url + "/v1", api_key=api_key, max_retries=0, timeout=deadline_s, http_client=http
    ) as client:
        tasks = [asyncio.ensure_future(one(client, r, model, settings, retry_s)) for r in records]
        await asyncio.wait(tasks, timeout=deadline_s)
        for r, task in zip(records, tasks):
            if not task.done():
                task.cancel()
                r.error = f"not answered within {deadline_s} s"
            elif task.exception() is not None:
                r.error = f"{type(task.exception()).__name__}: {task.exception()}"
    return records


async def alone(url: str, model: str, *, prompts: int, settings: dict, api_key: str = "none") -> list[Record]:
    """Each prompt streamed alone, one after another: the references of `load`'s answers."""
    records = [Record(-1, p) for p in range(prompts)]
    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key=api_key, max_retries=0, timeout=600) as client:
        for r in records:
            await one(client, r, model, settings, RETRY_S)
    return records


def wrong(records: list[Record], refs: list[Record]) -> list[str]:
    """Every request not answered completely and correctly, one line each."""
    bad = []
    for r in records:
        ref = refs[r.prompt]
        if r.error or r.text != ref.text or r.completion_tokens != ref.completion_tokens:
            bad.append(f"client {r.client}: {r.error or 'its answer differs from the reference'}")
    return bad


def percentiles(values: list[float]) -> dict[str, float]:
    """Median and 95th percentile (nearest rank)."""
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, max(0, -(-95 * len(ordered) // 100) - 1))]
    return {"median": statistics.median(ordered), "p95": p95}


def summarize(records: list[Record]) -> dict:
    """The load's figures over its answered requests."""
    done = [r for r in records if r.error is None and r.events]
    tokens, steps = sum(r.completion_tokens for r in done), sum(r.steps for r in done)
    return {
        "requests": len(records),
        "answered": len(done),
        "ttft_s": percentiles([r.ttft for r in done]),
        "tbt_s": percentiles([r.tbt for r in done if r.tbt is not None]),
        "rejected_429": sum(r.rejected for r in records),
        "S": tokens / steps if steps else None,
        "tokens": tokens,
        "wall_s": max(r.events[-1] for r in done) - min(r.start for r in done),
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


def start_server(keys: list[str]) -> tuple[subprocess.Popen, str]:
    """`python -m lp.serve KEYS` on a free port of 127.0.0.1: its process and URL, once ready."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "lp.serve", "host=127.0.0.1", f"port={port}", *keys]
    proc = subprocess.Popen(cmd, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 600
    while time.time() < deadline and proc.poll() is None:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
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
    proc.wait(120)
    time.sleep(1)
    return [p for p in started if running(p)]


def report(summary: dict, head: dict) -> str:
    """summary.md: what ran, where, and its figures."""
    ms = lambda d: f"median {1e3 * d['median']:.0f} ms, p95 {1e3 * d['p95']:.0f} ms"  # noqa: E731
    load, one = summary["load"], summary["alone"]
    return "\n".join(
        [
            "# lp.serve under load",
            "",
            f"- command: `{head['command']}`",
            f"- device: {head['device']} ({head['cores']} cores, load average {head['load_average']} at the start, "
            f"{summary['load_average']} at the end: other processes shared the cores); date: {head['date']}",
            f"- server: {json.dumps(head['server']['defaults'])}, max_queue {head['server']['max_queue']}, "
            f"world size {head['server']['world_size']}",
            "",
            f"| figure | each prompt alone ({one['requests']}, one by one) | {load['requests']} clients at once |",
            "|---|---|---|",
            f"| answered completely and correctly | {one['answered']} (the references) | "
            f"{load['answered'] - len(summary['wrong'])} / {load['requests']} |",
            f"| time to first token (the queue's wait included) | {ms(one['ttft_s'])} | {ms(load['ttft_s'])} |",
            f"| time between tokens | {ms(one['tbt_s'])} | {ms(load['tbt_s'])} |",
            f"| lp's S (tokens per step) | {one['S']:.2f} | {load['S']:.2f} |",
            f"| tokens, wall time | {one['tokens']}, {one['wall_s']:.0f} s | {load['tokens']}, {load['wall_s']:.0f} s"
            " |",
            f"| 429 answers (each retried after {head['retry_s']} s) | | {load['rejected_429']} |",
            f"| most requests queued at once | | {summary['most_queued']} (bound {head['server']['max_queue']}) |",
            f"| processes left after the server's stop | {summary.get('survivors', 'not started here')} | |",
            "",
        ]
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--server", nargs="*", default=[], help="lp.serve keys of the server this starts")
    ap.add_argument("--url", help="a running server instead")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--retry-s", type=float, default=RETRY_S)
    ap.add_argument("--deadline-s", type=float, default=3600)
    ap.add_argument("--out", type=Path, default=Path("results/serve/load"))
    args = ap.parse_args()
    proc, url = (None, args.url) if args.url else start_server(args.server)
    settings = {"max_tokens": args.max_tokens, "temperature": 0}
    survivors, start_load = None, os.getloadavg()[0]
    try:
        refs = asyncio.run(alone(url, args.model, prompts=args.prompts, settings=settings))
        records = asyncio.run(
            load(
                url,
                args.model,
                clients=args.clients,
                prompts=args.prompts,
                settings=settings,
                deadline_s=args.deadline_s,
                retry_s=args.retry_s,
            )
        )
        health = httpx.get(url + "/health").json()
    finally:
        if proc is not None:
            survivors = stop_server(proc)
    summary = {
        "alone": summarize(refs),
        "load": summarize(records),
        "wrong": wrong(records, refs),
        "most_queued": health["most_queued"],
        "load_average": round(os.getloadavg()[0], 1),
    }
    if survivors is not None:
        summary["survivors"] = survivors
    head = {
        "command": "python -m tools.serve_load " + shlex.join(sys.argv[1:]),
        "device": cpu_name(),
        "date": datetime.date.today().isoformat(),
        "cores": os.cpu_count(),
        "load_average": round(start_load, 1),
        "retry_s": args.retry_s,
        "server": health,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "requests.jsonl", "w") as f:
        for r in refs + records:  # client -1: a prompt alone
            f.write(json.dumps(asdict(r) | {"ttft": r.ttft, "tbt": r.tbt}) + "\n")
    (args.out / "summary.json").write_text(json.dumps(head | summary, indent=1) + "\n")
    (args.out / "summary.md").write_text(report(summary, head))
    print(report(summary, head))
    sys.exit(1 if summary["wrong"] or survivors else 0)


if __name__ == "__main__":
    main()
