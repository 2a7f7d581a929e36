"""Soak: thousands of concurrent keep-alive connections mixing small GET, PUT, DELETE and LIST
against one server for a fixed time. No errors, the server stays healthy, memory stays bounded.

Short mode in CI (1,000 connections, 10 s); long mode by hand, e.g.
    PACKRAT_SOAK_CONNECTIONS=4000 PACKRAT_SOAK_SECONDS=300 .venv/bin/python -m pytest -q -s tests/test_soak.py
"""

import json
import os
import resource
import subprocess
import urllib.request

import conftest
from conftest import Server

CONNECTIONS = int(os.environ.get("PACKRAT_SOAK_CONNECTIONS", "1000"))
SECONDS = int(os.environ.get("PACKRAT_SOAK_SECONDS", "10"))


def rss_mib(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def test_soak_many_connections_mixed_small_ops(workdir):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = CONNECTIONS + 512
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))
    connections = min(CONNECTIONS, resource.getrlimit(resource.RLIMIT_NOFILE)[0] - 512)
    srv = Server(workdir / "soak").start()
    try:
        env = dict(os.environ, AWS_ACCESS_KEY_ID=conftest.ROOT_AK, AWS_SECRET_ACCESS_KEY=conftest.ROOT_SK)
        common = [conftest.BIN, "bench", "--endpoint", srv.endpoint, "--bucket", "soak", "--prefix", "s/",
                  "--keys", "5000", "--size", "2KiB", "--server-pid", str(srv.proc.pid), "--json"]
        # Load the keys first (64 connections), then measure the start RSS.
        out = subprocess.run(common + ["--workload", "get", "--prepare", "--ops", "0", "--concurrency", "64"],
                             capture_output=True, text=True, timeout=300, env=env)
        assert out.returncode == 0, out.stderr
        rss_start = rss_mib(srv.proc.pid)
        out = subprocess.run(common + ["--workload", "soak", "--concurrency", str(connections),
                                       "--duration", f"{SECONDS}s"],
                             capture_output=True, text=True, timeout=SECONDS + 300, env=env)
        assert out.returncode == 0, out.stderr[-2000:]
        r = json.loads(out.stdout.strip().splitlines()[-1])
        rss_end = rss_mib(srv.proc.pid)
        print(f"\nsoak: {connections} connections for {r['seconds']:.1f} s: {r['ops']} operations "
              f"({r['ops_per_sec']:.0f}/s), {r['errors']} errors, p50 {r['latency_us_p50']} µs, "
              f"p99 {r['latency_us_p99']} µs, max {r['latency_us_max']} µs; server RSS {rss_start:.0f} MiB "
              f"at start, {rss_end:.0f} MiB at end (peak {r['server_rss_peak_mib']:.0f} MiB)")
        assert r["errors"] == 0
        assert r["ops"] > connections, "every connection should have done some work"
        assert urllib.request.urlopen(srv.endpoint + "/health/ready").read() == b"ready\n"
        # Bounded: a few KiB per connection plus buffers, not growth with the operation count.
        assert rss_end < rss_start + 64 + connections * 0.25, (rss_start, rss_end)
    finally:
        srv.stop()
