"""The HTTP API (FastAPI): `POST /v1/completions`, `POST /v1/chat/completions`, `GET /v1/models`,
`GET /health`. A handler checks its request, queues it for the decode thread (lp/serve/engine.py)
and answers with the whole completion, or streams it as server-sent events, one per decode step
that adds text, then `[DONE]`. Every refusal is an OpenAI error object with its status."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException

from lp.serve.engine import Engine, Job
from lp.serve.guard import Guard
from lp.serve.prepare import DecodeRequest, Preparer
from lp.serve.protocol import ApiError, ChatRequest, CompletionRequest, Fields
from lp.serve.responses import DONE, Reply, event

POLL_S = 0.25  # how often a waiting handler looks for its client's disconnect and the decode thread


@dataclass
class Server:
    """What the handlers share: the decode thread, the request checks, the served name."""

    engine: Engine
    preparer: Preparer
    name: str
    info: dict[str, Any]  # shown by /health: world size, tp, the decoding defaults
    rejected: int = 0  # requests answered 429


def build_app(server: Server, api_key: str | None, max_body_bytes: int) -> FastAPI:
    """The app, its routes and error handlers, behind the key and size checks (lp/serve/guard.py)."""
    app = FastAPI(title="lp", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(Guard, api_key=api_key, max_body_bytes=max_body_bytes)
    engine = server.engine

    @app.exception_handler(ApiError)
    async def api_error(request: Request, e: ApiError) -> JSONResponse:
        server.rejected += e.status == 429
        return JSONResponse(e.body(), status_code=e.status)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, e: HTTPException) -> JSONResponse:
        return await api_error(request, ApiError(e.status_code, str(e.detail)))

    @app.exception_handler(Exception)
    async def crash(request: Request, e: Exception) -> JSONResponse:
        return await api_error(request, ApiError(500, f"internal error: {type(e).__name__}"))

    @app.get("/health")
    async def health() -> JSONResponse:
        pool = engine.batch.worker.kv.pool
        state = {
            "status": "ok" if engine.failure is None else "failed",
            "queued": engine.jobs.qsize(),
            "decoding": engine.decoding,
            "kv_pages_held": pool.pages - 1 - pool.free,
            "kv_pages": pool.pages - 1,
            "draft_memory_tokens": engine.lm.memory.tokens,
            "draft_memory_mib": round(engine.lm.memory.nbytes / 2**20, 1),
            "most_queued": engine.most_queued,
            "served": engine.served,
            "last": engine.last,
            "rejected": server.rejected,
            **server.info,
        }
        return JSONResponse(state, status_code=200 if engine.failure is None else 503)

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": server.name, "object": "model", "created": 0, "owned_by": "lp"}]}

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        body = parse(CompletionRequest, await request.body())
        return await answer(server, body, request, lambda: server.preparer.completion(body), chat=False)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        body = parse(ChatRequest, await request.body())
        return await answer(server, body, request, lambda: server.preparer.chat(body), chat=True)

    return app


def parse(model: type[Fields], body: bytes) -> Any:
    """The request body as `model`, whatever its declared content type (curl's -d declares a
    form): ApiError 400 for malformed JSON, 422 naming the first wrong field."""
    try:
        return model.model_validate_json(body)
    except ValidationError as e:
        errors = e.errors()
        if any(err["type"] == "json_invalid" for err in errors):
            raise ApiError(400, f"the body is not valid JSON: {errors[0]['msg']}") from None
        param = ".".join(str(p) for p in errors[0]["loc"]) or None
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise ApiError(422, f"{param or 'body'}: {errors[0]['msg']}{more}", param) from None


async def answer(
    server: Server, body: Fields, request: Request, prepare: Callable[[], DecodeRequest], *, chat: bool
) -> Any:
    """Check, queue and answer one request (streamed or whole)."""
    if body.model != server.name:
        raise ApiError(404, f"the model {body.model!r} does not exist; this server serves {server.name!r}", "model")
    decode = prepare()
    job = Job(decode, body.stream, asyncio.get_running_loop())
    server.engine.submit(job)
    reply = Reply(chat, server.name, len(decode.ids), token_ids=body.return_token_ids)
    first = await next_event(job, server.engine, request)  # before any header: a failure keeps its status
    if first[0] == "error":
        raise first[1]
    if not body.stream:
        return reply.whole(first[1])
    usage = body.stream_options is not None and body.stream_options.include_usage
    return StreamingResponse(stream(job, server.engine, reply, first, usage), media_type="text/event-stream")


async def stream(job: Job, engine: Engine, reply: Reply, first: tuple, usage: bool) -> AsyncIterator[str]:
    """The events of a streamed answer; a client that leaves has its decode stopped at the next step."""
    ended = False
    try:
        kind, value = first
        while kind == "text":
            yield event(reply.piece(value))
            kind, value = await next_event(job, engine)
        ended = True
        if kind == "error":  # the status is sent: the error goes in the stream, as OpenAI's
            yield event(value.body())
            return
        yield event(reply.end(value))
        if usage:
            yield event(reply.usage(value))
        yield DONE
    finally:
        if not ended:
            job.cancelled.set()


async def next_event(job: Job, engine: Engine, request: Request | None = None) -> tuple:
    """The job's next event. While it waits: a `request` whose client left cancels the job
    (before a response starts; after, the streaming response notices), and a decode thread that
    ended without answering fails it with 503."""
    getter = asyncio.ensure_future(job.events.get())
    try:
        while True:
            done, _ = await asyncio.wait({getter}, timeout=POLL_S)
            if done:
                return getter.result()
            if request is not None and await request.is_disconnected():
                job.cancelled.set()
                return ("error", ApiError(499, "the client left"))
            if not engine.alive():
                return ("error", ApiError(503, engine.failure or "the server is shutting down"))
    except asyncio.CancelledError:  # the server shuts down, or the response's client left
        job.cancelled.set()
        raise
    finally:
        getter.cancel()


__all__ = ["Server", "build_app"]
