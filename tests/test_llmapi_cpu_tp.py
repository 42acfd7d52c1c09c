"""The CPU engine on the llmapi workflow with tensor parallelism 2, in the process layout of the real path: one MPI
job (mpirun here, srun on a cluster) whose rank 0 is the leader node beside tritonserver and whose rank 1 is a
worker node outside it. Its answers equal the single-rank engine's, token for token; a cancelled stream stops
the generation on both ranks; at tritonserver's stop both ranks leave by themselves (exit 0, MPI finalized).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from backend.cpu_engine.engine import Engine
from backend.cpu_engine.scheduler import GenerationRequest
from backend.models.tokenizer import load_tokenizer
from launcher.contracts.llmapi import CPU_MIN_STEP_VAR
from tests._llmapi import PROMPT, UNARY, Job, collect, flag, grpc, inputs, running_job, stream, text_of
from tests.steps import GPU_PACE_MS, LONG_REQUEST, STEPS_AFTER_STOP

pytestmark = [pytest.mark.triton, pytest.mark.slow]
TEXTS = [PROMPT, "Born in north-east France, Soyer trained as a", "What is machine learning?"]
NEW_TOKENS = 12
#: the cancelled request's length (paced: unpaced, the tiny model's steps left a cancel crossing a contended
#: machine well under a second before the request ran to its end)
LONG = LONG_REQUEST


@pytest.fixture(scope="module")
def job(tmp_path_factory, tiny_gpt2) -> Iterator[Job]:
    paced = {CPU_MIN_STEP_VAR: str(GPU_PACE_MS)}
    with running_job(tmp_path_factory.mktemp("llmapi-tp2"), str(tiny_gpt2), tp=2, extra_env=paced) as job:
        yield job


def _single_rank_texts(checkpoint: str) -> list[str]:
    tokenizer = load_tokenizer(checkpoint)
    engine = Engine(checkpoint)
    texts = []
    for text in TEXTS:
        prompt = tokenizer.encode(text)
        req = engine.generate(GenerationRequest(input_ids=prompt, max_new_tokens=NEW_TOKENS, end_id=tokenizer.end_id))
        texts.append(tokenizer.decode(prompt + req.output_ids))
    return texts


def test_tp2_answers_equal_the_single_rank_engine(job, tiny_gpt2):
    client = grpc(job)
    got = [text_of(client.infer(UNARY, inputs(t, NEW_TOKENS), request_id=str(i))) for i, t in enumerate(TEXTS)]
    assert got == _single_rank_texts(str(tiny_gpt2))


def test_tp2_streams_and_cancels(job):
    client, events = stream(job, inputs(PROMPT, NEW_TOKENS, streaming=flag()))
    responses = collect(events)
    client.stop_stream()
    assert len(responses) >= 2
    client, events = stream(job, inputs(PROMPT, LONG, streaming=flag()), request_id="c")
    assert events.get(timeout=60)[1] is None
    before = job.stats().iterations
    client.stop_stream(cancel_requests=True)
    stats = job.wait_for("nothing in flight", lambda s: s.active_requests == 0 and s.waiting_requests == 0)
    assert stats.iterations - before <= STEPS_AFTER_STOP  # the long request did not run to its end
