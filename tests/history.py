"""Records what clients did to a store under faults, and checks the history per key.

Every operation is kept with its start and end (one monotonic clock: all clients run in the
test's process) and its outcome: acknowledged (`ok`), refused for certain (`refused`: a 412 of
a conditional write), or unknown (an error, a timeout: the write may or may not have landed,
now or later; a gateway may still be retrying it after its client gave up).

Every value written is unique, so a read names the write it saw. That makes linearizability of
each key, taken as a register, checkable in O(n log n) by the zone method of Gibbons and Korach
("Testing shared memories", SIAM J. Comput. 1997), as Jepsen's Knossos and Porcupine check
registers in general: for each value, its write and the reads that returned it span a *zone*,
from the earliest end among them to the latest start. Where the earliest end comes before the
latest start the zone runs forward: the value must have been the register's value all through
it. The history is linearizable exactly when no two forward zones overlap and no backward zone
lies inside another value's forward zone. A write whose outcome is unknown may take effect at
any time after it began (its end counts as infinity); one that no read saw is left out. The
values read once every fault had healed count as a last read after everything, so a lost
acknowledged write shows as a violation too.

On top of that:
- no read returns a value never written, or one whose write began after the read ended;
- two conditional writes (`If-Match: <etag>`, `If-None-Match: *`) never both succeed against
  the same version.
"""

import bisect
import threading
import time


class History:
    def __init__(self):
        self.ops = []
        self.lock = threading.Lock()

    def record(self, **op):
        with self.lock:
            self.ops.append(op)

    def run(self, kind, key, fn, **fields):
        """Times `fn()` (which returns a dict of fields to keep, `outcome` among them) and
        records it; an exception counts as an unknown outcome."""
        start = time.monotonic()
        try:
            got = fn()
        except Exception as e:  # the outcome of this operation is unknown; the checker knows
            got = {"outcome": "unknown", "error": f"{type(e).__name__}: {e}"[:200]}
        self.record(kind=kind, key=key, start=start, end=time.monotonic(), **fields, **got)
        return got

    def counts(self):
        out = {}
        for op in self.ops:
            k = (op["kind"], op["outcome"])
            out[k] = out.get(k, 0) + 1
        return {f"{a}:{b}": n for (a, b), n in sorted(out.items())}


INFINITY = float("inf")


def check(ops, final, grace_s=0.0):
    """The violations of `ops` (as History recorded them) with `final` (key -> value read once
    every fault had healed, None for a missing key): a list of strings, empty when all holds.
    `grace_s` widens every operation by that much at both ends (a documented bound)."""
    bad = []
    by_key = {}
    for op in ops:
        by_key.setdefault(op["key"], []).append(op)
    after_all = max((o["end"] for o in ops), default=0.0) + 1.0
    for key, kops in sorted(by_key.items()):
        last = {"kind": "get", "key": key, "got": final.get(key), "outcome": "ok",
                "start": after_all, "end": after_all, "final": True}
        bad += check_register(key, kops + [last], grace_s)
        bad += check_conditional(key, kops)
    return bad


def check_durable(ops, final):
    """The violations no fault may cause, whatever else the history shows: an acknowledged
    write lost (the key ends on a value an acknowledged write had replaced, or is gone), a
    read of a value never written, and two conditional writes succeeding against one
    version. A subset of what `check` finds, without its ordering of reads."""
    bad = []
    by_key = {}
    for op in ops:
        by_key.setdefault(op["key"], []).append(op)
    for key, kops in sorted(by_key.items()):
        writes = {o["value"]: o for o in kops if o["kind"] in ("put", "cas")
                  and o["outcome"] != "refused"}
        acked = [o for o in kops if o["kind"] in ("put", "cas") and o["outcome"] == "ok"]
        for o in kops:
            if o["kind"] == "get" and o["outcome"] == "ok" and o["got"] is not None \
                    and o["got"] not in writes:
                bad.append(f"{key}: read {o['got']!r}, never written")
        end = final.get(key)
        if acked and end is None:
            bad.append(f"{key}: acknowledged writes, and the key is gone")
        elif end is not None and end in writes:
            w = writes[end]
            # Acknowledged writes that began after this value's write was acknowledged
            # replaced it for good (values are unique: it cannot come back).
            later = [a for a in acked if w["outcome"] == "ok" and a["start"] > w["end"]]
            replaced = [a for a in acked if a.get("base") is not None and a.get("base") == w.get("etag")]
            if later or replaced:
                a = (later or replaced)[0]
                bad.append(f"{key}: ends on {end!r}, which the acknowledged write {a['value']!r} "
                           f"replaced: that write was lost")
        bad += check_conditional(key, kops)
    return bad


