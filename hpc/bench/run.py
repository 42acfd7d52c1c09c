"""`hpc-serve bench TARGET`: from the command line's settings to the runs, their table and their files.

TARGET is a deployment or a job (sent through hpc.client.AsyncClient, which picks the gateway or the replicas
as every client does: what is measured is what users get) or a gateway URL `http://…` (its OpenAI API, e.g. a
gateway on another machine; `--tokenizer` then names the model's tokenizer folder, else one word counts as one
token). A sweep runs the same requests (same seed) once per point, one after the other.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from hpc.bench.arrivals import arrival_times
from hpc.bench.loadgen import LoadSpec, Sender, client_sender, gateway_sender, run_load
from hpc.bench.stats import RequestRecord, summarize
from hpc.bench.workloads import Tokenizer, WordTokenizer, WorkloadSpec, make_requests
from hpc.client.transport import Sampling, auth_headers

#: more distinct prompts than this are not made: a longer run cycles through them (making them costs time)
MAX_DISTINCT = 2048
#: requests scheduled for an open-ended --duration run at rate inf (sent only as --concurrency lets them)
OPEN_ENDED = 1_000_000


@dataclass(frozen=True)
class BenchSettings:
    target: str
    workload: WorkloadSpec
    num_requests: int | None = 100
    request_rate: float = math.inf
    arrivals: str = "poisson"
    concurrency: int | None = None
    duration_s: float | None = None
    sweep: tuple[str, tuple[float, ...]] | None = None  # ("rate" | "concurrency", values)
    seed: int = 0
    slo_ttft_ms: float | None = None
    slo_itl_ms: float | None = None
    temperature: float | None = None
    tokenizer: Path | None = None
    model: str | None = None
    token: str | None = None
    timeout_s: float = 300.0
    warmup: int = 1

    def points(self) -> list[tuple[str, float, int | None]]:
        """(label, request rate, concurrency) of each run."""
        if self.sweep is None:
            return [(self._label(self.request_rate, self.concurrency), self.request_rate, self.concurrency)]
        kind, values = self.sweep
        if kind == "rate":
            return [(self._label(v, self.concurrency), v, self.concurrency) for v in values]
        return [(self._label(self.request_rate, int(v)), self.request_rate, int(v)) for v in values]

    @staticmethod
    def _label(rate: float, concurrency: int | None) -> str:
        text = "rate inf" if math.isinf(rate) else f"rate {rate:g}/s"
        return f"{text}, conc {concurrency}" if concurrency else text

    def count(self, rate: float) -> int:
        if self.num_requests is not None:
            return self.num_requests
        assert self.duration_s is not None
        return OPEN_ENDED if math.isinf(rate) else math.ceil(rate * self.duration_s * 1.5) + 16

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["token"] = "***" if self.token else None
        data["workload"] = {k: str(v) if isinstance(v, Path) else v for k, v in data["workload"].items()}
        data["tokenizer"] = str(self.tokenizer) if self.tokenizer else None
        return data


def is_url(target: str) -> bool:
    return target.startswith(("http://", "https://"))


def tokenizer_for(settings: BenchSettings) -> tuple[Tokenizer, str]:
    """The model's tokenizer (`--tokenizer`, else the deployment's `model.tokenizer`) and what it is."""
    from backend.models.tokenizer import load_tokenizer

    if settings.tokenizer is not None:
        return load_tokenizer(settings.tokenizer), str(settings.tokenizer)
    if is_url(settings.target):
        return WordTokenizer(), "none (--tokenizer not given: one word = one token)"
    from hpc.client.discovery import resolve

    folder = resolve(settings.target).tokenizer_dir
    return load_tokenizer(folder), str(folder)


async def _gateway_model(http: httpx.AsyncClient, url: str, token: str | None) -> str:
    """The first model a gateway lists at /v1/models (a gateway serves one deployment)."""
    response = await http.get(f"{url.rstrip('/')}/v1/models", headers=auth_headers(token))
    if response.status_code == 401:  # the default auth: token; said before any request is sent
        raise PermissionError(
            f"{url} asks for its deployment's access token"
            + (" and refused the one given" if token else "")
            + ': pass --token "$(hpc-serve token NAME)", or bench the deployment by name (hpc-serve bench NAME: its '
            "gateway and token)"
        )
    response.raise_for_status()
    models = response.json().get("data") or []
    if not models:
        raise ValueError(f"{url}/v1/models lists no model; pass --model NAME")
    return str(models[0]["id"])


ProgressHook = Any  # (label, total or None) -> callable(record)


async def run_bench(
    settings: BenchSettings, tokenizer: Tokenizer, progress: ProgressHook | None = None
) -> list[tuple[str, dict[str, Any], list[RequestRecord]]]:
    """Every point's (label, summary, records)."""
    sampling: Sampling = {} if settings.temperature is None else {"temperature": settings.temperature}
    distinct = min(max(settings.count(p[1]) for p in settings.points()), MAX_DISTINCT)
    requests = make_requests(settings.workload, distinct, tokenizer, settings.seed)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=1024)
    async with httpx.AsyncClient(trust_env=False, timeout=httpx.Timeout(settings.timeout_s), limits=limits) as http:
        send: Sender
        if is_url(settings.target):
            model = settings.model or await _gateway_model(http, settings.target, settings.token)
            send = gateway_sender(http, settings.target, model, settings.token, sampling)
            client = None
        else:
            from hpc.client import AsyncClient

            client = AsyncClient(settings.target, token=settings.token, timeout_s=settings.timeout_s)
            send = client_sender(client, sampling)
        try:
            for request in requests[: settings.warmup]:  # connections, discovery: not in the numbers
                async for _ in send(request, {}):
                    pass
            results = []
            for label, rate, concurrency in settings.points():
                count = settings.count(rate)
                times = arrival_times(count, rate, settings.arrivals, settings.seed)
                load = LoadSpec(times, concurrency, settings.duration_s)
                hook = progress(label, None if settings.duration_s else count) if progress else None
                records = await run_load(requests, load, send, tokenizer, hook)
                results.append((label, summarize(records, settings.slo_ttft_ms, settings.slo_itl_ms), records))
            return results
        finally:
            if client is not None:
                await client.aclose()


