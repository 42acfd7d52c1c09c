"""Access control on a leader's tritonserver (launch.json ``auth: "token"``): its inference, model-repository,
model-config, shared-memory, statistics, trace and logging APIs, HTTP and gRPC, answer only requests that carry
the deployment's token (``authorization: Bearer <token>``); health and metadata stay open.

Why a preloaded shim (``auth_shim.c``) and not tritonserver's flags on its command line: the flags
(``--http-restricted-api``, ``--grpc-restricted-protocol``) take the token as their value, and every user of a
node reads every process's arguments (``ps``, /proc/<pid>/cmdline). The shim reads the token from the 0600 file
``Deployment(D).token`` and adds the two flags to the arguments tritonserver's main() sees, not to those the
kernel shows; the launcher passes it nothing but the file's path and the flags without their value.

Why compiled here, on the node that runs it: the login node and compute nodes (or a container) may differ in
CPU architecture and C library, and a shared $HOME serves them all; the build goes to a private (0700) cache
folder keyed by the source's hash, the machine and the C library. Why the check after READY: the dynamic
loader silently skips a preload it cannot load (a static or non-glibc tritonserver, a library built for
another C library), and then tritonserver would serve everyone; so before the endpoint record is published a
request without the token must be refused, one with it served, or the rank fails with the reason.

Standard library only (it runs on every rank). What the clients send (``HEADER``, ``GRPC_HEADER``) is decided
here, next to the flags that make tritonserver expect it.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import stat
import subprocess
import tempfile
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from launcher.contracts.urls import http_url, open_direct

#: launch.json / spec ``auth`` values
TOKEN = "token"
NONE = "none"
MODES = (TOKEN, NONE)

#: tritonserver's restricted-API groups the token guards (health and metadata stay open: probes need them)
RESTRICTED_APIS = ("inference", "model-repository", "model-config", "shared-memory", "statistics", "trace", "logging")
#: the HTTP header tritonserver checks (its name case-insensitively, its value exactly): a standard bearer token
HEADER = "authorization"
SCHEME = "Bearer"
#: tritonserver looks for gRPC restricted-protocol keys under this prefix; gRPC metadata keys are lower case
GRPC_HEADER = f"triton-grpc-protocol-{HEADER}"

SHIM_SOURCE = Path(__file__).with_name("auth_shim.c")
SHIM_NAME = "hpc_serve_auth.so"
#: what the shim reads (it unsets both before tritonserver's main() runs)
FILE_VAR = "HPC_SERVE_AUTH_FILE"
FLAGS_VAR = "HPC_SERVE_AUTH_FLAGS"
#: a restricted request that needs no model: refused (403) without the token, answered (200) with it
CHECK_PATH = "/v2/repository/index"
TOKEN_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.~")
MIN_TOKEN = 16
COMPILE_TIMEOUT_S = 120


class AuthSetupError(RuntimeError):
    """auth: token cannot be set up, or tritonserver does not enforce it; the message says what to do."""


def bearer(token: str) -> str:
    """The header value tritonserver expects (and every client sends)."""
    return f"{SCHEME} {token}"


def flag_prefixes() -> list[str]:
    """tritonserver's two restricted-API flags without their value (the token, which the shim appends)."""
    key = f"{','.join(RESTRICTED_APIS)}:{HEADER}={SCHEME} "
    return [f"--http-restricted-api={key}", f"--grpc-restricted-protocol={key}"]


def read_token(path: Path) -> str:
    """The token in `path`, which only its owner may read (as ssh insists for its keys)."""
    try:
        info = path.stat()
        text = path.read_text()
    except FileNotFoundError:
        raise AuthSetupError(
            f"auth is token but {path} does not exist; `hpc-serve token` makes it (render and submit do), "
            "or set `auth: none` in the spec"
        ) from None
    except OSError as exc:
        raise AuthSetupError(f"cannot read the access token {path}: {exc.strerror or exc}") from None
    if info.st_mode & 0o077:
        raise AuthSetupError(f"{path} may be read by other users (mode {stat.filemode(info.st_mode)}); chmod 600 it")
    token = text.strip()
    if len(token) < MIN_TOKEN or not set(token) <= TOKEN_CHARS:
        raise AuthSetupError(
            f"{path} does not hold a token of {MIN_TOKEN} or more characters from A-Z a-z 0-9 - _ . ~ "
            "(delete it and run `hpc-serve token` for a new one)"
        )
    return token


