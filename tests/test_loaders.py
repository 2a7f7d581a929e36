"""Data loaders a training job can trust (issue 19), against the real binary: epoch streams
are one permutation of the whole prefix with equal ranks and whole samples; broken streams and
batches are resumed by the installed Python client with every sample exactly once; injected
503s are retried; the map-style dataset fetches a batch with one batch GET."""

import collections
import hashlib
import json
import os
import random
import re
import tracemalloc
import urllib.request

import pytest

import packrat_client
from conftest import Server
from packrat_client import (
    EpochDataset,
    MapDataset,
    PackratClient,
    RetryPolicy,
    StreamChanged,
    Unavailable,
)
from sigv4_client import signed_request

EXTS = ("jpg", "cls", "json")


def sha(b):
    return hashlib.sha256(b).hexdigest()


@pytest.fixture(scope="module")
def srv(workdir):
    s = Server(workdir / "loaders", ["--fault-injection"]).start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def shards(srv):
    """WebDataset-style samples in class folders: `train/cNN/000123.{jpg,cls,json}`."""
    s3 = srv.client()
    s3.create_bucket(Bucket="wds")
    rng = random.Random(3)
    objs = {}
    for i in range(240):
        base = f"train/c{i % 6:02d}/{i:06d}"
        objs[f"{base}.jpg"] = rng.randbytes(rng.choice([700, 5000, 40_000]))
        objs[f"{base}.cls"] = str(i % 6).encode()
        objs[f"{base}.json"] = json.dumps({"i": i}).encode()
    for k, v in objs.items():
        s3.put_object(Bucket="wds", Key=k, Body=v)
    return objs


@pytest.fixture(params=[True, False], ids=["native", "pure-python"])
def native(request):
    """The client's TAR answers read by its native extension, or by its pure-Python reader:
    both resume, retry and stop early the same way."""
    return request.param


def set_http_faults(srv, **f):
    st, _, body = signed_request(srv.endpoint, "PUT", "/_packrat/admin/faults/http",
                                 body=json.dumps(f).encode())
    assert st == 200, body


def base(key):
    return key.rsplit(".", 1)[0]


def test_the_client_under_test_is_the_installed_package():
    # pip install ./sdk-examples/python: the tests use what users install, not the source tree.
    assert "site-packages" in packrat_client.__file__, packrat_client.__file__


def test_ranks_and_workers_read_every_sample_once_whole_and_equal(srv, shards):
    pc = srv.packrat()
    ranks, workers = 4, 3
    per_rank = collections.Counter()
    seen = []
    for r in range(ranks):
        for w in range(workers):
            for group in pc.stream_samples("wds", "train/", shard=(r, ranks), worker=(w, workers), seed=11,
                                           epoch=2, tail="drop"):
                names = [s.name for s in group]
                # A sample's files travel together, in key order, under one index.
                assert sorted(names) == [f"{base(names[0])}.{e}" for e in sorted(EXTS)], names
                assert len({s.index for s in group}) == 1
                for s in group:
                    assert s.ok and sha(s.data) == sha(shards[s.name])
                seen.append(base(names[0]))
                per_rank[r] += 1
    assert len(seen) == len(set(seen)) == 240, "every sample once (240 = 4 x 60, nothing dropped)"
    assert set(per_rank.values()) == {60}
    # Not bunched by class: the first 24 samples of rank 0's epoch come from every class.
    first = [s.name for s in pc.stream_epoch("wds", "train/", shard=(0, 1), seed=11, epoch=2)][: 24 * 3]
    assert len({n.split("/")[1] for n in first}) == 6


def test_pad_gives_equal_ranks_when_samples_do_not_divide(srv, shards):
    pc = srv.packrat()
    counts, seen = [], []
    for r in range(7):
        got = [base(g[0].name) for g in pc.stream_samples("wds", "train/", shard=(r, 7), seed=1)]
        counts.append(len(got))
        seen += got
    # 240 samples over 7 ranks: 35 each, 5 samples read twice, none missed.
    assert counts == [35] * 7
    assert len(set(seen)) == 240 and len(seen) == 245


def test_the_order_is_uniform_over_seeds(srv, shards):
    """Which of 6 single-key samples comes first, over 600 seeds: every one about 100 times
    (chi-square below 20.5, the 0.1% critical value for 5 degrees of freedom)."""
    s3 = srv.client()
    s3.create_bucket(Bucket="uniform")
    for i in range(6):
        s3.put_object(Bucket="uniform", Key=f"u/{i}", Body=b"x")
    pc = srv.packrat()
    first = collections.Counter()
    for seed in range(600):
        first[next(iter(pc.stream_epoch("uniform", "u/", seed=seed))).name] += 1
    chi = sum((c - 100) ** 2 / 100 for c in first.values()) + 100 * (6 - len(first))
    assert chi < 20.5, first


