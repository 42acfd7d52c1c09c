"""What the gateway's own code costs on the way to a streamed answer, in one process, against the floor relay
(benchmarks/minimal_relay.py), with a fake engine in place of the replica: no tritonserver, no sockets, so it runs
anywhere in seconds and shows what the gateway's Python does, not the network.

Each request goes through the ASGI app as uvicorn would call it (`POST /v1/completions`, `stream: true`); the
fake engine notes when it is called (the request would leave for the replica there), waits `--prefill-ms`
(the replica's work), and yields `--tokens` pieces. Per request:

  to the engine     from the app's call to the engine's: everything before the request leaves
  first piece out   from the engine's first piece to the first SSE event sent: everything after it
  CPU               the process's CPU time per request (and per piece: with `--tokens 200`, mostly what each
                    streamed piece costs the gateway's Python, the sockets aside)

Why `--cold` (the default): at one stream the gateway is idle between requests while other processes run, so it
finds its caches emptied, and its code then runs several times slower than in a tight loop (docs/decisions.md
"The gateway's own time"). Between requests `--cold` touches
64 MB and runs unrelated Python. The two apps take turns request by request, so both meet the same machine.

    python benchmarks/gateway_inprocess.py [--requests 1000] [--tokens 32] [--prefill-ms 2] [--warm]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from hpc.serving.model_io import Chunk, GenerateParams  # noqa: E402

App = Callable[[dict, Callable[[], Awaitable[dict]], Callable[[dict], Awaitable[None]]], Awaitable[None]]


class Clock:
    """When the engine was called and when it gave its first piece, for the request under way."""

    called = 0.0
    first_piece = 0.0


class FakeEngine:
    """The replica: called (the request leaves), `prefill_s` later its first piece, then the rest at once."""

    def __init__(self, tokens: int, prefill_s: float) -> None:
        self.tokens, self.prefill_s = tokens, prefill_s

    async def stream(
        self, grpc_url: str, params: GenerateParams, token: str | None = None, *how: Any
    ) -> AsyncIterator[Chunk]:
        """TritonEngine.stream's call: `how` is the replica's workflow, decoupled and llmapi model (the gateway
        passes them), which a fake replica has no use for."""
        Clock.called = time.perf_counter()
        try:  # as TritonEngine does once the request was written (hpc/serving/idle.py), where the tree has it
            from hpc.serving.idle import run_deferred
        except ImportError:
            pass
        else:
            run_deferred()
        await asyncio.sleep(self.prefill_s)
        for i in range(self.tokens):
            if i == 0:
                Clock.first_piece = time.perf_counter()
            yield Chunk(" w", 1)

    async def retain(self, urls: set[str]) -> None:
        pass

    async def close(self) -> None:
        pass


async def call(app: App, path: str, body: bytes) -> tuple[float, float]:
    """One request through `app`: (seconds to the engine's call, seconds from its first piece to the first event)."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"x"), (b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 2),
    }
    sent, done = False, asyncio.Event()
    first_event: list[float] = []

    async def receive() -> dict:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        if not first_event and message.get("body", b"").startswith(b"data"):
            first_event.append(time.perf_counter())

    started = time.perf_counter()
    await app(scope, receive, send)
    done.set()
    return Clock.called - started, first_event[0] - Clock.first_piece


async def gateway_app(engine: FakeEngine, work: Path) -> tuple[App, Any]:
    """The gateway's app (hpc.gateway.app.create_app) after its startup, with `engine` and one replica."""
    from backend.cpu_engine.init_model import create_checkpoint
    from hpc.gateway.app import create_app
    from hpc.serving.balancer import Replica
    from hpc.serving.deployment import Target
    from hpc.serving.discovery import Discovery

    async def no_look(self: Discovery) -> None:  # no deployment folder to look at: the replica is set below
        return None

    Discovery.refresh = no_look  # type: ignore[method-assign]
    checkpoint = Path(create_checkpoint(work / "tiny", family="gpt2", size="tiny", seed=0))
    app = create_app(Target(work / "runs", "bench", checkpoint), refresh_s=1e9)
    startup: asyncio.Queue[dict] = asyncio.Queue()
    started: asyncio.Queue[dict] = asyncio.Queue()
    await startup.put({"type": "lifespan.startup"})
    lifespan = asyncio.ensure_future(app({"type": "lifespan", "asgi": {"version": "3.0"}}, startup.get, started.put))
    await started.get()
    app.state.gateway.engine = engine
    app.state.gateway.balancer.update([Replica(key="job/0", http_url="http://replica", grpc_url="replica")])
    return app, lifespan


