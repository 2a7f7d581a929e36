"""Disk faults injected under the engine of the real binary (`--fault-injection`): EIO and
ENOSPC on writes, torn writes, failing fsync, EIO on reads, failing index writes. Each request
hit by a fault gets the right S3 error, nothing acknowledged is lost, no partial object becomes
visible, and the server recovers by itself once the fault clears (no restart)."""

import hashlib
import json
import os
import subprocess

import pytest
from botocore.exceptions import ClientError, ResponseStreamingError

import conftest
from conftest import Server
from packrat_client import PackratClient
from sigv4_client import signed_request


def set_faults(srv, **faults):
    st, _, body = signed_request(srv.endpoint, "PUT", "/_packrat/admin/faults",
                                 body=json.dumps(faults).encode())
    assert st == 200, body
    return json.loads(body)


@pytest.fixture
def faulty(workdir):
    srv = Server(workdir / ("faults-" + os.urandom(3).hex()), ["--fault-injection", "--compact-interval", "0"]).start()
    c = srv.client()
    c.create_bucket(Bucket="faulty")
    yield srv, c
    srv.stop()


def put_many(c, prefix, n, size=5000):
    acked = {}
    for i in range(n):
        body = os.urandom(size + i)
        c.put_object(Bucket="faulty", Key=f"{prefix}{i}", Body=body)
        acked[f"{prefix}{i}"] = hashlib.md5(body).hexdigest()
    return acked


def check(c, acked):
    for k, md5 in acked.items():
        assert hashlib.md5(c.get_object(Bucket="faulty", Key=k)["Body"].read()).hexdigest() == md5, k


def absent(c, key):
    with pytest.raises(ClientError) as e:
        c.head_object(Bucket="faulty", Key=key)
    return e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404