def bench(
    settings: BenchSettings,
    output_dir: Path | None,
    progress: ProgressHook | None = None,
    warn: Callable[[str], None] = lambda why: None,
):
    """Run, and write the files: → (points, files written, tokenizer description). What cannot be written is
    known before the first request (`warn` is told), so a long run never ends in an error that loses it: the
    numbers (summary.json, requests.csv) are written whether or not the plots can be."""
    from hpc.bench import plots

    no_plots = plots.missing() if output_dir is not None else None
    if no_plots is not None:
        warn(no_plots)
    tokenizer, described = tokenizer_for(settings)
    points = asyncio.run(run_bench(settings, tokenizer, progress))
    written: list[Path] = []
    if output_dir is not None:
        from hpc.bench.report import write_outputs

        written = write_outputs(output_dir, {**settings.to_json(), "tokenizer_used": described}, points)
        if no_plots is not None:
            return points, written, described
        for i, (label, _, records) in enumerate(points):
            suffix = f"-{i + 1}" if len(points) > 1 else ""
            title = f"{settings.target}: {label}"
            written.append(plots.distributions(records, output_dir / f"distributions{suffix}.png", title))
            written.append(plots.timeline(records, output_dir / f"timeline{suffix}.png", title))
            if (
                split_plot := plots.latency_split(records, output_dir / f"latency_split{suffix}.png", title)
            ) is not None:
                written.append(split_plot)
        if len(points) > 1:
            curve = [(label, summary) for label, summary, _ in points]
            written.append(plots.sweep_curve(curve, output_dir / "sweep.png", f"{settings.target}: sweep"))
    return points, written, described