def test_a_cut_stream_is_resumed_with_every_sample_exactly_once(srv, shards, native):
    pc = PackratClient(endpoint_url=srv.endpoint, region_name="us-east-1",
                       aws_access_key_id="PKTESTROOTKEY",
                       aws_secret_access_key="test-root-secret-0123456789abcdef", native=native,
                       retry=RetryPolicy(attempts=8, base=0.01, cap=0.05))
    assert (pc._native is not None) == native, "the reader asked for"
    whole = [[s.name for s in g] for g in pc.stream_samples("wds", "train/", seed=5, epoch=1)]
    # Three cuts, each 100 KB into an answer (mid-entry): the client resumes each time.
    set_http_faults(srv, cuts=3, cut_after_bytes=100_000)
    resumed = []
    for g in pc.stream_samples("wds", "train/", seed=5, epoch=1):
        for s in g:
            assert s.ok and sha(s.data) == sha(shards[s.name])
        resumed.append([s.name for s in g])
    st, _, body = signed_request(srv.endpoint, "GET", "/_packrat/admin/faults/http")
    assert json.loads(body)["cuts"] == 0, "every cut happened"
    assert resumed == whole


def test_a_resumed_stream_over_a_changed_prefix_is_refused(srv, shards):
    s3 = srv.client()
    s3.create_bucket(Bucket="changing")
    for i in range(5):
        s3.put_object(Bucket="changing", Key=f"p/{i}.bin", Body=b"x")
    st, h, _ = signed_request(srv.endpoint, "GET", "/changing", query="stream=&prefix=p%2F")
    assert st == 200 and h["x-packrat-samples"] == "5"
    listing = h["x-packrat-listing"]
    q = f"listing={listing}&prefix=p%2F&start=2&stream="
    st, _, _ = signed_request(srv.endpoint, "GET", "/changing", query=q)
    assert st == 200
    s3.put_object(Bucket="changing", Key="p/9.bin", Body=b"y")
    st, _, body = signed_request(srv.endpoint, "GET", "/changing", query=q)
    assert st == 412 and b"PreconditionFailed" in body, body


def test_a_cut_batch_is_resumed_for_the_items_not_received(srv, shards, native):
    pc = PackratClient(endpoint_url=srv.endpoint, region_name="us-east-1",
                       aws_access_key_id="PKTESTROOTKEY",
                       aws_secret_access_key="test-root-secret-0123456789abcdef", native=native,
                       retry=RetryPolicy(attempts=8, base=0.01, cap=0.05))
    assert (pc._native is not None) == native, "the reader asked for"
    keys = sorted(shards)
    random.Random(4).shuffle(keys)
    items = keys[:300] + [{"key": "train/missing.jpg", "tag": "gone"}]
    for order in ("request", "storage"):
        set_http_faults(srv, cuts=2, cut_after_bytes=150_000)
        got = list(pc.batch_get("wds", items, order=order))
        names = [s.name for s in got]
        assert sorted(names) == sorted(keys[:300] + ["train/missing.jpg"]), order
        if order == "request":
            assert names == keys[:300] + ["train/missing.jpg"]
        for s in got:
            if s.name == "train/missing.jpg":
                assert s.error[0] == "NoSuchKey" and s.tag == "gone"
            else:
                assert sha(s.data) == sha(shards[s.name])


def test_a_reader_that_stops_early_leaves_the_connection_clean(srv, shards, native):
    # One pooled connection, so the next request goes where the unread rest of the first
    # answer was: the client closes it rather than hand those bytes to the next answer.
    pc = PackratClient(endpoint_url=srv.endpoint, region_name="us-east-1",
                       aws_access_key_id="PKTESTROOTKEY",
                       aws_secret_access_key="test-root-secret-0123456789abcdef", native=native,
                       maxsize=1, retry=RetryPolicy(attempts=1))
    assert (pc._native is not None) == native, "the reader asked for"
    keys = sorted(shards)[:200]
    for s in pc.batch_get("wds", keys):
        assert s.ok
        break
    for g in pc.stream_samples("wds", "train/", seed=1):
        break
    got = list(pc.batch_get("wds", keys))
    assert [s.name for s in got] == keys
    assert all(sha(s.data) == sha(shards[s.name]) for s in got)


