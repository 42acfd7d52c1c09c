"""The gateway's check of `Authorization: Bearer <token>` against the deployment's tokens (hpc/serving/auth.py keeps
them; discovery re-reads them on every refresh, so a folder made after the gateway started counts)."""

from __future__ import annotations

import hmac


def authorized(header: str | None, tokens: set[str]) -> bool:
    """`Authorization: Bearer <token>` names one of `tokens` (none needed when there are none); compared in
    constant time."""
    if not tokens:
        return True
    scheme, _, given = (header or "").partition(" ")
    if scheme.lower() != "bearer" or not given:
        return False
    return any(hmac.compare_digest(given.strip().encode(), t.encode()) for t in tokens)
