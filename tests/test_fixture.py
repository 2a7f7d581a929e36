"""A data directory written by an earlier release (checked in under tests/fixtures/, made by
tests/fixtures/make_datadir.py) read back by the current binary: every object's bytes and
attributes, the upload left in progress (which then completes), TAR members, lifecycle rules,
the public bucket, both access keys, and an offline verify with no problems."""

import hashlib
import json
import pathlib
import subprocess
import tarfile

import boto3
import pytest
from botocore import UNSIGNED
from botocore.config import Config
from botocore.exceptions import ClientError

from conftest import BIN, REGION, Server

FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures"


def code(e):
    return e.response["Error"]["Code"]


@pytest.fixture(scope="module", params=sorted(p.name for p in FIXTURES.glob("datadir-*.tar.gz")))
def restored(request, workdir):
    dest = workdir / request.param.removesuffix(".tar.gz")
    with tarfile.open(FIXTURES / request.param) as t:
        t.extractall(dest, filter="data")
    data = dest / "data"
    manifest = json.loads((data / "fixture-manifest.json").read_text())
    srv = Server(data).start()
    yield srv, manifest
    srv.stop()


def test_fixtures_are_checked_in():
    assert list(FIXTURES.glob("datadir-*.tar.gz")), "no data directory fixture under tests/fixtures"


def test_objects_read_back_with_their_attributes(restored):
    srv, m = restored
    s3 = srv.client()
    assert {b["Name"] for b in s3.list_buckets()["Buckets"]} >= set(m["buckets"])
    for path, want in m["objects"].items():
        bucket, key = path.split("/", 1)
        r = s3.get_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
        body = r["Body"].read()
        assert len(body) == want["size"], path
        assert hashlib.sha256(body).hexdigest() == want["sha256"], path
        assert r["ETag"] == want["etag"], path
        if want["content_type"]:
            assert r["ContentType"] == want["content_type"], path
        assert r["Metadata"] == want["metadata"], path
        if want["checksum_sha256"]:
            assert r["ChecksumSHA256"] == want["checksum_sha256"], path
        tags = s3.get_object_tagging(Bucket=bucket, Key=key)["TagSet"]
        assert {t["Key"]: t["Value"] for t in tags} == want["tags"], path
    for path in m["deleted"]:
        bucket, key = path.split("/", 1)
        with pytest.raises(ClientError) as e:
            s3.head_object(Bucket=bucket, Key=key)
        assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404
    listed = [o["Key"] for o in s3.list_objects_v2(Bucket="fixture")["Contents"]]
    want_keys = sorted(k.split("/", 1)[1] for k in m["objects"] if k.startswith("fixture/"))
    assert listed == want_keys


def test_upload_in_progress_reads_back_and_completes(restored):
    srv, m = restored
    s3 = srv.client()
    for up in m["uploads"]:
        listed = s3.list_multipart_uploads(Bucket=up["bucket"])["Uploads"]
        assert [(u["Key"], u["UploadId"]) for u in listed] == [(up["key"], up["upload_id"])]
        parts = s3.list_parts(Bucket=up["bucket"], Key=up["key"], UploadId=up["upload_id"])["Parts"]
        assert [(p["PartNumber"], p["ETag"], p["Size"]) for p in parts] == [
            (p["number"], p["etag"], p["size"]) for p in up["parts"]
        ]
        s3.complete_multipart_upload(
            Bucket=up["bucket"], Key=up["key"], UploadId=up["upload_id"],
            MultipartUpload={"Parts": [{"PartNumber": p["number"], "ETag": p["etag"]} for p in up["parts"]]},
        )
        got = s3.head_object(Bucket=up["bucket"], Key=up["key"])
        assert got["ContentLength"] == sum(p["size"] for p in up["parts"])


def test_tar_members_lifecycle_and_public_bucket(restored):
    srv, m = restored
    s3 = srv.client()
    pk = srv.packrat()
    for path, members in m["tar_members"].items():
        bucket, key = path.split("/", 1)
        items = [{"key": key, "member": name} for name in members]
        got = list(pk.batch_get(bucket, items))
        assert [(s.error, s.data.decode()) for s in got] == [(None, d) for d in members.values()]
    for bucket, ids in m["lifecycle"].items():
        rules = s3.get_bucket_lifecycle_configuration(Bucket=bucket)["Rules"]
        assert sorted(r["ID"] for r in rules) == ids
    anon = boto3.client("s3", endpoint_url=srv.endpoint, region_name=REGION,
                        config=Config(signature_version=UNSIGNED, s3={"addressing_style": "path"}))
    for bucket, b in m["buckets"].items():
        for path in (p for p in m["objects"] if p.startswith(bucket + "/")):
            key = path.split("/", 1)[1]
            if b["public"]:
                assert anon.get_object(Bucket=bucket, Key=key)["Body"].read()
            else:
                with pytest.raises(ClientError) as e:
                    anon.get_object(Bucket=bucket, Key=key)
                assert code(e.value) == "AccessDenied"


def test_access_keys_read_back(restored):
    srv, m = restored
    for k in m["keys"]:
        s3 = srv.client(ak=k["access_key"], sk=k["secret_key"])
        names = {b["Name"] for b in s3.list_buckets()["Buckets"]}
        # The buckets belong to the root key's owner; the other key sees none of them.
        assert (names >= set(m["buckets"])) if k["root"] else not (names & set(m["buckets"]))


def test_offline_verify_finds_no_problems(restored):
    srv, _ = restored
    srv.stop()
    try:
        r = subprocess.run([BIN, "admin", "--data-dir", srv.data_dir, "verify", "--json"],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        assert json.loads(r.stdout)["problem_count"] == 0
    finally:
        srv.start()