def test_503s_are_retried_and_then_reported(srv, shards, native):
    pc = PackratClient(endpoint_url=srv.endpoint, region_name="us-east-1",
                       aws_access_key_id="PKTESTROOTKEY",
                       aws_secret_access_key="test-root-secret-0123456789abcdef", native=native,
                       retry=RetryPolicy(attempts=4, base=0.01, cap=0.05))
    assert (pc._native is not None) == native, "the reader asked for"
    key = "train/c00/000000.jpg"
    set_http_faults(srv, slowdown=3)
    assert [s.data for s in pc.batch_get("wds", [key])] == [shards[key]]
    set_http_faults(srv, slowdown=3)
    assert len(list(pc.stream_epoch("wds", "train/c01/"))) == 40 * 3
    set_http_faults(srv, slowdown=3)
    assert pc.get_ranges("wds", key, [(0, 9)]) == [shards[key][:10]]
    # More 503s than attempts: a typed error, after exactly `attempts` tries.
    set_http_faults(srv, slowdown=10)
    with pytest.raises(Unavailable) as e:
        list(pc.batch_get("wds", [key]))
    assert e.value.status == 503 and e.value.code == "SlowDown"
    st, _, body = signed_request(srv.endpoint, "GET", "/_packrat/admin/faults/http")
    assert json.loads(body)["slowdown"] == 6
    set_http_faults(srv)


def test_map_dataset_fetches_a_batch_with_one_request(srv, shards):
    ds = MapDataset.from_prefix(srv.packrat, "wds", "train/c02/", transform=lambda s: (s.name, s.data))
    assert len(ds) == 120
    assert ds[5] == (ds.keys[5], shards[ds.keys[5]])
    batch_gets = lambda: sum(  # noqa: E731
        float(v) for v in re.findall(rb'packrat_requests_total\{op="BatchGet",status="200"\} (\d+)',
                                     urllib.request.urlopen(srv.endpoint + "/metrics").read()))
    before = batch_gets()
    batch = ds.__getitems__([7, 3, 99, 3])
    assert [n for n, _ in batch] == [ds.keys[i] for i in (7, 3, 99, 3)]
    assert all(d == shards[n] for n, d in batch)
    assert batch_gets() == before + 1, "one batch GET for the whole batch"
    # Epoch datasets yield whole samples with samples=True.
    eds = EpochDataset(srv.packrat, "wds", "train/c03/", seed=2, samples=True, context=(1, 2, 0, 1))
    groups = list(eds)
    assert len(groups) == 20 and all(len(g) == 3 for g in groups)


def test_map_dataset_transforms_each_sample_as_it_arrives(srv, shards, native):
    # A DataLoader worker's batch: the transform copies each sample out (into a tensor), so
    # the raw bytes of the whole batch are never held at once, only those of a sample or two.
    pc = PackratClient(endpoint_url=srv.endpoint, region_name="us-east-1",
                       aws_access_key_id="PKTESTROOTKEY",
                       aws_secret_access_key="test-root-secret-0123456789abcdef", native=native,
                       maxsize=1)
    assert (pc._native is not None) == native, "the reader asked for"
    keys = sorted(k for k, v in shards.items() if len(v) == 40_000)
    assert len(keys) >= 60
    ds = MapDataset(lambda: pc, "wds", keys, transform=lambda s: sha(s.data))
    ds.__getitems__([0])  # the connection made, the modules warm
    tracemalloc.start()
    try:
        got = ds.__getitems__(list(range(len(keys))))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert got == [sha(shards[k]) for k in keys]
    # The pure-Python reader reads through one buffer of its own; the native one does not.
    bound = 10 * 40_000 + (0 if native else packrat_client.client._READ_BYTES)
    assert bound < 40_000 * len(keys) / 2
    assert peak < bound, f"{peak:,} bytes held at most, for a batch of {40_000 * len(keys):,}"

    # A transform that fails mid-batch stops the answer; the next batch reads whole.
    def fail_at_third(s, seen=[]):
        seen.append(s.name)
        if len(seen) == 3:
            raise ValueError("a bad sample")
        return sha(s.data)

    bad = MapDataset(lambda: pc, "wds", keys, transform=fail_at_third)
    with pytest.raises(ValueError, match="a bad sample"):
        bad.__getitems__(list(range(len(keys))))
    assert ds.__getitems__([5, 1, 5]) == [sha(shards[keys[i]]) for i in (5, 1, 5)]


def test_download_writes_files_and_reports_progress(srv, shards, tmp_path, capsys):
    pc = srv.packrat()
    keys = [k for k in shards if k.startswith("train/c04/")]
    n = pc.download("wds", keys, tmp_path / "out", batch_size=25, progress=True)
    assert n == sum(len(shards[k]) for k in keys)
    for k in keys:
        assert (tmp_path / "out" / k).read_bytes() == shards[k]
    err = capsys.readouterr().err
    assert re.search(rf"downloaded {len(keys)}/{len(keys)} objects, [0-9.]+ MB", err), err