def check_register(key, ops, grace_s):
    bad = []
    writes = {}
    for o in ops:
        if o["kind"] in ("put", "cas") and o["outcome"] != "refused":
            writes[o["value"]] = o
    reads = {}
    for o in ops:
        if o["kind"] == "get" and o["outcome"] == "ok":
            reads.setdefault(o["got"], []).append(o)
    zones = []  # (low, high, forward, value)
    for value, rs in reads.items():
        w = writes.get(value)
        if w is None:
            if value is not None:
                bad.append(f"{key}: read {value!r}, never written")
            continue
        w_end = w["end"] + grace_s if w["outcome"] == "ok" else INFINITY
        for r in rs:
            if r["end"] + grace_s < w["start"] - grace_s:
                bad.append(f"{key}: read {value!r} ending at {r['end']:.3f}, before its write "
                           f"began at {w['start']:.3f}")
        low = min([w_end] + [r["end"] + grace_s for r in rs])
        high = max([w["start"] - grace_s] + [r["start"] - grace_s for r in rs])
        zones.append((min(low, high), max(low, high), low < high, value))
    # Acknowledged writes no read saw: their zone is the write itself, backward (it may be
    # overwritten at once), and still must not sit inside another value's forward zone.
    for value, w in writes.items():
        if value not in reads and w["outcome"] == "ok":
            zones.append((w["start"] - grace_s, w["end"] + grace_s, False, value))
    forward = sorted(z for z in zones if z[2])
    for a, b in zip(forward, forward[1:]):
        if b[0] < a[1]:
            bad.append(f"{key}: {a[3]!r} and {b[3]!r} were each the value throughout "
                       f"overlapping times ({a[0]:.3f}-{a[1]:.3f}, {b[0]:.3f}-{b[1]:.3f}): "
                       f"a read went back, or a write was lost")
    lows = [z[0] for z in forward]
    for low, high, fwd, value in zones:
        if fwd:
            continue
        i = bisect.bisect_left(lows, low) - 1
        if i >= 0 and forward[i][1] > high and forward[i][3] != value:
            f = forward[i]
            what = "an acknowledged write was lost" if value in writes and \
                writes[value]["outcome"] == "ok" and value not in reads else "a stale read"
            bad.append(f"{key}: {value!r} ({low:.3f}-{high:.3f}) falls inside the time "
                       f"{f[3]!r} was the value ({f[0]:.3f}-{f[1]:.3f}): {what}")
    return bad


def check_conditional(key, ops):
    """Two conditional writes never both succeed against the same version."""
    bad = []
    by_base = {}
    for w in ops:
        if w["kind"] in ("put", "cas") and w["outcome"] == "ok" and "base" in w:
            by_base.setdefault(w["base"], []).append(w)
    for base, ws in by_base.items():
        if len(ws) > 1:
            bad.append(f"{key}: {len(ws)} conditional writes succeeded against {base!r}: "
                       f"{[w['value'] for w in ws]}")
    return bad


def _self_test():
    """The checker finds what it must and passes what is allowed (run by
    tests/test_partition.py)."""

    def op(kind, key, at, outcome="ok", **o):
        return dict(kind=kind, key=key, start=at, end=at + 0.5, outcome=outcome, **o)

    def w(key, value, at, outcome="ok", **o):
        return op("put", key, at, outcome, value=value, **o)

    def r(key, got, at):
        return op("get", key, at, got=got)

    def finds(ops, final, want):
        found = check(ops, final)
        assert any(want in f for f in found), (want, found)

    base = [w("k", "w:1", 1), w("k", "w:2", 2)]
    finds(base + [r("k", "w:1", 3)], {"k": "w:2"}, "'w:1'")  # stale
    finds(base, {"k": "w:1"}, "'w:2'")  # acknowledged, then lost
    finds(base + [r("k", "w:9", 3)], {"k": "w:2"}, "never written")
    finds(base + [r("k", "w:2", 3), r("k", "w:1", 4)], {"k": "w:2"}, "")
    assert check(base + [r("k", "w:2", 3)], {"k": "w:2"}) == []
    # A write of unknown outcome may land late, after writes acknowledged meanwhile...
    late = [w("k", "w:3", 5, "unknown"), w("k", "w:4", 6)]
    assert check(base + late + [r("k", "w:3", 8)], {"k": "w:3"}) == []
    # ...but once it was read, a read of the value it replaced goes back.
    finds(base + late + [r("k", "w:3", 8), r("k", "w:4", 9)], {"k": "w:4"}, "'w:3'")
    # Two conditional writes succeeding against one version.
    assert check_durable(base + [r("k", "w:1", 3)], {"k": "w:2"}) == [], "a stale read is no loss"
    assert any("was lost" in f for f in check_durable(base, {"k": "w:1"}))
    assert any("never written" in f for f in check_durable(base + [r("k", "w:9", 3)], {"k": "w:2"}))
    assert check_durable(base + late, {"k": "w:3"}) == [], "a write landing late is no loss"
    cas = [w("c", "a", 1, base=None, etag="ea"), op("cas", "c", 2, value="b", base="ea", etag="eb"),
           op("cas", "c", 3, value="x", base="ea", etag="ex")]
    assert any("2 conditional writes" in f for f in check_durable(cas, {"c": "x"}))
    assert any("was lost" in f for f in check_durable(cas[:2], {"c": "a"}))
    finds(cas, {"c": "x"}, "2 conditional writes succeeded")
    assert check(cas[:2], {"c": "b"}) == []
