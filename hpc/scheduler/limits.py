"""An account's own limits, as Slurm's association records say them (`sacctmgr show assoc`), and what its jobs
already use of them (`squeue`): the autoscaling controller asks `AccountWatch.refusal` before every submit, so
that it never asks for more than the account allows, even where Slurm would take the job and leave it pending
(docs/decisions.md "The account's own limits").

The limits read, on the user's association in the account the job runs under and on that account and each parent
up the tree: GrpTRES (gres/gpu, cpu, node), GrpJobs, GrpSubmitJobs, MaxJobs, MaxSubmitJobs, MaxTRESPerUser. A
Grp limit counts the jobs of every user in the account and its sub-accounts; a Max one the user's own in the
account, its value the user's association's own or else inherited from the nearest account that sets one. Every job
Slurm lists counts, PENDING ones too: a submit past a limit could only wait for a slot, so it is not made.
"""

from __future__ import annotations

import getpass
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from hpc.scheduler import slurm
from hpc.scheduler.slurm import SlurmError

log = logging.getLogger("hpc_serve.gateway")

#: how long an answer of sacctmgr stands: association limits change rarely (an admin's hand)
LIMITS_TTL_S = 300.0
#: the association fields read, in sacctmgr's `format=` order
ASSOC_FIELDS = (
    "Cluster",
    "Account",
    "User",
    "ParentName",
    "GrpTRES",
    "GrpJobs",
    "GrpSubmitJobs",
    "MaxJobs",
    "MaxSubmitJobs",
    "MaxTRESPerUser",
)
#: squeue's columns for the jobs counted against the limits; `tres-alloc` is a PENDING job's request too
QUEUE_FIELDS = ("JobID", "State", "Account", "UserName", "tres-alloc")
#: the TRES a serving job asks for, as Slurm names them
GPU, CPU, NODE = "gres/gpu", "cpu", "node"
COUNTED_TRES = (GPU, CPU, NODE)


def parse_tres(text: str) -> dict[str, int]:
    """`cpu=8,gres/gpu=4,mem=4000M` → {"cpu": 8, "gres/gpu": 4}: the whole-number ones (memory and its units are not
    counted here); "" and Slurm's `N/A` are none."""
    found: dict[str, int] = {}
    for part in text.split(","):
        name, _, value = part.strip().partition("=")
        if name and value.isdigit():
            found[name] = int(value)
    return found


def _count(text: str) -> int | None:
    return int(text) if text.strip().isdigit() else None


@dataclass(frozen=True)
class Association:
    """One row of `sacctmgr -nP show assoc`: an account's own (`user` "") or a user's in an account; `parent`:
    the parent account (an account's row only)."""

    cluster: str
    account: str
    user: str = ""
    parent: str = ""
    grp_tres: Mapping[str, int] = field(default_factory=dict)
    grp_jobs: int | None = None
    grp_submit_jobs: int | None = None
    max_jobs: int | None = None
    max_submit_jobs: int | None = None
    max_tres_per_user: Mapping[str, int] = field(default_factory=dict)


def parse_associations(text: str) -> list[Association]:
    """The rows of `sacctmgr -nP show assoc format=<ASSOC_FIELDS>`; a row of another shape is skipped."""
    rows = []
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) != len(ASSOC_FIELDS):
            continue
        cluster, account, user, parent, grp_tres, grp_jobs, grp_submit, max_jobs, max_submit, per_user = parts
        rows.append(
            Association(
                cluster,
                account,
                user,
                parent,
                parse_tres(grp_tres),
                _count(grp_jobs),
                _count(grp_submit),
                _count(max_jobs),
                _count(max_submit),
                parse_tres(per_user),
            )
        )
    return rows


@dataclass(frozen=True)
class QueuedJob:
    """A job Slurm lists (any state it still lists): its account, user and TRES (what it holds or asks for)."""

    job_id: str
    state: str
    account: str
    user: str
    tres: Mapping[str, int]