def private_dir(path: Path) -> Path:
    """`path`, made 0700 if missing; refused unless it is this user's and nobody else may write to it (a
    library others could replace would run as this user inside tritonserver)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = path.stat()
    if info.st_uid != os.getuid() or info.st_mode & 0o022:
        raise AuthSetupError(f"{path} is not a private folder of this user (mode {stat.filemode(info.st_mode)})")
    return path


def shim_path(cache_root: Path) -> Path:
    """Where the shim built from this source for this machine and C library is kept under `cache_root`."""
    libc, version = platform.libc_ver()
    key = f"{hashlib.sha256(SHIM_SOURCE.read_bytes()).hexdigest()[:16]}-{platform.machine()}-{libc or 'libc'}{version}"
    return private_dir(cache_root) / key / SHIM_NAME


def build_shim(cache_root: Path, env: Mapping[str, str] | None = None) -> Path:
    """The shim built for this node, from the cache or compiled now with `$CC` or `cc`."""
    env = os.environ if env is None else env
    built = shim_path(cache_root)
    folder = built.parent
    if built.is_file():
        return built
    name = env.get("CC") or "cc"
    compiler = shutil.which(name, path=env.get("PATH"))
    if compiler is None:
        raise AuthSetupError(
            f"auth: token needs a C compiler on the node to build its access-token shim, and there is no `{name}` "
            "on PATH ($CC names another); install gcc on the nodes (in the container image, if the ranks run in "
            "one), or set `auth: none` in the spec to serve without a token"
        )
    private_dir(folder)
    fd, tmp = tempfile.mkstemp(prefix=f".{SHIM_NAME}.", dir=folder)
    os.close(fd)
    try:
        try:
            done = subprocess.run(
                [compiler, "-shared", "-fPIC", "-O2", "-o", tmp, str(SHIM_SOURCE), "-ldl"],
                capture_output=True,
                text=True,
                timeout=COMPILE_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:
            raise AuthSetupError(f"{compiler} took over {COMPILE_TIMEOUT_S} s to build {SHIM_SOURCE}") from None
        if done.returncode != 0:
            tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-8:])
            raise AuthSetupError(
                f"{compiler} could not build the access-token shim from {SHIM_SOURCE}:\n{tail}\n"
                "install a working C compiler (gcc) on the nodes, or set `auth: none` in the spec"
            )
        os.replace(tmp, built)  # atomic: leaders building at once on one node each get a whole file
    finally:
        Path(tmp).unlink(missing_ok=True)
    return built


def cache_root(cache: Path) -> Path:
    """Where built shims are kept: `<hpc-serve cache>/auth-shim`, or a private temporary folder when the cache
    cannot be written (a read-only $HOME)."""
    try:
        return private_dir(cache / "auth-shim")
    except OSError:
        return private_dir(Path(tempfile.gettempdir()) / f"hpc-serve-{os.getuid()}" / "auth-shim")


def _status(url: str, token: str | None) -> int:
    request = urllib.request.Request(url, data=b"", method="POST")
    if token is not None:
        request.add_header(HEADER, bearer(token))
    try:
        with open_direct(request, timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


@dataclass(frozen=True)
class Guard:
    """What a leader needs for `auth: token`: the token's file and the shim that hands it to tritonserver."""

    token_file: Path
    shim: Path

    @classmethod
    def prepare(cls, token_file: Path, cache: Path) -> Guard:
        """Check the token file and build (or find) the shim; AuthSetupError says what is missing."""
        read_token(token_file)
        return cls(token_file, build_shim(cache_root(cache)))

    def env(self, base: Mapping[str, str]) -> dict[str, str]:
        """tritonserver's environment: the shim first in LD_PRELOAD, the file's path and the flags' prefixes."""
        env = dict(base)
        env["LD_PRELOAD"] = ":".join(p for p in (str(self.shim), base.get("LD_PRELOAD", "")) if p)
        env[FILE_VAR] = str(self.token_file)
        env[FLAGS_VAR] = "\n".join(flag_prefixes())
        return env

    def verify(self, http_port: int, host: str = "127.0.0.1") -> None:
        """AuthSetupError unless tritonserver refuses a restricted request without the token and serves it with."""
        url = http_url(host, http_port, CHECK_PATH)
        try:
            without, with_token = _status(url, None), _status(url, read_token(self.token_file))
        except OSError as exc:
            raise AuthSetupError(f"could not check that tritonserver requires the token: {exc}") from None
        if without != 403:
            raise AuthSetupError(
                f"tritonserver answered HTTP {without} to POST {CHECK_PATH} without the token: the token shim "
                f"{self.shim} did not take effect (tritonserver statically linked or not on glibc, or the loader "
                "refused the preload: see this rank's log); stopped rather than serve everyone. "
                "Set `auth: none` in the spec to serve without a token"
            )
        if with_token != 200:
            raise AuthSetupError(
                f"tritonserver answered HTTP {with_token} to POST {CHECK_PATH} with the token from "
                f"{self.token_file} (changed while it started?)"
            )
