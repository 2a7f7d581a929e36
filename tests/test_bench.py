"""`packrat bench` against the real server: a short smoke run of each workload, so the load
generator that produces docs/benchmarks.md keeps working."""

import json
import os
import subprocess

import conftest


def bench(server, *args):
    env = dict(os.environ, AWS_ACCESS_KEY_ID=conftest.ROOT_AK, AWS_SECRET_ACCESS_KEY=conftest.ROOT_SK)
    out = subprocess.run(
        [conftest.BIN, "bench", "--endpoint", server.endpoint, "--server-pid", str(server.proc.pid),
         "--bucket", "bench-smoke", "--json", "--concurrency", "4", *args],
        env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_bench_workloads(server):
    r = bench(server, "--workload", "get", "--prepare", "--keys", "200", "--size", "3KiB", "--ops", "400")
    assert r["ops"] == 400 and r["errors"] == 0 and r["mb_per_sec"] > 0
    assert r["latency_us_p50"] > 0 and r["server_cpu_us_per_op"] is not None
    assert r["client_cpu_us_per_op"] is not None and r["client_cpu_us_per_op"] >= 0
    for wl in ("put", "head", "mixed"):
        r = bench(server, "--workload", wl, "--keys", "200", "--size", "3KiB", "--ops", "100")
        assert r["ops"] == 100 and r["errors"] == 0, r
    r = bench(server, "--workload", "list", "--keys", "200", "--duration", "30s")
    assert r["keys_listed"] == 200 and r["errors"] == 0
    r = bench(server, "--workload", "get", "--keys", "200", "--size", "3KiB", "--ops", "100", "--zipf", "0.99")
    assert r["errors"] == 0
