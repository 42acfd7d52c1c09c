"""Answers of several choices: a completion's list of prompts (text or token ids), and `n` > 1, as evaluation
harnesses (lm-evaluation-harness's `local-completions` batches its prompts) and batch clients send them.

Each choice is a generation of its own: an engine request balanced and retried like any other (so a batch spreads
over the replicas), answered in OpenAI's order and shape: choice `i * n + j` is prompt i's j-th. With n > 1 the
choices of a prompt are sampled with seeds `seed + j` (a random `seed` when the request gave none), so that
sampled choices differ and a seeded request is repeatable; a greedy request gives n equal choices, as OpenAI's
does. Usage counts each prompt's tokens once and every choice's completion tokens.

Not streamed, the answer waits for every choice; the first error fails the request and stops the other
generations. Streamed, the answer starts once every choice has its first piece (an error before that is the HTTP
error a single choice gets), then relays pieces as they come, each event naming its choice's `index`, a
finish event per choice as it ends, and the usage (when asked) and `[DONE]` after the last.

Log probabilities are not served with several choices (a 400 says so); `echo` puts each prompt in front of its
choices' text (with log probabilities it would need the prompt's, which neither workflow's model returns).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import secrets
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

from fastapi.responses import JSONResponse

from hpc.gateway.accesslog import RequestRecord
from hpc.gateway.answers import ChatCompletion, Completion
from hpc.gateway.choices import DONE, Events, Tally, answer_error, finish_of, replica_header, usage_of
from hpc.gateway.errors import APIError
from hpc.gateway.state import Gateway
from hpc.gateway.streaming import EventStream
from hpc.serving.model_io import Chunk, GenerateParams
from hpc.serving.text import StopStream, cut_at_stop
from hpc.serving.triton import ModelError, ReplicaUnavailable, TokenRefused
from launcher.contracts.model_names import UINT64_MAX

T = TypeVar("T")
#: the seeds of a request without one that asks for n > 1 sampled choices (the engines take 64-bit seeds)
SEED_BITS = 31


def choice_params(prompts: Sequence[GenerateParams], n: int) -> list[GenerateParams]:
    """Every choice's generation, in OpenAI's order (module docstring: prompt i's j-th is `i * n + j`)."""
    if n == 1:
        return list(prompts)
    out = []
    for params in prompts:
        base = params.seed if params.seed is not None else secrets.randbits(SEED_BITS)
        wrapped = [(base + j) % (UINT64_MAX + 1) for j in range(n)]  # a seed near the top wraps round to 0
        out += [dataclasses.replace(params, seed=seed) for seed in wrapped]
    return out


async def _all(awaitables: Sequence[Awaitable[T]]) -> list[T]:
    """Every result, or the first error with the others cancelled (a generation cancelled mid-way is stopped by
    its stream's own clean-up: hpc/serving/abandon.py)."""
    tasks = [asyncio.ensure_future(a) for a in awaitables]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


def _sub(record: RequestRecord) -> RequestRecord:
    return RequestRecord(record.method, record.path)


def _merge_records(record: RequestRecord, subs: Sequence[RequestRecord]) -> None:
    """The access log's line for the request: the first choice's replica, every retry."""
    record.replica = subs[0].replica if subs else None
    record.retried = sum(s.retried for s in subs)


async def answer(
    gw: Gateway,
    prompts: Sequence[GenerateParams],
    n: int,
    chat: bool,
    record: RequestRecord,
    stream: bool,
    include_usage: bool = False,
    echo: bool = False,
) -> Any:
    """The answer (JSON, or an SSE stream) of `n` choices for each of `prompts`; APIError before it started."""
    record.model, record.stream = gw.model_name, stream
    choices = choice_params(prompts, n)
    subs = [_sub(record) for _ in choices]
    counted = [gw.count_prompt(p.prompt) for p in prompts]
    try:
        if not stream:
            tallies = await _all([_whole(gw, params, sub) for params, sub in zip(choices, subs, strict=True)])
            prompt_tokens = list(await asyncio.gather(*counted))
            _merge_records(record, subs)
            answer = _json(gw, prompts, choices, tallies, prompt_tokens, n, chat, record, echo)
            answer.headers.update(replica_header([sub.replica for sub in subs]))
            return answer
        pieces = [gw.generate(params, sub) for params, sub in zip(choices, subs, strict=True)]
        try:
            firsts = await _all([gw.first(p) for p in pieces])
        except BaseException:
            await asyncio.gather(*(p.aclose() for p in pieces), return_exceptions=True)
            raise
    except (ModelError, ReplicaUnavailable, TokenRefused) as exc:
        for future in counted:
            future.cancel()
        _merge_records(record, subs)
        raise answer_error(exc, chat, record) from None
    except APIError:
        for future in counted:
            future.cancel()
        raise
    _merge_records(record, subs)
    record.first_token()
    events = Events(f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}", int(time.time()), gw.model_name, chat)
    relay = _Relay(gw, prompts, choices, n, chat, record, events, echo, subs)
    return EventStream(
        relay.events(firsts, pieces, counted, include_usage),
        media_type="text/event-stream",
        headers=replica_header([sub.replica for sub in subs]),
    )


async def _whole(gw: Gateway, params: GenerateParams, record: RequestRecord) -> Tally:
    """One choice's generation, taken whole."""
    pieces = gw.generate(params, record, whole=True)
    tally = Tally()
    try:
        chunk = await gw.first(pieces)
        while chunk is not None:
            tally.add(chunk)
            chunk = await anext(pieces, None)
    finally:
        await pieces.aclose()
    return tally


def _text(prompt: GenerateParams, text: str, chat: bool, echo: bool) -> str:
    return prompt.prompt + text if echo and not chat else text


def _json(
    gw: Gateway,
    prompts: Sequence[GenerateParams],
    choices: Sequence[GenerateParams],
    tallies: Sequence[Tally],
    prompt_tokens: Sequence[int],
    n: int,
    chat: bool,
    record: RequestRecord,
    echo: bool,
) -> JSONResponse:
    out, completion = [], 0
    for index, (params, tally) in enumerate(zip(choices, tallies, strict=True)):
        record.kv_blocks(tally.perf)
        text, stopped = cut_at_stop(tally.text, params.stop)
        tokens = tally.completion_tokens(gw, params.max_tokens, prompt_tokens[index // n])
        completion += tokens
        mine = {"completion_tokens": tokens, "total_tokens": prompt_tokens[index // n] + tokens}
        finish = finish_of(stopped, mine, params, gw.context_length, tally.finish)
        choice: dict[str, Any] = {"index": index, "finish_reason": finish, "logprobs": None}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = _text(prompts[index // n], text, chat, echo)
        out.append(choice)
    body = {
        "id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
        "created": int(time.time()),
        "model": gw.model_name,
        "choices": out,
        "usage": usage_of(sum(prompt_tokens), completion, record),
    }
    return JSONResponse((ChatCompletion if chat else Completion).model_validate(body).wire())


@dataclasses.dataclass
class _Relay:
    """The SSE events of several choices' streams, as their pieces come (module docstring)."""

    gw: Gateway
    prompts: Sequence[GenerateParams]
    choices: Sequence[GenerateParams]
    n: int
    chat: bool
    record: RequestRecord
    out: Events
    echo: bool
    #: each choice's own record (its replica, and those that failed it half-way: `Gateway.resumed`)
    subs: Sequence[RequestRecord]

    def _opening(self) -> bytes:
        """Chat's role events, or (echo) each prompt in front of its choices."""
        if self.chat:
            return b"".join(self.out.event([self.out.opening(i)]) for i in range(len(self.choices)))
        if self.echo:
            return b"".join(
                self.out.event([self.out.choice(i, self.prompts[i // self.n].prompt)]) for i in range(len(self.choices))
            )
        return b""

    async def events(
        self,
        firsts: Sequence[Chunk | None],
        pieces: Sequence[AsyncGenerator[Chunk, None]],
        counted: Sequence[asyncio.Future[int]],
        include_usage: bool,
    ) -> AsyncIterator[bytes]:
        queue: asyncio.Queue[tuple[int, Chunk | BaseException | None]] = asyncio.Queue()
        tasks = [
            asyncio.ensure_future(
                _pump(i, first, stream, queue, functools.partial(self.gw.resumed, params, record=sub))
            )
            for i, (first, stream, params, sub) in enumerate(zip(firsts, pieces, self.choices, self.subs, strict=True))
        ]
        stops = [StopStream(params.stop) for params in self.choices]
        tallies = [Tally() for _ in self.choices]
        left = set(range(len(self.choices)))
        try:
            yield self._opening()
            while left:
                index, item = await queue.get()
                if index not in left:
                    continue
                if isinstance(item, BaseException):
                    self.record.error = "stream_failed"
                    yield APIError(500, str(item), "server_error").event()
                    return
                if item is not None:
                    tallies[index].add(item)
                    if text := stops[index].feed(item.text):
                        yield self.out.event([self.out.choice(index, text)])
                    if not stops[index].stopped:
                        continue
                    tasks[index].cancel()  # its stop sequence came: the rest of its generation is not needed
                left.discard(index)
                yield self._finish(index, stops[index], tallies[index], await counted[index // self.n])
            prompt_tokens = sum([await future for future in counted])
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for future in counted:
                future.cancel()
        completion = sum(
            tally.completion_tokens(self.gw, params.max_tokens, counted[index // self.n].result())
            for index, (tally, params) in enumerate(zip(tallies, self.choices, strict=True))
        )
        usage = usage_of(prompt_tokens, completion, self.record)
        for tally in tallies:
            self.record.kv_blocks(tally.perf)
        yield (self.out.event([], usage=usage) if include_usage else b"") + DONE

    def _finish(self, index: int, stops: StopStream, tally: Tally, prompt_tokens: int) -> bytes:
        params = self.choices[index]
        rest = stops.flush()
        tokens = tally.completion_tokens(self.gw, params.max_tokens, prompt_tokens)
        mine = {"completion_tokens": tokens, "total_tokens": prompt_tokens + tokens}
        finish = finish_of(stops.stopped, mine, params, self.gw.context_length, tally.finish)
        text = self.out.event([self.out.choice(index, rest)]) if rest else b""
        return text + self.out.event([self.out.choice(index, None, finish)])


async def _pump(
    index: int,
    first: Chunk | None,
    pieces: AsyncGenerator[Chunk, None],
    queue: asyncio.Queue[tuple[int, Chunk | BaseException | None]],
    resumed: Callable[..., Awaitable[tuple[Chunk | None, AsyncGenerator[Chunk, None]] | None]],
) -> None:
    """One choice's pieces into the relay's queue, then None (or what ended it); a choice whose replica failed it
    half-way goes on on another (`resumed`: `Gateway.resumed` of the choice's parameters and record)."""
    tally = Tally()
    try:
        chunk = first
        while chunk is not None:
            queue.put_nowait((index, chunk))
            tally.add(chunk)
            try:
                chunk = await anext(pieces, None)
            except (ModelError, ReplicaUnavailable) as exc:
                again = await resumed(tally.text, None if tally.uncounted else tally.tokens, exc=exc)
                if again is None:
                    raise
                await pieces.aclose()
                chunk, pieces = again
        queue.put_nowait((index, None))
    except (ModelError, ReplicaUnavailable, TokenRefused) as exc:
        queue.put_nowait((index, exc))
    finally:
        await pieces.aclose()
