"""The rule for a stream whose replica fails it half-way: go on on another replica, from where the text stopped.

The gateway (hpc/gateway/state.py `Gateway.resumed`) and the Python client (hpc/client/aio.py) both follow it, each
routing the continuation by its own retry rule (hpc/serving/retry.py) with the failed replicas left out. Why text and
not token ids, which errors, and why twice: docs/decisions.md "A stream goes on on another replica".
"""

from __future__ import annotations

import dataclasses

from hpc.serving.model_io import GenerateParams
from hpc.serving.triton import ReplicaUnavailable, failed_internally

#: times one stream may go on on another replica: a failure that follows the request (not its replica) fails it
#: again, and then it ends; two, because a job's replicas often go together
RESUMES = 2


def resumable(exc: BaseException, resumed: int) -> bool:
    """Whether a stream that failed with `exc` after its first piece, `resumed` times continued already, goes on:
    its replica unreachable or its stream broken, or its model failing it (the engine gone under it); not an error
    of the request itself (its context too long, a refused token, a queue full)."""
    return resumed < RESUMES and (isinstance(exc, ReplicaUnavailable) or failed_internally(exc))


def continuation(params: GenerateParams, sent: str, made: int) -> GenerateParams | None:
    """What another replica is asked for to go on after the text `sent` (`made` tokens of it): the prompt followed by
    that text, the tokens left of `max_tokens` and of `min_tokens`; None when every token asked for was made (only
    the stream's end was lost: it ends at its length)."""
    left = params.max_tokens - made
    if left <= 0:
        return None
    least = None if params.min_tokens is None else max(0, params.min_tokens - made)
    return dataclasses.replace(params, prompt=params.prompt + sent, max_tokens=left, min_tokens=least)
