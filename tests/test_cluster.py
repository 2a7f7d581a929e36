"""A packrat cluster on loopback: a private etcd (Debian's etcd-server), three storage nodes
(`packrat node`) and two stateless gateways (`packrat gateway`), driven with boto3. Nodes are
killed with SIGKILL under load; nothing is mocked."""

import base64
import concurrent.futures
import datetime
import functools
import hashlib
import io
import json
import os
import re
import signal
import socket
import subprocess
import tarfile
import threading
import time
import urllib.error
import urllib.request

import pytest
from botocore.exceptions import (ClientError, ConnectionClosedError, EndpointConnectionError,
                                 IncompleteReadError, ResponseStreamingError)
from urllib3.exceptions import ProtocolError

import conftest
from cluster import (BIN, PGS, Etcd, Gateway, Node, cluster_cmd, free_port, healthy, overwrite_in_turn, start_cluster,
                     status, version_of, versioned_body, wait_for)
from test_versioning import history_left, make_history


def assert_acknowledged(client, bucket, acked):
    """Each key of `acked` reads back as its last acknowledged write: its bytes, or (None)
    404 for a key whose delete was acknowledged last."""
    for key, body in sorted(acked.items()):
        if body is None:
            with pytest.raises(ClientError) as e:
                client.head_object(Bucket=bucket, Key=key)
            assert e.value.response["Error"]["Code"] == "404", key
        else:
            assert client.get_object(Bucket=bucket, Key=key)["Body"].read() == body, key


@pytest.fixture
def cluster(workdir, request):
    etcd, nodes, gateways = start_cluster(workdir / f"cluster-{request.node.name}", gateways=2)
    yield etcd, nodes, gateways
    for p in gateways + nodes:
        p.stop()
    etcd.stop()


def test_s3_through_two_gateways(cluster):
    etcd, nodes, (gw_a, gw_b) = cluster
    a, b = gw_a.client(), gw_b.client()
    a.create_bucket(Bucket="data")
    # Read-after-write and list-after-write across gateways.
    bodies = {f"train/c{i % 3}/{i:04d}.jpg": os.urandom(100 + i * 37) for i in range(60)}
    for k, v in bodies.items():
        a.put_object(Bucket="data", Key=k, Body=v, ContentType="image/jpeg",
                     Metadata={"label": k[7]})
    for k, v in bodies.items():
        got = b.get_object(Bucket="data", Key=k)
        assert got["Body"].read() == v
        assert got["ETag"] == '"%s"' % hashlib.md5(v).hexdigest()
        assert got["ContentType"] == "image/jpeg"
        assert got["Metadata"] == {"label": k[7]}, "the cluster's own version is never shown"
    assert b.get_object(Bucket="data", Key="train/c1/0001.jpg", Range="bytes=10-19")["Body"].read() \
        == bodies["train/c1/0001.jpg"][10:20]
    keys = []
    for page in b.get_paginator("list_objects_v2").paginate(Bucket="data", PaginationConfig={"PageSize": 7}):
        keys += [o["Key"] for o in page.get("Contents", [])]
    assert keys == sorted(bodies)
    top = b.list_objects_v2(Bucket="data", Prefix="train/", Delimiter="/")
    assert [p["Prefix"] for p in top["CommonPrefixes"]] == ["train/c0/", "train/c1/", "train/c2/"]
    assert "Contents" not in top
    # Overwrite, copy, tags, delete: each seen through the other gateway at once.
    a.put_object(Bucket="data", Key="train/c0/0000.jpg", Body=b"new")
    assert b.get_object(Bucket="data", Key="train/c0/0000.jpg")["Body"].read() == b"new"
    a.copy_object(Bucket="data", Key="copy.jpg", CopySource={"Bucket": "data", "Key": "train/c0/0003.jpg"})
    assert b.get_object(Bucket="data", Key="copy.jpg")["Body"].read() == bodies["train/c0/0003.jpg"]
    a.put_object_tagging(Bucket="data", Key="copy.jpg", Tagging={"TagSet": [{"Key": "split", "Value": "val"}]})
    assert b.get_object_tagging(Bucket="data", Key="copy.jpg")["TagSet"] == [{"Key": "split", "Value": "val"}]
    a.delete_object(Bucket="data", Key="copy.jpg")
    with pytest.raises(ClientError) as e:
        b.head_object(Bucket="data", Key="copy.jpg")
    assert e.value.response["Error"]["Code"] == "404"
    # A conditional create is decided once, at the PG's head.
    with pytest.raises(ClientError) as e:
        b.put_object(Bucket="data", Key="train/c0/0000.jpg", Body=b"x", IfNoneMatch="*")
    assert e.value.response["Error"]["Code"] == "PreconditionFailed"
    # Buckets: a non-empty bucket stays; an empty one goes, for both gateways.
    with pytest.raises(ClientError) as e:
        b.delete_bucket(Bucket="data")
    assert e.value.response["Error"]["Code"] == "BucketNotEmpty"
    b.create_bucket(Bucket="scratch")
    assert "scratch" in [x["Name"] for x in a.list_buckets()["Buckets"]]
    a.delete_bucket(Bucket="scratch")
    assert "scratch" not in [x["Name"] for x in b.list_buckets()["Buckets"]]

    def gone():
        try:
            b.head_bucket(Bucket="scratch")
            return False
        except ClientError as e:
            assert e.response["Error"]["Code"] == "404"
            return True
    # Another gateway's bucket cache follows etcd's watch: as in S3, a deleted bucket may be
    # seen for a moment (here, milliseconds).
    wait_for("the other gateway to see the bucket gone", gone, timeout=5)
    s3b = gw_b.client()
    s3b.create_bucket(Bucket="unversioned")
    assert "Status" not in s3b.get_bucket_versioning(Bucket="unversioned")
    # Versioning set through one gateway holds through the other: versions written through
    # either are read by id through both.
    s3b.create_bucket(Bucket="versioned")
    s3b.put_bucket_versioning(Bucket="versioned", VersioningConfiguration={"Status": "Enabled"})
    wait_for("the other gateway to see versioning", lambda: a.get_bucket_versioning(
        Bucket="versioned").get("Status") == "Enabled", timeout=5)
    v1 = a.put_object(Bucket="versioned", Key="k", Body=b"one")["VersionId"]
    v2 = s3b.put_object(Bucket="versioned", Key="k", Body=b"two")["VersionId"]
    assert v1 != v2 and "null" not in (v1, v2)
    for client in (a, s3b):
        assert client.get_object(Bucket="versioned", Key="k", VersionId=v1)["Body"].read() == b"one"
        assert client.get_object(Bucket="versioned", Key="k")["VersionId"] == v2
    marker = a.delete_object(Bucket="versioned", Key="k")["VersionId"]
    assert [v["VersionId"] for v in s3b.list_object_versions(Bucket="versioned")["Versions"]] == [v2, v1]
    for vid in (marker, v2, v1):
        s3b.delete_object(Bucket="versioned", Key="k", VersionId=vid)
    a.delete_bucket(Bucket="versioned")
    # Object Lock set through one gateway holds through the other: the chain's head judges.
    s3b.create_bucket(Bucket="locked", ObjectLockEnabledForBucket=True)
    a.put_object_lock_configuration(Bucket="locked", ObjectLockConfiguration={
        "ObjectLockEnabled": "Enabled", "Rule": {"DefaultRetention": {"Mode": "GOVERNANCE", "Days": 1}}})
    held = a.put_object(Bucket="locked", Key="k", Body=b"held")["VersionId"]
    assert s3b.head_object(Bucket="locked", Key="k", VersionId=held)["ObjectLockMode"] == "GOVERNANCE"
    with pytest.raises(ClientError) as e:
        s3b.delete_object(Bucket="locked", Key="k", VersionId=held)
    assert e.value.response["Error"]["Code"] == "AccessDenied"
    assert a.get_object(Bucket="locked", Key="k", VersionId=held)["Body"].read() == b"held"
    s3b.delete_object(Bucket="locked", Key="k", VersionId=held, BypassGovernanceRetention=True)
    a.delete_bucket(Bucket="locked")
    s3b.put_object(Bucket="unversioned", Key="k", Body=b"v")
    assert s3b.get_object(Bucket="unversioned", Key="k", VersionId="null")["Body"].read() == b"v"
    assert [v["VersionId"] for v in s3b.list_object_versions(Bucket="unversioned")["Versions"]] == ["null"]
    s3b.delete_object(Bucket="unversioned", Key="k", VersionId="null")
    s3b.delete_bucket(Bucket="unversioned")
    # Every PG has three caught-up replicas; heads are spread over the nodes.
    s = status(etcd.url)
    assert s["pgs_healthy"] == PGS
    assert all(n["pgs"] == PGS and n["heads"] > 0 for n in s["nodes"])


def test_a_console_session_is_known_to_every_gateway(cluster):
    """A browser behind a load balancer meets a different gateway on each request: a console
    session made at one gateway acts at the other and survives a gateway's restart; etcd
    holds only the token's digest; a sign-out at one gateway ends it at all of them."""
    etcd, nodes, (gw_a, gw_b) = cluster
    gw_a.client().create_bucket(Bucket="console-seen")
    st, hdrs, _ = conftest.console_request(
        gw_a, "POST", "/console/session", {"x-packrat-console": "1", "content-type": "application/json"},
        json.dumps({"access_key": conftest.ROOT_AK, "secret_key": conftest.ROOT_SK}))
    assert st == 200
    cookie = hdrs["set-cookie"].split(";")[0]
    token = cookie.split("=", 1)[1]
    as_console = {"x-packrat-console": "1", "cookie": cookie}
    st, _, body = conftest.console_request(gw_b, "GET", "/console/session", as_console)
    assert (st, json.loads(body)["access_key"]) == (200, conftest.ROOT_AK)
    st, _, body = conftest.console_request(gw_b, "GET", "/", as_console)
    assert st == 200 and b"console-seen" in body
    stored = etcd_value(etcd.url, "/packrat/console-sessions/" + hashlib.sha256(token.encode()).hexdigest())
    assert stored == conftest.ROOT_AK
    gw_a.stop()
    gw_a.start()
    st, _, _ = conftest.console_request(gw_a, "GET", "/console/session", as_console)
    assert st == 200, "a gateway's restart does not end the sessions it made"
    st, _, _ = conftest.console_request(gw_b, "DELETE", "/console/session", as_console)
    assert st == 200
    for gw in (gw_a, gw_b):
        st, _, body = conftest.console_request(gw, "GET", "/", as_console)
        assert st == 403 and b"No live console session" in body, (gw.endpoint, body)
        st, _, _ = conftest.console_request(gw, "GET", "/console/session", as_console)
        assert st == 401


def test_node_killed_under_load_loses_nothing_and_catches_up(cluster):
    etcd, nodes, (gw_a, gw_b) = cluster
    setup = gw_a.client()
    setup.create_bucket(Bucket="load")
    setup.put_bucket_ownership_controls(Bucket="load", OwnershipControls={"Rules": [{"ObjectOwnership": "ObjectWriter"}]})
    acked = {}  # key -> bytes, or None once a delete was acknowledged
    lock = threading.Lock()
    stop = threading.Event()
    slowest = [0.0]
    failures = []

    def worker(w):
        c = (gw_a if w % 2 else gw_b).client(read_timeout=60)
        i = 0
        while not stop.is_set():
            key = f"w{w}/{i % 40:03d}"
            t0 = time.time()
            try:
                if i % 5 == 4:
                    c.delete_object(Bucket="load", Key=key)
                    with lock:
                        acked[key] = None
                else:
                    body = os.urandom(512 + (i * 131) % 4096)
                    c.put_object(Bucket="load", Key=key, Body=body)
                    with lock:
                        acked[key] = body
                got = c.get_object(Bucket="load", Key=f"w{w}/{(i * 7) % 40:03d}")
                want = acked.get(f"w{w}/{(i * 7) % 40:03d}")
                assert want is None or got["Body"].read() == want
            except ClientError as e:
                if e.response["Error"]["Code"] not in ("NoSuchKey", "404"):
                    failures.append(str(e))
            slowest[0] = max(slowest[0], time.time() - t0)
            i += 1

    # Multipart uploads around the failure: one completed before it, one begun before and
    # completed after the victim is back (the victim lacks its upload and copies the object
    # from the member before it), one begun and completed while the victim is away (the
    # victim copies it as it catches up). Each copy must keep the parts and the ETag.
    mp = gw_a.client(read_timeout=60)
    multipart = {}  # key -> (bytes, ETag)

    def multipart_etag(parts):
        digest = hashlib.md5(b"".join(hashlib.md5(p).digest() for p in parts)).hexdigest()
        return f'"{digest}-{len(parts)}"'

    def begin(key):
        return mp.create_multipart_upload(Bucket="load", Key=key, Metadata={"k": key})["UploadId"]

    def part(key, uid, n, data):
        etag = mp.upload_part(Bucket="load", Key=key, UploadId=uid, PartNumber=n, Body=data)["ETag"]
        return {"PartNumber": n, "ETag": etag}

    def complete(key, uid, done, parts):
        r = mp.complete_multipart_upload(Bucket="load", Key=key, UploadId=uid, MultipartUpload={"Parts": done})
        assert r["ETag"] == multipart_etag(parts), key
        multipart[key] = (b"".join(parts), r["ETag"])

    MiB = 1024 * 1024
    before = [os.urandom(5 * MiB), os.urandom(1000)]
    uid = begin("mp-before")
    complete("mp-before", uid, [part("mp-before", uid, i + 1, p) for i, p in enumerate(before)], before)
    across = [os.urandom(5 * MiB), os.urandom(5 * MiB), os.urandom(777)]
    across_uid = begin("mp-across")
    across_done = [part("mp-across", across_uid, 1, across[0])]

    pool = concurrent.futures.ThreadPoolExecutor(4)
    futures = [pool.submit(worker, w) for w in range(4)]
    time.sleep(2)
    victim = nodes[1]
    victim.kill9()
    # The survivors take over the victim's chains once its lease lapses.
    wait_for("the map without the victim", lambda: len(status(etcd.url)["nodes"]) == 2, timeout=30)
    across_done.append(part("mp-across", across_uid, 2, across[1]))
    away = [os.urandom(5 * MiB), os.urandom(2000)]
    uid = begin("mp-away")
    complete("mp-away", uid, [part("mp-away", uid, i + 1, p) for i, p in enumerate(away)], away)
    # An SSE-S3 object, a tag edit and an object ACL edit while the victim is away: it copies
    # them as it catches up.
    sse_body = os.urandom(100_000)
    mp.put_object(Bucket="load", Key="sse-away", Body=sse_body, ServerSideEncryption="AES256")
    mp.put_object_tagging(Bucket="load", Key="mp-before", Tagging={"TagSet": [{"Key": "t", "Value": "away"}]})
    mp.put_object_acl(Bucket="load", Key="mp-before", ACL="public-read")
    time.sleep(2)
    stop.set()
    for f in futures:
        f.result()
    assert not failures, failures[:3]
    # No request waited longer than the failover (lease of 5 s, then the manager's round).
    print(f"slowest request during the failover: {slowest[0]:.2f} s")
    assert slowest[0] < 12, slowest[0]

    def check(client):
        assert_acknowledged(client, "load", acked)

        for key, (body, etag) in sorted(multipart.items()):
            got = client.get_object(Bucket="load", Key=key)
            assert (got["ETag"], got["Metadata"], got["Body"].read() == body) == (etag, {"k": key}, True), key
            assert client.head_object(Bucket="load", Key=key, PartNumber=1)["PartsCount"] == int(etag.strip('"').split("-")[1])

    check(gw_b.client())
    # The victim comes back: it rejoins at the tails, catches up, then serves reads.
    victim.start()
    wait_for("three caught-up replicas of every PG", lambda: healthy(etcd.url, 3), timeout=90)
    # An edit once it is back reaches its copy down the chain, in place.
    mp.put_object_tagging(Bucket="load", Key="mp-away", Tagging={"TagSet": [{"Key": "t", "Value": "back"}]})
    across_done.append(part("mp-across", across_uid, 3, across[2]))
    complete("mp-across", across_uid, across_done, across)
    # Only the victim left: everything acknowledged must come from its copy.
    nodes[0].kill9()
    nodes[2].kill9()
    wait_for("the victim alone in the map", lambda: len(status(etcd.url)["nodes"]) == 1, timeout=30)
    check(gw_a.client())
    alone = gw_a.client()
    got = alone.get_object(Bucket="load", Key="sse-away")
    assert (got["Body"].read() == sse_body, got["ServerSideEncryption"]) == (True, "AES256")
    for key, tag in [("mp-before", "away"), ("mp-away", "back")]:
        assert alone.get_object_tagging(Bucket="load", Key=key)["TagSet"] == [{"Key": "t", "Value": tag}], key
    with urllib.request.urlopen(f"{gw_a.endpoint}/load/mp-before", timeout=30) as r:
        assert r.status == 200 and r.read() == multipart["mp-before"][0]
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(f"{gw_a.endpoint}/load/mp-away", timeout=30)
    assert e.value.code == 403
    # One replica of three is too few to take writes: refused cleanly, not acknowledged.
    with pytest.raises(ClientError) as e:
        gw_a.client().put_object(Bucket="load", Key="late", Body=b"x")
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503
    # So is a batch PUT: its members are written only at commit, and none could be.
    tar = io.BytesIO()
    with tarfile.open(fileobj=tar, mode="w") as tf:
        for i in range(3):
            info = tarfile.TarInfo(f"m{i}")
            info.size = 10
            tf.addfile(info, io.BytesIO(b"%010d" % i))
    with pytest.raises(ClientError) as e:
        gw_a.client().put_object(Bucket="load", Key="batch/x.tar", Body=tar.getvalue(),
                                 Metadata={"snowball-auto-extract": "true"})
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503
    assert "0 of 3 members were written" in e.value.response["Error"]["Message"]
    assert gw_a.client().list_objects_v2(Bucket="load", Prefix="batch/")["KeyCount"] == 0


