"""Starts the server process: the socket first, then the model, then uvicorn."""
from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import threading

import uvicorn

from nextok.server.serve import bind_socket, server_config

log = logging.getLogger("nextok.server")


def launch(args: argparse.Namespace) -> int:
    from nextok.cli import engine_kwargs
    from nextok.engine.async_engine import AsyncEngine
    from nextok.engine.factory import EngineArgs, create_engine
    from nextok.server.app import build_app
    from nextok.server.logs import configure_logging
    from nextok.server.metrics import ServerMetrics

    config = server_config(args)
    configure_logging(args.log_level if args.log_level != "warning" else "info", config.log_format)
    sock = bind_socket(config.host, config.port)
    metrics = ServerMetrics(config.served_model_name)
    # Built in the thread that will step it (why: AsyncEngine's docstring, OpenMP teams).
    async_engine = AsyncEngine.build_in_thread(lambda: create_engine(EngineArgs(**engine_kwargs(args))),
                                               on_step=metrics.observe_step,
                                               on_abort=metrics.observe_abort)
    app = build_app(async_engine, config, metrics)
    state = app.state.nextok
    server = DrainingServer(uvicorn.Config(app, log_config=None, access_log=False, lifespan="on",
                                           timeout_graceful_shutdown=config.shutdown_timeout_s),
                            on_exit_signal=lambda: setattr(state, "draining", True))

    def engine_died(exc: BaseException) -> None:
        log.error("the engine loop died (%s); shutting down", exc)
        server.exit_code = 1
        server.should_exit = True

    async_engine.on_dead = engine_died
    host = f"[{config.host}]" if ":" in config.host else config.host
    url = f"http://{host}:{config.port}"
    auth = ' -H "Authorization: Bearer $NEXTOK_API_KEY"' if config.api_keys else ""
    print(f"nextok serving {config.served_model_name!r} at {url}  (OpenAI API: {url}/v1)\n"
          f"  try: curl {url}/v1/completions -H 'Content-Type: application/json'{auth} "
          f"-d '{{\"prompt\": \"def fibonacci(n):\", \"max_tokens\": 32}}'", flush=True)
    server.run(sockets=[sock])
    return server.exit_code


class DrainingServer(uvicorn.Server):
    """uvicorn's Server, with SIGTERM marking the server as draining (so /ready fails and new
    requests get 503) and not re-raised at the end: uvicorn re-raises a captured signal, which
    would turn a clean drain into exit status 143."""

    def __init__(self, config: uvicorn.Config, on_exit_signal):
        super().__init__(config)
        self.on_exit_signal = on_exit_signal
        self.exit_code = 0

    def handle_exit(self, sig, frame):
        self.on_exit_signal()
        super().handle_exit(sig, frame)

    @contextlib.contextmanager
    def capture_signals(self):
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        old = {s: signal.signal(s, self.handle_exit) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for s, handler in old.items():
                signal.signal(s, handler)
