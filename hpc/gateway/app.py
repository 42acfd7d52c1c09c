"""`create_app(target)`: the FastAPI application, with discovery running for as long as the app does.

Why everything is built in the lifespan and not at import: the app owns an event-loop-bound HTTP client,
gRPC channels and a background refresh task, which must be made inside uvicorn's loop and closed with it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import httpx
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError

from hpc.gateway import liveness, openai_api, passthrough
from hpc.gateway.discovery import REFRESH_S, Discovery
from hpc.gateway.errors import APIError, api_error_handler, validation_error_handler
from hpc.gateway.state import Gateway
from hpc.gateway.text import ChatTemplate
from hpc.gateway.triton import TritonEngine
from hpc.routing.balancer import Balancer, Replica
from hpc.routing.deployment import Target


def create_app(target: Target, refresh_s: float = REFRESH_S) -> FastAPI:
    """The gateway for `target` (hpc.gateway.discovery.resolve_target)."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        from backend.models.tokenizer import load_tokenizer

        tokenizer = await asyncio.to_thread(load_tokenizer, target.tokenizer_dir)
        balancer = Balancer()
        # trust_env=False: replicas are cluster nodes, never behind the user's $http_proxy (launcher/urls.py)
        async with httpx.AsyncClient(trust_env=False) as http:
            engine = TritonEngine()

            async def retain(ready: list[Replica]) -> None:
                await engine.retain({r.grpc_url for r in ready})

            discovery = Discovery(target, balancer, http, refresh_s=refresh_s, on_update=retain)
            app.state.gateway = Gateway(
                target,
                balancer,
                discovery,
                engine,
                http,
                tokenizer,
                ChatTemplate.from_tokenizer_dir(target.tokenizer_dir),
            )
            try:
                async with discovery.running():
                    yield
            finally:
                await engine.close()

    app = FastAPI(title=f"hpc-serve gateway: {target.name}", lifespan=lifespan)
    app.add_exception_handler(APIError, api_error_handler)
    app.add_exception_handler(RequestValidationError, validation_error_handler)
    app.include_router(openai_api.router)
    app.include_router(passthrough.health)
    app.include_router(liveness.router)
    app.include_router(passthrough.router)
    return app
