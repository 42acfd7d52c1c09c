"""Reading what Slurm's commands print: `scontrol -o show partition`, `sinfo -N`, `scontrol show config`,
`srun --mpi=list`, GRES strings, `sinfo --version`.

Why a module of its own: these are pure functions of text, so every format quirk (a `*` on the default
partition, `~` on a powered-down node, a typed GRES with its sockets `gpu:a100:4(S:0-1)`, values with spaces in
`scontrol -o`) is unit-tested on outputs copied from real clusters, without a cluster.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: the start of `Key=` in `scontrol -o` output: values may hold spaces (`OS=Linux 6.1.0 #1 SMP`) and `=`
#: (`TRES=cpu=16,mem=8000M`), so a value runs until the next ` Key=`.
_KEY = re.compile(r"(?:^|\s)([A-Za-z][\w/.:]*)=")

#: node states (sinfo's %T, lower case, without suffixes) in which a node takes no new job.
UNUSABLE_STATES = ("down", "drain", "draining", "drained", "fail", "failing", "future", "inval", "maint", "reboot")


def scontrol_records(text: str) -> list[dict[str, str]]:
    """One dict per line of `scontrol -o show partition|node|job` output."""
    records = []
    for line in text.splitlines():
        matches = list(_KEY.finditer(line))
        if not matches:
            continue
        record = {}
        for here, after in zip(matches, [*matches[1:], None], strict=True):
            end = after.start() if after is not None else len(line)
            record[here.group(1)] = line[here.end() : end].strip()
        records.append(record)
    return records


def config_values(text: str) -> dict[str, str]:
    """`scontrol show config`: `Key   = Value` lines."""
    values = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() and " " not in key.strip():
            values[key.strip()] = value.strip()
    return values


def gres_gpus(gres: str) -> int:
    """GPUs in a GRES string: `gpu:4`, `gpu:a100:8(S:0-1)`, `gpu:a100:4,gpu:v100:2`, `gpu` (one), `(null)`."""
    total = 0
    for item in re.split(r",(?![^()]*\))", gres or ""):
        item = re.sub(r"\(.*?\)", "", item).strip()
        parts = item.split(":")
        if parts[0] != "gpu":
            continue
        count = parts[-1] if len(parts) > 1 else "1"
        total += int(count) if count.isdigit() else 1
    return total


@dataclass(frozen=True)
class NodeInfo:
    """A node as one partition sees it (`sinfo -N` prints a node once per partition)."""

    name: str
    partition: str
    state: str
    cpus: int
    gpus: int
    memory_mb: int

    @property
    def usable(self) -> bool:
        """Takes jobs now or soon: idle, mixed, allocated, completing, powered down (`~`, booted on demand)."""
        return not any(self.state.startswith(bad) for bad in UNUSABLE_STATES)


#: the sinfo format `sinfo_nodes` reads: node, partition, state, CPUs, GRES, memory (MB).
SINFO_NODE_FORMAT = "%N|%P|%T|%c|%G|%m"


def sinfo_nodes(text: str) -> list[NodeInfo]:
    """`sinfo -h -N -o SINFO_NODE_FORMAT` → one NodeInfo per node and partition. The default partition's `*`
    and a state's suffixes (`idle~` powered down, `mixed*` not responding, `drain$` maintenance) are dropped
    from the names; a non-responding `*` makes the node unusable."""
    nodes = []
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 6:
            continue
        name, partition, state, cpus, gres, memory = parts
        state = state.lower()
        if state.endswith("*"):
            state = "down*"  # not responding: as good as down for a job
        nodes.append(
            NodeInfo(
                name=name,
                partition=partition.rstrip("*"),
                state=state.rstrip("~#!%$@^-+"),
                cpus=int(cpus) if cpus.isdigit() else 0,
                gpus=gres_gpus(gres),
                memory_mb=int(memory.rstrip("+")) if memory.rstrip("+").isdigit() else 0,
            )
        )
    return nodes


def mpi_types(text: str) -> tuple[list[str], list[str]]:
    """`srun --mpi=list` → (plugin types, specific versions). Slurm 22.05 prints `MPI plugin types are...` then one
    type per line and `specific pmix plugin versions available: pmix_v4`; older ones print `srun: mpi/pmix_v4`."""
    types: list[str] = []
    versions: list[str] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("MPI plugin types"):
            continue
        if line.startswith("specific"):
            versions += [v.strip() for v in line.partition(":")[2].split(",") if v.strip()]
        elif line.startswith("srun: mpi/"):
            name = line.removeprefix("srun: mpi/").strip()
            types.append(name)
            if re.fullmatch(r"pmix_v\d+", name):
                versions.append(name)
        elif re.fullmatch(r"[\w.-]+", line):
            types.append(line)
    if versions and "pmix" not in types:
        types.append("pmix")
    return types, versions


def slurm_version(text: str) -> str | None:
    """`sinfo --version` → `22.05.8` (`slurm 23.11.4`, `slurm-wlm 22.05.8`)."""
    match = re.search(r"(\d+\.\d+(?:\.\d+)?)", text)
    return match.group(1) if match else None


def mem_mb(value: str) -> int | None:
    """A Slurm memory size in MB (`64G`, `512000M`, `512000`, `1T`); None for 0 (all of a node's memory)."""
    match = re.fullmatch(r"(\d+)([KMGT]?)B?", value.strip().upper())
    if not match or int(match.group(1)) == 0:
        return None
    factor = {"K": 1 / 1024, "": 1, "M": 1, "G": 1024, "T": 1024 * 1024}[match.group(2)]
    return int(int(match.group(1)) * factor)