def parse_queue(text: str) -> list[QueuedJob]:
    """The rows of `squeue -h -O <QUEUE_FIELDS, |-separated>`."""
    jobs = []
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) >= len(QUEUE_FIELDS) and parts[0]:
            jobs.append(QueuedJob(parts[0], parts[1], parts[2], parts[3], parse_tres(parts[4])))
    return jobs


@dataclass(frozen=True)
class Limit:
    """One limit of one association: whose (`who`: "account 'x'", "user 'u' in account 'x'"), Slurm's name for it
    (`GrpTRES gres/gpu`, `GrpJobs`), its value, and which jobs count against it (those of `accounts`, and of
    `user` only where it is per user). `tres`: the TRES counted; "" counts jobs."""

    who: str
    name: str
    value: int
    accounts: frozenset[str]
    user: str = ""
    tres: str = ""

    def used(self, jobs: Iterable[QueuedJob]) -> int:
        mine = [j for j in jobs if j.account in self.accounts and (not self.user or j.user == self.user)]
        return sum(j.tres.get(self.tres, 0) for j in mine) if self.tres else len(mine)

    def refusal(self, jobs: Iterable[QueuedJob], need: Mapping[str, int]) -> str:
        """Why one more job that asks `need` would pass this limit ("" if it would not)."""
        used = self.used(jobs)
        more = need.get(self.tres, 0) if self.tres else 1
        if not more or used + more <= self.value:
            return ""
        unit = f", a job needs {more}" if self.tres else ""
        label = f"{self.name}={self.value}" if not self.tres else f"{self.name} {self.tres}={self.value}"
        return f"{self.who} {label}: {used} in use{unit}"


@dataclass(frozen=True)
class AccountLimits:
    """The limits one more job of `user` under `account` meets: its association's, its account's and each parent
    account's, up the tree."""

    account: str
    user: str
    limits: tuple[Limit, ...] = ()

    @classmethod
    def of_associations(cls, rows: Iterable[Association], account: str, user: str) -> AccountLimits:
        rows = list(rows)
        accounts = {r.account: r for r in rows if not r.user}
        children: dict[str, set[str]] = {}
        for row in accounts.values():
            if row.parent:
                children.setdefault(row.parent, set()).add(row.account)

        def tree(name: str) -> frozenset[str]:
            found, todo = {name}, [name]
            while todo:
                for child in children.get(todo.pop(), ()):
                    if child not in found:
                        found.add(child)
                        todo.append(child)
            return frozenset(found)

        account = account.lower()  # Slurm keeps account names in lower case (sacctmgr's man page)
        limits: list[Limit] = []
        own = next((r for r in rows if r.user == user and r.account == account), None)
        # Grp limits: each level's, on the jobs of its whole subtree (the user's own row: the user's jobs there)
        chain: list[tuple[Association, str]] = []
        if own is not None:
            chain.append((own, f"user '{user}' in account '{account}'"))
            limits += _grp_limits(own, chain[-1][1], frozenset({account}), user)
        name, seen = account, set()
        while name in accounts and name not in seen:  # the account, then its parents (a loop would be a bad tree)
            seen.add(name)
            chain.append((accounts[name], f"account '{name}'"))
            limits += _grp_limits(accounts[name], chain[-1][1], tree(name), "")
            name = accounts[name].parent
        # Max limits are the user's association's: its own value, else inherited from the nearest account that sets
        # one (a value on an account is a default for the associations under it, not a limit of its own)
        limits += _max_limits(chain, frozenset({account}), user)
        return cls(account, user, tuple(limits))

    def refusal(self, jobs: Iterable[QueuedJob], need: Mapping[str, int]) -> str:
        """Why one more job asking `need` would pass a limit: the first that it would ("" where none)."""
        jobs = list(jobs)
        return next((why for limit in self.limits if (why := limit.refusal(jobs, need))), "")


