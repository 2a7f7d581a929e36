"""Object and bucket tagging against the real binary through boto3: the x-amz-tagging header on
PutObject, CopyObject and CreateMultipartUpload, Get/Put/DeleteObjectTagging and
Get/Put/DeleteBucketTagging, S3's limits and errors, tags surviving a restart, and lifecycle
rules that select objects by tag."""

import os
import subprocess
import urllib.error
import urllib.request

import pytest
from botocore.exceptions import ClientError

import conftest
from conftest import Server
from sigv4_client import signed_request
from test_tiering import admin


def tagset(s3, bucket, key):
    return {t["Key"]: t["Value"] for t in s3.get_object_tagging(Bucket=bucket, Key=key)["TagSet"]}


def code_of(fn, *args, **kw):
    with pytest.raises(ClientError) as e:
        fn(*args, **kw)
    return e.value.response["Error"]["Code"]


def test_tags_on_put_get_replace_delete(s3, bucket):
    s3.put_object(Bucket=bucket, Key="img/1.jpg", Body=b"x" * 100,
                  Tagging="split=train&label=cat%20photo&empty=")
    assert tagset(s3, bucket, "img/1.jpg") == {"split": "train", "label": "cat photo", "empty": ""}
    assert s3.get_object(Bucket=bucket, Key="img/1.jpg")["TagCount"] == 3
    s3.put_object_tagging(Bucket=bucket, Key="img/1.jpg", Tagging={"TagSet": [
        {"Key": "split", "Value": "val"}, {"Key": "ünïcode", "Value": "ok @ 1.0/2+3=5_:-"}]})
    assert tagset(s3, bucket, "img/1.jpg") == {"split": "val", "ünïcode": "ok @ 1.0/2+3=5_:-"}
    # Tagging changes neither the bytes nor the ETag.
    got = s3.get_object(Bucket=bucket, Key="img/1.jpg")
    assert got["Body"].read() == b"x" * 100 and got["TagCount"] == 2
    s3.delete_object_tagging(Bucket=bucket, Key="img/1.jpg")
    assert tagset(s3, bucket, "img/1.jpg") == {}
    assert "TagCount" not in s3.get_object(Bucket=bucket, Key="img/1.jpg")
    # An overwrite without tags has none.
    s3.put_object(Bucket=bucket, Key="k", Body=b"1", Tagging="a=1")
    s3.put_object(Bucket=bucket, Key="k", Body=b"2")
    assert tagset(s3, bucket, "k") == {}


def test_tag_limits_and_errors(s3, bucket):
    s3.put_object(Bucket=bucket, Key="k", Body=b"1", Tagging="keep=me")
    eleven = {"TagSet": [{"Key": f"k{i}", "Value": "v"} for i in range(11)]}
    assert code_of(s3.put_object_tagging, Bucket=bucket, Key="k", Tagging=eleven) == "BadRequest"
    dup = {"TagSet": [{"Key": "a", "Value": "1"}, {"Key": "a", "Value": "2"}]}
    assert code_of(s3.put_object_tagging, Bucket=bucket, Key="k", Tagging=dup) == "InvalidTag"
    for bad in ({"Key": "aws:x", "Value": "1"}, {"Key": "k" * 129, "Value": "1"},
                {"Key": "a", "Value": "v" * 257}, {"Key": "a", "Value": "<b>"}):
        assert code_of(s3.put_object_tagging, Bucket=bucket, Key="k",
                       Tagging={"TagSet": [bad]}) == "InvalidTag", bad
    assert code_of(s3.put_object, Bucket=bucket, Key="k2", Body=b"1", Tagging="a=1&a=2") == "InvalidTag"
    assert code_of(s3.put_object_tagging, Bucket="no-such-bucket-x", Key="k",
                   Tagging={"TagSet": []}) == "NoSuchBucket"
    assert code_of(s3.get_object_tagging, Bucket=bucket, Key="missing") == "NoSuchKey"
    assert code_of(s3.delete_object_tagging, Bucket=bucket, Key="missing") == "NoSuchKey"
    # Failed requests changed nothing; a new object was not created.
    assert tagset(s3, bucket, "k") == {"keep": "me"}
    assert code_of(s3.head_object, Bucket=bucket, Key="k2") == "404"


