"""Which replica is a prompt prefix's home: the one whose KV cache should hold it (hpc/serving/balancer.py uses it
for prefix affinity).

Why a table and not a hash alone: a replica's cache holds some number of prefixes, so what matters is how many
of the prefixes in use each replica is home to. Hashing (rendezvous, Thaler & Ravishankar) spreads them only as
evenly as chance does: 16 documents over 2 replicas split 10/6 as often as not, and with caches of 8 documents the
replica with 10 thrashes while the other has room (docs/decisions.md "Prefix affinity with bounded load"). So a new
prefix goes to the replica home to the fewest prefixes, ties broken by the prefix's rendezvous rank (so that two
gateways, or a gateway and `hpc.client`, that start alike agree), and stays
there. A replica that leaves (its job ended or drains) gives its prefixes to the others as they are next asked
for; one that joins takes new prefixes, and prefixes of any replica home to more than `slack` × the mean as they
are next asked for, so a deployment that grows rebalances by moving only what it must. The table keeps the
`size` prefixes used last (least recently used out): the working set, which is what the caches hold too.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter, OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hpc.serving.balancer import Replica

#: prefixes remembered (each a few hundred bytes): far more than the replicas' caches hold together
HOME_TABLE = 4096


def rank(key: str, replica_key: str) -> bytes:
    """Rendezvous score of a replica for `key` (stable across processes, unlike `hash`): higher first."""
    return hashlib.blake2b(f"{replica_key}\0{key}".encode(), digest_size=8).digest()


class PrefixHomes:
    """Prefix → home replica key, with how many prefixes each replica is home to."""

    def __init__(self, slack: float, size: int = HOME_TABLE) -> None:
        self.slack = slack
        self.size = size
        self._homes: OrderedDict[str, str] = OrderedDict()
        self.count: Counter[str] = Counter()

    def __len__(self) -> int:
        return len(self._homes)

    def home(self, key: str, replicas: Sequence[Replica]) -> Replica:
        """The home of `key` among `replicas` (those taking new requests; not empty): its own while it is one of
        them and not home to more than `slack` × their mean, else (or for a new prefix) the least-homed one."""
        live = {r.key: r for r in replicas}
        current = self._homes.get(key)
        if current in live:
            cap = math.ceil(self.slack * sum(self.count[k] for k in live) / len(live))
            if self.count[current] <= cap or len(live) == 1:
                self._homes.move_to_end(key)
                return live[current]
        chosen = max(replicas, key=lambda r: (-self.count[r.key], rank(key, r.key)))
        self._assign(key, chosen.key)
        return chosen

    def _assign(self, key: str, replica_key: str) -> None:
        old = self._homes.pop(key, None)
        if old is not None:
            self.count[old] -= 1
        self._homes[key] = replica_key
        self.count[replica_key] += 1
        while len(self._homes) > self.size:
            _, evicted = self._homes.popitem(last=False)
            self.count[evicted] -= 1
