"""nextok's /v1/code/complete over HTTP, as the language server calls it.

The editor's document is cut at the cursor into a prefix and a suffix, each bounded to a window of
lines (the server trims further to fit its context; a bounded window keeps a large file's
keystrokes cheap to send), and sent with the language id, the file path and the document's
`session_id`. No pygls here: this part is plain asyncio + httpx.
"""
from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass

import httpx


@dataclass(frozen=True)
class BackendConfig:
    server_url: str = "http://127.0.0.1:8000"
    api_key: str | None = None
    model: str | None = None
    max_tokens: int | None = None  # None: the server's default per mode (64 single-line, 256 multi-line)
    prefix_lines: int = 200  # lines above the cursor's line sent as prefix
    suffix_lines: int = 50  # lines below the cursor's line sent as suffix
    timeout_s: float = 120.0


class BackendError(Exception):
    """A completion the nextok server could not give: unreachable, or an error response (the
    message carries the server's OpenAI-style error text)."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


def window(text: str, offset: int, prefix_lines: int, suffix_lines: int) -> tuple[str, str]:
    """(prefix, suffix) around `offset`: the cursor's line plus at most `prefix_lines` lines above
    and `suffix_lines` lines below it."""
    offset = max(0, min(offset, len(text)))
    before = text[:offset].split("\n")
    after = text[offset:].split("\n")
    return "\n".join(before[-(prefix_lines + 1):]), "\n".join(after[:suffix_lines + 1])


def error_text(r: httpx.Response) -> str:
    """The message of an OpenAI-style error body, else the raw body (shortened)."""
    try:
        err = r.json()["error"]
        return err["message"] if isinstance(err, dict) else str(err)
    except (ValueError, KeyError, TypeError):
        return r.text[:200] or r.reason_phrase


class Backend:
    """One HTTP client (a pool of keep-alive connections) for the whole editor session."""

    def __init__(self, config: BackendConfig, transport: httpx.AsyncBaseTransport | None = None):
        self.config = config
        self.url = config.server_url.rstrip("/")
        headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
        self.client = httpx.AsyncClient(base_url=self.url, headers=headers, timeout=config.timeout_s,
                                        transport=transport)
        # Sessions are keyed per API key on the server: two editors with the same key and file
        # must not cancel each other, so each language server process adds its own token.
        self._token = secrets.token_hex(4)

    def session_id(self, uri: str) -> str:
        return f"lsp-{self._token}-{hashlib.sha1(uri.encode()).hexdigest()[:16]}"

    def body(self, prefix: str, suffix: str, language: str, filepath: str | None, session_id: str) -> dict:
        body = {"prefix": prefix, "suffix": suffix, "language": language, "filepath": filepath,
                "session_id": session_id, "mode": "auto", "temperature": 0.0}
        if self.config.model:
            body["model"] = self.config.model
        if self.config.max_tokens:
            body["max_tokens"] = self.config.max_tokens
        return body

    async def complete(self, text: str, offset: int, language: str, filepath: str | None,
                       session_id: str) -> dict:
        """The server's response object for a completion at `offset` of `text`.

        Cancelling the awaiting task closes the request's connection mid-response: the server sees
        the client disconnect and aborts the generation."""
        prefix, suffix = window(text, offset, self.config.prefix_lines, self.config.suffix_lines)
        body = self.body(prefix, suffix, language, filepath, session_id)
        try:
            r = await self.client.post("/v1/code/complete", json=body)
        except httpx.TimeoutException:
            raise BackendError(f"the nextok server at {self.url} did not answer within "
                               f"{self.config.timeout_s:g}s") from None
        except httpx.HTTPError as e:
            raise BackendError(f"cannot reach the nextok server at {self.url}: {e}") from None
        if r.status_code != 200:
            raise BackendError(f"nextok server error {r.status_code}: {error_text(r)}", r.status_code)
        try:
            return r.json()
        except ValueError:
            raise BackendError(f"{self.url}/v1/code/complete answered with a non-JSON body "
                               f"(is this a nextok server?)") from None

    async def aclose(self) -> None:
        await self.client.aclose()
