"""The deployment's access token on the login side: made once per deployment, kept in a 0600 file in each of
its folders (`Deployment(D).token`), read by everything that talks to its replicas or its gateway.

Why one token for the whole deployment (every folder `<workdir>/<name>-*`): a user resubmits, a job is renewed
by a successor, and the clients, the gateway and any tool given the token must keep working; so a new folder
gets the newest token its deployment already has, and only the first folder gets a new one. Why a file and
not an argument or environment variable: both are visible to other users of a node (`ps`, /proc), and a file
readable only by its owner is what ssh keys use too. Replacing the file changes the token for jobs started
after it; jobs already running keep the one their tritonserver read at start (the clients send each job its
folder's token).

What is sent and how (the header names tritonserver expects) is decided in launcher/contracts/auth.py.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from launcher.contracts.auth import GRPC_HEADER, HEADER, TOKEN, bearer
from launcher.contracts.job_index import entry_name_of
from launcher.contracts.layout import Deployment, JobPaths


def read_token(deploy_dir: Path) -> str | None:
    """A deployment folder's token, if it has one."""
    try:
        return Deployment(deploy_dir).token.read_text().strip() or None
    except OSError:
        return None


def _write_new(path: Path, token: str) -> None:
    """`path` holding `token`, 0600 from its first byte; never replaces a token another process made
    meanwhile (a hard link fails where the name exists)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(token + "\n")
    try:
        os.link(tmp, path)
    except FileExistsError:
        pass
    finally:
        tmp.unlink()


#: what a new token begins with: never a '-' (which tools would read as an option), and easy for secret scanners
TOKEN_PREFIX = "hpcs_"


def new_token() -> str:
    """A new random token: 256 bits, URL-safe (it travels as an HTTP header and a tritonserver option value)."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def ensure_token(deploy_dir: Path, deployment: Sequence[Path] = ()) -> str:
    """`deploy_dir`'s token; when it has none, the newest token among `deployment` (the deployment's folders,
    oldest first), or a new random one, written to it first."""
    token = read_token(deploy_dir)
    if token is not None:
        return token
    inherited = [t for t in (read_token(d) for d in deployment if Path(d) != Path(deploy_dir)) if t]
    _write_new(Deployment(deploy_dir).token, inherited[-1] if inherited else new_token())
    token = read_token(deploy_dir)
    assert token is not None
    return token


def ensure_deployment_token(deploy_dir: Path, workdir: Path, name: str) -> str:
    """What render does for `auth: token`: `deploy_dir`'s token, shared with the folders of deployment `name`
    in `workdir`."""
    from hpc.serving.deployment import Target, deployment_folders

    return ensure_token(deploy_dir, deployment_folders(Target(Path(workdir).resolve(), name, Path())))


def deployment_token(folders: Sequence[Path]) -> str | None:
    """What `hpc-serve token` prints: the newest folder's token (made now, shared with the older folders', for
    one rendered before render made tokens); None when the newest folder serves with `auth: none`."""
    newest = folders[-1]
    token = read_token(newest)
    if token is not None:
        return token
    from hpc.spec import load_spec

    if load_spec(Deployment(newest).spec, check_files=False).auth != TOKEN:
        return None
    return ensure_token(newest, folders)


def read_tokens(deploy_dirs: Iterable[Path]) -> set[str]:
    """Every token of the deployment's folders (one, unless a token file was replaced)."""
    return {t for t in (read_token(d) for d in deploy_dirs) if t}


@dataclass
class Tokens:
    """The deployment's tokens: each job's (its folder's: what its tritonserver checks), by the job's entry name
    (`33@twin`, a local job's id: job ids are per cluster, launcher/contracts/job_index.py), and the newest folder's (for a
    job whose folder has none, and for the gateway, which accepts any of the deployment's)."""

    by_job: dict[str, str] = field(default_factory=dict)
    newest: str | None = None

    @classmethod
    def of_folders(cls, deploy_dirs: Iterable[Path]) -> Tokens:
        """From the deployment's folders, oldest first."""
        tokens = cls()
        for folder in deploy_dirs:
            token = read_token(folder)
            if token is None:
                continue
            tokens.newest = token
            jobs_dir = Deployment(folder).jobs_dir
            for job_dir in jobs_dir.iterdir() if jobs_dir.is_dir() else ():
                tokens.by_job[entry_name_of(JobPaths(folder, job_dir.name))] = token
        return tokens

    def for_job(self, job: str) -> str | None:
        """The token of a job, named by its entry name (`33@twin`; a local job's id)."""
        return self.by_job.get(job, self.newest)


def http_headers(token: str | None) -> dict[str, str]:
    """What an HTTP request to a replica (or the gateway) carries: `authorization: Bearer <token>`."""
    return {HEADER: bearer(token)} if token else {}


def grpc_headers(token: str | None) -> dict[str, str]:
    """What a gRPC call to a replica carries (tritonclient's `headers=`, or metadata pairs)."""
    return {GRPC_HEADER: bearer(token)} if token else {}
