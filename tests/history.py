"""Records what clients did to a store under faults, and checks the history per key.

Every operation is kept with its start and end (one monotonic clock: all clients run in the
test's process) and its outcome: acknowledged (`ok`), refused for certain (`refused`: a 412 of
a conditional write), or unknown (an error, a timeout: the write may or may not have landed).

Two kinds of keys keep the check exact without a general linearizability search:

- a **register** has one writer, which writes values in order (`w:<seq>`), so versions are
  totally ordered by their sequence number;
- a **CAS key** is written only by conditional writes (`If-Match: <etag>` of the value a
  writer read, or `If-None-Match: *` to create it), by several writers at once. Each value is
  unique, so its ETag names it.

What must hold (each violation is reported with the operations involved):

1. **No acknowledged write lost**: after the run, a register holds its last acknowledged
   value or a later one; a CAS key's value was not replaced by an acknowledged conditional
   write (whose base it would be), unless something later replaced that one.
2. **No read of a value never written.**
3. **No stale read**: a read that began after a write was acknowledged returns that write or a
   later one (registers); a CAS key's read returns no value an acknowledged conditional write
   had replaced before the read began. `grace_s` widens "before" for a documented bound.
4. **No read goes back**: of two reads of a register, the one that began after the other
   ended returns the same or a later version.
5. **Conditional writes never both succeed against the same version.**
"""

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


def seq_of(value):
    """A register value's sequence number (`w:<seq>`), None for anything else."""
    if value is None or not value.startswith("w:"):
        return None
    return int(value[2:])


def check(ops, final, grace_s=0.0):
    """The violations of `ops` (as History recorded them) with `final` (key -> value read once
    every fault had healed, None for a missing key): a list of strings, empty when all holds."""
    bad = []
    by_key = {}
    for op in ops:
        by_key.setdefault(op["key"], []).append(op)
    for key, kops in sorted(by_key.items()):
        writes = [o for o in kops if o["kind"] in ("put", "cas")]
        reads = [o for o in kops if o["kind"] == "get" and o["outcome"] == "ok"]
        written = {o["value"] for o in writes} | {o.get("initial") for o in kops if o.get("initial")}
        # 2. Reads of values never written.
        for r in reads:
            if r["got"] is not None and r["got"] not in written:
                bad.append(f"{key}: read {r['got']!r}, never written")
        if any(o["kind"] == "cas" for o in writes):
            bad += check_cas(key, writes, reads, final.get(key), grace_s)
        else:
            bad += check_register(key, writes, reads, final.get(key), grace_s)
    return bad


def check_register(key, writes, reads, final, grace_s):
    bad = []
    acked = [w for w in writes if w["outcome"] == "ok"]
    # 1. The last acknowledged write, or one after it, is what stays.
    if acked:
        last = max(seq_of(w["value"]) for w in acked)
        if final is None or seq_of(final) is None or seq_of(final) < last:
            bad.append(f"{key}: acknowledged w:{last} lost (holds {final!r})")
    for r in reads:
        got = seq_of(r["got"]) if r["got"] is not None else -1
        # 3. Stale: a write acknowledged before the read began is newer than what it read.
        newer = [w for w in acked if w["end"] + grace_s < r["start"] and seq_of(w["value"]) > got]
        if newer:
            w = max(newer, key=lambda w: seq_of(w["value"]))
            bad.append(f"{key}: read {r['got']!r} at {r['start']:.3f}, after {w['value']} was "
                       f"acknowledged at {w['end']:.3f}")
    # 4. Reads never go back.
    ordered = sorted(reads, key=lambda r: r["end"])
    for i, r1 in enumerate(ordered):
        s1 = seq_of(r1["got"]) if r1["got"] is not None else -1
        for r2 in ordered[i + 1:]:
            s2 = seq_of(r2["got"]) if r2["got"] is not None else -1
            if r2["start"] > r1["end"] + grace_s and s2 < s1:
                bad.append(f"{key}: read {r2['got']!r} at {r2['start']:.3f} after a read of "
                           f"{r1['got']!r} ended at {r1['end']:.3f}")
                break
    return bad


def check_cas(key, writes, reads, final, grace_s):
    bad = []
    acked = [w for w in writes if w["outcome"] == "ok"]
    # 5. One success per version.
    by_base = {}
    for w in acked:
        by_base.setdefault(w["base"], []).append(w)
    for base, ws in by_base.items():
        if len(ws) > 1:
            bad.append(f"{key}: {len(ws)} conditional writes succeeded against {base!r}: "
                       f"{[w['value'] for w in ws]}")
    # The ETag each acknowledged write left, by value, and which ETags were replaced (and when).
    etag_of = {w["value"]: w["etag"] for w in writes if w.get("etag")}
    replaced_at = {}
    for w in acked:
        if w["base"] is not None:
            replaced_at[w["base"]] = min(replaced_at.get(w["base"], w["end"]), w["end"])
    # 1. The value left was not replaced by an acknowledged write, unless the replacing value
    #    was itself replaced by an attempted one (a chain of writes, the last one unknown).
    if acked:
        if final is None:
            bad.append(f"{key}: acknowledged conditional writes, and the key is gone")
        else:
            tag = etag_of.get(final)
            if tag is not None and tag in replaced_at:
                bad.append(f"{key}: holds {final!r}, which an acknowledged conditional write "
                           f"replaced")
    # 3. Stale: a read of a value an acknowledged write had replaced before the read began.
    for r in reads:
        tag = r.get("etag")
        if tag in replaced_at and replaced_at[tag] + grace_s < r["start"]:
            bad.append(f"{key}: read {r['got']!r} at {r['start']:.3f}, replaced by an "
                       f"acknowledged write at {replaced_at[tag]:.3f}")
    return bad


def _self_test():
    """The checker finds what it must (run by tests/test_partition.py)."""
    h = []
    t = [0.0]

    def op(**o):
        t[0] += 1
        o.setdefault("start", t[0])
        o.setdefault("end", t[0] + 0.5)
        h.append(o)

    op(kind="put", key="r", value="w:1", outcome="ok")
    op(kind="put", key="r", value="w:2", outcome="ok")
    op(kind="get", key="r", got="w:1", outcome="ok")  # stale: w:2 acknowledged before
    op(kind="get", key="r", got="w:9", outcome="ok")  # never written
    op(kind="put", key="c", value="a", base=None, etag="ea", outcome="ok")
    op(kind="cas", key="c", value="b", base="ea", etag="eb", outcome="ok")
    op(kind="cas", key="c", value="x", base="ea", etag="ex", outcome="ok")  # second success
    found = check(h, {"r": "w:1", "c": "a"})
    want = ["r: acknowledged w:2 lost", "r: read 'w:1'", "r: read 'w:9', never written",
            "c: 2 conditional writes succeeded", "c: holds 'a'"]
    for w in want:
        assert any(f.startswith(w) for f in found), (w, found)
    clean = [o for o in h if o.get("got") not in ("w:1", "w:9") and o.get("value") != "x"]
    assert check(clean, {"r": "w:2", "c": "b"}) == [], check(clean, {"r": "w:2", "c": "b"})