def _grp_limits(row: Association, who: str, accounts: frozenset[str], grp_user: str) -> list[Limit]:
    """The Grp limits one association row sets; `grp_user`: whose jobs they count ("" every user's)."""
    found = [Limit(who, "GrpTRES", row.grp_tres[t], accounts, grp_user, t) for t in COUNTED_TRES if t in row.grp_tres]
    found += [
        Limit(who, name, value, accounts, grp_user)
        for name, value in (("GrpJobs", row.grp_jobs), ("GrpSubmitJobs", row.grp_submit_jobs))
        if value is not None
    ]
    return found


def _max_limits(chain: list[tuple[Association, str]], accounts: frozenset[str], user: str) -> list[Limit]:
    """The Max limits of `user`'s association in `accounts`' one account: each from the first row of `chain` (the
    user's own, then its account's, then each parent's) that sets it, named after that row."""
    found: list[Limit] = []
    for name in ("MaxJobs", "MaxSubmitJobs"):
        attr = "max_jobs" if name == "MaxJobs" else "max_submit_jobs"
        row = next(((r, who) for r, who in chain if getattr(r, attr) is not None), None)
        if row is not None:
            found.append(Limit(row[1], name, getattr(row[0], attr), accounts, user))
    for tres in COUNTED_TRES:
        row = next(((r, who) for r, who in chain if tres in r.max_tres_per_user), None)
        if row is not None:
            found.append(Limit(row[1], "MaxTRESPerUser", row[0].max_tres_per_user[tres], accounts, user, tres))
    return found


@dataclass
class AccountWatch:
    """The limits of the account a deployment's jobs run under (`account`: `slurm.account`; None: the user's default
    account), read with sacctmgr at most every LIMITS_TTL_S, and the account's jobs read with squeue at each
    question. A sacctmgr that fails is "no limit known", said once in the log (and again once it answered)."""

    account: str | None = None
    user: str = field(default_factory=getpass.getuser)
    clock: Callable[[], float] = time.monotonic
    _limits: AccountLimits | None = field(default=None, init=False)
    _until: float = field(default=-1.0, init=False)
    _failing: bool = field(default=False, init=False)

    def limits(self) -> AccountLimits | None:
        """The limits now (cached); None when sacctmgr could not say."""
        if self.clock() < self._until:
            return self._limits
        try:
            self._limits = self._read()
            self._failing = False
        except SlurmError as exc:
            if not self._failing:
                log.warning("autoscale: the account's limits are unknown (sacctmgr: %s); only gpu_budget holds", exc)
            self._limits, self._failing = None, True
        self._until = self.clock() + LIMITS_TTL_S
        return self._limits

    def _read(self) -> AccountLimits:
        run = slurm.default.run
        account = (self.account or "").lower()
        if not account:
            out = run(["sacctmgr", "-nP", "show", "user", self.user, "format=DefaultAccount"]).stdout
            account = out.strip().splitlines()[0].strip() if out.strip() else ""
        argv = ["sacctmgr", "-nP", "show", "assoc", f"format={','.join(ASSOC_FIELDS)}"]
        cluster = slurm.default.cluster_name()
        if cluster:
            argv.insert(4, f"cluster={cluster}")
            argv.insert(4, "where")
        return AccountLimits.of_associations(parse_associations(run(argv).stdout), account, self.user)

    def refusal(self, need: Mapping[str, int]) -> str:
        """Why the account's limits refuse one more job asking `need` (TRES: GPU, CPU, NODE); "" where they allow
        it, or no limit is known. The account's jobs are read now (one squeue), only where it has a limit."""
        limits = self.limits()
        if limits is None or not limits.limits:
            return ""
        accounts = sorted(set().union(*(limit.accounts for limit in limits.limits)))
        fields = ",".join(f"{name}:|" for name in QUEUE_FIELDS)
        try:
            out = slurm.default.run(["squeue", "-h", "-a", "-A", ",".join(accounts), "-O", fields]).stdout
        except SlurmError as exc:
            return f"the account's jobs could not be read (squeue: {exc})"
        return limits.refusal(parse_queue(out), need)
