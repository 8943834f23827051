"""The FastAPI application: routes, middleware (auth, limits, CORS), health and metrics.

    AuthMiddleware (401 / 429 per key) -> BodySizeLimit (413) -> CORS -> FastAPI routes
"""
from __future__ import annotations

import contextlib
import json

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response

from nextok import __version__
from nextok.engine.async_engine import AsyncEngine
from nextok.server.config import ServerConfig
from nextok.server.errors import APIError, error_body, install_error_handlers
from nextok.server.metrics import ServerMetrics
from nextok.server.security import BodySizeLimit
from nextok.server.state import ServerState

PUBLIC_PATHS = ("/health", "/ready", "/metrics", "/openapi.json", "/docs", "/redoc", "/playground")


class AuthMiddleware:
    """Checks the API key and the request rate before anything reads the body."""

    def __init__(self, app, state: ServerState):
        self.app = app
        self.state = state

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"].startswith(PUBLIC_PATHS) or scope["method"] == "OPTIONS":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers") or []}
        client = (scope.get("client") or ("unknown", 0))[0]
        try:
            caller = self.state.auth.authenticate(headers.get("authorization"), headers.get("x-api-key"), client)
            self.state.limiter.check_request(caller)
        except APIError as e:
            self.state.metrics.observe_http(scope["path"], e.status)
            body = json.dumps(error_body(e.status, e.message, e.param, e.code)).encode()
            extra = [(k.lower().encode(), v.encode()) for k, v in (e.headers or {}).items()]
            await send({"type": "http.response.start", "status": e.status,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(body)).encode()), *extra]})
            await send({"type": "http.response.body", "body": body})
            return
        scope.setdefault("state", {})["caller"] = caller
        await self.app(scope, receive, send)


def build_app(engine: AsyncEngine, config: ServerConfig, metrics: ServerMetrics | None = None) -> FastAPI:
    """The app for one engine. The engine thread starts with the app and stops with it."""
    metrics = metrics or ServerMetrics(config.served_model_name)
    state = ServerState(engine, config, metrics)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        if not engine.is_running and engine.dead is None:
            engine.start()
        yield
        engine.shutdown()

    app = FastAPI(title="nextok", version=__version__, lifespan=lifespan,
                  description="OpenAI-compatible LLM server for code completion.")
    app.state.nextok = state
    install_error_handlers(app)

    from nextok.server import chat_api, code_api, infill_api, openai_api

    app.include_router(openai_api.router)
    app.include_router(chat_api.router)
    app.include_router(code_api.router)
    app.include_router(infill_api.router)
    _add_ops_routes(app, state)
    from nextok.server.playground import add_playground_routes

    add_playground_routes(app, state.auth.enabled, config.served_model_name)

    if config.cors_origins:
        from starlette.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=list(config.cors_origins),
                           allow_methods=["GET", "POST", "OPTIONS"],
                           allow_headers=["Authorization", "Content-Type", "X-Api-Key"])
    app.add_middleware(BodySizeLimit, max_bytes=config.max_request_body_bytes)
    app.add_middleware(AuthMiddleware, state=state)
    if state.auth.enabled:
        _declare_bearer_auth(app)
    return app


def _add_ops_routes(app: FastAPI, state: ServerState) -> None:
    @app.get("/health", tags=["ops"])
    async def health():
        """Liveness: the process answers."""
        return {"status": "ok"}

    @app.get("/ready", tags=["ops"], responses={503: {"description": "Not ready"}})
    async def ready():
        """Readiness: the model is loaded, the engine loop runs, and the server is not draining."""
        engine = state.engine
        if state.draining:
            return JSONResponse({"status": "draining"}, status_code=503)
        if not engine.is_running:
            return JSONResponse({"status": "engine_dead" if engine.dead else "starting"}, status_code=503)
        return {"status": "ready", "running": engine.last_stats.get("num_running", 0),
                "waiting": engine.num_waiting}

    @app.get("/metrics", tags=["ops"], response_class=Response,
             responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text format"}})
    async def metrics_route():
        return Response(state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")


def _declare_bearer_auth(app: FastAPI) -> None:
    """States in /openapi.json that the API routes take `Authorization: Bearer <key>`."""
    def openapi():
        if app.openapi_schema is None:
            from fastapi.openapi.utils import get_openapi

            schema = get_openapi(title=app.title, version=app.version, description=app.description,
                                 routes=app.routes)
            schema.setdefault("components", {})["securitySchemes"] = {
                "bearer": {"type": "http", "scheme": "bearer"}}
            for path, ops in schema["paths"].items():
                if not path.startswith(PUBLIC_PATHS):
                    for op in ops.values():
                        op["security"] = [{"bearer": []}]
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi

