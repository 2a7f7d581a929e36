"""Disk faults injected under the engine of the real binary (`--fault-injection`): EIO and
ENOSPC on writes, torn writes, failing fsync, EIO on reads, failing index writes. Each request
hit by a fault gets the right S3 error, nothing acknowledged is lost, no partial object becomes
visible, and the server recovers by itself once the fault clears (no restart)."""

import hashlib
import json
import os
import subprocess

import pytest
from botocore.exceptions import ClientError

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
