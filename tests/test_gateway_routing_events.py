"""Cache-aware routing against a real replica: hpc-serve's llmapi model over the CPU engine inside tritonserver,
its KV-cache events on (tests/_llmapi.py's repository), followed by the gateway's follower
(hpc/serving/kv_events.py). A prompt the engine computed is then found in that replica's cache, block for block,
through the deployment's tokenizer; a replica whose model sends no events, and one that cannot be asked, are
routed by the prompts sent there and said to be (the unit tests of the index and the policy:
tests/test_prefix_index.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from hpc.serving.balancer import Balancer, Replica
from hpc.serving.kv_events import KvEventsFollower
from hpc.serving.model_io import GenerateParams
from hpc.serving.routing import CachedPrefix
from hpc.serving.triton import TritonEngine
from launcher.contracts.llmapi import IMAGE_MODEL, LLMAPI, OWN_MODEL
from tests._llmapi import Job, running_job
from tests.e2e import free_port

pytestmark = [pytest.mark.triton, pytest.mark.slow]
#: how long the engine may take to show a prompt's blocks in its events (it computes them in one step)
EVENTS_WAIT_S = 60


@pytest.fixture(scope="module")
def job(tmp_path_factory, tiny_gpt2) -> Iterator[Job]:
    with running_job(tmp_path_factory.mktemp("routing"), str(tiny_gpt2)) as job:
        yield job


def _replica(key: str, grpc_port: int, llmapi_model: str = OWN_MODEL) -> Replica:
    return Replica(key, "", f"127.0.0.1:{grpc_port}", workflow=LLMAPI, llmapi_model=llmapi_model)


def test_a_prompt_the_engine_computed_is_found_in_its_replicas_cache_block_for_block(job, tiny_gpt2):
    from backend.models.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(tiny_gpt2)
    prompt = " ".join(f"w{i}" for i in range(70))
    ids = tokenizer.encode(prompt)
    assert len(ids) > 3 * 32, "three full blocks at least"
    followed = _replica("j/0", job.server.grpc_port)
    image = _replica("j/1", job.server.grpc_port, IMAGE_MODEL)
    gone = _replica("j/2", free_port())
    balancer = Balancer()
    balancer.update([followed, image, gone])
    mode = CachedPrefix(tokenizer.encode)

    async def main() -> tuple[int, int, dict[str, str]]:
        follower = KvEventsFollower(mode, balancer, lambda _replica: None)
        async with follower.running():
            await follower.poll()  # what the engine held before: followed from here on
            # through the model the follower asks (its events reader starts with its first generation)
            engine = TritonEngine()
            try:
                params = GenerateParams(prompt=prompt, max_tokens=1)
                async for _ in engine.stream(followed.grpc_url, params, None, LLMAPI, True, OWN_MODEL):
                    pass
            finally:
                await engine.close()

            async def found() -> int:
                while True:
                    await follower.poll()
                    route = await mode.scored(prompt + " and a question")
                    if route.held_tokens(followed) > 0:
                        return route.held_tokens(followed)

            held = await asyncio.wait_for(found(), EVENTS_WAIT_S)
            route = await mode.scored(prompt + " and a question")
            return held, route.held_tokens(image), mode.degraded_reasons()

    held, on_image, degraded = asyncio.run(main())
    assert held == (len(ids) - 1) // 32 * 32 or held == len(ids) // 32 * 32, (held, len(ids))
    assert on_image == 0, "nothing was sent to the replica without events"
    assert degraded["j/1"] == "no_events" and degraded["j/2"] == "events_failed", degraded
    assert "j/0" not in degraded
