"""API keys, per-key rate limits, and the request body size limit."""
from __future__ import annotations

import collections
import hmac
import math
import time
from dataclasses import dataclass

from nextok.server.config import ApiKey, ServerConfig
from nextok.server.errors import APIError, error_body

WINDOW_S = 60.0


@dataclass
class Caller:
    """Who sent a request: the key's name (never the key) and its limits."""

    name: str
    rpm: int | None
    tpm: int | None


class Authenticator:
    def __init__(self, config: ServerConfig):
        self.keys: list[ApiKey] = list(config.api_keys)
        self.default_rpm = config.rate_limit_rpm
        self.default_tpm = config.rate_limit_tpm

    @property
    def enabled(self) -> bool:
        return bool(self.keys)

    def authenticate(self, authorization: str | None, api_key_header: str | None, client: str) -> Caller:
        if not self.keys:
            return Caller(f"client-{client}", self.default_rpm, self.default_tpm)
        token = None
        if authorization:
            scheme, _, value = authorization.partition(" ")
            if scheme.lower() == "bearer" and value.strip():
                token = value.strip()
        token = token or (api_key_header or "").strip() or None
        if token is None:
            raise APIError(401, "missing API key: send 'Authorization: Bearer <key>'",
                           code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
        match = None
        for k in self.keys:  # compare against every key, in constant time, whatever matches
            if hmac.compare_digest(k.key.encode(), token.encode()):
                match = k
        if match is None:
            raise APIError(401, "incorrect API key", code="invalid_api_key",
                           headers={"WWW-Authenticate": "Bearer"})
        return Caller(match.name, match.rpm or self.default_rpm, match.tpm or self.default_tpm)


class _Window:
    """Events of the last minute: (time, amount); amounts can be corrected afterwards."""

    def __init__(self):
        self.events: collections.deque[list] = collections.deque()

    def total(self, now: float) -> float:
        while self.events and self.events[0][0] <= now - WINDOW_S:
            self.events.popleft()
        return sum(e[1] for e in self.events)

    def retry_after(self, now: float, excess: float) -> int:
        """Seconds until enough of the window expires to bring the total under the limit."""
        freed = 0.0
        for t, amount in self.events:
            freed += amount
            if freed >= excess:
                return max(1, math.ceil(t + WINDOW_S - now))
        return int(WINDOW_S)


class RateLimiter:
    """Sliding one-minute windows per caller: requests/minute and tokens/minute.

    Tokens are charged at admission as prompt + max_tokens (the most the request can use, as
    OpenAI counts), and corrected to what it really used when it ends.
    """

    def __init__(self):
        self.requests: dict[str, _Window] = collections.defaultdict(_Window)
        self.tokens: dict[str, _Window] = collections.defaultdict(_Window)

    def check_request(self, caller: Caller) -> None:
        if caller.rpm is None:
            return
        now = time.monotonic()
        w = self.requests[caller.name]
        if w.total(now) >= caller.rpm:
            wait = w.retry_after(now, w.total(now) - caller.rpm + 1)
            raise APIError(429, f"rate limit reached: {caller.rpm} requests per minute",
                           code="rate_limit_exceeded", headers={"Retry-After": str(wait)})
        w.events.append([now, 1])

    def charge_tokens(self, caller: Caller, amount: int) -> list | None:
        """Admits `amount` tokens or raises 429; returns a handle for `settle`."""
        if caller.tpm is None:
            return None
        now = time.monotonic()
        w = self.tokens[caller.name]
        used = w.total(now)
        if amount > caller.tpm:
            raise APIError(429, f"this request needs up to {amount} tokens, more than the limit of "
                                f"{caller.tpm} tokens per minute; lower max_tokens",
                           code="rate_limit_exceeded", headers={"Retry-After": str(int(WINDOW_S))})
        if used + amount > caller.tpm:
            wait = w.retry_after(now, used + amount - caller.tpm)
            raise APIError(429, f"rate limit reached: {caller.tpm} tokens per minute",
                           code="rate_limit_exceeded", headers={"Retry-After": str(wait)})
        event = [now, amount]
        w.events.append(event)
        return event

    @staticmethod
    def settle(handle: list | None, used: int) -> None:
        if handle is not None:
            handle[1] = used


class BodySizeLimit:
    """ASGI middleware: 413 for a body over the limit, by Content-Length or as it streams in."""

    def __init__(self, app, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            return await self._reject(send)
        seen = 0

        async def limited_receive():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise _TooLarge()
            return message

        try:
            await self.app(scope, limited_receive, send)
        except _TooLarge:
            await self._reject(send)

    async def _reject(self, send):
        import json

        body = json.dumps(error_body(413, f"the request body is larger than {self.max_bytes} bytes")).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


class _TooLarge(BaseException):  # not Exception: FastAPI turns those into 400 while reading a body
    pass
