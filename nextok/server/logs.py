"""One structured access line per request: `--log-format json|text`."""
from __future__ import annotations

import json
import logging
import time

access_log = logging.getLogger("nextok.access")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {"time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)),
                 "level": record.levelname.lower(), "logger": record.name}
        fields = getattr(record, "fields", None)
        if fields:
            entry.update(fields)
        else:
            entry["message"] = record.getMessage()
        return json.dumps(entry)


def configure_logging(level: str, fmt: str) -> None:
    handler = logging.StreamHandler()
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # Access lines are the point of this logger: keep them at INFO whatever the root level.
    access_log.setLevel(logging.INFO)


def log_request(**fields) -> None:
    """fields: id, route, key, status, prompt_tokens, completion_tokens, ttft_ms, total_ms,
    finish_reason. Never the API key itself (callers pass the key's name)."""
    text = " ".join(f"{k}={v}" for k, v in fields.items())
    access_log.info(text, extra={"fields": fields})
