"""What every request meets before a handler: the API key (401 without it, for the /v1 paths)
and the body's size limit (413 past it, whether the size is declared or not). An ASGI
middleware, so both come first whatever the route, and a body past the limit is never read
whole."""

from __future__ import annotations

import hmac
import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from lp.serve.protocol import ApiError


class Guard:
    """Checks the key and reads the body (up to `max_body_bytes`) before the app sees them."""

    def __init__(self, app: ASGIApp, api_key: str | None, max_body_bytes: int) -> None:
        self.app, self.key, self.limit = app, api_key, max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        if self.key is not None and scope["path"].startswith("/v1"):
            given = headers.get("authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {self.key}".encode()):
                await _answer(send, ApiError(401, "a valid API key is needed: Authorization: Bearer <key>"))
                return
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.limit:
            await _answer(send, self._too_large())
            return
        body, more = [], True
        size = 0
        while more:  # the whole body, as the handler would read it, but no more than the limit
            message = await receive()
            if message["type"] != "http.request":
                break
            body.append(message.get("body", b""))
            size += len(body[-1])
            if size > self.limit:
                await _answer(send, self._too_large())
                return
            more = message.get("more_body", False)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:  # then what the client sends next: its disconnect, when it leaves
                return await receive()
            replayed = True
            return {"type": "http.request", "body": b"".join(body), "more_body": False}

        await self.app(scope, replay, send)

    def _too_large(self) -> ApiError:
        return ApiError(413, f"the request body is larger than {self.limit} bytes", code="request_too_large")


async def _answer(send: Send, error: ApiError) -> None:
    body = json.dumps(error.body()).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


__all__ = ["Guard"]
