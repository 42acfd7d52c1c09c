"""The deployment's access token: created once, kept in a 0600 file in the deployment folder.

Why a file and not an argument or environment variable: process arguments and environments are visible to
other users of a shared login node (`ps`, /proc), and a file readable only by its owner is what ssh keys use
too. The gateway re-reads the tokens on every discovery refresh, so a token made after it started counts.
"""

from __future__ import annotations

import hmac
import os
import secrets
from collections.abc import Iterable
from pathlib import Path

from launcher.layout import Deployment


def ensure_token(deploy_dir: Path) -> str:
    """The deployment's token, created (0600, atomically) when it has none yet."""
    path = Deployment(deploy_dir).token
    if path.exists():
        return path.read_text().strip()
    token = secrets.token_urlsafe(32)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(token + "\n")
    try:
        os.link(tmp, path)  # never replace a token another process made meanwhile
    except FileExistsError:
        pass
    finally:
        tmp.unlink()
    return path.read_text().strip()


def read_tokens(deploy_dirs: Iterable[Path]) -> set[str]:
    """Every token of the deployment's folders (one per submission that has one)."""
    tokens = set()
    for folder in deploy_dirs:
        try:
            token = Deployment(folder).token.read_text().strip()
        except OSError:
            continue
        if token:
            tokens.add(token)
    return tokens


def authorized(header: str | None, tokens: set[str]) -> bool:
    """`Authorization: Bearer <token>` names one of `tokens` (none needed when there are none)."""
    if not tokens:
        return True
    scheme, _, given = (header or "").partition(" ")
    if scheme.lower() != "bearer" or not given:
        return False
    return any(hmac.compare_digest(given.strip().encode(), t.encode()) for t in tokens)
