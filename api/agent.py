"""The API as a node agent's server: what ``ioe sidecar`` and ``ioe demo`` pass to
:class:`collector.agent.Agent` as its ``frontend`` when ``api_enabled`` is true.

Rules:
  1. The app serves the agent's store and commits OTLP/HTTP spans through the agent's direct sink
     (a receiver acknowledges only what is committed); ``/metrics`` adds the agent's self-metrics.
  2. The app's lifespan is off under the agent: the refresher (every :data:`api.app.REFRESH_S`)
     starts with the server and stops after it.
  3. On leaving, the server is asked to exit and awaited (up to 10 s of graceful shutdown), then
     the refresher stops; the agent closes the store afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import uvicorn

from api.app import REFRESH_S, create_app
from api.limits import server_options  # header/body read timeouts, connection cap

if TYPE_CHECKING:
    from collector.agent import Agent


@contextlib.asynccontextmanager
async def serve_api(agent: Agent) -> AsyncIterator[None]:
    """Serve the API on the agent's listen address while the ``async with`` body runs (rules 1-3)."""
    settings = agent.settings
    app = create_app(
        settings, agent.store, sink=agent.direct, refresh_s=REFRESH_S, registries=[agent.metrics.registry]
    )
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=settings.listen_host,
            port=settings.listen_port,
            log_level="warning",
            lifespan="off",
            timeout_graceful_shutdown=10,
            **server_options(),
        )
    )
    refresher = app.state.refresher  # rule 2
    refresher.start()
    task = asyncio.create_task(server.serve(), name="api")
    try:
        yield
    finally:  # rule 3
        server.should_exit = True
        with contextlib.suppress(Exception):
            await task
        await asyncio.to_thread(refresher.stop)
