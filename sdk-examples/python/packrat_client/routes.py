"""Reads straight from the storage nodes that hold them, in a packrat cluster.

A cluster gateway tells a caller who may list a bucket where its objects live
(`GET /BUCKET?routes`): the map's epoch, the placement group count, the bucket's id, each
node's S3 read endpoint, and for each placement group the nodes that serve its reads. The
client computes each key's group as the cluster does (`pg_of`), and sends each node the part of
a batch GET it holds, signed as for the gateway, with the map's epoch in `x-packrat-map-epoch`.
Whatever a node does not answer (it died, its map moved on: 421, a transient error) is asked of
the gateway, which knows the way: every item is yielded once.

One `packrat serve` answers 501 to `?routes` (every read has one place), and the client then
sends everything to it, as before.
"""

import json
from dataclasses import dataclass
from typing import Dict, List, Optional

_M64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15

#: The header a routed request carries its map's epoch in, and a node's 421 answer its own.
MAP_EPOCH_HEADER = "x-packrat-map-epoch"

#: How long a bucket's routes are used before they are asked for again (a node's 421 asks
#: sooner).
ROUTES_TTL_SECS = 30.0


def pg_of(bucket_id: int, key: str, pgs: int) -> int:
    """The placement group of `key` in the bucket `bucket_id` among `pgs` groups: FNV-1a of the
    key's UTF-8 bytes, mixed with the bucket id, through SplitMix64's finaliser, scaled onto
    the groups (packrat's `store-api/src/routes.rs`; the two are checked against the same
    values)."""
    h = 0xCBF29CE484222325
    for b in key.encode("utf-8", "surrogateescape"):
        h = ((h ^ b) * 0x100000001B3) & _M64
    z = ((h ^ ((bucket_id * _GOLDEN) & _M64)) + _GOLDEN) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    z ^= z >> 31
    return (z * max(pgs, 1)) >> 64


@dataclass
class Routes:
    """A bucket's routes as of one map epoch."""

    epoch: int
    pgs: int
    bucket_id: int
    nodes: Dict[str, str]
    readers: List[List[str]]
    fetched: float

    @staticmethod
    def parse(body: bytes, now: float) -> "Routes":
        doc = json.loads(body)
        return Routes(
            epoch=int(doc["epoch"]),
            pgs=int(doc["pgs"]),
            bucket_id=int(doc["bucket_id"]),
            nodes=dict(doc["nodes"]),
            readers=[list(r) for r in doc["readers"]],
            fetched=now,
        )

    def node_for(self, key: str) -> Optional[str]:
        """The S3 read endpoint of a node serving `key`'s reads, or `None` (none has one). The
        groups' readers take turns by group, so a batch spreads over every reader."""
        pg = pg_of(self.bucket_id, key, self.pgs)
        readers = [n for n in (self.readers[pg] if pg < len(self.readers) else []) if n in self.nodes]
        if not readers:
            return None
        return self.nodes[readers[pg % len(readers)]]
