"""Metrics and logs as an operator's tools read them: a scrape parsed by the Prometheus
project's own OpenMetrics parser, byte counters that match what a batch GET sent to its last
byte, refused connections counted, the Grafana dashboard's queries naming metrics that exist,
and the access log as JSON lines that never carry a secret."""

import json
import re
import socket
import time
import urllib.request
from pathlib import Path

from prometheus_client.openmetrics.parser import text_string_to_metric_families

from conftest import ROOT_AK, ROOT_SK, Server
from sigv4_client import signed_request

REPO = Path(__file__).resolve().parent.parent
DASHBOARD = REPO / "deploy" / "grafana" / "packrat.json"


def scrape(srv):
    r = urllib.request.urlopen(f"{srv.endpoint}/metrics", timeout=10)
    assert r.headers["content-type"].startswith("application/openmetrics-text"), r.headers
    # The parser refuses anything that is not valid OpenMetrics: a family without TYPE, a
    # sample outside its family, a missing `# EOF`.
    return list(text_string_to_metric_families(r.read().decode()))


def sample(families, name, **labels):
    """The value of one sample, or 0 when the label set has not been seen yet."""
    for f in families:
        for s in f.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return 0


def test_scrape_parses_and_counts_a_batch_get_to_its_last_byte(workdir):
    srv = Server(workdir / "metrics", extra_args=["--log-format", "json"]).start()
    s3 = srv.client()
    s3.create_bucket(Bucket="met")
    keys = [f"k/{i:03}" for i in range(40)]
    for i, k in enumerate(keys):
        s3.put_object(Bucket="met", Key=k, Body=bytes([i]) * (1000 + 977 * i))
    before = scrape(srv)
    body = json.dumps({"items": [{"key": k} for k in keys]}).encode()
    status, headers, tar = signed_request(srv.endpoint, "POST", "/met", query="batch", body=body,
                                          headers={"content-type": "application/json"})
    assert status == 200 and headers.get("transfer-encoding") == "chunked", (headers, tar[:300])
    after = scrape(srv)
    for f in after:
        assert f.documentation, f"{f.name} has no HELP"
        assert f.type in ("counter", "gauge", "histogram", "info"), (f.name, f.type)
    sent = sample(after, "packrat_bytes_out_total", op="BatchGet") - sample(
        before, "packrat_bytes_out_total", op="BatchGet")
    assert sent == len(tar), (sent, len(tar))
    assert sample(after, "packrat_requests_total", op="BatchGet", status="200") == 1
    assert sample(after, "packrat_request_duration_seconds_count", op="BatchGet", status="200") == 1
    assert sample(after, "packrat_bytes_in_total", op="BatchGet") == len(body)
    assert sample(after, "packrat_requests_total", op="PutObject", status="200") == 40
    # Build and process figures, as every Prometheus client names them.
    assert sample(after, "packrat_build_info", version="0.1.0") == 1
    assert sample(after, "process_resident_memory_bytes") > 1 << 20
    assert sample(after, "process_open_fds") > 0
    assert sample(after, "process_start_time_seconds") > time.time() - 3600
    assert sample(after, "packrat_segment_appended_bytes_total") > 0
    assert sample(after, "packrat_commit_duration_seconds_count") > 0
    # boto3 keeps its connection; the scrapes and the batch GET open one each.
    assert sample(after, "packrat_connections_accepted_total") >= 3
    srv.stop()
    # The access log: one JSON object per request, the access key id but never the secret
    # nor a signature.
    lines = [json.loads(l) for l in Path(srv.log_path).read_text().splitlines() if l.startswith("{")]
    access = [l for l in lines if l.get("target") == "packrat::access"]
    batch = [l for l in access if l.get("op") == "BatchGet"]
    assert len(batch) == 1, batch
    b = batch[0]
    assert (b["method"], b["bucket"], b["status"], b["bytes_out"], b["access_key"], b["complete"]) == \
        ("POST", "met", 200, len(tar), ROOT_AK, True), b
    assert b["request_id"] == headers["x-amz-request-id"]
    puts = [l for l in access if l.get("op") == "PutObject"]
    assert sorted(p["key"] for p in puts) == keys
    text = Path(srv.log_path).read_text()
    assert ROOT_SK not in text and "Signature" not in text


def test_refused_connections_are_counted_and_the_access_log_can_be_off(workdir):
    srv = Server(workdir / "metrics-refused",
                 extra_args=["--max-connections", "1", "--no-access-log"]).start()
    host, port = srv.endpoint.split("://")[1].split(":")
    holder = socket.create_connection((host, int(port)))
    time.sleep(0.2)
    refused = socket.create_connection((host, int(port)))
    refused.settimeout(10)
    assert refused.recv(4096).startswith(b"HTTP/1.1 503"), "over --max-connections: 503"
    refused.close()
    holder.close()
    deadline = time.time() + 10
    while True:
        try:
            fams = scrape(srv)
            break
        except OSError:
            assert time.time() < deadline, "the held connection's permit never came back"
            time.sleep(0.1)
    assert sample(fams, "packrat_connections_refused_total") >= 1
    srv.stop()
    assert "packrat::access" not in Path(srv.log_path).read_text()


def test_dashboard_queries_name_metrics_that_exist(workdir):
    srv = Server(workdir / "metrics-dash").start()
    s3 = srv.client()
    s3.create_bucket(Bucket="dash")
    s3.put_object(Bucket="dash", Key="a", Body=b"x")
    s3.get_object(Bucket="dash", Key="a")["Body"].read()
    names = {s.name for f in scrape(srv) for s in f.samples}
    srv.stop()
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 8, "the dashboard has its panels"
    used = set()
    for e in exprs:
        # Metric names: identifiers not followed by `(` (functions) and not label names.
        for m in re.finditer(r"\b([a-z_][a-z0-9_]*)\b(?!\s*\()", re.sub(r"\{[^}]*\}", "", e)):
            w = m.group(1)
            if w.startswith(("packrat_", "process_")):
                used.add(w)
    assert used, exprs
    missing = sorted(used - names)
    assert not missing, f"the dashboard queries metrics that do not exist: {missing}"
