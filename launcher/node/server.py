"""Find a tritonserver binary and what it needs to run (library path, backends directory).

Resolution order: launch.json ``tritonserver`` → ``$TRITONSERVER`` → ``/opt/tritonserver/bin/tritonserver`` (NGC
containers) → the binary bundled in the ``nvidia-pytriton`` wheel.  The wheel's binary is not usable as shipped:
its shared libraries live in ``site-packages/nvidia_pytriton.libs`` (needs ``LD_LIBRARY_PATH``), and its python
backend directory has no ``triton_python_backend_stub`` (one stub per Python version is shipped separately), so we
build a private backends directory with the stub for *this* interpreter in a cache dir.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import shutil
import sys
import sysconfig
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

NGC_TRITONSERVER = "/opt/tritonserver/bin/tritonserver"
STUB_NAME = "triton_python_backend_stub"


class ServerNotFound(FileNotFoundError):
    """No usable tritonserver binary; the message lists every place that was tried."""


@dataclass(frozen=True)
class ServerBinary:
    """A runnable tritonserver: ``argv0``, extra environment, and ``--backend-directory`` (None = its default)."""

    argv0: str
    env: dict[str, str] = field(default_factory=dict)
    backend_dir: str | None = None
    source: str = ""


def _executable(candidate: str) -> str | None:
    """An absolute path to ``candidate`` if it is an executable file (a bare name is looked up on PATH)."""
    if os.sep not in candidate:
        found = shutil.which(candidate)
        return os.path.abspath(found) if found else None
    path = os.path.abspath(os.path.expanduser(candidate))
    return path if os.path.isfile(path) and os.access(path, os.X_OK) else None


def cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """``$HPC_SERVE_CACHE_DIR`` → ``$XDG_CACHE_HOME/hpc-serve`` → ``~/.cache/hpc-serve``."""
    env = os.environ if env is None else env
    if env.get("HPC_SERVE_CACHE_DIR"):
        return Path(env["HPC_SERVE_CACHE_DIR"])
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "hpc-serve"


def _pytriton_root() -> Path | None:
    """The installed ``pytriton`` package directory, found without importing it (import pulls numpy etc.)."""
    try:
        spec = importlib.util.find_spec("pytriton")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def _python_libdir() -> str | None:
    """The directory of this interpreter's ``libpython3.X.so`` if it has one.

    The wheel's stub links ``libpython3.X.so.1.0`` by soname; without this directory first on LD_LIBRARY_PATH the
    loader picks the *system* libpython (Debian's /usr), whose sys.prefix has none of our packages (numpy import
    fails in ``triton_python_backend_utils``).
    """
    libdir = sysconfig.get_config_var("LIBDIR")
    ldlib = sysconfig.get_config_var("LDLIBRARY") or ""
    if libdir and ldlib.endswith(".so") and os.path.exists(os.path.join(libdir, ldlib)):
        return str(libdir)
    return None


def prepare_backends(wheel_backends: Path, stub: Path, dest_root: Path) -> Path:
    """Copy the wheel's backends plus ``stub`` into ``dest_root/<key>/`` once, atomically, and return it.

    Copy (not symlink) so the directory survives a reinstall of the wheel; a temporary sibling directory is renamed
    into place so concurrent ranks on a shared $HOME never see a half-built directory.
    """
    key_src = f"{wheel_backends.resolve()}|{stub.resolve()}|{stub.stat().st_size}|{int(stub.stat().st_mtime)}"
    key = hashlib.sha1(key_src.encode()).hexdigest()[:10]
    final = dest_root / key
    if (final / "python" / STUB_NAME).is_file():
        return final
    dest_root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=dest_root))
    try:
        shutil.copytree(wheel_backends, tmp / "b", ignore=shutil.ignore_patterns("__pycache__", STUB_NAME))
        shutil.copy2(stub, tmp / "b" / "python" / STUB_NAME)
        os.chmod(tmp / "b" / "python" / STUB_NAME, 0o755)
        try:
            os.rename(tmp / "b", final)
        except OSError:
            if not (final / "python" / STUB_NAME).is_file():  # lost a race to a broken dir: report it
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def pytriton_server(env: Mapping[str, str] | None = None) -> ServerBinary | None:
    """The nvidia-pytriton wheel's tritonserver with its libraries and a private backends dir, or None."""
    root = _pytriton_root()
    if root is None:
        return None
    binary = root / "tritonserver" / "bin" / "tritonserver"
    if not binary.is_file():
        return None
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    stub = root / "tritonserver" / "python_backend_stubs" / version / STUB_NAME
    if not stub.is_file():
        raise ServerNotFound(f"nvidia-pytriton at {root} has no python backend stub for Python {version} ({stub})")
    libs = root.parent / "nvidia_pytriton.libs"
    if not libs.is_dir():
        libs = root / "tritonserver" / "external_libs"  # editable installs
    try:
        wheel_version = importlib.metadata.version("nvidia-pytriton")
    except importlib.metadata.PackageNotFoundError:
        wheel_version = "unknown"
    dest = cache_dir(env) / "triton-backends" / f"{wheel_version}-py{version}"
    try:
        backends = prepare_backends(root / "tritonserver" / "backends", stub, dest)
    except OSError:  # read-only $HOME: per-user temp dir instead
        backends = prepare_backends(
            root / "tritonserver" / "backends",
            stub,
            Path(tempfile.gettempdir())
            / f"hpc-serve-{os.getuid()}"
            / "triton-backends"
            / f"{wheel_version}-py{version}",
        )
    lib_dirs = [d for d in (_python_libdir(), str(libs)) if d]
    extra = {
        "LD_LIBRARY_PATH": os.pathsep.join(lib_dirs),
        # The stub embeds Python and locates its prefix (and a venv's pyvenv.cfg) from the python on PATH.
        "PATH": os.path.dirname(sys.executable),
    }
    return ServerBinary(str(binary), extra, str(backends), f"nvidia-pytriton {wheel_version}")


