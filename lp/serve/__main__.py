"""`python -m lp.serve` (or `torchrun --nproc_per_node P -m lp.serve`): serve a model over an
OpenAI-compatible HTTP API. Keys: configs/serve.yaml (`python -m lp.serve --help`)."""

from __future__ import annotations

import signal
import socket
import sys
import threading
from typing import Any

import uvicorn
from omegaconf import DictConfig

from lp.errors import LPError
from lp.frontend import cli
from lp.generate import check_runtime, load
from lp.serve.app import Server, build_app
from lp.serve.channel import TICK_S, Channel
from lp.serve.engine import Engine, follow
from lp.serve.prepare import KEYS, Preparer, check_engine_settings, engine_settings

SHUTDOWN_S = 3.0  # on a signal, how long open responses may go on before they are cut
WARMUP_TOKENS = 4


def check(cfg: DictConfig) -> dict[str, Any]:
    """Every check that needs no model (on every rank); the decoding defaults."""
    check_runtime(cfg)
    if cfg.timeout_s <= 4 * TICK_S:
        raise LPError(f"timeout_s must be > {4 * TICK_S:g} (rank 0 broadcasts every {TICK_S:g} s while idle)")
    defaults = {name: cfg[name] for name in KEYS}
    check_engine_settings(engine_settings(defaults))
    for key, low in (("port", 0), ("max_batch", 1), ("max_queue", 1), ("prefill_chunk", 1), ("max_body_bytes", 1)):
        if not isinstance(cfg[key], int) or isinstance(cfg[key], bool) or cfg[key] < low:
            raise LPError(f"{key} must be an integer >= {low}, got {cfg[key]!r}")
    if cfg.port > 65535:
        raise LPError(f"port must be at most 65535, got {cfg.port}")
    if cfg.api_key is not None and not str(cfg.api_key):
        raise LPError("api_key must not be empty (null: no key)")
    return defaults


def bind(host: str, port: int) -> socket.socket:
    """The server's socket, bound before the model loads: a port in use fails in a second."""
    family = socket.AF_INET6 if ":" in str(host) else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((str(host), port))
    except OSError as e:
        sock.close()
        raise LPError(f"cannot serve on {host}:{port}: {e.strerror or e}") from None
    return sock


def serve(lm: Any, channel: Channel, sock: socket.socket, cfg: DictConfig, defaults: dict[str, Any]) -> None:
    """Rank 0: the decodes in this thread (the main one: torch's OpenMP workers spin for it alone;
    from another thread a small matmul took 1.6x as long on a 2-core CPU), HTTP in another,
    until a signal or a failed step."""
    name = str(cfg.served_model_name or cfg.model.name)
    config = uvicorn.Config(
        app=None, log_level="warning", access_log=False, lifespan="off", timeout_graceful_shutdown=SHUTDOWN_S
    )
    http = uvicorn.Server(config)

    def failed() -> None:  # the engine's steps failed: uvicorn's loop reads the flag and shuts down
        http.should_exit = True

    engine = Engine(lm, channel, cfg.max_batch, cfg.max_queue, cfg.prefill_chunk, on_failure=failed)
    info = {"model": name, "world_size": lm.comm.world_size, "tp": lm.tp.size}
    info.update(max_batch=cfg.max_batch, max_queue=cfg.max_queue, kv_tokens=lm.decoder.worker.kv_tokens)
    info["defaults"] = defaults
    server = Server(engine, Preparer(lm, defaults), name, info)
    api_key = None if cfg.api_key is None else str(cfg.api_key)
    config.app = build_app(server, api_key, cfg.max_body_bytes)
    web = threading.Thread(target=http.run, kwargs={"sockets": [sock]}, name="lp-http", daemon=True)

    def stop(signum: int, frame: object) -> None:
        """SIGTERM or Ctrl-C: open responses get SHUTDOWN_S, the batch ends at its next step."""
        http.should_exit = True
        engine.stop()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stop)  # uvicorn installs no handler outside the main thread
    web.start()
    host, port = sock.getsockname()[:2]
    ranks = f"{lm.comm.world_size} rank{'s' if lm.comm.world_size > 1 else ''}, tp={lm.tp.size}"
    print(f"lp: serving {name} at http://{host}:{port}/v1 ({ranks})", file=sys.stderr, flush=True)
    try:
        engine.run(stop_when=lambda: not web.is_alive())
    finally:
        http.should_exit = True
        web.join(SHUTDOWN_S + 2)
    if engine.failure is not None:
        raise LPError(engine.failure)


def run(cfg: DictConfig) -> None:
    """The job: check the keys, bind (rank 0), load the model, warm up, then serve (rank 0) or
    follow rank 0's requests (the other ranks)."""
    defaults = check(cfg)
    sock = bind(cfg.host, cfg.port) if cli.is_main_rank() else None
    lm = load(cfg)
    try:
        channel = Channel(lm.comm)
        if cfg.warmup:  # every rank alike: W=auto's calibration and the compiled loops, before any request
            warm = {**defaults, "max_tokens": WARMUP_TOKENS, "memory": False}  # no request's text
            lm.generate(lm.encode("Hello"), **engine_settings(warm))
        if sock is not None:
            serve(lm, channel, sock, cfg, defaults)
        else:
            follow(lm, channel, cfg.max_batch, cfg.prefill_chunk)
    finally:
        if sock is not None:
            sock.close()
        lm.close()


main = cli.entry("serve", run)

if __name__ == "__main__":
    main()