def admin_cli(gw, *args):
    env = dict(os.environ, PACKRAT_ROOT_ACCESS_KEY=conftest.ROOT_AK, PACKRAT_ROOT_SECRET_KEY=conftest.ROOT_SK)
    return subprocess.run([BIN, "admin", "--endpoint", gw.endpoint, "--output", "json", *args],
                          env=env, capture_output=True, text=True, timeout=120)


def admin_json(gw, *args):
    out = admin_cli(gw, *args)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_admin_jobs_run_on_every_node_through_a_gateway(cluster):
    """`packrat admin compact|scrub|tier run --endpoint GATEWAY` runs the job on every node's
    own store and answers the nodes' figures added up."""
    etcd, nodes, (gw, _) = cluster
    s3 = gw.client()
    s3.create_bucket(Bucket="upkeep")
    for i in range(30):
        s3.put_object(Bucket="upkeep", Key=f"k{i:02d}", Body=os.urandom(3000))
    for i in range(0, 30, 2):
        s3.delete_object(Bucket="upkeep", Key=f"k{i:02d}")
    compacted = admin_json(gw, "compact", "--threshold", "0.9")
    # Every node holds a copy of every object (R=3): 15 live objects and 15 tombstones each,
    # scanned on each of the three nodes.
    assert compacted["objects_scanned"] >= 3 * 15, compacted
    # These nodes keep plain copies (no --ec): each node's answer comes through as it is.
    out = admin_cli(gw, "scrub")
    assert out.returncode != 0 and "scrub needs erasure coding" in out.stderr, out.stderr
    tier = admin_json(gw, "tier", "run")
    assert tier["objects_unreadable"] == 0 and tier["lifecycle_expirations"] == 0, tier
    for i in range(1, 30, 2):
        assert len(s3.get_object(Bucket="upkeep", Key=f"k{i:02d}")["Body"].read()) == 3000


def test_batch_get_and_epoch_streams_through_a_gateway(cluster):
    """packrat's read extensions through a gateway: a batch GET's items (and an epoch stream's
    samples) are read by committed replicas of their PGs, each node its share through its own
    batch reader, and emitted in order; TAR members are located by the node that reads them."""
    etcd, nodes, (gw_a, gw_b) = cluster
    a = gw_a.client()
    a.create_bucket(Bucket="feed")
    # Small objects, one past the size a lookup alone brings (64 KiB) and one past what the
    # gateway takes whole from a node's answer (1 MiB: streamed through).
    bodies = {f"train/{i:04d}.bin": os.urandom(200 + i * 13) for i in range(200)}
    bodies["train/big.bin"] = os.urandom(100 * 1024)
    bodies["train/huge.bin"] = os.urandom(3 * 1024 * 1024 + 5)
    for k, v in bodies.items():
        a.put_object(Bucket="feed", Key=k, Body=v)
    pc = gw_b.packrat()
    items = ["train/0007.bin", "train/missing.bin", "train/huge.bin",
             {"key": "train/big.bin", "range": "bytes=10-19", "tag": "r"}, "train/0199.bin"]
    got = list(pc.batch_get("feed", items))
    assert [s.name for s in got] == ["train/0007.bin", "train/missing.bin", "train/huge.bin",
                                     "train/big.bin", "train/0199.bin"]
    assert got[0].data == bodies["train/0007.bin"] and got[0].etag == hashlib.md5(bodies["train/0007.bin"]).hexdigest()
    assert got[1].error[0] == "NoSuchKey" and not got[1].data
    assert got[2].data == bodies["train/huge.bin"]
    assert got[3].data == bodies["train/big.bin"][10:20] and got[3].tag == "r"
    assert got[4].data == bodies["train/0199.bin"]
    # TAR members: the node reading them indexes the archive on first use; through either
    # gateway, a second time from the kept index.
    members = {"a.jpg": os.urandom(100_000), "a.cls": b"7", "b.jpg": os.urandom(3000)}
    tar = io.BytesIO()
    with tarfile.open(fileobj=tar, mode="w") as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    a.put_object(Bucket="feed", Key="shards/s.tar", Body=tar.getvalue())
    items = [{"key": "shards/s.tar", "member": m} for m in members]
    items += [{"key": "shards/s.tar", "member": "a.jpg", "range": "bytes=5-9"},
              {"key": "shards/s.tar", "member": "c.jpg"}]
    for gw in (gw_a, gw_b, gw_a):
        got = list(gw.packrat().batch_get("feed", items))
        assert [s.name for s in got] == [f"shards/s.tar/{m}" for m in [*members, "a.jpg", "c.jpg"]]
        assert [s.data for s in got[:3]] == list(members.values())
        assert got[3].data == members["a.jpg"][5:10] and got[4].error[0] == "NoSuchKey"
    from packrat_client import InvalidRequest
    with pytest.raises(InvalidRequest) as e:
        list(pc.batch_get("feed", [{"key": "train/0001.bin", "member": "x"}]))
    assert e.value.status == 400 and "not a TAR archive" in str(e.value)
    # An epoch over two ranks: every object exactly once, each rank the same count, the same
    # order again for the same seed and epoch, another for the next epoch.
    ranks = [list(pc.stream_epoch("feed", prefix="train/", shard=(r, 2), seed=7, tail="drop")) for r in range(2)]
    seen = [s.name for rank in ranks for s in rank]
    assert len(ranks[0]) == len(ranks[1]) == len(bodies) // 2
    assert sorted(seen) == sorted(bodies)
    assert all(s.data == bodies[s.name] for rank in ranks for s in rank)
    again = [s.name for s in pc.stream_epoch("feed", prefix="train/", shard=(0, 2), seed=7, tail="drop")]
    assert again == [s.name for s in ranks[0]]
    other = [s.name for s in pc.stream_epoch("feed", prefix="train/", shard=(0, 2), seed=7, epoch=1, tail="drop")]
    assert other != again
    # A batch larger than one request per node (2,048 items): each node's later requests are
    # sent in their turn; in request order and in storage order, every item exactly once.
    many = [f"train/{i % 200:04d}.bin" for i in range(7000)]
    t0 = time.time()
    got = list(pc.batch_get("feed", many))
    assert [s.name for s in got] == many
    assert all(s.data == bodies[s.name] for s in got)
    print(f"batch GET of 7,000 items (3+ requests per node): {time.time() - t0:.2f} s")
    got = list(pc.batch_get("feed", many + ["train/missing.bin"], order="storage"))
    assert sorted(s.name for s in got) == sorted(many + ["train/missing.bin"])
    assert all(s.data == bodies[s.name] for s in got if s.name != "train/missing.bin")
    # A node dies while its answer streams (the gateway has sent some of its entries, and is
    # held back by the client): the rest of its items are looked up alone, and the batch is
    # whole, with no retry by the client (one attempt: a cut answer would raise).
    from packrat_client import PackratClient, RetryPolicy
    once = PackratClient(endpoint_url=gw_b.endpoint, region_name=conftest.REGION,
                         aws_access_key_id=conftest.ROOT_AK, aws_secret_access_key=conftest.ROOT_SK,
                         retry=RetryPolicy(attempts=1))
    # 1,500 items of 100 KiB: each node's share (50 MB) is far more than the connections
    # between the gateway and the node hold, so the dead node's answer is cut mid-way.
    heavy = ["train/big.bin", "train/0003.bin"] * 750
    streaming = once.batch_get("feed", heavy)
    seen = 0
    for s in streaming:
        assert s.name == heavy[seen] and s.data == bodies[s.name], (seen, s.name, s.error)
        seen += 1
        if seen == 100:
            nodes[2].kill9()
    assert seen == len(heavy)
    # The gateway's map still names the dead node: the keys it is asked for fail as a
    # request and are looked up alone, on the surviving replicas.
    small = [f"train/{i:04d}.bin" for i in range(200)]
    t0 = time.time()
    got = list(pc.batch_get("feed", small))
    assert [s.name for s in got] == small
    assert all(s.data == bodies[s.name] for s in got), [s.name for s in got if s.data != bodies[s.name]][:3]
    print(f"batch GET of 200 objects with a replica just killed: {time.time() - t0:.2f} s")


def test_batch_get_reads_acknowledged_writes_while_keys_are_overwritten(cluster):
    """Batch GET through one gateway while two writers overwrite the same keys through the
    other: every entry is a whole version that was written (never torn, never another key's
    bytes: the per-node answers are split by key correctly), and never older than the newest
    version acknowledged before the batch was asked (read-after-write, item by item)."""
    etcd, nodes, (gw_a, gw_b) = cluster
    a = gw_a.client()
    a.create_bucket(Bucket="hot")
    keys = [f"k/{i:03d}" for i in range(60)]

    def version(key, v):
        return versioned_body(key, v, 1 + v % 5)

    def parse(key, data):
        return version_of(key, data, version)

    acked = {k: 0 for k in keys}
    for k in keys:
        a.put_object(Bucket="hot", Key=k, Body=version(k, 0))
    stop = threading.Event()
    lock = threading.Lock()
    pool = concurrent.futures.ThreadPoolExecutor(2)
    writers = [pool.submit(overwrite_in_turn, gw_a, "hot", keys[w::2], version, acked, lock, stop)
               for w in range(2)]
    pc = gw_b.packrat()
    batches = 0
    deadline = time.time() + 6
    try:
        while time.time() < deadline:
            with lock:
                floor = dict(acked)
            # Every other batch names each key 40 times: more than one request per node, the
            # later ones sent in their turn, after keys they name were refused at planning.
            asked = keys if batches % 2 == 0 else keys * 40
            got = list(pc.batch_get("hot", asked))
            assert [s.name for s in got] == asked
            for s in got:
                assert s.error is None, (s.name, s.error)
                v = parse(s.name, s.data)
                assert v >= floor[s.name], (s.name, v, floor[s.name], "an acknowledged write not read")
            batches += 1
    finally:
        stop.set()
        for f in writers:
            f.result()
    print(f"{batches} batches of {len(keys)} keys read while about {sum(acked.values())} overwrites landed")
    assert batches >= 5 and sum(acked.values()) >= 100


def gateway_counter(gw, name):
    text = urllib.request.urlopen(gw.endpoint + "/metrics", timeout=5).read().decode()
    m = re.search(rf"^{name} (\d+)$", text, re.M)
    assert m, f"{name} not in the gateway's metrics"
    return int(m.group(1))