def test_bucket_tagging(server, s3, bucket):
    """Put/Get/DeleteBucketTagging: up to 50 tags (an object has 10), S3's rules, a put
    replaces the set, the owner's only, and a bad set changes nothing."""
    assert code_of(s3.get_bucket_tagging, Bucket=bucket) == "NoSuchTagSet"
    tags = [{"Key": f"k{i}", "Value": f"v {i}"} for i in range(50)]
    r = s3.put_bucket_tagging(Bucket=bucket, Tagging={"TagSet": tags})
    assert r["ResponseMetadata"]["HTTPStatusCode"] == 204
    assert s3.get_bucket_tagging(Bucket=bucket)["TagSet"] == tags
    s3.put_bucket_tagging(Bucket=bucket, Tagging={"TagSet": [{"Key": "team", "Value": "vision"}]})
    assert s3.get_bucket_tagging(Bucket=bucket)["TagSet"] == [{"Key": "team", "Value": "vision"}]
    for bad in ([{"Key": f"k{i}", "Value": "v"} for i in range(51)],
                [{"Key": "a", "Value": "1"}, {"Key": "a", "Value": "2"}],
                [{"Key": "aws:x", "Value": "1"}]):
        assert code_of(s3.put_bucket_tagging, Bucket=bucket, Tagging={"TagSet": bad}) == "InvalidTag"
    assert s3.get_bucket_tagging(Bucket=bucket)["TagSet"] == [{"Key": "team", "Value": "vision"}]
    # Object tags are their own: the bucket's set is not an object's.
    s3.put_object(Bucket=bucket, Key="o", Body=b"1")
    assert tagset(s3, bucket, "o") == {}
    # Another user neither reads nor changes it; anonymous callers neither, on a public bucket.
    out = subprocess.run([conftest.BIN, "admin", "--endpoint", server.endpoint, "key", "create", "--name", "mallory",
                          "--access-key", "MALLORYTAGS", "--secret-key", "mallory-secret-1"],
                         env=dict(os.environ, PACKRAT_ROOT_ACCESS_KEY=conftest.ROOT_AK,
                                  PACKRAT_ROOT_SECRET_KEY=conftest.ROOT_SK),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    mallory = server.client("MALLORYTAGS", "mallory-secret-1")
    assert code_of(mallory.get_bucket_tagging, Bucket=bucket) == "AccessDenied"
    assert code_of(mallory.put_bucket_tagging, Bucket=bucket, Tagging={"TagSet": []}) == "AccessDenied"
    assert code_of(mallory.delete_bucket_tagging, Bucket=bucket) == "AccessDenied"
    s3.put_bucket_acl(Bucket=bucket, ACL="public-read")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(f"{server.endpoint}/{bucket}?tagging")
    assert e.value.code == 403
    s3.put_bucket_acl(Bucket=bucket, ACL="private")
    assert s3.delete_bucket_tagging(Bucket=bucket)["ResponseMetadata"]["HTTPStatusCode"] == 204
    assert code_of(s3.get_bucket_tagging, Bucket=bucket) == "NoSuchTagSet"


def test_malformed_tagging_xml(server, bucket, s3):
    s3.put_object(Bucket=bucket, Key="k", Body=b"1", Tagging="a=1")
    for body in (b"<Tagging><TagSet><Tag><Key>x", b"not xml at all", b""):
        status, _, answer = signed_request(server.endpoint, "PUT", f"/{bucket}/k", "tagging", body,
                                           ak=conftest.ROOT_AK, sk=conftest.ROOT_SK)
        assert status == 400 and b"MalformedXML" in answer, (body, status, answer)
    assert tagset(s3, bucket, "k") == {"a": "1"}


@pytest.mark.local_only
def test_copy_and_multipart_carry_tags(s3, bucket):
    s3.put_object(Bucket=bucket, Key="src", Body=b"s" * 10, Tagging="a=1&b=2")
    s3.copy_object(Bucket=bucket, Key="copy", CopySource={"Bucket": bucket, "Key": "src"})
    assert tagset(s3, bucket, "copy") == {"a": "1", "b": "2"}
    s3.copy_object(Bucket=bucket, Key="copy2", CopySource={"Bucket": bucket, "Key": "src"},
                   TaggingDirective="REPLACE", Tagging="c=3")
    assert tagset(s3, bucket, "copy2") == {"c": "3"}
    # A copy onto itself that only replaces tags is allowed and keeps the bytes.
    s3.copy_object(Bucket=bucket, Key="src", CopySource={"Bucket": bucket, "Key": "src"},
                   TaggingDirective="REPLACE", Tagging="d=4")
    assert tagset(s3, bucket, "src") == {"d": "4"}
    assert s3.get_object(Bucket=bucket, Key="src")["Body"].read() == b"s" * 10
    up = s3.create_multipart_upload(Bucket=bucket, Key="mp", Tagging="dataset=imagenet&shard=7")
    part = s3.upload_part(Bucket=bucket, Key="mp", UploadId=up["UploadId"], PartNumber=1, Body=b"m" * 100)
    s3.complete_multipart_upload(Bucket=bucket, Key="mp", UploadId=up["UploadId"],
                                 MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": part["ETag"]}]})
    assert tagset(s3, bucket, "mp") == {"dataset": "imagenet", "shard": "7"}
    head = s3.head_object(Bucket=bucket, Key="mp")
    assert "x-amz-tagging" not in {k.lower() for k in head["ResponseMetadata"]["HTTPHeaders"]}
    assert code_of(s3.create_multipart_upload, Bucket=bucket, Key="mp2", Tagging="aws:no=1") == "InvalidTag"


@pytest.mark.local_only
def test_tags_survive_restart_and_drive_lifecycle(workdir):
    srv = Server(workdir / "tags-restart").start()
    try:
        s3 = srv.client()
        s3.create_bucket(Bucket="tagged")
        for i in range(20):
            tags = "stage=raw" if i % 2 else "stage=clean"
            s3.put_object(Bucket="tagged", Key=f"d/{i:02d}", Body=b"z" * 10, Tagging=tags)
        s3.put_object(Bucket="tagged", Key="plain", Body=b"p")
        srv.stop()
        srv.start()
        s3 = srv.client()
        assert tagset(s3, "tagged", "d/01") == {"stage": "raw"}
        assert tagset(s3, "tagged", "plain") == {}
        s3.put_bucket_lifecycle_configuration(Bucket="tagged", LifecycleConfiguration={"Rules": [
            {"ID": "raw", "Filter": {"Tag": {"Key": "stage", "Value": "raw"}}, "Status": "Enabled",
             "Expiration": {"Days": 1}}]})
        rules = s3.get_bucket_lifecycle_configuration(Bucket="tagged")["Rules"]
        assert rules[0]["Filter"] == {"Tag": {"Key": "stage", "Value": "raw"}}
        out = admin(srv, "tier", "run", "--days-ahead", "2")
        assert "10 expirations" in out.stdout, out.stdout
        keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket="tagged")["Contents"])
        assert keys == [f"d/{i:02d}" for i in range(0, 20, 2)] + ["plain"]
        # The offline check reads the version-2 index entries of tagged objects.
        srv.stop()
        out = subprocess.run([conftest.BIN, "admin", "--data-dir", srv.data_dir, "verify"],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stdout + out.stderr
    finally:
        srv.stop()
