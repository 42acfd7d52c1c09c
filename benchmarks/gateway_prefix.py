"""bench_gateway.py's part 2: what prefix affinity keeps of a shared-prefix workload's KV-reuse opportunities over
2 replicas, against least outstanding (run) and round robin (computed over the same order).

Two counts per policy, side by side: what the order of requests allowed (`kept`: a request whose document an
earlier one brought to the same replica, with caches of `--cache-docs` documents, least recently used out), and
what the engines really reused: requests whose answer's perf metrics say KV blocks were found in the replica's
cache (the access log's `kv_reused_blocks`; the CPU engine's block reuse, backend/cpu_engine/prefix_cache.py). Each
replica's KV cache is sized to hold `--cache-docs` documents beside a full batch (`llm_api.kv_cache_config`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from pathlib import Path

import httpx
from gateway_procs import cli, gateway, job, write_spec


def workload(prefixes: int, questions: int, seed: int = 0) -> list[tuple[int, str]]:
    words = "the of river mountain report annual budget policy engine weather station harbor data".split()
    rng = random.Random(seed)
    docs = [f"Document {d}: " + " ".join(rng.choice(words) for _ in range(50)) for d in range(prefixes)]
    items = [
        (d, f"{docs[d][:300]}\nQuestion {q}: what is it about?") for d in range(prefixes) for q in range(questions)
    ]
    rng.shuffle(items)
    return items


def kept(docs: list[int], replicas: list[str], cache: int | None = None) -> int:
    """Requests whose document an earlier request (in sending order) had brought to the same replica, which
    holds the `cache` documents it saw last (None: every one it saw)."""
    held: dict[str, list[int]] = {}
    count = 0
    for doc, replica in zip(docs, replicas, strict=True):
        recent = held.setdefault(replica, [])
        if doc in recent:
            count += 1
            recent.remove(doc)
        recent.append(doc)
        if cache is not None and len(recent) > cache:
            recent.pop(0)
    return count


async def shared_prefix(url: str, token: str | None, model: str, items: list[tuple[int, str]], workers: int):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    replicas: list[str] = [""] * len(items)
    queue = iter(enumerate(items))
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=300, trust_env=False) as http:

        async def worker() -> None:
            for i, (_, prompt) in queue:
                body = {"model": model, "prompt": prompt, "max_tokens": 8}
                response = await http.post("/v1/completions", json=body)
                response.raise_for_status()
                replicas[i] = response.headers["x-hpc-serve-replica"]

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(workers)))
        return replicas, time.perf_counter() - t0


#: the replicas' engine: a batch of this many requests; KV blocks of this many tokens (TensorRT-LLM's default)
BATCH, BLOCK = 4, 32
#: answer length (tokens) of every shared-prefix request
ANSWER_TOKENS = 8


def llm_api(prompt_tokens: int, cache_docs: int) -> dict:
    """Each replica's LLM API arguments: a KV cache of a full batch's blocks plus `cache_docs` documents'
    (what stays free for reuse while a batch runs)."""
    request_blocks = -(-(prompt_tokens + ANSWER_TOKENS) // BLOCK)
    doc_blocks = prompt_tokens // BLOCK
    blocks = BATCH * request_blocks + cache_docs * doc_blocks
    return {
        "max_batch_size": BATCH,
        "kv_cache_config": {
            "max_tokens": blocks * BLOCK,
            "enable_block_reuse": True,
            "tokens_per_block": BLOCK,
            "event_buffer_max_size": 4096,  # routing: cache follows each replica's cache
        },
    }


def reused_requests(log: Path) -> int:
    """Requests of the gateway's access log whose engine found KV blocks of their prompt in its cache."""
    count = 0
    for line in log.read_text().splitlines():
        if line.startswith("{") and '"kv_reused_blocks"' in line:
            count += (json.loads(line).get("kv_reused_blocks") or 0) > 0
    return count


def picks_of(url: str) -> dict[str, int]:
    """The gateway's `hpc_serve_gateway_picks_total` by outcome (least / home / spilled), from `/metrics`."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url + "/metrics", timeout=5, trust_env=False).text
    return {
        s.labels["outcome"]: int(s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "hpc_serve_gateway_picks_total" and s.value
    }


def part2(args: argparse.Namespace, work: Path, checkpoint: Path) -> None:
    items = workload(args.prefixes, args.questions)
    docs = [d for d, _ in items]
    best = len(items) - args.prefixes
    print(
        f"\nshared prefixes, 2 replicas: {args.prefixes} documents x {args.questions} questions, {args.workers} at a time"
    )
    cache = args.cache_docs
    print(f"  KV-reuse opportunities kept (at best {best} of {len(items)}), each replica's cache unbounded / holding")
    print(f"  the last {cache} documents it saw (a KV cache smaller than the whole working set):")
    print("  and, after `engines`, the requests whose engine really found their document's KV blocks in its cache")
    from backend.models.tokenizer import load_tokenizer

    tokens = max(len(load_tokenizer(checkpoint).encode(prompt)) for _, prompt in items)
    spec = write_spec(work, "bench-gw2", checkpoint, replicas=2, auth=args.auth, llm_api=llm_api(tokens, cache))
    policies = (
        ("cached prefix", ()),  # the default, routing: cache
        ("prefix affinity", ("--routing", "prefix")),  # the default before: the first 256 characters as the key
        ("least outstanding", ("--routing", "least")),
    )
    for label, options in policies:
        with job(spec) as (job_id, _):  # a job per policy: each starts with empty caches
            token = cli("token", job_id).strip() if args.auth == "token" else None
            with gateway(job_id, work, *options) as (url, _, log):
                replicas, wall = asyncio.run(shared_prefix(url, token, "bench-gw2", items, args.workers))
                picks = picks_of(url)
            share = {r: replicas.count(r) for r in sorted(set(replicas))}
            counts = f"{kept(docs, replicas):4d} / {kept(docs, replicas, cache):4d}   engines {reused_requests(log):4d}"
            print(f"    {label:18} {counts}   requests per replica {share}   {wall:.2f} s   picks {picks}")
    names = sorted(set(replicas))
    rr = [names[i % 2] for i in range(len(items))]
    print(f"    {'round robin':18} {kept(docs, rr):4d} / {kept(docs, rr, cache):4d}   (computed over the same order)")