def prepared_get_load(gw, bucket, keys):
    """A `packrat bench` GET load through `gw` (the command, to add its connections and
    duration to, and its environment), its `keys` objects of 4 KiB in `bucket` written."""
    env = dict(os.environ, AWS_ACCESS_KEY_ID=conftest.ROOT_AK, AWS_SECRET_ACCESS_KEY=conftest.ROOT_SK)
    load = [BIN, "bench", "--endpoint", gw.endpoint, "--bucket", bucket, "--keys", str(keys),
            "--size", "4KiB", "--workload", "get"]
    out = subprocess.run(load + ["--prepare", "--ops", "0", "--concurrency", "8"],
                         capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    return load, env


def test_gets_gathered_per_node_read_acknowledged_writes(cluster):
    """GETs and HEADs from many clients through one gateway, while two writers overwrite the
    keys through the other: the gateway gathers the lookups waiting for a node into one
    request (counted in its metrics), and every answer is still the right one: whole bytes of
    the key asked, small (inline) and large objects alike, never older than what was
    acknowledged before the GET, 404 for a key that does not exist. The readers go on until
    gathered lookups have also been sent back alone (a dirty copy met while a write was under
    way), so both ways of answering are checked."""
    etcd, nodes, (gw_a, gw_b) = cluster
    a = gw_a.client()
    a.create_bucket(Bucket="gather")
    keys = [f"k/{i:03d}" for i in range(48)]

    def version(key, v):
        # Every fourth key is past the inline limit (64 KiB): its bytes are a second request.
        return versioned_body(key, v, (30 if int(key[2:]) % 4 else 1100) + v % 3)

    def parse(key, data):
        return version_of(key, data, version)

    acked = {k: 0 for k in keys}
    for k in keys:
        a.put_object(Bucket="gather", Key=k, Body=version(k, 0))
    # Python's clients alone rarely have more than two lookups under way at one node, so a
    # load from `packrat bench` (another bucket, 32 connections) keeps the nodes' queues full;
    # the checked GETs are gathered with its lookups.
    load, env = prepared_get_load(gw_b, "load", 400)
    bench = subprocess.Popen(load + ["--concurrency", "32", "--duration", "120s"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    before = gateway_counter(gw_b, "packrat_cluster_lookups_gathered_total")
    stop = threading.Event()
    lock = threading.Lock()
    reads = [0]

    def reader(r):
        c = gw_b.client()
        i = r
        while not stop.is_set():
            i += 7
            k = keys[i % len(keys)]
            with lock:
                floor = acked[k]
            if i % 5 == 0:
                with pytest.raises(ClientError) as e:
                    c.head_object(Bucket="gather", Key=f"missing/{i}")
                assert e.value.response["Error"]["Code"] == "404"
                continue
            v = parse(k, c.get_object(Bucket="gather", Key=k)["Body"].read())
            assert v >= floor, (k, v, floor, "an acknowledged write not read")
            with lock:
                reads[0] += 1

    pool = concurrent.futures.ThreadPoolExecutor(14)
    work = [pool.submit(overwrite_in_turn, gw_a, "gather", keys[w::2], version, acked, lock, stop)
            for w in range(2)] + [pool.submit(reader, r) for r in range(12)]
    try:
        wait_for("gathered lookups sent back alone",
                 lambda: gateway_counter(gw_b, "packrat_cluster_lookups_gathered_alone_total") > 0
                 or any(f.done() for f in work), timeout=40)
        time.sleep(1)
    finally:
        stop.set()
        bench.terminate()
        bench.wait(timeout=30)
        for f in work:
            f.result()
    gathered = gateway_counter(gw_b, "packrat_cluster_lookups_gathered_total") - before
    requests = gateway_counter(gw_b, "packrat_cluster_gathered_requests_total")
    alone = gateway_counter(gw_b, "packrat_cluster_lookups_gathered_alone_total")
    print(f"{reads[0]} GETs checked; {gathered} lookups gathered in {requests} requests, {alone} then asked alone")
    assert alone > 0
    assert gathered > requests > 0


def gathered_answer(node, secret, epoch, bid, key, pgs, codec):
    """A node's answer to one gathered request (`POST /g`) of `key` under every PG in turn
    (only its own PG finds it; the others come back to be asked alone), asked with or without
    binary metadata: the (status, body) pair."""
    body = b"".join(bid.to_bytes(8, "big") + pg.to_bytes(4, "big") + (65536).to_bytes(8, "big")
                    + len(key.encode()).to_bytes(4, "big") + key.encode() for pg in range(pgs))
    headers = {"x-packrat-cluster-secret": secret, "x-packrat-epoch": str(epoch)}
    if codec:
        headers["x-packrat-meta-codec"] = codec
    req = urllib.request.Request(f"http://{node.listen}/g", method="POST", data=body, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_gathered_lookups_answer_binary_metadata_only_when_asked(cluster):
    """A gateway asks for a gathered lookup's metadata in binary (`x-packrat-meta-codec: 1`);
    a node answers binary (kinds 4 and 5) only to a request that asks, and JSON (kinds 0 and
    1) otherwise, so a gateway from before the codec still reads a newer node. Both carry the
    same object: its size, and its bytes inline."""
    etcd, nodes, (gw_a, _) = cluster
    a = gw_a.client()
    a.create_bucket(Bucket="codec")
    data = b"gathered bytes " * 10
    a.put_object(Bucket="codec", Key="k", Body=data)
    secret = etcd_value(etcd.url, "/packrat/secret")
    bid = json.loads(etcd_value(etcd.url, "/packrat/buckets/codec"))["id"]
    # Epoch 0 is older than any map: the refusal tells the node's epoch.
    status, body = gathered_answer(nodes[0], secret, 0, bid, "k", PGS, None)
    assert status == 409, (status, body[:200])
    epoch = json.loads(body)["epoch"]
    for codec, found_kind in [(None, 1), ("1", 5)]:
        status, body = gathered_answer(nodes[0], secret, epoch, bid, "k", PGS, codec)
        assert status == 200, (status, body[:200])
        kinds, at = [], 0
        found = None
        while at < len(body):
            kind = body[at]
            n = int.from_bytes(body[at + 1:at + 5], "big")
            count = int.from_bytes(body[at + 5:at + 13], "big")
            text = body[at + 13:at + 13 + n]
            inline = body[at + 13 + n:at + 13 + n + count]
            kinds.append(kind)
            if kind in (0, 1, 4, 5):
                found = (kind, text, inline)
            at += 13 + n + count
        assert len(kinds) == PGS, kinds
        # One PG holds the key; every other answer sends its lookup back to be asked alone.
        assert sorted(kinds) == sorted([found_kind] + [3] * (PGS - 1)), sorted(set(kinds))
        kind, text, inline = found
        assert inline == data
        if kind == 1:
            assert json.loads(text)["size"] == len(data)
        else:
            assert int.from_bytes(text[:8], "big") == len(data)


def node_counter(node, name):
    text = urllib.request.urlopen(f"http://{node.listen}/metrics", timeout=5).read().decode()
    m = re.search(rf"^{name} (\d+)$", text, re.M)
    assert m, f"{name} not in {node.listen}'s metrics"
    return int(m.group(1))


def test_writes_relayed_together_are_each_answered_as_alone(cluster):
    """Under a load of small PUTs (`packrat bench`, 32 connections), the gateway relays the
    writes waiting for a head in one request, and each node the steps waiting for its
    successor (both counted in their metrics). Every write among them is still answered as it
    would be alone: the bytes written read back through the other gateway, a conditional write
    on an existing key fails with 412 and one on a new key succeeds once, a delete leaves 404,
    a body past the relay's limit (64 KiB) goes alone, and the load itself sees no error."""
    etcd, nodes, (gw_a, gw_b) = cluster
    a, b = gw_a.client(), gw_b.client()
    b.create_bucket(Bucket="relay")
    env = dict(os.environ, AWS_ACCESS_KEY_ID=conftest.ROOT_AK, AWS_SECRET_ACCESS_KEY=conftest.ROOT_SK)
    bench = subprocess.Popen([BIN, "bench", "--endpoint", gw_b.endpoint, "--bucket", "load",
                              "--keys", "2000", "--size", "4KiB", "--workload", "put",
                              "--concurrency", "32", "--duration", "12s", "--json"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    stop = threading.Event()
    written = {}
    lock = threading.Lock()

    def writer(w):
        c = gw_b.client()
        i = 0
        while not stop.is_set():
            i += 1
            k = f"w{w}/{i:05d}"
            body = hashlib.sha256(k.encode()).digest() * (4 if i % 9 else 2100)
            c.put_object(Bucket="relay", Key=k, Body=body)
            with pytest.raises(ClientError) as e:
                c.put_object(Bucket="relay", Key=k, Body=b"other", IfNoneMatch="*")
            assert e.value.response["Error"]["Code"] == "PreconditionFailed", e.value.response
            if i % 4 == 0:
                c.delete_object(Bucket="relay", Key=k)
                body = None
            with lock:
                written[k] = body

    pool = concurrent.futures.ThreadPoolExecutor(6)
    work = [pool.submit(writer, w) for w in range(6)]
    try:
        out, err = bench.communicate(timeout=90)
    finally:
        stop.set()
        bench.kill()
        for f in work:
            f.result()
    assert bench.returncode == 0, err
    report = json.loads(out.strip().splitlines()[-1])
    assert report["errors"] == 0 and report["ops"] > 1000, report
    # A conditional create of a new key, from many clients at once: exactly one succeeds.
    def create(i):
        try:
            b.put_object(Bucket="relay", Key="once", Body=f"{i}".encode(), IfNoneMatch="*")
            return i
        except ClientError as e:
            assert e.response["Error"]["Code"] in ("PreconditionFailed", "ConditionalRequestConflict"), e.response
            return None

    won = [i for i in pool.map(create, range(16)) if i is not None]
    assert len(won) == 1, won
    assert a.get_object(Bucket="relay", Key="once")["Body"].read() == f"{won[0]}".encode()
    assert_acknowledged(a, "relay", written)
    relayed = gateway_counter(gw_b, "packrat_cluster_writes_relayed_total")
    relays = gateway_counter(gw_b, "packrat_cluster_relay_requests_total")
    steps = sum(node_counter(n, "packrat_node_steps_relayed_total") for n in nodes)
    step_relays = sum(node_counter(n, "packrat_node_relay_requests_total") for n in nodes)
    print(f"{len(written)} keys checked; the gateway relayed {relayed} writes in {relays} requests, "
          f"the nodes {steps} steps in {step_relays}; load: {report}")
    assert relayed > relays > 0 and steps > step_relays > 0


def test_placement_figures():
    r = subprocess.run([BIN, "cluster", "simulate"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    figs = {f["nodes"]: f for f in map(json.loads, r.stdout.splitlines())}
    assert sorted(figs) == [10, 100, 1000]
    assert figs[100]["max_over_mean"] <= 1.05
    for f in figs.values():
        assert f["moved_on_add"] <= f["ideal_on_add"] * 1.1, f
        assert f["moved_on_remove"] <= f["ideal_on_remove"] * 1.1, f


def test_a_hung_node_and_an_etcd_restart_do_not_stop_the_cluster(cluster):
    etcd, nodes, (gw_a, gw_b) = cluster
    c = gw_a.client(read_timeout=60)
    c.create_bucket(Bucket="hang")
    written = {}

    def write_and_read(n, label):
        slowest = 0.0
        for i in range(n):
            key = f"{label}/{i:03d}"
            body = os.urandom(1000 + i)
            t0 = time.time()
            c.put_object(Bucket="hang", Key=key, Body=body)
            written[key] = body
            assert c.get_object(Bucket="hang", Key=key)["Body"].read() == body
            slowest = max(slowest, time.time() - t0)
        return slowest

    write_and_read(30, "before")
    # GETs from 16 connections at once go on through the hang: the gateway gathers the lookups
    # waiting for a node (one gathered request under way while its requests are large), so a
    # node that stops answering must not leave the lookups gathered behind it waiting.
    load, env = prepared_get_load(gw_a, "hangload", 200)
    # A hung machine: the process is stopped, its connections stay open and unanswered.
    hung = nodes[2]
    hung.proc.send_signal(signal.SIGSTOP)
    try:
        bench = subprocess.Popen(load + ["--concurrency", "16", "--duration", "12s", "--json"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        slowest = write_and_read(40, "hung")
        out, err = bench.communicate(timeout=60)
        assert bench.returncode == 0, err
        gets = json.loads(out)
        print(f"slowest PUT+GET while a node hangs: {slowest:.2f} s; GETs from 16 connections: "
              f"{gets['ops']}, errors {gets['errors']}, slowest {gets['latency_us_max'] / 1e6:.2f} s")
        assert slowest < 15, slowest
        assert gets["ops"] > 0 and gets["errors"] == 0, gets
        assert gets["latency_us_max"] < 15e6, gets
        wait_for("the hung node out of the map", lambda: len(status(etcd.url)["nodes"]) == 2, timeout=30)
    finally:
        hung.proc.send_signal(signal.SIGCONT)
    # It finds its lease gone and exits (status 3) for its supervisor to restart it; it then
    # rejoins and catches up.
    assert hung.proc.wait(timeout=30) == 3
    hung.proc = None
    hung.start()
    wait_for("three caught-up replicas of every PG", lambda: healthy(etcd.url, 3), timeout=90)
    # etcd restarts: reads and writes of an existing bucket go on, on the cached map. The
    # restart is shorter than the nodes' fence time (an outage past it stops I/O: see
    # test_an_etcd_outage_past_the_fence_time_stops_io_and_loses_nothing).
    etcd.stop()
    write_and_read(5, "etcd-down")
    etcd.start()
    write_and_read(10, "etcd-back")
    wait_for("a healthy map after etcd's restart", lambda: healthy(etcd.url, 3), timeout=30)
    d = gw_b.client()
    for key, body in written.items():
        assert d.get_object(Bucket="hang", Key=key)["Body"].read() == body, key


def read_back_within(client, bucket, bodies, seconds, started=None):
    """Reads every key of `bodies` back with its bytes, each retried while its PG answers 503
    (it waits for a member or catches up), for up to `seconds` after `started` (default: now):
    the seconds it took."""
    started = started or time.time()
    pending = dict(bodies)
    while pending:
        assert time.time() - started < seconds, \
            f"{len(pending)} of {len(bodies)} objects unreadable after {seconds} s, e.g. {sorted(pending)[:3]}"
        for key in sorted(pending):
            try:
                got = client.get_object(Bucket=bucket, Key=key)["Body"].read()
            except ClientError as e:
                assert e.response["Error"]["Code"] == "ServiceUnavailable", (key, e.response)
                time.sleep(0.2)
                break
            assert got == pending.pop(key), key
    return time.time() - started


def map_incarnations(etcd_url):
    """The incarnation (start time) of each node in the cluster map: a node's changes once the
    manager has taken in its restart."""
    m = json.loads(etcd_value(etcd_url, "/packrat/map"))
    return {i: n["incarnation"] for i, n in m["nodes"].items()}


def put_many(client, bucket, prefix, n):
    """`n` objects of a few hundred random bytes, from 8 threads: their bodies by key."""
    bodies = {f"{prefix}/{i:04d}": os.urandom(200 + i % 300) for i in range(n)}
    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        list(ex.map(lambda kv: client.put_object(Bucket=bucket, Key=kv[0], Body=kv[1]), bodies.items()))
    return bodies


def each_at_once(nodes, what):
    with concurrent.futures.ThreadPoolExecutor(len(nodes)) as ex:
        list(ex.map(what, nodes))


def test_every_node_restarted_at_once_serves_every_object_again(cluster):
    """A power cut: every node stops at once (SIGTERM, then kill -9) and starts again on its
    data directory. Each PG's source is a member that was caught up in its last chain (the
    map keeps who those are while none is back); every object reads back within 60 s of the
    last node being up, and new writes work. Without that, every PG stayed catching up with
    nothing to copy from, and every request hung."""
    etcd, nodes, (gw, _) = cluster
    c = gw.client(read_timeout=30)
    c.create_bucket(Bucket="power")
    bodies = put_many(c, "power", "before", 300)
    for how in ("SIGTERM", "SIGKILL"):
        before = map_incarnations(etcd.url)
        each_at_once(nodes, lambda n: n.stop() if how == "SIGTERM" else n.kill9())
        each_at_once(nodes, lambda n: n.start())
        up = time.time()
        # Until the manager takes the restarts in, the nodes serve by the map they left.
        wait_for("the manager to take in every node's restart",
                 lambda: (now := map_incarnations(etcd.url)).keys() == before.keys()
                 and all(now[i] != before[i] for i in now), timeout=60)
        noticed = time.time() - up
        took = read_back_within(c, "power", bodies, 60, started=up)
        wait_for("three caught-up replicas of every PG", lambda: healthy(etcd.url, 3), timeout=60)
        print(f"every node stopped with {how} and started: restarts in the map after "
              f"{noticed:.1f} s, {len(bodies)} objects read back {took:.1f} s and every PG "
              f"healthy {time.time() - up:.1f} s after the last node was up")
        new = put_many(c, "power", f"after-{how}", 30)
        assert read_back_within(c, "power", new, 5) < 5
        bodies.update(new)
        wait_for("three caught-up replicas of every PG", lambda: healthy(etcd.url, 3), timeout=60)
    assert status(etcd.url)["pgs_waiting"] == []
    assert_acknowledged(gw.client(), "power", bodies)


def test_a_pg_waits_for_its_last_caught_up_member_and_says_so(cluster):
    """Two nodes stop, then the third, the only caught-up member of every chain left. The two
    that went first come back: their copies may lack what the last chains acknowledged, so
    every PG waits (no reads, no writes) and `cluster status` and the gateway's metrics name
    the node it waits for. Once that node is back, it is the source and everything reads
    back."""
    etcd, nodes, (gw, _) = cluster
    c = gw.client(read_timeout=30)
    c.create_bucket(Bucket="wait")
    bodies = put_many(c, "wait", "k", 100)
    last = nodes[0]
    last_id = open(last.data_dir + "/node-id").read().strip()
    each_at_once(nodes[1:], lambda n: n.stop())
    wait_for("chains of the last node alone",
             lambda: all(n["pgs"] == PGS for n in status(etcd.url)["nodes"]) and len(status(etcd.url)["nodes"]) == 1,
             timeout=30)
    last.stop()
    each_at_once(nodes[1:], lambda n: n.start())
    s = wait_for("every PG waiting for the last node",
                 lambda: len((st := status(etcd.url))["pgs_waiting"]) == PGS and st, timeout=30)
    assert s["waited_for"] == {last_id: PGS}, s
    assert all(w["waiting_for"] == [last_id] for w in s["pgs_waiting"]), s["pgs_waiting"][:3]
    m = urllib.request.urlopen(gw.endpoint + "/metrics", timeout=5).read().decode()
    assert f"packrat_cluster_pgs_waiting {PGS}\n" in m
    assert f'packrat_cluster_pgs_waiting_for{{node="{last_id}"}} {PGS}\n' in m
    # Nothing is served from, or written to, a copy that may be partial.
    quick = gw.client(read_timeout=30)
    with pytest.raises(ClientError) as e:
        quick.put_object(Bucket="wait", Key="k/0000", Body=b"over a partial copy")
    assert e.value.response["Error"]["Code"] == "ServiceUnavailable"
    with pytest.raises(ClientError) as e:
        quick.get_object(Bucket="wait", Key="k/0001")
    assert e.value.response["Error"]["Code"] == "ServiceUnavailable"
    last.start()
    took = read_back_within(c, "wait", bodies, 60)
    print(f"{len(bodies)} objects read back {took:.1f} s after the last caught-up node was up")
    wait_for("three caught-up replicas of every PG", lambda: healthy(etcd.url, 3), timeout=60)


def test_an_etcd_outage_past_the_fence_time_stops_io_and_loses_nothing(cluster):
    """etcd stops answering (SIGSTOP: its connections stay open, unanswered, as in a network
    cut) for longer than a node's lease. Each node stops serving once its last confirmed
    renewal is older than the fence time, so requests answer 503 promptly rather than from a
    node that may have been replaced; the gateways' map is unchanged. When etcd answers again
    the leases have lapsed: each node exits (status 3) for its supervisor to start it again,
    and the cluster resumes as after a power cut, with every acknowledged write."""
    etcd, nodes, (gw, _) = cluster
    c = gw.client(read_timeout=30)
    c.create_bucket(Bucket="fence")
    bodies = put_many(c, "fence", "k", 60)
    etcd.proc.send_signal(signal.SIGSTOP)
    frozen = time.time()
    try:
        wait_for("every node fenced",
                 lambda: all(node_counter(n, "packrat_node_fenced") == 1 for n in nodes), timeout=15)
        fenced_after = time.time() - frozen
        # The fence time is 4 s after the last renewal etcd confirmed (sent every 0.5 s).
        assert fenced_after >= 2.5, f"fenced {fenced_after:.1f} s after etcd stopped answering"
        for call in (lambda: c.get_object(Bucket="fence", Key="k/0001"),
                     lambda: c.put_object(Bucket="fence", Key="k/0002", Body=b"while fenced")):
            t0 = time.time()
            with pytest.raises(ClientError) as e:
                call()
            assert e.value.response["Error"]["Code"] == "ServiceUnavailable", e.value.response
            assert time.time() - t0 < 10, "a fenced cluster answers promptly"
        assert sum(node_counter(n, "packrat_node_fenced_requests_total") for n in nodes) > 0
        time.sleep(max(0.0, frozen + 12 - time.time()))
    finally:
        etcd.proc.send_signal(signal.SIGCONT)
    before = map_incarnations(etcd.url)
    for n in nodes:
        assert n.proc.wait(timeout=30) == 3, "a node whose lease lapsed exits with status 3"
        n.proc = None
    each_at_once(nodes, lambda n: n.start())
    up = time.time()
    wait_for("the manager to take in every node's restart",
             lambda: all(i != before[n] for n, i in map_incarnations(etcd.url).items()), timeout=60)
    took = read_back_within(c, "fence", bodies, 60, started=up)
    wait_for("three caught-up replicas of every PG", lambda: healthy(etcd.url, 3), timeout=60)
    print(f"fenced {fenced_after:.1f} s after etcd froze; {len(bodies)} objects read back "
          f"{took:.1f} s and every PG healthy {time.time() - up:.1f} s after the nodes were "
          f"started again")
    new = put_many(c, "fence", "after", 20)
    assert read_back_within(c, "fence", new, 5) < 5


def test_a_rolling_restart_under_load_fails_no_request_and_loses_nothing(cluster):
    """Every node restarted in turn (SIGTERM, start, then the README's wait: until `cluster
    status` shows every PG healthy) while four clients write and read: with the SDK's
    standard retries no request fails, and every acknowledged write reads back."""
    etcd, nodes, (gw, _) = cluster
    gw.client().create_bucket(Bucket="rolling")
    stop = threading.Event()
    acked, failures, lock = {}, [], threading.Lock()

    def load(w):
        c = gw.client(retries={"total_max_attempts": 5, "mode": "standard"}, read_timeout=30)
        i = 0
        while not stop.is_set():
            key, body = f"w{w}/{i:05d}", os.urandom(300 + i % 700)
            try:
                c.put_object(Bucket="rolling", Key=key, Body=body)
                with lock:
                    acked[key] = body
                prev = f"w{w}/{i - 1:05d}"
                if prev in acked:
                    assert c.get_object(Bucket="rolling", Key=prev)["Body"].read() == acked[prev]
            except Exception as e:  # kept and failed on below: no request may fail
                failures.append(f"{key}: {e!r}")
            i += 1

    with concurrent.futures.ThreadPoolExecutor(4) as ex:
        futures = [ex.submit(load, w) for w in range(4)]
        time.sleep(2)
        waits = []
        for n in nodes:
            nid = open(n.data_dir + "/node-id").read().strip()
            t0 = time.time()
            n.stop()
            n.start()

            def back():
                s = healthy(etcd.url, 3)
                return s and any(x["id"] == nid and x["started_ms"] > t0 * 1000 for x in s["nodes"])

            wait_for(f"{nid} back in the map and every PG healthy", back, timeout=120)
            waits.append(round(time.time() - t0, 1))
        time.sleep(2)
        stop.set()
        for f in futures:
            f.result()
    print(f"rolling restart: {len(acked)} writes acknowledged, waits for healthy {waits} s")
    assert not failures, failures[:5]
    assert len(acked) > 100
    assert_acknowledged(gw.client(), "rolling", acked)


def test_a_member_catching_up_keeps_the_writes_it_committed_before_its_source_shows_them(workdir):
    """A member back from a restart catches up while writes go on. Each write is staged at the
    members before it in the chain (visible there only once durable) and committed at once at
    the one catching up; judged against its source's visible copy, such a write looked like
    one that never committed and was dropped there, an acknowledged write lost on one member.
    With every segment sync of the other two members slowed to a second, every write
    acknowledged during the catch-up reads back from every member."""
    etcd, nodes, gws = start_cluster(workdir / "cluster-catchup", node_args=["--fault-injection"])
    try:
        secret = etcd_value(etcd.url, "/packrat/secret")
        c = gws[0].client(retries={"total_max_attempts": 5, "mode": "standard"}, read_timeout=60)
        c.create_bucket(Bucket="catchup")
        back = nodes[2]
        back.stop()
        for n in nodes[:2]:
            store_faults(n, secret, rules=[{"op": "sync", "fault": "slow", "path": "seg-"}])
        stop = threading.Event()
        acked, failures, lock = {}, [], threading.Lock()

        def load(w):
            i = 0
            while not stop.is_set():
                key, body = f"w{w}/{i:04d}", os.urandom(200 + i % 300)
                try:
                    c.put_object(Bucket="catchup", Key=key, Body=body)
                    with lock:
                        acked[key] = body
                except Exception as e:  # kept and failed on below: no request may fail
                    failures.append(f"{key}: {e!r}")
                i += 1

        with concurrent.futures.ThreadPoolExecutor(8) as ex:
            futures = [ex.submit(load, w) for w in range(8)]
            time.sleep(2)
            t0 = time.time()
            back.start()
            nid = open(back.data_dir + "/node-id").read().strip()

            def caught_up():
                s = healthy(etcd.url, 3)
                return s and any(x["id"] == nid and x["started_ms"] > t0 * 1000 for x in s["nodes"])

            wait_for("the restarted member caught up", caught_up, timeout=90)
            time.sleep(1)
            stop.set()
            for f in futures:
                f.result()
        injected = [store_faults(n, secret)["injected"] for n in nodes[:2]]
        for n in nodes[:2]:
            store_faults(n, secret, rules=[])
        assert not failures, failures[:5]
        assert min(injected) > 0, injected
        with open(back.log_path) as f:
            dropped = f.read().count("dropping a copy that never committed")
        print(f"catch-up under slow syncs: {len(acked)} writes acknowledged, "
              f"{dropped} copies dropped as never committed")
        assert len(acked) > 10
        # Consecutive reads of a key go to its PG's members in turn: three see every member.
        for key, body in acked.items():
            got = []
            for _ in range(3):
                try:
                    got.append(c.get_object(Bucket="catchup", Key=key)["Body"].read() == body)
                except ClientError as e:
                    got.append(e.response["Error"]["Code"])
            assert got == [True] * 3, (key, got)
    finally:
        for p in [*gws, *nodes]:
            p.stop()
        etcd.stop()


def test_a_node_drops_a_body_that_stops_and_a_gateway_does_not_ask_etcd_for_every_unknown_name(cluster):
    """Bounded waits inside the cluster: a peer that sends an internal request's head and then
    stops mid-body (hung, or cut off) gets 503 within a hop's time, instead of holding the
    request for as long as the connection lives; and requests naming a bucket or an access key
    etcd does not have do not each read etcd (a gateway remembers the miss briefly, until its
    caches next reload), while a bucket made through another gateway is still seen at once."""
    etcd, nodes, (gw_a, gw_b) = cluster
    secret = etcd_value(etcd.url, "/packrat/secret")
    with socket.create_connection(tuple(nodes[0].listen.rsplit(":", 1)), timeout=15) as s:
        s.sendall(f"POST /w HTTP/1.1\r\nHost: n\r\nx-packrat-cluster-secret: {secret}\r\n"
                  f"Content-Length: 100000\r\n\r\n".encode() + b"x" * 10)
        t0 = time.time()
        answer = s.recv(4096)
        waited = time.time() - t0
    assert answer.startswith(b"HTTP/1.1 503"), answer[:200]
    assert 2.5 < waited < 10, waited
    print(f"a body that stopped after 10 of 100,000 bytes: 503 after {waited:.1f} s")
    a = gw_a.client()
    before = gateway_counter(gw_a, "packrat_cluster_etcd_cache_misses_total")
    for _ in range(50):
        with pytest.raises(ClientError) as e:
            a.head_bucket(Bucket="not-made-yet")
        assert e.value.response["Error"]["Code"] == "404"
    stranger = gw_a.client(ak="PKNOSUCHKEY", sk="x" * 40)
    for _ in range(50):
        with pytest.raises(ClientError) as e:
            stranger.list_buckets()
        assert e.value.response["Error"]["Code"] == "InvalidAccessKeyId"
    asked = gateway_counter(gw_a, "packrat_cluster_etcd_cache_misses_total") - before
    print(f"100 requests naming an unknown bucket or key: {asked} etcd reads")
    assert 2 <= asked <= 8, asked
    gw_b.client().create_bucket(Bucket="not-made-yet")

    def made():
        try:
            return a.head_bucket(Bucket="not-made-yet")["ResponseMetadata"]["HTTPStatusCode"] == 200
        except ClientError as e:
            assert e.response["Error"]["Code"] == "404"
            return False

    wait_for("the bucket made through the other gateway", made, timeout=2)


def verify_offline(node):
    """`packrat admin verify --json` over a stopped node's data directory: its report, after
    checking that every record was found and checked."""
    out = subprocess.run([BIN, "admin", "--data-dir", node.data_dir, "verify", "--json"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout)


def test_add_a_node_and_drain_one_under_load(workdir):
    """A fourth node takes its share of the PGs under load, and the three old nodes then drop
    their copies of the PGs they left (adding a node frees space on the others); one of them
    is drained, the PGs it held go back to the others (some to nodes that had dropped them,
    which copy them again), and every object reads back. Offline, each node left holds every
    object once. Tombstones are kept 2 s here: a PG's copies go that long after it was left."""
    keep = ["--tombstone-keep", "2"]
    base = workdir / "cluster-add-drain"
    etcd, nodes, (gw_a, gw_b) = start_cluster(base, gateways=2, node_args=keep)
    c = gw_a.client(read_timeout=60)
    c.create_bucket(Bucket="move")
    bodies = {f"k/{i:04d}": os.urandom(200 + (i * 53) % 3000) for i in range(300)}
    for k, v in bodies.items():
        c.put_object(Bucket="move", Key=k, Body=v)
    stop = threading.Event()
    errors = []

    def load():
        w = gw_b.client(read_timeout=60)
        i = 0
        while not stop.is_set():
            k = f"live/{i % 50:03d}"
            v = os.urandom(700 + i % 500)
            try:
                w.put_object(Bucket="move", Key=k, Body=v)
                bodies[k] = v
                got = w.get_object(Bucket="move", Key=f"k/{(i * 7) % 300:04d}")["Body"].read()
                assert got == bodies[f"k/{(i * 7) % 300:04d}"]
            except Exception as e:  # noqa: BLE001 - collected and failed on below
                errors.append(repr(e))
            i += 1

    t = threading.Thread(target=load)
    t.start()
    fourth = None
    try:
        fourth = Node(base / "node3", etcd.url, keep).start()
        s = wait_for("four caught-up nodes", lambda: healthy(etcd.url, 4), timeout=90)
        # 64 PGs x 3 replicas over 4 nodes: 48 each, so the new node took exactly its share
        # (a quarter of the replicas moved, the least possible).
        assert sorted(n["pgs"] for n in s["nodes"]) == [48, 48, 48, 48], s
        # Each old node drops its copies of the 16 PGs it left.
        wait_for("the old nodes to drop the PGs they left",
                 lambda: all(node_counter(n, "packrat_node_pgs_dropped_total") == 16 for n in nodes), timeout=60)
        dropped = [node_counter(n, "packrat_node_copies_dropped_total") for n in nodes]
        assert all(d > 0 for d in dropped), dropped
        # An old node restarted knows from its data directory that it dropped those 16 PGs,
        # and the new node that it never held its other 16: after the time a PG left waits
        # before its sweep (2 s, passes every 2 s), neither has swept anything (both used to
        # sweep 16 PGs, finding nothing). The old nodes, their drops done, hold 48 each too.
        nodes[1].stop()
        nodes[1].start()
        wait_for("four caught-up nodes again", lambda: healthy(etcd.url, 4), timeout=90)
        time.sleep(6)
        assert node_counter(fourth, "packrat_node_pgs_dropped_total") == 0
        assert node_counter(fourth, "packrat_node_copies_dropped_total") == 0
        assert node_counter(nodes[1], "packrat_node_pgs_dropped_total") == 0
        assert [node_counter(n, "packrat_node_pgs_held") for n in nodes + [fourth]] == [48] * 4
        drained = s["nodes"][0]["id"]
        # --wait follows the drain to its end (a progress bar on a terminal).
        r = cluster_cmd(etcd.url, "drain", drained, "--wait", "--timeout", "90", timeout=120)
        assert r.returncode == 0 and f"{drained} drained: 48 PGs moved" in r.stdout, r.stdout + r.stderr
        s = wait_for("the drained node out of every chain", lambda: healthy(etcd.url, 3), timeout=90)
        assert drained not in [n["id"] for n in s["nodes"]]
        assert sorted(n["pgs"] for n in s["nodes"]) == [64, 64, 64], s
    finally:
        stop.set()
        t.join()
    assert not errors, errors[:3]
    r = cluster_cmd(etcd.url, "remove-node", drained)
    assert r.returncode == 0, r.stderr
    left = [n for n in nodes + [fourth] if drained not in open(n.data_dir + "/node-id").read()]
    d = gw_a.client()
    for k, v in bodies.items():
        assert d.get_object(Bucket="move", Key=k)["Body"].read() == v, k
    for p in [gw_a, gw_b, *nodes, fourth]:
        p.stop()
    etcd.stop()
    # Each node left holds every PG (three nodes, R=3): every object once, those of PGs it
    # had dropped copied back.
    for n in left:
        report = verify_offline(n)
        assert report["objects"] == len(bodies), (n.data_dir, report)


def test_a_delete_is_not_undone_by_a_node_away_longer_than_its_tombstone(workdir):
    # Tombstones kept 1 s: the node that was away catches up after they are gone, and must
    # learn of the delete from the object's absence.
    etcd, nodes, (gw,) = start_cluster(workdir / "cluster-tombstones", node_args=["--tombstone-keep", "1"],
                                       node_env={"PACKRAT_LOG": "info,packrat_cluster=debug"})
    try:
        c = gw.client(read_timeout=60)
        c.create_bucket(Bucket="tomb")
        for i in range(20):
            c.put_object(Bucket="tomb", Key=f"k{i:02d}", Body=b"old %d" % i)
        away = nodes[2]
        away.kill9()
        wait_for("the map without the node", lambda: len(status(etcd.url)["nodes"]) == 2, timeout=30)
        for i in range(10):
            c.delete_object(Bucket="tomb", Key=f"k{i:02d}")
        wait_for("the tombstones collected", lambda: all(
            "collected" in open(n.log_path).read() for n in nodes[:2]), timeout=30)
        away.start()
        wait_for("three caught-up replicas of every PG", lambda: healthy(etcd.url, 3), timeout=90)
        # Only the node that was away is left to answer.
        nodes[0].kill9()
        nodes[1].kill9()
        wait_for("the returned node alone", lambda: len(status(etcd.url)["nodes"]) == 1, timeout=30)
        for i in range(20):
            if i < 10:
                with pytest.raises(ClientError) as e:
                    c.head_object(Bucket="tomb", Key=f"k{i:02d}")
                assert e.value.response["Error"]["Code"] == "404", i
            else:
                assert c.get_object(Bucket="tomb", Key=f"k{i:02d}")["Body"].read() == b"old %d" % i
    finally:
        for p in [gw, *nodes]:
            p.stop()
        etcd.stop()


def test_versions_made_while_a_node_was_away_are_served_by_it_alone(workdir):
    """Versioning through a cluster: every replica keeps a key's versions under the same ids.
    While a node is away, keys get new versions, delete markers, a multipart version and a
    suspended write's null version, and one version is deleted by id; the node comes back and
    catches up on each key's history (copying what it lacks, removing the deleted version).
    Then it is left alone, and answers every version (by id, byte for byte), every delete
    marker and the listing exactly as the full cluster did. Object Lock changes made while it
    was away (a legal hold, retention lengthened, shortened with the bypass, a version removed
    with the bypass) are caught up too: a lock changes no ETag or date, so only comparing
    the locks themselves finds them; edited in place, no bytes copied again. So are tag sets
    changed by version id (of an older version, of the current one, and one emptied), for the
    same reason. And object ACLs changed while it was away on a version then superseded: the
    version it copies again carries the ACL as changed (a grant taken back stays taken back)."""
    etcd, nodes, (gw,) = start_cluster(workdir / "cluster-versions")
    try:
        c = gw.client(read_timeout=60)
        c.create_bucket(Bucket="hist")
        c.create_bucket(Bucket="held", ObjectLockEnabledForBucket=True)
        now = datetime.datetime.now(datetime.timezone.utc)
        later = {n: now + datetime.timedelta(hours=n) for n in (1, 2, 3)}
        held = {f"L{i}": c.put_object(Bucket="held", Key=f"L{i}", Body=b"held %d" % i, ObjectLockMode="GOVERNANCE",
                                      ObjectLockRetainUntilDate=later[2])["VersionId"] for i in range(4)}
        c.put_object(Bucket="hist", Key="plain", Body=b"before versioning")
        c.put_bucket_versioning(Bucket="hist", VersioningConfiguration={"Status": "Enabled"})
        versions = {"plain": {"null": b"before versioning"}}  # key -> id -> bytes (None: marker)
        latest = {"plain": "null"}

        def put(key, body):
            vid = c.put_object(Bucket="hist", Key=key, Body=body)["VersionId"]
            versions.setdefault(key, {})[vid] = body
            latest[key] = vid

        for i in range(12):
            put(f"k{i:02d}", b"one %d" % i)
        put("plain", b"after versioning")
        doomed = latest["k00"]
        first = dict(latest)
        c.put_object_tagging(Bucket="hist", Key="k03", VersionId=first["k03"],
                             Tagging={"TagSet": [{"Key": "before", "Value": "1"}]})
        c.put_bucket_ownership_controls(Bucket="hist", OwnershipControls={"Rules": [{"ObjectOwnership": "ObjectWriter"}]})
        acl_first = {}
        for key, acl in (("acl-shut", "public-read"), ("acl-open", "private")):
            acl_first[key] = c.put_object(Bucket="hist", Key=key, Body=key.encode(), ACL=acl)["VersionId"]
            versions[key] = {acl_first[key]: key.encode()}
            latest[key] = acl_first[key]

        def anonymous(key, vid):
            try:
                with urllib.request.urlopen(f"{gw.endpoint}/hist/{key}?versionId={vid}", timeout=30) as r:
                    return r.status
            except urllib.error.HTTPError as e:
                return e.code

        assert (anonymous("acl-shut", acl_first["acl-shut"]), anonymous("acl-open", acl_first["acl-open"])) == (200, 403)
        away = nodes[2]
        away.kill9()
        wait_for("the map without the node", lambda: len(status(etcd.url)["nodes"]) == 2, timeout=30)
        for i in range(12):
            put(f"k{i:02d}", b"two %d" % i)
        for i in range(0, 12, 4):
            d = c.delete_object(Bucket="hist", Key=f"k{i:02d}")
            assert d["DeleteMarker"] is True
            versions[f"k{i:02d}"][d["VersionId"]] = None
            latest[f"k{i:02d}"] = d["VersionId"]
        c.delete_object(Bucket="hist", Key="k00", VersionId=doomed)
        del versions["k00"][doomed]
        parts = [os.urandom(5 * 1024 * 1024), os.urandom(1000)]
        uid = c.create_multipart_upload(Bucket="hist", Key="k05")["UploadId"]
        etags = [c.upload_part(Bucket="hist", Key="k05", UploadId=uid, PartNumber=n + 1, Body=p)["ETag"]
                 for n, p in enumerate(parts)]
        done = c.complete_multipart_upload(Bucket="hist", Key="k05", UploadId=uid, MultipartUpload={
            "Parts": [{"PartNumber": n + 1, "ETag": e} for n, e in enumerate(etags)]})
        versions["k05"][done["VersionId"]] = b"".join(parts)
        latest["k05"] = done["VersionId"]
        c.put_bucket_versioning(Bucket="hist", VersioningConfiguration={"Status": "Suspended"})
        put("k01", b"the null version")
        assert latest["k01"] == "null"
        c.put_object_legal_hold(Bucket="held", Key="L0", VersionId=held["L0"], LegalHold={"Status": "ON"})
        c.put_object_retention(Bucket="held", Key="L1", VersionId=held["L1"],
                               Retention={"Mode": "COMPLIANCE", "RetainUntilDate": later[3]})
        c.put_object_retention(Bucket="held", Key="L2", VersionId=held["L2"], BypassGovernanceRetention=True,
                               Retention={"Mode": "GOVERNANCE", "RetainUntilDate": later[1]})
        c.delete_object(Bucket="held", Key="L3", VersionId=held["L3"], BypassGovernanceRetention=True)
        tagged = {("k02", first["k02"]): [{"Key": "older", "Value": "away"}],
                  ("k06", latest["k06"]): [{"Key": "current", "Value": "away"}]}
        for (key, vid), tags in tagged.items():
            c.put_object_tagging(Bucket="hist", Key=key, VersionId=vid, Tagging={"TagSet": tags})
        c.delete_object_tagging(Bucket="hist", Key="k03", VersionId=first["k03"])
        tagged[("k03", first["k03"])] = []
        c.put_object_acl(Bucket="hist", Key="acl-shut", ACL="private")
        c.put_object_acl(Bucket="hist", Key="acl-open", ACL="public-read")
        for key in ("acl-shut", "acl-open"):
            put(key, b"superseding " + key.encode())
        away.start()
        wait_for("three caught-up replicas of every PG", lambda: healthy(etcd.url, 3), timeout=90)
        # Versions whose tags or lock alone changed are edited in place, not dropped to be
        # copied again (the one removed by id with the bypass, L3, is dropped).
        removed = "".join(line for line in open(away.log_path) if "removing a version" in line)
        edited = [vid for (_, vid) in tagged] + [held[k] for k in ("L0", "L1", "L2")]
        assert not [vid for vid in edited if f'version="{vid}"' in removed], removed
        assert f'version="{held["L3"]}"' in removed, removed
        nodes[0].kill9()
        nodes[1].kill9()
        wait_for("the returned node alone", lambda: len(status(etcd.url)["nodes"]) == 1, timeout=30)
        listed, kw = {}, {}
        while True:
            page = c.list_object_versions(Bucket="hist", MaxKeys=7, **kw)
            for v in page.get("Versions", []):
                listed.setdefault(v["Key"], {})[v["VersionId"]] = (v["IsLatest"], False)
            for m in page.get("DeleteMarkers", []):
                listed.setdefault(m["Key"], {})[m["VersionId"]] = (m["IsLatest"], True)
            if not page["IsTruncated"]:
                break
            kw = {"KeyMarker": page["NextKeyMarker"], "VersionIdMarker": page.get("NextVersionIdMarker", "")}
            if not kw["VersionIdMarker"]:
                del kw["VersionIdMarker"]
        assert listed == {k: {vid: (latest[k] == vid, body is None) for vid, body in vs.items()}
                          for k, vs in versions.items()}
        for key, vs in versions.items():
            for vid, body in vs.items():
                if body is None:
                    with pytest.raises(ClientError) as e:
                        c.get_object(Bucket="hist", Key=key, VersionId=vid)
                    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 405, (key, vid)
                    continue
                got = c.get_object(Bucket="hist", Key=key, VersionId=vid)
                assert got["Body"].read() == body and got["VersionId"] == vid, (key, vid)
            if versions[key][latest[key]] is None:
                with pytest.raises(ClientError) as e:
                    c.head_object(Bucket="hist", Key=key)
                assert e.value.response["Error"]["Code"] == "404"
            else:
                got = c.get_object(Bucket="hist", Key=key)
                assert got["Body"].read() == versions[key][latest[key]] and got["VersionId"] == latest[key]
        locks = {}
        for key in ("L0", "L1", "L2"):
            h = c.head_object(Bucket="held", Key=key, VersionId=held[key])
            locks[key] = (h["ObjectLockMode"], h["ObjectLockRetainUntilDate"].replace(microsecond=0),
                          h.get("ObjectLockLegalHoldStatus"))
        assert locks == {"L0": ("GOVERNANCE", later[2].replace(microsecond=0), "ON"),
                         "L1": ("COMPLIANCE", later[3].replace(microsecond=0), None),
                         "L2": ("GOVERNANCE", later[1].replace(microsecond=0), None)}
        assert "Versions" not in c.list_object_versions(Bucket="held", Prefix="L3")
        for (key, vid), tags in tagged.items():
            got = c.get_object_tagging(Bucket="hist", Key=key, VersionId=vid)
            assert (got["TagSet"], got["VersionId"]) == (tags, vid), key
        assert (anonymous("acl-shut", acl_first["acl-shut"]), anonymous("acl-open", acl_first["acl-open"])) == (403, 200)
    finally:
        for p in [gw, *nodes]:
            p.stop()
        etcd.stop()


def test_a_node_back_within_the_grace_period_takes_its_places_back(workdir):
    """A node that goes away (a reboot, an upgrade) keeps its places for `--rereplicate-after`
    seconds: its chains run a member short and nothing is copied elsewhere; back in time, it
    rejoins the PGs it held and copies only what it missed. A node gone for longer has its
    replicas made on the others."""
    etcd, nodes, (gw,) = start_cluster(workdir / "cluster-grace", nodes=4, node_env={"PACKRAT_LOG": "info"})
    try:
        r = cluster_cmd(etcd.url, "set", "--rereplicate-after", "120")
        assert r.returncode == 0, r.stderr
        assert status(etcd.url)["rereplicate_after_s"] == 120
        c = gw.client(read_timeout=60)
        c.create_bucket(Bucket="grace")
        bodies = {f"k/{i:03d}": os.urandom(100 + i) for i in range(200)}
        for k, v in bodies.items():
            c.put_object(Bucket="grace", Key=k, Body=v)
        assert sorted(n["pgs"] for n in status(etcd.url)["nodes"]) == [48] * 4
        away = nodes[3]
        away_id = open(away.data_dir + "/node-id").read().strip()
        away.kill9()
        s = wait_for("the node away", lambda: (st := status(etcd.url))["away"] and st, timeout=30)
        assert [a["id"] for a in s["away"]] == [away_id], s
        assert s["away"][0]["pgs_kept"] == 48, s
        assert 100 <= s["away"][0]["rereplicated_in_s"] <= 120, s
        # Nothing was copied to the other three: the 48 PGs the node held run on two members.
        assert sorted(n["pgs"] for n in s["nodes"]) == [48] * 3, s
        assert s["pgs_degraded"] == 48, s
        # The gateway's metrics say so, for an operator's alert.
        def metrics_with_away():
            m = urllib.request.urlopen(gw.endpoint + "/metrics", timeout=5).read().decode()
            return m if "packrat_cluster_nodes_away 1\n" in m else None

        metrics = wait_for("the gateway's map with the node away", metrics_with_away, timeout=10)
        assert "packrat_cluster_pgs_degraded 48\n" in metrics, metrics
        # Writes go on meanwhile (two members take them); every other one SSE-S3, whose ETag
        # is its plaintext's MD5, not the stored ciphertext's that a copy is checked against.
        changed = [f"k/{i:03d}" for i in range(0, 200, 10)]
        sealed = changed[::2]
        for k in changed:
            bodies[k] = os.urandom(300)
            # A client's metadata under the names nodes keep their own entries under is
            # dropped: it passes neither for a version nor for the stored bytes' MD5 (the
            # copies below would fail their checks).
            sse = ({"ServerSideEncryption": "AES256"} if k in sealed else
                   {"Metadata": {"packrat-md5": "0" * 32, "packrat-cv": "9" * 18, "mine": "kept"}})
            put = c.put_object(Bucket="grace", Key=k, Body=bodies[k], **sse)
            assert put["ETag"] == '"%s"' % hashlib.md5(bodies[k]).hexdigest(), k
        deleted = [f"k/{i:03d}" for i in range(5, 200, 40)]
        for k in deleted:
            c.delete_object(Bucket="grace", Key=k)
            del bodies[k]
        time.sleep(2)  # four of the manager's rounds
        s = status(etcd.url)
        assert sorted(n["pgs"] for n in s["nodes"]) == [48] * 3 and len(s["away"]) == 1, s
        mark = os.path.getsize(away.log_path)
        t0 = time.time()
        away.start()
        s = wait_for("four caught-up nodes", lambda: healthy(etcd.url, 4), timeout=90)
        print(f"back and caught up on 48 PGs in {time.time() - t0:.1f} s")
        assert sorted(n["pgs"] for n in s["nodes"]) == [48] * 4 and s["away"] == [], s
        with open(away.log_path) as f:
            f.seek(mark)
            copied = [int(n) for n in re.findall(r"caught up.*objects=(\d+)", f.read())]
        # It caught up on each of its 48 PGs, and copied the overwritten objects among them,
        # not the ~150 it holds.
        assert len(copied) == 48, copied
        assert 1 <= sum(copied) <= len(changed), copied
        # An edit keeps the stored bytes' MD5 with them: the copies made below check it.
        for k in sealed:
            c.put_object_tagging(Bucket="grace", Key=k, Tagging={"TagSet": [{"Key": "t", "Value": "1"}]})
        # Gone for longer than the grace period: its replicas are made on the others. Another
        # node goes, so that reads come from the one that came back too. The period is an
        # etcd lease taken when the node is found gone; shortening the setting while it is
        # away shortens its lease too (by etcd's count of the time gone, no clock's).
        t0 = time.time()
        nodes[0].kill9()
        s = wait_for("the second node away", lambda: (st := status(etcd.url))["away"] and st, timeout=30)
        assert s["away"][0]["rereplicated_in_s"] > 100, s
        time.sleep(1)
        assert len(status(etcd.url)["away"]) == 1, "kept for the 120 s it was given"
        r = cluster_cmd(etcd.url, "set", "--rereplicate-after", "2")
        assert r.returncode == 0, r.stderr
        s = wait_for("the replicas made on the three left", lambda: healthy(etcd.url, 3), timeout=90)
        print(f"a node's 48 replicas made on the others {time.time() - t0:.1f} s after it died "
              "(the grace period cut to 2 s once it was away)")
        assert sorted(n["pgs"] for n in s["nodes"]) == [64] * 3 and s["away"] == [], s
        for k, v in bodies.items():
            assert c.get_object(Bucket="grace", Key=k)["Body"].read() == v, k
        # Every member's copy of a sealed object (reads go round the members) shows the
        # plaintext's MD5, its tag, and decrypts.
        for k in sealed:
            for _ in range(3):
                got = c.get_object(Bucket="grace", Key=k)
                assert got["ETag"] == '"%s"' % hashlib.md5(bodies[k]).hexdigest(), k
                assert got["ServerSideEncryption"] == "AES256" and got["Body"].read() == bodies[k], k
                assert got.get("TagCount") == 1, k
        for k in set(changed) - set(sealed) - set(deleted):
            assert c.head_object(Bucket="grace", Key=k)["Metadata"] == {"mine": "kept"}, k
        # A copy keeps the bytes (sealed with the same key) and shows the same ETag.
        copied = c.copy_object(Bucket="grace", Key="copy", CopySource={"Bucket": "grace", "Key": sealed[0]})
        assert copied["CopyObjectResult"]["ETag"] == '"%s"' % hashlib.md5(bodies[sealed[0]]).hexdigest()
        assert c.get_object(Bucket="grace", Key="copy")["Body"].read() == bodies[sealed[0]]
        for k in deleted:
            with pytest.raises(ClientError) as e:
                c.head_object(Bucket="grace", Key=k)
            assert e.value.response["Error"]["Code"] == "404", k
    finally:
        for p in [gw, *nodes]:
            p.stop()
        etcd.stop()


def test_a_write_that_failed_midway_settles_on_one_version(workdir):
    """A PUT whose chain broke midway (a member died) and whose gateway died before it could
    retry leaves the new version on the members it reached. S3 allows a failed write to take
    effect, but every replica must then answer the same: the members that hold it re-send it
    down the chain. And a member that held such a version alone and restarted (its marks of
    what is unsettled were in memory) takes its PG's committed copy back as it catches up."""
    etcd, nodes, gws = start_cluster(workdir / "cluster-unsettled", gateways=2,
                                     node_env={"PACKRAT_LOG": "info"})
    try:
        keys = [f"k/{i:02d}" for i in range(48)]
        old = {k: b"old " + k.encode() for k in keys}
        c = gws[1].client(read_timeout=60)
        c.create_bucket(Bucket="unsettled")
        for k in keys:
            c.put_object(Bucket="unsettled", Key=k, Body=old[k])
        # The same keys in a bucket with versioning: a member re-sends such a step as its
        # history of the key, which the next member copies.
        c.create_bucket(Bucket="vunsettled")
        c.put_bucket_versioning(Bucket="vunsettled", VersioningConfiguration={"Status": "Enabled"})
        old_vid = {k: c.put_object(Bucket="vunsettled", Key=k, Body=old[k])["VersionId"] for k in keys}
        # And in a bucket whose versions a COMPLIANCE retention protects: a member that holds
        # a version its PG never committed removes it as it catches up, lock or not (the
        # source's history decides, not the member's judgement of the lock).
        c.create_bucket(Bucket="lunsettled", ObjectLockEnabledForBucket=True)
        c.put_object_lock_configuration(Bucket="lunsettled", ObjectLockConfiguration={
            "ObjectLockEnabled": "Enabled", "Rule": {"DefaultRetention": {"Mode": "COMPLIANCE", "Days": 1}}})
        locked_vid = {k: c.put_object(Bucket="lunsettled", Key=k, Body=old[k])["VersionId"] for k in keys}
        # And deletes that failed midway there: delete markers.
        c.create_bucket(Bucket="vdeleted")
        c.put_bucket_versioning(Bucket="vdeleted", VersioningConfiguration={"Status": "Enabled"})
        del_vid = {k: c.put_object(Bucket="vdeleted", Key=k, Body=old[k])["VersionId"] for k in keys}

        def node_page(n, path):
            with urllib.request.urlopen(f"http://{n.listen}{path}", timeout=5) as r:
                return r.status, r.headers["content-type"], r.read().decode()

        def unsettled_on(n):
            page = node_page(n, "/metrics")[2]
            return int(re.search(r"^packrat_node_writes_unsettled (\d+)$", page, re.M).group(1))

        # Each node serves /metrics and /health to operators without the cluster secret: its
        # store's figures, the process's and its own; nothing else answers without it.
        status_code, content_type, page = node_page(nodes[0], "/metrics")
        assert status_code == 200 and content_type.startswith("application/openmetrics-text"), content_type
        for family in ["packrat_commit_duration_seconds", "packrat_node_pgs", "packrat_node_pgs_head",
                       "packrat_node_writes_unsettled", "packrat_build_info", "process_resident_memory_bytes"]:
            assert f"\n{family}" in page, family
        assert "# TYPE packrat_node_pgs gauge" in page and "# HELP packrat_node_pgs " in page
        assert "packrat_requests" not in page and "packrat_connections_open" not in page  # no S3 here
        assert re.search(r"^packrat_node_pgs 64$", page, re.M), page  # every PG, R=3 of 3 nodes
        assert unsettled_on(nodes[0]) == 0
        code, _, body = node_page(nodes[0], "/health/ready")
        assert (code, body) == (200, "ready\n")
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"http://{nodes[0].listen}/l/1?pgs=0", timeout=5)
        assert e.value.code == 403

        def failed_writes(gw, new, also_die=()):
            # A member dies; PUTs go to the gateway, whose heads apply them and cannot hand
            # them on (every chain of 3 nodes has the dead one); the gateway dies before the
            # map changes, so none is retried on a chain without it.
            nodes[1].kill9()
            w = gw.client(read_timeout=60, max_pool_connections=4 * len(keys))
            pool = concurrent.futures.ThreadPoolExecutor(4 * len(keys))
            futures = {(b, k): pool.submit(w.put_object, Bucket=b, Key=k, Body=new[k])
                       for k in keys for b in ("unsettled", "vunsettled", "lunsettled")}
            futures.update({("vdeleted", k): pool.submit(w.delete_object, Bucket="vdeleted", Key=k) for k in keys})
            time.sleep(0.7)
            gw.kill9()
            for n in also_die:
                n.kill9()
            for k, f in futures.items():
                # Not acknowledged: the gateway died with the request.
                with pytest.raises((ConnectionClosedError, EndpointConnectionError)):
                    f.result()
            pool.shutdown()
            if not also_die:
                # The members that applied them say so on their /metrics.
                assert unsettled_on(nodes[0]) + unsettled_on(nodes[2]) > 0
            for n in [nodes[1], *also_die]:
                n.start()
            wait_for("three caught-up replicas of every PG", lambda: healthy(etcd.url, 3), timeout=90)

        def answers(gw, k):
            # Consecutive reads go to the PG's members in turn.
            r = gw.client(read_timeout=30)
            return {r.get_object(Bucket="unsettled", Key=k)["Body"].read() for _ in range(6)}

        def unsettled(gw, allowed):
            out = {}
            for k in keys:
                got = answers(gw, k)
                assert got <= allowed[k], (k, got)
                if len(got) > 1:
                    out[k] = got
            return out

        def settled(gw, allowed, timeout=20):
            deadline = time.time() + timeout
            while (left := unsettled(gw, allowed)) and time.time() < deadline:
                time.sleep(0.5)
            assert not left, f"{len(left)} of {len(keys)} keys answered differently by their members: {left}"

        def versions_settled(gw, allowed, bucket="vunsettled", vids=old_vid, timeout=20):
            # Every member answers the same current version (bytes, id and lock), and keeps
            # the version written before the failed one.
            deadline = time.time() + timeout
            while True:
                r, left = gw.client(read_timeout=30), {}
                for k in keys:
                    got = set()
                    for _ in range(6):
                        o = r.get_object(Bucket=bucket, Key=k)
                        got.add((o["Body"].read(), o["VersionId"], o.get("ObjectLockMode")))
                    assert {body for body, _, _ in got} <= allowed[k], (k, got)
                    if len(got) > 1:
                        left[k] = got
                    for _ in range(6):
                        kept = r.get_object(Bucket=bucket, Key=k, VersionId=vids[k])
                        assert kept["Body"].read() == old[k], k
                if not left or time.time() > deadline:
                    break
                time.sleep(0.5)
            assert not left, f"{len(left)} of {len(keys)} versioned keys answered differently: {left}"

        def deletes_settled(gw, timeout=20):
            # Every member answers the same: the object, or the same delete marker over it.
            deadline = time.time() + timeout
            while True:
                r, left = gw.client(read_timeout=30), {}
                for k in keys:
                    got = set()
                    for _ in range(6):
                        try:
                            got.add(r.get_object(Bucket="vdeleted", Key=k)["Body"].read())
                        except ClientError as e:
                            assert e.response["Error"]["Code"] == "NoSuchKey", e.response
                            headers = e.response["ResponseMetadata"]["HTTPHeaders"]
                            got.add((headers.get("x-amz-delete-marker"), headers.get("x-amz-version-id")))
                    if len(got) > 1:
                        left[k] = got
                    for _ in range(6):
                        kept = r.get_object(Bucket="vdeleted", Key=k, VersionId=del_vid[k])
                        assert kept["Body"].read() == old[k], k
                if not left or time.time() > deadline:
                    break
                time.sleep(0.5)
            assert not left, f"{len(left)} of {len(keys)} deleted keys answered differently: {left}"

        # A member in the middle or at the tail died: the head (and the middle) hold the new
        # version, the member after it the old one, and the member that died copies the new
        # one from the head as it catches up, so replicas differ unless the head re-sends it.
        new = {k: b"new " + k.encode() for k in keys}
        failed_writes(gws[0], new)
        allowed = {k: {old[k], new[k]} for k in keys}
        settled(gws[1], allowed)
        versions_settled(gws[1], allowed)
        versions_settled(gws[1], allowed, "lunsettled", locked_vid)
        deletes_settled(gws[1])
        assert [unsettled_on(n) for n in nodes] == [0, 0, 0]
        # This time the head of some chains held the newer version alone and restarts too:
        # it takes its PG's committed copy back as it catches up.
        newer = {k: b"newer " + k.encode() for k in keys}
        failed_writes(gws[1], newer, also_die=[nodes[0]])
        reader = Gateway(workdir / "cluster-unsettled" / "gw2", etcd.url).start()
        gws.append(reader)
        allowed = {k: allowed[k] | {newer[k]} for k in keys}
        settled(reader, allowed)
        versions_settled(reader, allowed)
        versions_settled(reader, allowed, "lunsettled", locked_vid)
        # Every node caught up and every re-sent step was handed on: a member whose copy of a
        # key cannot be made its source's (a version its lock would keep) never would.
        wait_for("every node caught up", lambda: healthy(etcd.url, 3), timeout=30)
        wait_for("no step left to re-send", lambda: [unsettled_on(n) for n in nodes] == [0, 0, 0], timeout=20)
    finally:
        for p in [*gws, *nodes]:
            p.stop()
        etcd.stop()


def test_a_member_whose_sync_fails_never_answers_apart_from_its_chain(workdir):
    """A member hands a PUT on to the next once it has stored and checked it, and makes it
    durable meanwhile, so the chain's syncs overlap. If its sync then fails, the rest of the
    chain may hold a version it lacks: it keeps the key marked (reads of it there go to the
    tail) and copies the version back once it can. Every member of every key answers the same
    throughout, and all settle once the disk works again."""
    etcd, nodes, gws = start_cluster(workdir / "cluster-sync", node_args=["--fault-injection"])
    try:
        secret = etcd_value(etcd.url, "/packrat/secret")

        c = gws[0].client(read_timeout=60)
        c.create_bucket(Bucket="sync")
        keys = [f"k/{i:02d}" for i in range(24)]
        old = {k: b"old " + k.encode() for k in keys}
        for k in keys:
            c.put_object(Bucket="sync", Key=k, Body=old[k])
        faulty = nodes[1]
        # One sync of a segment file in three fails: some writes fail before they are staged
        # there (a new segment's sync), some after (the group commit's), some succeed.
        store_faults(faulty, secret, rules=[{"op": "sync", "fault": "eio", "path": "seg-", "every": 3}])
        new = {k: b"new " + k.encode() for k in keys}
        acked, failed = set(), set()
        for k in keys:
            try:
                c.put_object(Bucket="sync", Key=k, Body=new[k])
                acked.add(k)
            except ClientError as e:
                # Every chain of 3 nodes has the faulty one: a 500 for each write.
                assert e.response["ResponseMetadata"]["HTTPStatusCode"] == 500, e.response
                failed.add(k)
        assert failed, "no write failed while a member's sync failed"
        assert store_faults(faulty, secret, rules=[])["injected"] > 0
        with open(faulty.log_path) as f:
            lost = f.read().count("a staged write failed to become durable here")
        assert lost > 0, "no write failed after it was handed on"
        print(f"{len(acked)} acknowledged, {len(failed)} failed, {lost} lost after staging")

        def reads(k, n=6):
            # Consecutive reads go to the PG's members in turn.
            return [c.get_object(Bucket="sync", Key=k)["Body"].read() for _ in range(n)]

        def answers(k):
            return set(reads(k))

        # While the disk fails: whichever member reads a key, it never goes back to the old
        # version once the new one was seen (a failed write may still take effect, as the
        # members settle, but not come and go).
        for k in keys:
            got = reads(k, 9)
            assert set(got) <= {old[k], new[k]}, (k, got)
            assert old[k] not in got[got.index(new[k]):] if new[k] in got else True, (k, got)
            if k in acked:
                assert set(got) == {new[k]}, (k, got)
        store_faults(faulty, secret, rules=[])  # the disk works again

        def unsettled_on(n):
            with urllib.request.urlopen(f"http://{n.listen}/metrics", timeout=5) as r:
                page = r.read().decode()
            return int(re.search(r"^packrat_node_writes_unsettled (\d+)$", page, re.M).group(1))

        wait_for("every member to settle", lambda: all(unsettled_on(n) == 0 for n in nodes), timeout=30)
        for k in keys:
            got = answers(k)
            assert len(got) == 1 and got <= {old[k], new[k]}, (k, got)
            if k in acked:
                assert got == {new[k]}, (k, got)
        # And the faulty member serves again, its copies those of its chains.
        for k in keys:
            c.put_object(Bucket="sync", Key=k, Body=b"after " + k.encode())
            assert answers(k) == {b"after " + k.encode()}
    finally:
        for p in [*gws, *nodes]:
            p.stop()
        etcd.stop()


def test_a_write_damaged_between_members_is_refused_and_settles(workdir):
    """Every hop of a chain write is checked: its sender sends the body's CRC32C, and the head
    sends its MD5 (the ETag), which members take rather than hash the bytes again. A body
    damaged on its way to a member is refused there (the client gets a 500 and may retry),
    and the members then settle on the head's bytes: no replica serves other bytes under the
    write's ETag. Before, a member stored whatever it got, under its own MD5."""
    etcd, nodes, gws = start_cluster(workdir / "cluster-hop", node_args=["--fault-injection"])
    try:
        secret = etcd_value(etcd.url, "/packrat/secret")

        def hop(n, flip=None):
            return hop_faults(n, secret, None if flip is None else {"flip": flip})["flip"]

        # No flexible checksum from the client (a member checks one, which would catch the
        # damage too, but blame the client with a 400 BadDigest).
        c = gws[0].client(request_checksum_calculation="when_required")
        c.create_bucket(Bucket="hop")
        bodies = {f"k/{i:02d}": os.urandom(4096) + f"{i}".encode() for i in range(40)}
        # The next body nodes[0] hands on (as a head, or as the second member) changes on its
        # way; writes it does not hand on pass untouched.
        faulty = nodes[0]

        def first_refused(writes):
            """Arms one damaged hop on `faulty`, then makes `writes` (key, write) in turn until
            one is refused with a 500: its key. Every write acknowledged before was not damaged."""
            assert hop(faulty, 1) == 1
            for k, write in writes:
                try:
                    write()
                except ClientError as e:
                    assert e.response["ResponseMetadata"]["HTTPStatusCode"] == 500, e.response
                    return k
                assert hop(faulty) == 1, f"{k} was acknowledged, yet damaged on a hop"
            raise AssertionError("nodes[0] handed none of the writes on")

        damaged = first_refused(
            (k, functools.partial(c.put_object, Bucket="hop", Key=k, Body=body))
            for k, body in bodies.items())
        assert hop(faulty) == 0
        assert sum(node_counter(n, "packrat_node_damaged_writes_total") for n in nodes) == 1
        assert node_counter(faulty, "packrat_node_damaged_writes_total") == 0
        # The rest are written with nothing damaged.
        for k, body in bodies.items():
            if k > damaged:
                c.put_object(Bucket="hop", Key=k, Body=body)

        def unsettled_on(n):
            return node_counter(n, "packrat_node_writes_unsettled")

        wait_for("every member to settle", lambda: all(unsettled_on(n) == 0 for n in nodes), timeout=30)
        for k, body in bodies.items():
            etag = '"' + hashlib.md5(body).hexdigest() + '"'
            # Consecutive reads go to the PG's members in turn: every replica answers the
            # bytes the client sent, under their MD5.
            for _ in range(6):
                got = c.get_object(Bucket="hop", Key=k)
                assert got["ETag"] == etag, (k, got["ETag"])
                assert got["Body"].read() == body, k

        # A multipart upload's parts are checked the same way: a part damaged on a hop is
        # refused, sent again, and the object completes from the bytes the client sent. The
        # parts are above 256 KiB, which a node hashes off its runtime threads (the PUTs above
        # are hashed on them).
        uploads = {}

        def part_writes():
            for i in range(40):
                k = f"mp/{i:02d}"
                part = os.urandom(320 * 1024) + k.encode()
                uid = c.create_multipart_upload(Bucket="hop", Key=k)["UploadId"]
                uploads[k] = (uid, part)
                yield k, functools.partial(c.upload_part, Bucket="hop", Key=k, UploadId=uid,
                                           PartNumber=1, Body=part)

        refused = first_refused(part_writes())
        assert hop(faulty) == 0
        assert sum(node_counter(n, "packrat_node_damaged_writes_total") for n in nodes) == 2
        uid, part = uploads[refused]
        etag = c.upload_part(Bucket="hop", Key=refused, UploadId=uid, PartNumber=1,
                             Body=part)["ETag"]
        assert etag == '"' + hashlib.md5(part).hexdigest() + '"'
        c.complete_multipart_upload(
            Bucket="hop", Key=refused, UploadId=uid,
            MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": etag}]})
        wait_for("every member to settle", lambda: all(unsettled_on(n) == 0 for n in nodes), timeout=30)
        for _ in range(6):
            assert c.get_object(Bucket="hop", Key=refused)["Body"].read() == part
    finally:
        for p in [*gws, *nodes]:
            p.stop()
        etcd.stop()


def test_a_conditional_write_refused_on_retry_keeps_its_unsettled_first_attempt_off_reads(workdir):
    """A conditional write that its head applied and could not hand on (the chain broke under
    it) is tried again by its gateway; the head refuses the retry (412: it holds the first
    attempt itself) and the client gets 503, outcome unknown. Until the rest of the chain has
    the first attempt, every member must answer reads with the committed value. Before, the
    refused retry cleared the head's mark of the first attempt, and the head answered it as
    committed while the other members answered the value before it: reads went back and
    forth (the histories under partitions found it)."""
    etcd, nodes, gws = start_cluster(workdir / "cluster-retry", node_args=["--fault-injection"])
    try:
        secret = etcd_value(etcd.url, "/packrat/secret")
        c = gws[0].client()
        c.create_bucket(Bucket="cas")
        etag = c.put_object(Bucket="cas", Key="k", Body=b"before")["ETag"]
        # From now on no node hands a step on: a write stays at its head.
        for n in nodes:
            assert hop_faults(n, secret, {"flip": 0, "drop": 100_000})["drop"] == 100_000
        with pytest.raises(ClientError) as e:
            c.put_object(Bucket="cas", Key="k", Body=b"after", IfMatch=etag)
        assert e.value.response["Error"]["Code"] == "ServiceUnavailable", e.value.response
        # Consecutive reads go to the members in turn.
        got = [c.get_object(Bucket="cas", Key="k")["Body"].read() for _ in range(9)]
        assert set(got) == {b"before"}, got
        # Steps flow again: the head hands the write on (its outcome was unknown, so it may
        # take effect), and from then on every member answers it.
        for n in nodes:
            hop_faults(n, secret, {"flip": 0, "drop": 0})
        wait_for("every member to settle",
                 lambda: all(node_counter(n, "packrat_node_writes_unsettled") == 0 for n in nodes),
                 timeout=30)
        got = [c.get_object(Bucket="cas", Key="k")["Body"].read() for _ in range(9)]
        assert set(got) == {b"after"}, got
        # A delete that the middle member applied and could not hand on (its steps dropped)
        # is re-sent through the head, then down to the tail, once its steps flow again.
        bid = json.loads(etcd_value(etcd.url, "/packrat/buckets/cas"))["id"]
        m = json.loads(etcd_value(etcd.url, "/packrat/map"))
        chain = m["chains"][pg_of(bid, "k", PGS)]
        middle = next(n for n in nodes if m["nodes"][chain[1]]["addr"] == n.listen)
        hop_faults(middle, secret, {"flip": 0, "drop": 100_000})
        with pytest.raises(ClientError) as e:
            c.delete_object(Bucket="cas", Key="k")
        assert e.value.response["Error"]["Code"] == "ServiceUnavailable", e.value.response
        got = [c.get_object(Bucket="cas", Key="k")["Body"].read() for _ in range(9)]
        assert set(got) == {b"after"}, got
        hop_faults(middle, secret, {"flip": 0, "drop": 0})
        wait_for("every member to settle",
                 lambda: all(node_counter(n, "packrat_node_writes_unsettled") == 0 for n in nodes),
                 timeout=30)
        for _ in range(9):
            with pytest.raises(ClientError) as e:
                c.get_object(Bucket="cas", Key="k")
            assert e.value.response["Error"]["Code"] == "NoSuchKey", e.value.response
    finally:
        for p in [*gws, *nodes]:
            p.stop()
        etcd.stop()


M64 = (1 << 64) - 1


def pg_of(bucket_id, key, pgs):
    """The PG of a key, as `placement::pg_of` places it (FNV-1a of the key mixed with the
    bucket id, through SplitMix64's finaliser)."""
    h = 0xCBF29CE484222325
    for b in key.encode():
        h = ((h ^ b) * 0x100000001B3) & M64
    z = ((h ^ ((bucket_id * 0x9E3779B97F4A7C15) & M64)) + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    z ^= z >> 31
    return (z * pgs) >> 64


def test_a_hung_chain_holds_back_no_write_relayed_with_it(workdir):
    """Writes waiting for one node go to it relayed in one request (`POST /w`), and a node's
    answer gives each step's outcome as that step ends. With one node of four hung (stopped,
    its connections open and unanswered) for 2.5 s, the writes whose chains do not hold it
    are each answered within a second while the writes through it wait: before, a relayed
    request was answered once its slowest step was, so a write relayed with one whose chain
    held the hung node waited as long."""
    etcd, nodes, gws = start_cluster(workdir / "cluster-hungpg", nodes=4)
    try:
        c = gws[0].client()
        c.create_bucket(Bucket="hung")
        bid = json.loads(etcd_value(etcd.url, "/packrat/buckets/hung"))["id"]
        m = json.loads(etcd_value(etcd.url, "/packrat/map"))
        hung = nodes[3]
        hung_id = next(i for i, n in m["nodes"].items() if n["addr"] == hung.listen)
        keys = [f"k/{i:04d}" for i in range(2000)]
        through = [k for k in keys if hung_id in m["chains"][pg_of(bid, k, PGS)]]
        around = [k for k in keys if hung_id not in m["chains"][pg_of(bid, k, PGS)]]
        # Every write through the gateway first, so each path is warm.
        for k in through[:4] + around[:4]:
            c.put_object(Bucket="hung", Key=k, Body=b"warm")
        relayed_before = gateway_counter(gws[0], "packrat_cluster_writes_relayed_total")
        order = [k for pair in zip(through[:200], around[:200]) for k in pair]
        clients = [gws[0].client() for _ in range(48)]
        stopped_at = time.monotonic()
        hung.proc.send_signal(signal.SIGSTOP)
        timer = threading.Timer(2.5, hung.proc.send_signal, [signal.SIGCONT])
        timer.start()

        def put(i_k):
            i, k = i_k
            t0 = time.monotonic()
            clients[i % len(clients)].put_object(Bucket="hung", Key=k, Body=k.encode() * 20)
            return k, t0 - stopped_at, time.monotonic() - t0

        try:
            with concurrent.futures.ThreadPoolExecutor(len(clients)) as ex:
                done = list(ex.map(put, enumerate(order)))
        finally:
            timer.join()
            hung.proc.send_signal(signal.SIGCONT)
        # The writes around the hung node begun while it was stopped.
        arounds = [(k, at, took) for k, at, took in done if k in set(around) and at < 2.0]
        slow = [(k, round(at, 2), round(took, 2)) for k, at, took in arounds if took > 1.0]
        held = max(took for k, at, took in done if k in set(through) and at < 1.0)
        relayed = gateway_counter(gws[0], "packrat_cluster_writes_relayed_total") - relayed_before
        print(f"while a node hung: {len(arounds)} writes around it, slowest "
              f"{max(t for _, _, t in arounds):.2f} s; writes through it held up to {held:.2f} s; "
              f"{relayed} writes relayed")
        assert len(arounds) >= 20, arounds
        assert held > 2.0, "the writes through the hung node did not wait for it"
        assert relayed > 0, "no write was relayed with another: the test shows nothing"
        assert not slow, f"writes around the hung node held back: {slow[:10]}"
        for k in order:
            assert c.get_object(Bucket="hung", Key=k)["Body"].read() == k.encode() * 20
    finally:
        for p in [*gws, *nodes]:
            p.stop()
        etcd.stop()


def store_faults(node, secret, **set_):
    """A node's store fault rules (`/admin/faults`), set first if `set_` is given."""
    req = urllib.request.Request(f"http://{node.listen}/admin/faults", method="PUT" if set_ else "GET",
                                 data=json.dumps(set_).encode() if set_ else None,
                                 headers={"x-packrat-cluster-secret": secret})
    with urllib.request.urlopen(req, timeout=5) as r:
        return json.load(r)


def hop_faults(node, secret, set_to=None):
    """A node's hop faults (`/admin/faults/hop`), set first to `set_to` if given."""
    req = urllib.request.Request(
        f"http://{node.listen}/admin/faults/hop", method="GET" if set_to is None else "PUT",
        data=None if set_to is None else json.dumps(set_to).encode(),
        headers={"x-packrat-cluster-secret": secret})
    with urllib.request.urlopen(req, timeout=5) as r:
        return json.load(r)


def test_a_read_answer_damaged_on_its_way_is_never_served(workdir):
    """A node sends the CRC32C of every answer: a header on one sent whole, a trailer on one
    streamed, and in a batch GET's answer one after each record's header and each payload.
    The gateway checks it: a small object's damaged answer (or batch entry) is read again
    from another member, a large object's answer to the client is cut before its last bytes.
    No client ever gets other bytes than were written. Before, the bytes between a node and a
    gateway were checked by TCP alone."""
    etcd, nodes, gws = start_cluster(workdir / "cluster-answers",
                                     node_args=["--fault-injection"])
    try:
        secret = etcd_value(etcd.url, "/packrat/secret")
        # The client checks no checksum itself: what it gets is what the gateway served.
        c = gws[0].client(response_checksum_validation="when_required")
        c.create_bucket(Bucket="ans")
        # Inline in the lookup (4 KiB), one piece (512 KiB), streamed (3 MiB).
        bodies = {f"s/{i:02d}": os.urandom(4096) for i in range(12)}
        bodies.update({f"m/{i}": os.urandom(512 * 1024) for i in range(3)})
        bodies["l/0"] = os.urandom(3 * 1024 * 1024)
        for k, body in bodies.items():
            c.put_object(Bucket="ans", Key=k, Body=body)
        wait_for("every member to settle",
                 lambda: all(node_counter(n, "packrat_node_writes_unsettled") == 0 for n in nodes),
                 timeout=30)

        def read_all():
            for _ in range(3):
                for k, body in bodies.items():
                    if k.startswith("l/"):
                        continue
                    got = c.get_object(Bucket="ans", Key=k)["Body"].read()
                    assert got == body, f"{k}: other bytes than were written"

        # Nothing damaged: streamed answers' trailers arrive (a missing one fails the read).
        read_all()
        assert c.get_object(Bucket="ans", Key="l/0")["Body"].read() == bodies["l/0"]
        assert gateway_counter(gws[0], "packrat_cluster_damaged_answers_total") == 0

        # Each node in turn damages its next answer: every read is still right (read again
        # of another member), and each damaged answer was refused.
        for i, n in enumerate(nodes):
            assert hop_faults(n, secret, {"flip": 0, "answers": 1})["answers"] == 1
            read_all()
            assert hop_faults(n, secret)["answers"] == 0, f"node {i} sent no object bytes"
            assert gateway_counter(gws[0], "packrat_cluster_damaged_answers_total") == i + 1

        # A large object's streamed answer damaged: the client's read fails, it never gets
        # the damaged bytes whole; read again, it gets the right ones.
        for n in nodes:
            hop_faults(n, secret, {"flip": 0, "answers": 1})
        got = c.get_object(Bucket="ans", Key="l/0")
        with pytest.raises((IncompleteReadError, ResponseStreamingError, ProtocolError)):
            got["Body"].read()
        assert gateway_counter(gws[0], "packrat_cluster_damaged_answers_total") == 4
        for n in nodes:
            hop_faults(n, secret, {"flip": 0, "answers": 0})
        assert c.get_object(Bucket="ans", Key="l/0")["Body"].read() == bodies["l/0"]

        # Batch GET, with a client that does not resume a broken answer (it would hide a cut).
        from packrat_client import RetryPolicy, Unavailable
        pc = gws[0].packrat(retry=RetryPolicy(attempts=1))
        small = [k for k in bodies if not k.startswith("l/")]

        def batch(keys):
            """The samples of a batch GET of `keys`, each checked; None if the answer broke."""
            got = []
            try:
                for s in pc.batch_get("ans", keys):
                    assert s.data == bodies[s.name], f"{s.name}: other bytes than were written"
                    got.append(s.name)
            except Unavailable:
                return None
            assert got == keys
            return got

        assert batch(small) == small
        damaged = gateway_counter(gws[0], "packrat_cluster_damaged_answers_total")
        # Each node in turn damages its next answer of object bytes (its batch answer, a frame
        # of one record or more; or a read of one of its items alone): every entry is right,
        # and every damaged answer was refused.
        for n in nodes:
            hop_faults(n, secret, {"flip": 0, "answers": 1})
            assert batch(small) == small
            left = hop_faults(n, secret, {"flip": 0, "answers": 0})["answers"]
            damaged += 1 - left
            assert gateway_counter(gws[0], "packrat_cluster_damaged_answers_total") == damaged
        assert damaged >= 2, "the batches reached too few nodes to test anything"
        # A streamed entry (3 MiB) damaged in its payload: the client's answer breaks before
        # the entry is whole (the gateway held its last piece back until the CRC after it).
        for n in nodes:
            hop_faults(n, secret, {"flip": 0, "answers": 1})
        assert batch(["l/0"]) is None
        assert gateway_counter(gws[0], "packrat_cluster_damaged_answers_total") == damaged + 1
        for n in nodes:
            hop_faults(n, secret, {"flip": 0, "answers": 0})
        assert batch(["s/00", "l/0"]) == ["s/00", "l/0"]
        assert gateway_counter(gws[0], "packrat_cluster_damaged_answers_total") == damaged + 1
    finally:
        for p in [*gws, *nodes]:
            p.stop()
        etcd.stop()


def gone_and_kept(c, gone, gone_size, kept):
    """Buckets `gone` (`gone` objects g/NN of `gone_size` bytes, to be deleted) and `kept`
    (`kept` objects k/N of 100 bytes); answers the kept objects' bytes by key."""
    c.create_bucket(Bucket="gone")
    c.create_bucket(Bucket="kept")
    for i in range(gone):
        c.put_object(Bucket="gone", Key=f"g/{i:02d}", Body=os.urandom(gone_size))
    bodies = {f"k/{i}": os.urandom(100) for i in range(kept)}
    for k, v in bodies.items():
        c.put_object(Bucket="kept", Key=k, Body=v)
    return bodies


def test_a_deleted_bucket_leaves_nothing_on_the_nodes(workdir):
    """Deleting a bucket drops what each node keeps of it (its local buckets of objects and of
    tombstones), on a node that was away while its objects were deleted too, once it is back.
    A resync covers the buckets that exist, so before, that node kept the deleted objects on
    its disks for good, and every node kept the emptied local buckets. The note of the delete
    in etcd stays while a node is away, and goes once every node has dropped its copies."""
    etcd, nodes, (gw,) = start_cluster(workdir / "cluster-dropped",
                                       node_args=["--tombstone-keep", "1"])
    try:
        c = gw.client()
        kept = gone_and_kept(c, gone=30, gone_size=2000, kept=5)
        away = nodes[2]
        away.kill9()
        wait_for("the node away", lambda: status(etcd.url)["away"], timeout=30)
        for i in range(30):
            c.delete_object(Bucket="gone", Key=f"g/{i:02d}")
        c.delete_bucket(Bucket="gone")
        # The nodes up drop their copies; the note of the delete stays in etcd for the one
        # away.
        wait_for("the nodes up to drop the deleted bucket's local buckets",
                 lambda: all(node_counter(n, "packrat_node_buckets_dropped_total") >= 1
                             for n in nodes[:2]), timeout=30)
        time.sleep(2.5)  # two more passes of theirs
        assert status(etcd.url)["deleted_buckets_pending"] == 1
        away.start()
        wait_for("three caught-up nodes", lambda: healthy(etcd.url, 3), timeout=90)
        wait_for("every node to drop the deleted bucket's local buckets",
                 lambda: all(node_counter(n, "packrat_node_buckets_dropped_total") >= 1
                             for n in nodes), timeout=30)
        # Then, every node having dropped it, the note goes.
        wait_for("the deleted bucket's note removed",
                 lambda: status(etcd.url)["deleted_buckets_pending"] == 0, timeout=30)
        for k, v in kept.items():
            assert c.get_object(Bucket="kept", Key=k)["Body"].read() == v
        with pytest.raises(ClientError) as e:
            c.head_bucket(Bucket="gone")
        assert e.value.response["Error"]["Code"] == "404"
    finally:
        for p in [gw, *nodes]:
            p.stop()
        etcd.stop()
    # On the disks: each node holds the kept bucket's five objects (in its local buckets of
    # objects and of tombstones), nothing of the other; compaction frees the dead bytes.
    for n in nodes:
        report = verify_offline(n)
        got = (report["buckets"], report["objects"], report["object_bytes"])
        assert got == (2, 5, 500), (n.data_dir, report)


def test_a_removed_node_added_back_drops_what_was_deleted_meanwhile(workdir):
    """A node killed, its replicas made elsewhere and `remove-node`d, misses the delete of a
    bucket: the note of the delete goes once the registered nodes have dropped their copies.
    Added back with its old data directory, it drops that bucket's copies by itself (the
    bucket's id was handed out and has no record). Meanwhile its data directory, which
    belongs to its cluster, is refused by another cluster's etcd, untouched."""
    base = workdir / "cluster-readded"
    etcd, nodes, (gw,) = start_cluster(base, nodes=4, node_args=["--tombstone-keep", "1"])
    other = None
    try:
        c = gw.client()
        kept = gone_and_kept(c, gone=20, gone_size=1000, kept=8)
        out = nodes[3]
        out_id = open(out.data_dir + "/node-id").read().strip()
        cluster_id = status(etcd.url)["cluster_id"]
        assert cluster_id.startswith("cluster-")
        assert all(open(n.data_dir + "/cluster-id").read() == cluster_id for n in nodes)
        assert cluster_cmd(etcd.url, "set", "--rereplicate-after", "0").returncode == 0
        out.kill9()
        wait_for("the node's replicas made elsewhere", lambda: healthy(etcd.url, 3), timeout=90)
        r = cluster_cmd(etcd.url, "remove-node", out_id)
        assert r.returncode == 0, r.stderr
        # Another cluster's etcd: the node does not start, and says why.
        other = Etcd(base / "other-etcd").start()
        assert cluster_cmd(other.url, "init", "--pgs", "8", "--replicas", "1").returncode == 0
        r = subprocess.run([BIN, "node", "--etcd", other.url, "--data-dir", out.data_dir,
                            "--listen", f"127.0.0.1:{free_port()}"], capture_output=True, text=True, timeout=60)
        assert r.returncode != 0 and f"belongs to cluster {cluster_id}" in r.stderr, r.stdout + r.stderr
        assert status(other.url)["nodes"] == []
        for i in range(20):
            c.delete_object(Bucket="gone", Key=f"g/{i:02d}")
        c.delete_bucket(Bucket="gone")
        wait_for("the deleted bucket's note removed by the registered nodes",
                 lambda: status(etcd.url)["deleted_buckets_pending"] == 0, timeout=30)
        out.start()
        wait_for("four caught-up nodes", lambda: healthy(etcd.url, 4), timeout=90)
        wait_for("the node back to drop the deleted bucket's local buckets",
                 lambda: node_counter(out, "packrat_node_buckets_dropped_total") >= 1, timeout=30)
        for k, v in kept.items():
            assert c.get_object(Bucket="kept", Key=k)["Body"].read() == v
    finally:
        for p in [gw, *nodes]:
            p.stop()
        etcd.stop()
        if other is not None:
            other.stop()
    # Nothing of the deleted bucket (objects of 1,000 bytes) is left on the node back.
    report = verify_offline(out)
    assert report["objects"] > 0 and report["object_bytes"] == 100 * report["objects"], report


def etcd_value(etcd_url, key):
    """A key's value, read with etcd's JSON gateway (v3 API)."""
    body = json.dumps({"key": base64.b64encode(key.encode()).decode()}).encode()
    with urllib.request.urlopen(urllib.request.Request(f"{etcd_url}/v3/kv/range", data=body),
                                timeout=5) as r:
        return base64.b64decode(json.load(r)["kvs"][0]["value"]).decode()


def test_uploads_in_progress_complete_at_a_head_that_joined_mid_upload(workdir):
    """A node added mid-upload copies the uploads in progress of the PGs it joins, with their
    parts, as it catches up: once it heads some of those PGs, ListParts and the completion
    work there (before, it lacked the upload and answered NoSuchUpload)."""
    base = workdir / "cluster-uploads"
    etcd, nodes, (gw,) = start_cluster(base, node_env={"PACKRAT_LOG": "info"})
    try:
        c = gw.client(read_timeout=60)
        c.create_bucket(Bucket="uploads")
        uploads = {}  # key -> (upload id, part bytes, part ETag)
        for i in range(64):
            k = f"u/{i:02d}"
            uid = c.create_multipart_upload(Bucket="uploads", Key=k, Metadata={"k": k},
                                            ContentType="application/x-test")["UploadId"]
            body = os.urandom(1000 + i)
            etag = c.upload_part(Bucket="uploads", Key=k, UploadId=uid, PartNumber=1, Body=body)["ETag"]
            uploads[k] = (uid, body, etag)
        new = Node(base / "node3", etcd.url, extra_env={"PACKRAT_LOG": "info"}).start()
        nodes.append(new)
        new_id = open(new.data_dir + "/node-id").read().strip()

        def heading():
            s = healthy(etcd.url, 4)
            return s and any(n["id"] == new_id and n["heads"] > 0 for n in s["nodes"]) and s

        s = wait_for("the new node caught up and heading PGs", heading, timeout=120)
        heads = next(n["heads"] for n in s["nodes"] if n["id"] == new_id)
        assert heads >= 8, s  # about a quarter of the 64 PGs
        with open(new.log_path) as f:
            copied = sum(int(n) for n in re.findall(r"copied parts of uploads in progress.*parts=(\d+)", f.read()))
        assert copied >= 16, copied  # one part of each upload of the 48 PGs it joined (64 in all)
        for k, (uid, body, etag) in uploads.items():
            listed = c.list_parts(Bucket="uploads", Key=k, UploadId=uid)["Parts"]
            assert [(p["PartNumber"], p["ETag"], p["Size"]) for p in listed] == [(1, etag, len(body))], k
            done = c.complete_multipart_upload(Bucket="uploads", Key=k, UploadId=uid,
                                               MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": etag}]})
            assert done["ETag"] == '"%s-1"' % hashlib.md5(bytes.fromhex(etag.strip('"'))).hexdigest(), k
            got = c.get_object(Bucket="uploads", Key=k)
            assert got["Body"].read() == body and got["Metadata"] == {"k": k}, k
            assert got["ContentType"] == "application/x-test", k
        assert c.list_multipart_uploads(Bucket="uploads").get("Uploads", []) == []
    finally:
        for p in [gw, *nodes]:
            p.stop()
        etcd.stop()


def test_lifecycle_rules_and_storage_tiers_are_applied_by_the_nodes(workdir):
    """Each node applies the buckets' lifecycle rules to the PGs it heads: expirations are chain
    deletes (gone from every replica), transitions chain edits of the storage class, stale
    multipart uploads are aborted, and what no rule names stays. Every node has a directory
    tier for STANDARD_IA, and its own tier worker moves its copies of such objects there. The
    nodes evaluate the rules 4 days ahead (a hidden test flag, as `packrat admin tier run
    --days-ahead` on one server) every second."""
    base = workdir / "cluster-lifecycle"
    tier_dirs = [base / f"tier{i}" for i in range(3)]
    etcd, nodes, (gw,) = start_cluster(
        base, node_args=lambda i: ["--tier-interval", "1", "--lifecycle-days-ahead", "4",
                                   "--tier-rate", "0", "--tier", f"STANDARD_IA=dir:{tier_dirs[i]}"])
    try:
        s3 = gw.client()
        s3.create_bucket(Bucket="expiring")
        for i in range(40):
            s3.put_object(Bucket="expiring", Key=f"logs/{i:02d}", Body=b"x" * (i + 1))
        s3.put_object(Bucket="expiring", Key="keep/a", Body=b"a")
        s3.put_object(Bucket="expiring", Key="tmp/tagged", Body=b"t", Tagging="expire=yes")
        s3.put_object(Bucket="expiring", Key="tmp/plain", Body=b"p")
        cold = {f"old/{i}": os.urandom(20_000 + i) for i in range(8)}
        for k, v in cold.items():
            s3.put_object(Bucket="expiring", Key=k, Body=v, Metadata={"n": k[-1]})
        direct = os.urandom(70_000)
        s3.put_object(Bucket="expiring", Key="ia/direct", Body=direct, StorageClass="STANDARD_IA")
        stale = s3.create_multipart_upload(Bucket="expiring", Key="up/stale")["UploadId"]
        other = s3.create_multipart_upload(Bucket="expiring", Key="other/upload")["UploadId"]
        # A class the nodes have no tier for is refused, in a PUT and in a rule.
        with pytest.raises(ClientError) as e:
            s3.put_object(Bucket="expiring", Key="g", Body=b"g", StorageClass="GLACIER")
        assert e.value.response["Error"]["Code"] == "InvalidStorageClass"
        with pytest.raises(ClientError) as e:
            s3.put_bucket_lifecycle_configuration(Bucket="expiring", LifecycleConfiguration={"Rules": [
                {"ID": "t", "Filter": {"Prefix": ""}, "Status": "Enabled",
                 "Transitions": [{"Days": 1, "StorageClass": "GLACIER"}]}]})
        assert e.value.response["Error"]["Code"] == "InvalidStorageClass"
        before = {k: s3.head_object(Bucket="expiring", Key=k) for k in cold}
        s3.put_bucket_lifecycle_configuration(Bucket="expiring", LifecycleConfiguration={"Rules": [
            {"ID": "logs", "Filter": {"Prefix": "logs/"}, "Status": "Enabled", "Expiration": {"Days": 3}},
            {"ID": "tagged", "Status": "Enabled", "Expiration": {"Days": 3},
             "Filter": {"And": {"Prefix": "tmp/", "Tags": [{"Key": "expire", "Value": "yes"}]}}},
            {"ID": "later", "Filter": {"Prefix": "keep/"}, "Status": "Enabled", "Expiration": {"Days": 30}},
            {"ID": "cold", "Filter": {"Prefix": "old/"}, "Status": "Enabled",
             "Transitions": [{"Days": 2, "StorageClass": "STANDARD_IA"}]},
            {"ID": "uploads", "Filter": {"Prefix": "up/"}, "Status": "Enabled",
             "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 3}}]})

        def listing():
            return {o["Key"]: o for o in s3.list_objects_v2(Bucket="expiring").get("Contents", [])}

        def transitioned():
            got = listing()
            return set(got) == {"keep/a", "tmp/plain", "ia/direct", *cold} and all(
                got[k]["StorageClass"] == "STANDARD_IA" for k in [*cold, "ia/direct"]) and got

        wait_for("the expirations and transitions", transitioned, timeout=30)
        uploads = s3.list_multipart_uploads(Bucket="expiring").get("Uploads", [])
        assert [(u["Key"], u["UploadId"]) for u in uploads] == [("other/upload", other)]
        with pytest.raises(ClientError) as e:
            s3.list_parts(Bucket="expiring", Key="up/stale", UploadId=stale)
        assert e.value.response["Error"]["Code"] == "NoSuchUpload"

        # Every node's tier worker moves its own copies: 9 objects on each node's tier.
        def on_tiers(objects):
            st = admin_json(gw, "tier", "status")
            ia = [t for t in st["tiers"] if t["class"] == "STANDARD_IA"]
            return ia and ia[0]["objects"] == 3 * objects and st["pending_objects"] == 0 and st

        st = wait_for("every copy moved to its node's tier", lambda: on_tiers(9), timeout=30)
        assert len(st["nodes"]) == 3 and st["tiers"][0]["object_bytes"] == 3 * (
            sum(map(len, cold.values())) + len(direct)), st
        for d in tier_dirs:
            assert sum(f.stat().st_size for f in d.rglob("*") if f.is_file()) >= len(direct), d
        # Read from every replica in turn: the bytes come from each node's tier; a transition
        # is an edit (same ETag, Last-Modified and metadata), and the expired keys are gone
        # everywhere.
        for _ in range(6):
            for k, v in cold.items():
                got = s3.get_object(Bucket="expiring", Key=k)
                assert got["Body"].read() == v and got["StorageClass"] == "STANDARD_IA"
                assert (got["ETag"], got["LastModified"], got["Metadata"]) == (
                    before[k]["ETag"], before[k]["LastModified"], {"n": k[-1]})
            r = s3.get_object(Bucket="expiring", Key="ia/direct", Range="bytes=1000-1999")
            assert r["Body"].read() == direct[1000:2000]
            for key in ("logs/00", "tmp/tagged"):
                with pytest.raises(ClientError) as e:
                    s3.head_object(Bucket="expiring", Key=key)
                assert e.value.response["Error"]["Code"] == "404"
            assert s3.get_object(Bucket="expiring", Key="tmp/plain")["Body"].read() == b"p"
        # A copy onto itself back to STANDARD (an edit, the bytes untouched) brings the
        # copies back to NVMe on the nodes' next runs.
        s3.copy_object(Bucket="expiring", Key="ia/direct", CopySource={"Bucket": "expiring", "Key": "ia/direct"},
                       StorageClass="STANDARD", MetadataDirective="COPY")
        assert "StorageClass" not in s3.head_object(Bucket="expiring", Key="ia/direct")
        wait_for("the copies back on NVMe", lambda: on_tiers(8), timeout=30)
        assert s3.get_object(Bucket="expiring", Key="ia/direct")["Body"].read() == direct

        # With versioning, an expiration is a delete marker made on every replica, as in S3:
        # the keys leave the listing and their bytes stay readable by version id.
        s3.create_bucket(Bucket="versioned-expiring")
        s3.put_bucket_versioning(Bucket="versioned-expiring", VersioningConfiguration={"Status": "Enabled"})
        ids = {f"logs/{i}": s3.put_object(Bucket="versioned-expiring", Key=f"logs/{i}", Body=b"log")["VersionId"]
               for i in range(5)}
        s3.put_bucket_lifecycle_configuration(Bucket="versioned-expiring", LifecycleConfiguration={"Rules": [
            {"ID": "logs", "Filter": {"Prefix": "logs/"}, "Status": "Enabled", "Expiration": {"Days": 3}}]})

        def marked():
            listed = s3.list_object_versions(Bucket="versioned-expiring")
            latest = {m["Key"] for m in listed.get("DeleteMarkers", []) if m["IsLatest"]}
            return latest == set(ids) and listed

        listed = wait_for("delete markers over every expired key", marked, timeout=30)
        assert {v["Key"]: v["VersionId"] for v in listed["Versions"]} == ids
        assert s3.list_objects_v2(Bucket="versioned-expiring")["KeyCount"] == 0
        for _ in range(3):  # from each replica in turn
            for key, vid in ids.items():
                got = s3.get_object(Bucket="versioned-expiring", Key=key, VersionId=vid)
                assert got["Body"].read() == b"log" and got["VersionId"] == vid

        # NoncurrentVersionExpiration and ExpiredObjectDeleteMarker: removals by id, chain
        # steps from each key's head, so every replica's history loses the same versions.
        s3.create_bucket(Bucket="versioned-history")
        s3.put_bucket_versioning(Bucket="versioned-history", VersioningConfiguration={"Status": "Enabled"})
        history = make_history(s3, "versioned-history")
        wait_for("the noncurrent versions and the lone marker removed",
                 lambda: history_left(s3, "versioned-history", history), timeout=30)
        for _ in range(3):  # the same on each replica
            assert history_left(s3, "versioned-history", history)
            got = s3.get_object(Bucket="versioned-history", Key="ds/a", VersionId=history["ds/a"][1])
            assert got["Body"].read() == b"ds/a-2"

        # NoncurrentVersionTransition: a chain edit of each noncurrent version's class by id,
        # then every node's tier worker moves its copy; the current versions stay on NVMe. One
        # node is away while the classes change: back, it catches them up (a class changes no
        # ETag or date, so only comparing the classes finds it) and moves its copies too.
        s3.create_bucket(Bucket="versioned-cold")
        s3.put_bucket_versioning(Bucket="versioned-cold", VersioningConfiguration={"Status": "Enabled"})
        bodies = {}
        for n in range(3):
            for k in ("ckpt/a", "ckpt/b"):
                body = os.urandom(30_000 + n)
                bodies[s3.put_object(Bucket="versioned-cold", Key=k, Body=body)["VersionId"]] = (k, body)
        away = nodes[2]
        away.kill9()
        wait_for("the map without the node", lambda: len(status(etcd.url)["nodes"]) == 2, timeout=30)
        s3.put_bucket_lifecycle_configuration(Bucket="versioned-cold", LifecycleConfiguration={"Rules": [
            {"ID": "old-ckpt", "Filter": {"Prefix": "ckpt/"}, "Status": "Enabled",
             "NoncurrentVersionTransitions": [{"NoncurrentDays": 2, "StorageClass": "STANDARD_IA"}]}]})

        def version_classes():
            listed = s3.list_object_versions(Bucket="versioned-cold")["Versions"]
            return {v["VersionId"]: (v["IsLatest"], v["StorageClass"]) for v in listed}

        def versions_on_tiers():
            st = admin_json(gw, "tier", "status")
            ia = [t for t in st["tiers"] if t["class"] == "STANDARD_IA"]
            return ia and ia[0].get("versions") == 3 * 4 and st["pending_objects"] == 0 and st

        wait_for("the noncurrent versions' class changed", lambda: all(
            c == ("STANDARD" if latest else "STANDARD_IA") for latest, c in version_classes().values()), timeout=30)
        away.start()
        wait_for("three caught-up replicas of every PG", lambda: healthy(etcd.url, 3), timeout=90)
        st = wait_for("every copy of them moved to its node's tier", versions_on_tiers, timeout=30)
        assert st["tiers"][0]["version_bytes"] == 3 * 2 * (30_000 + 30_001), st
        # The classes were edited in place on its return: no version was dropped to be copied
        # again.
        recopied = [line for line in open(away.log_path) if "removing a version" in line and "ckpt/" in line]
        assert not recopied, recopied
        for _ in range(3):  # from each replica in turn
            assert len(version_classes()) == 6
            for vid, (k, body) in bodies.items():
                got = s3.get_object(Bucket="versioned-cold", Key=k, VersionId=vid)
                assert got["Body"].read() == body
    finally:
        gw.stop()
        for n in nodes:
            n.stop()
        etcd.stop()


def node_metric(node, name):
    text = urllib.request.urlopen(f"http://{node.listen}/metrics", timeout=5).read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name))


def test_a_node_of_an_older_build_works_beside_newer_ones(workdir):
    """A mixed-age cluster, as during a rolling upgrade: node2 speaks the internal API over
    HTTP only (`PACKRAT_INTERNAL_HTTP=1`, as a build before the multiplexed connection), the
    others and the gateway the multiplexed connection. Every chain holds node2 (R=3 of three
    nodes), so each write goes through it both ways; every object reads back whole."""
    old = {"PACKRAT_INTERNAL_HTTP": "1"}
    etcd, nodes, (gw,) = start_cluster(workdir / "cluster-mixed", node_env=lambda i: old if i == 2 else None)
    try:
        c = gw.client()
        c.create_bucket(Bucket="mixed")
        bodies = {f"k/{i:03d}": os.urandom(200 + i * 51) for i in range(60)}
        for k, v in bodies.items():
            c.put_object(Bucket="mixed", Key=k, Body=v)
        big = os.urandom(6 * 1024 * 1024)
        up = c.create_multipart_upload(Bucket="mixed", Key="mp")
        p1 = c.upload_part(Bucket="mixed", Key="mp", UploadId=up["UploadId"], PartNumber=1, Body=big)
        p2 = c.upload_part(Bucket="mixed", Key="mp", UploadId=up["UploadId"], PartNumber=2, Body=b"tail")
        c.complete_multipart_upload(Bucket="mixed", Key="mp", UploadId=up["UploadId"], MultipartUpload={
            "Parts": [{"PartNumber": 1, "ETag": p1["ETag"]}, {"PartNumber": 2, "ETag": p2["ETag"]}]})
        for k, v in bodies.items():
            assert c.get_object(Bucket="mixed", Key=k)["Body"].read() == v, k
        assert c.get_object(Bucket="mixed", Key="mp")["Body"].read() == big + b"tail"
        listed = [o["Key"] for p in c.get_paginator("list_objects_v2").paginate(Bucket="mixed")
                  for o in p.get("Contents", [])]
        assert sorted(listed) == sorted([*bodies, "mp"])
        # The new nodes took requests over the multiplexed connection; the old one none.
        assert node_metric(nodes[0], "packrat_node_mux_requests_total") > 0
        assert node_metric(nodes[1], "packrat_node_mux_requests_total") > 0
        assert node_metric(nodes[2], "packrat_node_mux_connections_total") == 0
        assert node_metric(nodes[2], "packrat_node_mux_requests_total") == 0
    finally:
        for p in [gw, *nodes]:
            p.stop()
        etcd.stop()


def mux_frame(req_id, kind, payload, flags=0):
    from awscrt import checksums
    head = len(payload).to_bytes(4, "big") + req_id.to_bytes(8, "big") + bytes([kind, flags, 0, 0])
    return head + payload + checksums.crc32c(head + payload).to_bytes(4, "big")


def mux_read(s):
    """One frame from a node: (id, kind, flags, payload); None if the node closed."""
    head = b""
    while len(head) < 16:
        got = s.recv(16 - len(head))
        if not got:
            return None
        head += got
    n = int.from_bytes(head[:4], "big")
    rest = b""
    while len(rest) < n + 4:
        got = s.recv(n + 4 - len(rest))
        assert got, "cut mid-frame"
        rest += got
    return int.from_bytes(head[4:12], "big"), head[12], head[13], rest[:n]


def test_the_multiplexed_connection_checks_secret_epoch_and_frames(cluster):
    """A node's multiplexed connection, spoken by hand: a wrong secret or another cluster's
    id is refused at the preface; a request routed by an old map is answered 409 with the
    node's epoch, as over HTTP; a frame with a changed byte ends the connection, never a
    request."""
    etcd, nodes, (gw_a, _) = cluster
    a = gw_a.client()
    a.create_bucket(Bucket="muxed")
    a.put_object(Bucket="muxed", Key="k", Body=b"over the connection")
    secret = etcd_value(etcd.url, "/packrat/secret")
    cluster_id = etcd_value(etcd.url, "/packrat/cluster-id")
    assert cluster_id.startswith("cluster-"), cluster_id
    bid = json.loads(etcd_value(etcd.url, "/packrat/buckets/muxed"))["id"]
    host, port = nodes[0].listen.rsplit(":", 1)

    def connect(with_secret, of_cluster):
        s = socket.create_connection((host, int(port)), timeout=5)
        s.sendall(b"PKMX\x02" + b"".join(len(p).to_bytes(2, "big") + p.encode()
                                          for p in (with_secret, of_cluster)))
        answer = s.recv(8)
        msg = s.recv(int.from_bytes(answer[6:8], "big")) if answer[6:8] != b"\0\0" else b""
        return s, answer[:6], msg

    s, answer, msg = connect("not-the-secret", cluster_id)
    assert answer == b"PKMX\x02\x01" and msg == b"cluster secret wrong", (answer, msg)
    assert s.recv(1) == b""
    s.close()
    s, answer, msg = connect(secret, "cluster-of-another")
    assert answer == b"PKMX\x02\x01", (answer, msg)
    assert msg == f"this node is in {cluster_id}, not in cluster-of-another".encode(), msg
    assert s.recv(1) == b""
    s.close()

    s, answer, _ = connect(secret, cluster_id)
    assert answer == b"PKMX\x02\x00"
    lookup = b"".join(bid.to_bytes(8, "big") + pg.to_bytes(4, "big") + (65536).to_bytes(8, "big")
                      + (1).to_bytes(4, "big") + b"k" for pg in range(PGS))

    def request(req_id, epoch):
        path = b"/g"
        return (bytes([3]) + epoch.to_bytes(8, "big") + len(path).to_bytes(2, "big") + path
                + (0).to_bytes(2, "big") + lookup)

    s.sendall(mux_frame(1, 1, request(1, 0)))
    rid, kind, flags, payload = mux_read(s)
    status = int.from_bytes(payload[:2], "big")
    assert (rid, kind, flags & 1, status) == (1, 2, 1, 409), (rid, kind, flags, payload[:100])
    nheaders = int.from_bytes(payload[2:4], "big")
    at = 4
    for _ in range(nheaders):
        at += 2 + int.from_bytes(payload[at:at + 2], "big")
        at += 4 + int.from_bytes(payload[at:at + 4], "big")
    epoch = json.loads(payload[at:])["epoch"]
    assert epoch > 0
    # Two requests in flight at once on the one connection, answered by their ids.
    s.sendall(mux_frame(2, 1, request(2, epoch)) + mux_frame(3, 1, request(3, epoch)))
    answers = {mux_read(s)[0]: None for _ in range(2)}
    assert set(answers) == {2, 3}
    # A changed byte: the node drops the connection, answering nothing.
    bad = bytearray(mux_frame(4, 1, request(4, epoch)))
    bad[40] ^= 1
    s.sendall(bytes(bad))
    assert mux_read(s) is None
    s.close()
