"""Routing policies side by side on a multi-turn chat trace: what each keeps of the conversations' KV cache, by the
engines' own counts, and what that does to the time to the first token and to throughput.

The trace: one long system prompt shared by every conversation, `--conversations` conversations of `--turns`
turns, `--workers` of them in flight at a time (interleaved); each turn's prompt is the conversation so far, the
previous answers included. Over `--replicas` replicas of one local job whose KV caches hold `--cache-fraction` of
the working set together (`llm_api.kv_cache_config`, events on), each policy runs the same trace shape with words
of its own (a policy finds nothing another one left: its blocks are new to every cache, which evicts what the
previous policy left least recently used first).

Policies: `cache` (the default: the longest cached prefix against load, following the replicas' KV-cache events),
`client` (the same rule on the prompts sent to each replica, no events followed: what `hpc.client` runs),
`prefix` (the first 256 characters as the key, the default before), `least` (least outstanding), `round_robin`,
and `pinned` (conversation i on replica i mod R: the ideal a router can reach). Each request is routed by the
gateway's own routing (hpc/serving: the balancer, the routing mode, the events follower and the retry rule that
`Gateway.routed` runs) and sent over Triton's gRPC stream as the gateway sends it; the HTTP hop is left out, so
that the numbers are the routing's (bench_gateway.py measures the hop).

Per policy: KV blocks reused / computed (each request's perf metrics: the engine's own counts, as the gateway's
hpc_serve_gateway_replica_kv_* metrics add them up), the share of each conversation's own history (beyond the
system prompt) found in cache from its second turn on, requests per replica, TTFT p50/p90, output tokens/s.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from gateway_procs import job

from hpc.serving.balancer import Balancer, Replica
from hpc.serving.deployment import as_replica
from hpc.serving.kv_events import KvEventsFollower
from hpc.serving.model_io import GenerateParams
from hpc.serving.retry import stream_with_retry
from hpc.serving.routing import CachedPrefix, routing_mode
from hpc.serving.triton import ReplicaBusy, ReplicaUnavailable, TritonEngine
from launcher.contracts.job_index import HOME_ENV

POLICIES = ("cache", "client", "prefix", "least", "round_robin", "pinned")
#: the engines' KV blocks (TensorRT-LLM's default)
BLOCK = 32
WORDS = (
    "the of river mountain report annual budget policy engine weather station harbor data answer careful "
    "assistant question customer order invoice delivery account support"
).split()


def text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


@dataclass
class Turn:
    conversation: int
    turn: int
    replica: str = ""
    reused: int = 0
    missed: int = 0
    prompt_blocks: int = 0
    ttft_s: float = 0.0
    tokens: int = 0


@dataclass
class Result:
    turns: list[Turn] = field(default_factory=list)
    wall_s: float = 0.0


async def run_policy(
    policy: str, replicas: list[Replica], args: argparse.Namespace, seed: int, tokenizer, system_blocks: int
) -> Result:
    rng = random.Random(seed)
    system = f"System {seed}: " + text(rng, args.system_words)
    engine = TritonEngine()
    mode = routing_mode(
        {"pinned": "least", "client": "cache"}.get(policy, policy),
        tokenize=lambda p: tokenizer.encode(p, add_special_tokens=True),
        follows_events=policy != "client",  # hpc.client's rule: by the prompts it sent, no events followed
    )
    balancer = Balancer(round_robin=mode.round_robin)
    replicas = [dataclasses.replace(r) for r in replicas]  # counters of its own
    balancer.update(replicas)
    follows = isinstance(mode, CachedPrefix) and mode.follows_events
    follower = KvEventsFollower(mode, balancer, lambda _r: None) if follows else None
    result = Result()
    gate = asyncio.Semaphore(args.workers)

    async def ask(conversation: int, turn: int, prompt: str) -> str:
        record = Turn(conversation, turn, prompt_blocks=len(tokenizer.encode(prompt)) // BLOCK)
        params = GenerateParams(prompt=prompt, max_tokens=args.answer_tokens, ignore_eos=True)
        pieces: list[str] = []
        start = time.perf_counter()

        def attempt(replica: Replica):
            record.replica = replica.key
            return engine.stream(replica.grpc_url, params, None, replica.workflow, True, replica.llmapi_model)

        if policy == "pinned":
            chunks = attempt(replicas[conversation % len(replicas)])
        else:
            chunks = stream_with_retry(
                balancer,
                attempt,
                ReplicaUnavailable,
                ReplicaBusy,
                mode.prefix_key(prompt),
                route=mode.route(prompt),
            )
        async for chunk in chunks:
            if not record.ttft_s:
                record.ttft_s = time.perf_counter() - start
            pieces.append(chunk.text)
            if chunk.perf:
                record.reused += int(chunk.perf.get("kv_cache_reused_block", 0))
                record.missed += int(chunk.perf.get("kv_cache_missed_block", 0))
        answer = "".join(pieces)
        record.tokens = args.answer_tokens
        result.turns.append(record)
        return answer

    async def conversation(c: int) -> None:
        crng = random.Random(seed * 1000 + c)
        history = f"{system}\n"
        for t in range(args.turns):
            history += f"User {c}: {text(crng, args.question_words)}\nAssistant:"
            async with gate:
                answer = await ask(c, t, history)
            history += f"{answer}\n"

    async def everything() -> None:
        await asyncio.gather(*(conversation(c) for c in range(args.conversations)))

    start = time.perf_counter()
    try:
        if follower is not None:
            async with follower.running():
                await everything()
        else:
            await everything()
    finally:
        await engine.close()
    result.wall_s = time.perf_counter() - start
    return result


def report(policy: str, result: Result, system_blocks: int, pinned_reused: int | None) -> str:
    turns = result.turns
    reused, missed = sum(t.reused for t in turns), sum(t.missed for t in turns)
    # a conversation's own history: what its previous turn's prompt held beyond the system prompt
    by_conv: dict[int, list[Turn]] = {}
    for t in sorted(turns, key=lambda t: (t.conversation, t.turn)):
        by_conv.setdefault(t.conversation, []).append(t)
    own_found = own_all = 0
    for chain in by_conv.values():
        for before, now in zip(chain, chain[1:], strict=False):
            own = max(0, before.prompt_blocks - system_blocks)
            own_all += own
            own_found += min(own, max(0, now.reused - system_blocks))
    ttfts = sorted(t.ttft_s for t in turns)
    p50 = statistics.median(ttfts)
    p90 = ttfts[min(len(ttfts) - 1, int(0.9 * len(ttfts)))]
    share = {}
    for t in turns:
        share[t.replica.rsplit("/", 1)[-1]] = share.get(t.replica.rsplit("/", 1)[-1], 0) + 1
    of_pinned = f"{reused / pinned_reused:5.2f}" if pinned_reused else "    -"
    own = f"{own_found / own_all:5.2f}" if own_all else "    -"
    tps = sum(t.tokens for t in turns) / result.wall_s
    return (
        f"    {policy:12} reused {reused:6d} computed {missed:6d} ({reused / max(1, reused + missed):4.2f})"
        f"  of pinned {of_pinned}  own history found {own}  TTFT p50 {p50 * 1e3:7.1f} ms p90 {p90 * 1e3:7.1f} ms"
        f"  {tps:7.1f} tok/s  per replica {dict(sorted(share.items()))}"
    )


def write_spec(
    work: Path, name: str, checkpoint: Path, replicas: int, backend: str, batch: int, kv_tokens: int
) -> Path:
    spec = {
        "auth": "none",
        "name": name,
        "workdir": str(work / "runs"),
        "slurm": {"nodes": 1, "ntasks_per_node": replicas, "time": "00:30:00"},
        "model": {
            "backend": backend,
            "checkpoint_dir": str(checkpoint),
            "tp_size": 1,
            **({"sim": {"gpu": "h200"}} if backend == "sim" else {}),
        },
        "triton": {"ready_timeout_s": 300},
        "replicas": replicas,
        "llm_api": {
            "max_batch_size": batch,
            "kv_cache_config": {
                "max_tokens": kv_tokens,
                "enable_block_reuse": True,
                "tokens_per_block": BLOCK,
                "event_buffer_max_size": 16384,
            },
        },
    }
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def long_checkpoint(work: Path, positions: int) -> Path:
    """The tiny random GPT-2 with `positions` positions (the embedded default's 256 hold no multi-turn chat)."""
    from backend.cpu_engine import init_model

    init_model.SIZES["bench-long"] = {**init_model.SIZES["tiny"], "positions": positions}
    return Path(init_model.create_checkpoint(work / "long-gpt2", family="gpt2", size="bench-long", seed=0))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", default="2,4", help="replica counts, each a job of its own (e.g. 2,4)")
    parser.add_argument("--conversations", type=int, default=16)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--workers", type=int, default=8, help="conversations in flight at a time")
    parser.add_argument("--system-words", type=int, default=300, help="the shared system prompt's length")
    parser.add_argument("--question-words", type=int, default=40, help="each user turn's length")
    parser.add_argument("--answer-tokens", type=int, default=32, help="each answer's length (ignore_eos)")
    parser.add_argument("--cache-fraction", type=float, default=0.7, help="the replicas' caches / the working set")
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument(
        "--backend",
        choices=["cpu", "sim"],
        default="cpu",
        help="model.backend of the replicas: cpu, or sim (Llama 3.1 8B on a simulated H200: an H200's pace)",
    )
    parser.add_argument(
        "--checkpoint", type=Path, help="default: cpu, a tiny random GPT-2 with 4096 positions; sim, Llama 3.1 8B's"
    )
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    args = parser.parse_args()
    policies = args.policies.split(",")
    if "pinned" in policies:  # first: the others are compared with it
        policies.remove("pinned")
        policies.insert(0, "pinned")

    from backend.models.tokenizer import load_tokenizer
    from launcher.contracts.layout import JobPaths
    from launcher.contracts.records import read_endpoints

    work = Path(tempfile.mkdtemp(prefix="bench-routing-"))
    os.environ[HOME_ENV] = str(work / "hpc-home")
    if args.checkpoint is not None:
        checkpoint = args.checkpoint
    elif args.backend == "sim":
        from backend.sim_engine.checkpoint import create_sim_checkpoint

        checkpoint = Path(create_sim_checkpoint(work / "sim-llama", "llama-3.1-8b"))
    else:
        checkpoint = long_checkpoint(work, 4096)
    tokenizer = load_tokenizer(checkpoint)
    # the working set, in blocks: the system prompt once, each conversation's last prompt beyond it
    probe = random.Random(0)
    system_blocks = len(tokenizer.encode("System 0: " + text(probe, args.system_words))) // BLOCK
    turn_tokens = len(tokenizer.encode(f"User 0: {text(probe, args.question_words)}\nAssistant:")) + args.answer_tokens
    own_blocks = args.turns * turn_tokens // BLOCK
    working_set = system_blocks + args.conversations * own_blocks
    longest = (system_blocks + own_blocks + 2) * BLOCK
    print(f"checkpoint: {checkpoint}\nwork folder: {work}")
    print(
        f"trace: {args.conversations} conversations x {args.turns} turns, {args.workers} in flight; system prompt "
        f"{system_blocks} blocks of {BLOCK} tokens, each conversation's own history up to {own_blocks}; working set "
        f"{working_set} blocks; caches together hold {args.cache_fraction:.0%} of it beside a full batch"
    )
    try:
        for count in [int(n) for n in args.replicas.split(",")]:
            # a batch as large as the requests in flight (a replica is never the queue: a GPU's batch is 64 and
            # more), and a KV cache of its share of what may stay cached beside its share of the requests in flight
            share = -(-args.workers // count)
            cached = int(args.cache_fraction * working_set / count)
            kv_tokens = (cached + share * (longest // BLOCK + 1)) * BLOCK
            spec = write_spec(work, f"routing{count}", checkpoint, count, args.backend, args.workers, kv_tokens)
            print(
                f"\n  {count} replicas, each a KV cache of {cached} blocks beside its share of the requests in flight"
            )
            with job(spec) as (job_id, job_dir):
                replicas = [as_replica(r) for r in read_endpoints(JobPaths.of_folder(job_dir))]
                pinned_reused = None
                for i, policy in enumerate(policies):
                    seed = 100 * count + i
                    result = asyncio.run(run_policy(policy, replicas, args, seed, tokenizer, system_blocks))
                    if policy == "pinned":
                        pinned_reused = sum(t.reused for t in result.turns)
                    print(report(policy, result, system_blocks, pinned_reused), flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