def resolve(configured: str | None = None, env: Mapping[str, str] | None = None) -> ServerBinary:
    """Pick the tritonserver binary (see module docstring for the order); raise ServerNotFound listing attempts."""
    env = os.environ if env is None else env
    tried: list[str] = []
    for source, candidate in (
        ("launch.json tritonserver", configured),
        ("$TRITONSERVER", env.get("TRITONSERVER")),
        ("NGC default", NGC_TRITONSERVER),
    ):
        if not candidate:
            tried.append(f"{source}: not set")
            continue
        path = _executable(candidate)
        if path:
            return ServerBinary(path, {}, None, source)
        tried.append(f"{source}: {candidate} (not an executable file)")
        if source != "NGC default":
            # An explicit choice that is broken is an error, not a reason to silently run something else.
            raise ServerNotFound(f"tritonserver from {source} is not an executable file: {candidate}")
    server = pytriton_server(env)
    if server is not None:
        return server
    tried.append("nvidia-pytriton wheel: not installed for " + sys.executable)
    raise ServerNotFound(
        "no tritonserver found; tried:\n  "
        + "\n  ".join(tried)
        + '\nset "tritonserver" in launch.json or $TRITONSERVER, or `pip install nvidia-pytriton`'
    )


def merge_env(
    base: Mapping[str, str],
    extra: Mapping[str, str],
    prepend: tuple[str, ...] = ("LD_LIBRARY_PATH", "PATH", "PYTHONPATH"),
) -> dict[str, str]:
    """``base`` updated with ``extra``; path-list variables in ``prepend`` are prepended, not replaced."""
    out = dict(base)
    for key, value in extra.items():
        if key in prepend and out.get(key):
            parts = [p for p in value.split(os.pathsep) if p]
            rest = [p for p in out[key].split(os.pathsep) if p and p not in parts]
            out[key] = os.pathsep.join(parts + rest)
        else:
            out[key] = value
    return out