def floor_app(engine: FakeEngine) -> App:
    """benchmarks/minimal_relay.py's raw ASGI relay, on `engine`."""
    import minimal_relay

    from hpc.serving import triton

    triton.TritonEngine.stream = engine.stream  # type: ignore[method-assign,assignment]
    return minimal_relay.make_app("replica", None)


def empty_caches(junk: bytearray) -> None:
    """What the other processes of a one-stream run do to this one's caches between its requests."""
    for i in range(0, len(junk), 4096):
        junk[i] = (junk[i] + 1) & 255
    json.dumps([{"a": i, "b": str(i)} for i in range(3000)])


async def run(args: argparse.Namespace) -> None:
    engine = FakeEngine(args.tokens, args.prefill_ms / 1e3)
    with tempfile.TemporaryDirectory(prefix="gateway-inprocess-") as work:
        gateway, lifespan = await gateway_app(engine, Path(work))
        floor = floor_app(engine)
        body = json.dumps({"model": "bench", "prompt": "Once upon a time", "max_tokens": args.tokens, "stream": True})
        apps = {"gateway": (gateway, "/v1/completions"), "floor": (floor, "/")}
        out: dict[str, dict[str, list[float]]] = {k: {"to": [], "out": [], "cpu": []} for k in apps}
        junk = bytearray(64 * 2**20)
        for i in range(args.requests + 50):  # 50 unmeasured
            for name in list(apps)[i % 2 :] + list(apps)[: i % 2]:
                if not args.warm:
                    empty_caches(junk)
                app, path = apps[name]
                cpu = time.process_time()
                to_engine, first_out = await call(app, path, body.encode())
                cpu = time.process_time() - cpu  # the fake replica's wait costs none
                if i >= 50:
                    out[name]["to"].append(to_engine)
                    out[name]["out"].append(first_out)
                    out[name]["cpu"].append(cpu)
        lifespan.cancel()
    mode = "warm" if args.warm else "caches emptied between requests"
    print(f"in-process, fake engine, {args.requests} requests each, {args.tokens} pieces, {mode} (p50, us):")
    print(f"  {'':8} {'to the engine':>14} {'first piece out':>16} {'CPU':>8}")
    for name, v in out.items():
        p50 = {k: statistics.median(x) * 1e6 for k, x in v.items()}
        print(f"  {name:8} {p50['to']:14.0f} {p50['out']:16.0f} {p50['cpu']:8.0f}")
    g, f = out["gateway"], out["floor"]
    added = (
        statistics.median(g["to"])
        + statistics.median(g["out"])
        - statistics.median(f["to"])
        - statistics.median(f["out"])
    )
    print(f"  the gateway's own code adds {added * 1e6:.0f} us to the first token over the floor")
    per_piece = {k: statistics.median(v["cpu"]) / args.tokens * 1e6 for k, v in out.items()}
    print(
        f"  CPU per piece relayed (a request's CPU / its pieces; the socket writes not included): gateway "
        f"{per_piece['gateway']:.1f} us, floor {per_piece['floor']:.1f} us"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--prefill-ms", type=float, default=2.0, help="the fake replica's time to its first piece")
    parser.add_argument("--warm", action="store_true", help="leave the caches alone between requests")
    args = parser.parse_args()
    import uvloop

    uvloop.run(run(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
