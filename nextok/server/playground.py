"""The Monaco web playground at /playground: a page, its one script, and Monaco's AMD build.

    GET /playground              index.html (503 with how to build it when Monaco is missing)
    GET /playground/config.json  whether the API needs a key, the served model
    GET /playground/{file}       playground.js and vs/... (Monaco's min/vs, copied by `make playground`)

The paths are public (app.PUBLIC_PATHS): the page sends the key the user types to /v1/code/complete.
"""
from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, PlainTextResponse, Response

STATIC_DIR = Path(__file__).parent / "static" / "playground"
MISSING = ("the playground's Monaco editor assets are not built ({missing} is missing): run "
           "`make playground` in a nextok checkout (npm ci in editors/playground), or install a "
           "nextok package built with them")


def add_playground_routes(app: FastAPI, auth_enabled: bool, model: str, static_dir: Path = STATIC_DIR) -> None:
    root = static_dir.resolve()
    loader = root / "vs" / "loader.js"

    @app.get("/playground", tags=["playground"], response_class=HTMLResponse,
             responses={503: {"description": "Monaco assets not built"}})
    async def playground_page() -> Response:
        """The Monaco editor with inline completions from /v1/code/complete."""
        if not loader.is_file():
            return PlainTextResponse(MISSING.format(missing="vs/loader.js"), status_code=503)
        return FileResponse(root / "index.html", media_type="text/html; charset=utf-8",
                            headers={"Cache-Control": "no-cache"})

    @app.get("/playground/config.json", tags=["playground"], include_in_schema=False)
    async def playground_config():
        return {"auth": auth_enabled, "model": model}

    @app.get("/playground/{path:path}", tags=["playground"], include_in_schema=False)
    async def playground_file(path: str) -> Response:
        file = (root / path).resolve()
        if not file.is_relative_to(root) or not file.is_file():
            if path.startswith("vs/") and not loader.is_file():
                return PlainTextResponse(MISSING.format(missing="vs/"), status_code=404)
            return PlainTextResponse(f"not found: /playground/{path}", status_code=404)
        # Monaco's files are versioned by the pinned package; the page's own files may change.
        cache = "public, max-age=86400" if path.startswith("vs/") else "no-cache"
        return FileResponse(file, headers={"Cache-Control": cache})
