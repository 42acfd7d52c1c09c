"""The floor under `hpc-serve gateway`: the least a Python HTTP server can do to relay one replica's stream.

A raw ASGI app on the gateway's own server settings (uvicorn, httptools, uvloop), nothing else: no FastAPI, no
validation, no routing, no balancer, no access log or metrics, no OpenAI envelope (one `data: {"text": ...}`
event per piece, then a usage event and `[DONE]`), the same gRPC stream to the replica (hpc.serving.triton's
TritonEngine). bench_gateway.py measures it as the `floor` side beside the real gateway: what the gateway adds
beyond this floor is its own code; what the floor adds over direct gRPC is the price of any HTTP hop in Python.

With `--fastapi` the same relay is one FastAPI route (a pydantic body, Starlette's streaming response as the
gateway uses it): the price of the web framework alone, between the floor and the gateway. With `--late-head` the
raw relay sends its response head only once the replica's first piece came, as the gateway must (an error before
the first token is an HTTP status there, so the status is known only then): the price of that order alone (the
head and the first event then leave in two writes after the first piece, not one).

The replica's workflow (`--workflow`, default llmapi: the spec's default) says which model the stream goes to and
how its answers read (hpc/serving/model_io.py); the llmapi model counts no tokens, so the usage event says
`max_tokens` (bench_gateway.py asks every side with `ignore_eos`: each generation runs to it).

    python benchmarks/minimal_relay.py GRPC_URL PORT [TOKEN] [--fastapi | --late-head] [--workflow llmapi|engine]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import uvicorn  # noqa: E402
from pydantic import BaseModel  # noqa: E402

from hpc.serving.model_io import GenerateParams  # noqa: E402
from hpc.serving.triton import TritonEngine  # noqa: E402
from launcher.contracts.llmapi import LLMAPI, WORKFLOWS  # noqa: E402

HEADERS = [(b"content-type", b"text/event-stream")]


class Body(BaseModel):
    """The `--fastapi` route's body (at module level: FastAPI resolves the annotation by name)."""

    prompt: str
    max_tokens: int
    ignore_eos: bool = False


def params_of(prompt: str, max_tokens: int, ignore_eos: bool) -> GenerateParams:
    return GenerateParams(prompt, max_tokens, ignore_eos=ignore_eos)


def usage_event(tokens: int, params: GenerateParams) -> bytes:
    """The last events: the usage (the tokens the engine counted; a model that counts none, llmapi: max_tokens)
    and `[DONE]`."""
    usage = json.dumps({"id": "floor", "usage": {"completion_tokens": tokens or params.max_tokens}}).encode()
    return b"data: " + usage + b"\n\ndata: [DONE]\n\n"


def make_app(grpc_url: str, token: str | None, late_head: bool = False, workflow: str = LLMAPI) -> Any:
    engine = TritonEngine()

    async def app(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await engine.close()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        request = json.loads(body)
        params = params_of(request["prompt"], int(request["max_tokens"]), bool(request.get("ignore_eos")))
        if not late_head:
            await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
        tokens, started = 0, False
        async for chunk in engine.stream(grpc_url, params, token, workflow):
            if late_head and not started:
                await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
            started = True
            tokens += chunk.tokens or 0
            if chunk.text:
                event = b'data: {"text": ' + json.dumps(chunk.text).encode() + b"}\n\n"
                await send({"type": "http.response.body", "body": event, "more_body": True})
        await send({"type": "http.response.body", "body": usage_event(tokens, params)})

    return app


def make_fastapi_app(grpc_url: str, token: str | None, workflow: str = LLMAPI) -> Any:
    from fastapi import FastAPI

    from hpc.gateway.streaming import EventStream

    engine = TritonEngine()
    app = FastAPI()

    async def events(params: GenerateParams) -> Any:
        tokens = 0
        async for chunk in engine.stream(grpc_url, params, token, workflow):
            tokens += chunk.tokens or 0
            if chunk.text:
                yield b'data: {"text": ' + json.dumps(chunk.text).encode() + b"}\n\n"
        yield usage_event(tokens, params)

    @app.post("/")
    async def relay(body: Body) -> Any:
        params = params_of(body.prompt, body.max_tokens, body.ignore_eos)
        return EventStream(events(params), media_type="text/event-stream")

    return app


def main() -> None:
    argv = sys.argv[1:]
    workflow = LLMAPI
    if "--workflow" in argv:
        at = argv.index("--workflow")
        workflow = argv[at + 1]
        del argv[at : at + 2]
        if workflow not in WORKFLOWS:
            raise SystemExit(f"--workflow: one of {', '.join(WORKFLOWS)}, not {workflow!r}")
    args = [a for a in argv if not a.startswith("--")]
    grpc_url, port = args[0], int(args[1])
    token = args[2] if len(args) > 2 else None
    if "--fastapi" in argv:
        app = make_fastapi_app(grpc_url, token, workflow)
    else:
        app = make_app(grpc_url, token, late_head="--late-head" in argv, workflow=workflow)
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=port,
        http="httptools",
        loop="uvloop",
        log_level="warning",
        access_log=False,
    )


if __name__ == "__main__":
    main()
