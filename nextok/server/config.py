"""The server's own options (the engine's are `EngineArgs`), frozen at start."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ApiKey:
    key: str
    name: str  # what logs and metrics show instead of the key itself
    rpm: int | None = None  # requests per minute; None: the server default
    tpm: int | None = None  # tokens (prompt + completion) per minute


def key_id(key: str) -> str:
    """A stable, non-reversible name for a key that was given without one."""
    return "key-" + hashlib.sha256(key.encode()).hexdigest()[:8]


def parse_key_file(text: str) -> list[ApiKey]:
    """One key per line: `KEY [name=NAME] [rpm=N] [tpm=N]`; `#` starts a comment."""
    keys = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        key, *opts = line.split()
        fields = {}
        for opt in opts:
            name, sep, value = opt.partition("=")
            if not sep or name not in ("name", "rpm", "tpm") or not value:
                raise ValueError(f"API key file line {lineno}: bad option {opt!r} "
                                 "(expected name=NAME, rpm=N or tpm=N)")
            if name in ("rpm", "tpm"):
                if not value.isdigit() or int(value) < 1:
                    raise ValueError(f"API key file line {lineno}: {name} must be a positive integer")
                fields[name] = int(value)
            else:
                fields[name] = value
        keys.append(ApiKey(key, fields.pop("name", key_id(key)), **fields))
    return keys


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    served_model_name: str = "nextok"  # what /v1/models lists and responses carry
    model_aliases: tuple[str, ...] = ()  # other names accepted in the `model` field
    api_keys: tuple[ApiKey, ...] = ()  # empty: no authentication
    rate_limit_rpm: int | None = None  # per key (or per client address without keys)
    rate_limit_tpm: int | None = None
    max_queued_requests: int | None = None  # None: unbounded
    max_request_body_bytes: int = 4 << 20
    max_prompt_tokens: int | None = None  # None: the context window bounds it
    cors_origins: tuple[str, ...] = ()
    log_format: str = "text"  # text | json
    shutdown_timeout_s: float = 30.0
    fim_format: str | None = None  # override the detected FIM family
    fim_order: str = "psm"  # psm | spm
    code_context_tokens: int = 1024  # budget for repository context on /v1/code/complete
    extra: dict = field(default_factory=dict)