def test_disk_full_is_507_and_recovers_without_restart(faulty):
    srv, c = faulty
    acked = put_many(c, "ok/", 10)
    set_faults(srv, write="enospc")
    for size in (100, 3 * 1024 * 1024):  # a one-record and a multi-record object
        with pytest.raises(ClientError) as e:
            c.put_object(Bucket="faulty", Key="full", Body=os.urandom(size))
        assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 507
        assert e.value.response["Error"]["Code"] == "InsufficientStorage"
        assert "full" in e.value.response["Error"]["Message"]
    assert absent(c, "full")
    check(c, acked)  # reads go on while the disk is full
    # A multipart part hit by the full disk fails; the retry after space returns succeeds.
    uid = c.create_multipart_upload(Bucket="faulty", Key="mp")["UploadId"]
    with pytest.raises(ClientError):
        c.upload_part(Bucket="faulty", Key="mp", UploadId=uid, PartNumber=1, Body=b"p" * 1000)
    set_faults(srv)  # space is back
    e1 = c.upload_part(Bucket="faulty", Key="mp", UploadId=uid, PartNumber=1, Body=b"p" * 1000)["ETag"]
    c.complete_multipart_upload(Bucket="faulty", Key="mp", UploadId=uid,
                                MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": e1}]})
    acked.update(put_many(c, "after/", 10))
    check(c, acked)
    assert c.get_object(Bucket="faulty", Key="mp")["Body"].read() == b"p" * 1000


def test_torn_and_failed_writes_leave_no_partial_object(faulty):
    srv, c = faulty
    acked = put_many(c, "ok/", 10)
    for fault in ("torn", "eio"):
        set_faults(srv, write=fault)
        for key, size in (("small", 2000), ("large", 2 * 1024 * 1024 + 5)):
            with pytest.raises(ClientError) as e:
                c.put_object(Bucket="faulty", Key=f"{fault}-{key}", Body=os.urandom(size))
            assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 500
            assert absent(c, f"{fault}-{key}")
        # An overwrite hit by the fault leaves the old version in place.
        with pytest.raises(ClientError):
            c.put_object(Bucket="faulty", Key="ok/0", Body=b"new version")
        set_faults(srv)
        check(c, acked)
    acked.update(put_many(c, "after/", 5))
    check(c, acked)
    # The torn bytes sit beyond every indexed record: the data directory still verifies.
    srv.kill9()
    out = subprocess.run([conftest.BIN, "admin", "--data-dir", srv.data_dir, "verify"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout
    srv.start()
    check(srv.client(), acked)


def test_failing_fsync_fails_the_write_and_nothing_acknowledged_is_lost(faulty):
    srv, c = faulty
    acked = put_many(c, "ok/", 10)
    set_faults(srv, sync="eio")
    for i in range(3):
        with pytest.raises(ClientError) as e:
            c.put_object(Bucket="faulty", Key=f"unsynced{i}", Body=os.urandom(3000))
        assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 500
        assert absent(c, f"unsynced{i}")
    # A delete writes no segment data, so it needs no segment fsync and still succeeds.
    c.delete_object(Bucket="faulty", Key="ok/1")
    del acked["ok/1"]
    set_faults(srv)
    # After a failed fsync the segment is abandoned; new writes go to a fresh one.
    acked.update(put_many(c, "after/", 10))
    check(c, acked)
    srv.kill9()
    srv.start()
    c = srv.client()
    check(c, acked)
    for i in range(3):
        assert absent(c, f"unsynced{i}")
    assert absent(c, "ok/1")


def test_read_errors_are_500_never_wrong_bytes(faulty):
    srv, c = faulty
    acked = put_many(c, "ok/", 5)
    c.put_object(Bucket="faulty", Key="big", Body=b"b" * (3 * 1024 * 1024))
    set_faults(srv, read="eio")
    with pytest.raises(ClientError) as e:
        c.get_object(Bucket="faulty", Key="ok/0")["Body"].read()
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 500
    assert c.head_object(Bucket="faulty", Key="ok/0")["ContentLength"] > 0  # metadata still served
    pc = PackratClient(endpoint_url=srv.endpoint, region_name=conftest.REGION,
                       aws_access_key_id=conftest.ROOT_AK, aws_secret_access_key=conftest.ROOT_SK)
    got = list(pc.batch_get("faulty", list(acked)))
    assert all(not s.ok for s in got) and all(s.data == b"" for s in got)
    assert set_faults(srv)["injected"] > 0
    check(c, acked)
    assert c.get_object(Bucket="faulty", Key="big")["Body"].read() == b"b" * (3 * 1024 * 1024)


def test_failing_index_writes(faulty):
    srv, c = faulty
    acked = put_many(c, "ok/", 5)
    set_faults(srv, index_write="eio")
    with pytest.raises(ClientError) as e:
        c.put_object(Bucket="faulty", Key="noindex", Body=b"x" * 100)
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 500
    with pytest.raises(ClientError):
        c.delete_object(Bucket="faulty", Key="ok/0")
    with pytest.raises(ClientError):
        c.create_bucket(Bucket="not-created")
    set_faults(srv)
    assert absent(c, "noindex")
    check(c, acked)  # the delete that failed did not happen
    acked.update(put_many(c, "after/", 5))
    check(c, acked)


def test_a_read_that_fails_midway_through_a_streamed_get_never_serves_wrong_bytes(faulty):
    srv, c = faulty
    big = os.urandom(3 * 1024 * 1024 + 17)  # four 1 MiB records
    c.put_object(Bucket="faulty", Key="big", Body=big)
    # The first record reads; the second fails, after the response has started.
    got = set_faults(srv, rules=[{"op": "read", "fault": "eio", "after": 1, "times": 1}])
    assert got["rules"] == [{"op": "read", "fault": "eio", "after": 1, "times": 1, "every": 0}]
    with pytest.raises(ResponseStreamingError):
        c.get_object(Bucket="faulty", Key="big")["Body"].read()
    assert set_faults(srv)["injected"] == 1
    assert c.get_object(Bucket="faulty", Key="big")["Body"].read() == big


def test_intermittent_write_faults_fail_some_puts_and_lose_none(faulty):
    srv, _ = faulty
    c = srv.client()  # one attempt per call: each failed attempt is a failed PUT here
    set_faults(srv, rules=[{"op": "write", "fault": "eio", "every": 3}])
    acked, failed = {}, []
    for i in range(12):
        body = os.urandom(2000 + i)
        try:
            c.put_object(Bucket="faulty", Key=f"k{i}", Body=body)
            acked[f"k{i}"] = hashlib.md5(body).hexdigest()
        except ClientError as e:
            assert e.response["ResponseMetadata"]["HTTPStatusCode"] == 500, e.response
            failed.append(f"k{i}")
    assert set_faults(srv)["injected"] == len(failed)
    assert failed == ["k0", "k3", "k6", "k9"], failed
    check(c, acked)
    for k in failed:
        assert absent(c, k)


def test_failing_index_deletes_only(faulty):
    srv, c = faulty
    acked = put_many(c, "ok/", 3)
    set_faults(srv, rules=[{"op": "index_delete", "fault": "eio"}])
    acked.update(put_many(c, "during/", 3))  # writes that delete nothing go on
    with pytest.raises(ClientError) as e:
        c.delete_object(Bucket="faulty", Key="ok/0")
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 500
    set_faults(srv)
    check(c, acked)  # the delete that failed did not happen
    c.delete_object(Bucket="faulty", Key="ok/0")
    assert absent(c, "ok/0")


def test_a_failing_tier_upload_leaves_objects_local_and_the_next_run_moves_them(workdir):
    root = workdir / ("tierfault-" + os.urandom(3).hex())
    root.mkdir()
    srv = Server(root / "data", ["--fault-injection", "--tier", f"STANDARD_IA=dir:{root / 'hdd'}",
                                 "--tier-interval", "0"]).start()
    try:
        c = srv.client()
        c.create_bucket(Bucket="cold")
        bodies = {f"o{i}": os.urandom(5000 + i) for i in range(20)}
        for k, b in bodies.items():
            c.put_object(Bucket="cold", Key=k, Body=b, StorageClass="STANDARD_IA")
        set_faults(srv, rules=[{"op": "tier_upload", "fault": "eio"}])
        env = dict(os.environ, PACKRAT_ROOT_ACCESS_KEY=conftest.ROOT_AK,
                   PACKRAT_ROOT_SECRET_KEY=conftest.ROOT_SK)
        run = [conftest.BIN, "admin", "--endpoint", srv.endpoint, "tier", "run"]
        out = subprocess.run(run, capture_output=True, text=True, timeout=120, env=env)
        assert out.returncode != 0 and "storage tier STANDARD_IA failed" in out.stdout + out.stderr, \
            out.stdout + out.stderr
        assert set_faults(srv)["injected"] >= 1
        for k, b in bodies.items():
            assert c.get_object(Bucket="cold", Key=k)["Body"].read() == b
        out = subprocess.run(run, capture_output=True, text=True, timeout=120, env=env)
        assert out.returncode == 0, out.stdout + out.stderr
        assert [p.name for p in root.joinpath("hdd").rglob("seg-*")], "no segment reached the tier"
        for k, b in bodies.items():
            assert c.get_object(Bucket="cold", Key=k)["Body"].read() == b
    finally:
        srv.stop()
