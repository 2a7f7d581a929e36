"""Turns the JSON lines of bench/compare.sh into a table with packrat/SeaweedFS ratios."""

import json
import statistics
import sys
from collections import defaultdict


def main(path):
    runs = defaultdict(lambda: defaultdict(list))
    order = []
    for line in open(path):
        line = line.strip()
        if not line.startswith("{"):
            continue
        r = json.loads(line)
        if r["ops"] == 0:
            continue  # a prepare-only run
        key = (r["workload"], r["size_bytes"], r["concurrency"])
        if key not in order:
            order.append(key)
        runs[key][r["label"]].append(r)
    cols = [("ops/s", "ops_per_sec", True), ("MB/s", "mb_per_sec", True), ("p50 µs", "latency_us_p50", False),
            ("p99 µs", "latency_us_p99", False), ("CPU µs/op", "server_cpu_us_per_op", False),
            ("load gen. CPU µs/op", "client_cpu_us_per_op", False),
            ("RSS MiB", "server_rss_peak_mib", False)]
    print("| workload | server | " + " | ".join(c[0] for c in cols) + " | errors |")
    print("|---|---|" + "---|" * (len(cols) + 1))
    for key in order:
        wl, size, conc = key
        name = f"{wl} {size // 1024} KiB x{conc}" if size < 1 << 30 else f"{wl} {size >> 30} GiB x{conc}"
        if wl == "list":
            name = "list (full prefix, 1000/page)"
        best = {}
        for label in ("packrat", "seaweedfs"):
            rs = runs[key].get(label, [])
            if not rs:
                continue
            # The last run of each label is reported (the first PUT runs fill the buckets).
            best[label] = rs[-1]
            r = rs[-1]
            vals = []
            for _, f, _ in cols:
                v = r.get(f)
                vals.append("-" if v is None else (f"{v:.1f}" if isinstance(v, float) else str(v)))
            extra = f" ({r['seconds']:.2f} s, {r.get('keys_listed')} keys)" if wl == "list" else ""
            print(f"| {name}{extra} | {label} | " + " | ".join(vals) + f" | {r['errors']} |")
        if len(best) == 2:
            ratios = []
            for _, f, higher_better in cols:
                a, b = best["packrat"].get(f), best["seaweedfs"].get(f)
                ratios.append(f"{a / b:.2f}x" if a and b else "-")
            print(f"| {name} | **ratio** packrat/seaweedfs | " + " | ".join(ratios) + " | |")
    rounds(order, runs)


def rounds(order, runs):
    """With ROUNDS > 1: each round's ops/s on both servers and their ratio, and the median
    ratio, since the table above shows the last round only."""
    rows = []
    for key in order:
        p, s = runs[key].get("packrat", []), runs[key].get("seaweedfs", [])
        if min(len(p), len(s)) < 2:
            continue
        wl, size, conc = key
        ratios = [a["ops_per_sec"] / b["ops_per_sec"] for a, b in zip(p, s) if b["ops_per_sec"]]
        each = ", ".join(f"{a['ops_per_sec']:,.0f} / {b['ops_per_sec']:,.0f} ({a['ops_per_sec'] / b['ops_per_sec']:.2f}x)"
                         for a, b in zip(p, s) if b["ops_per_sec"])
        rows.append(f"| {wl} {size // 1024} KiB x{conc} | {each} | {statistics.median(ratios):.2f}x |")
    if rows:
        print()
        print("| workload | per round: packrat / SeaweedFS ops/s (ratio) | median ratio |")
        print("|---|---|---|")
        print("\n".join(rows))


if __name__ == "__main__":
    main(sys.argv[1])
