"""SSE-KMS against packrat's own key provider, with boto3 against the real binary: named keys
made with `packrat admin kms key create`, who may use each, the default key, copies between
every kind of encryption, multipart uploads, bucket defaults and what still answers 501. The
tests without `local_only` run on one server and through a cluster gateway (`PACKRAT_TEST_TARGET=cluster`)."""

import hashlib
import json
import os

import botocore
import pytest

import conftest
from conftest import Server
from test_auth_checksums import admin
from test_bucket_acl import new_user
from test_sse import BLOCK, code_of, pattern, stored_bytes, tls_client, tls  # noqa: F401 (tls: fixture)


def kms_key(server, name, *users):
    """A new KMS key (a name unique to the run) that `users` may use: its JSON record."""
    name = f"{name}-{os.urandom(3).hex()}"
    args = [a for u in users for a in ("--user", u)]
    out = admin(server, "--output", "json", "kms", "key", "create", name, *args)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def listed_keys(server):
    out = admin(server, "--output", "json", "kms", "key", "list")
    assert out.returncode == 0, out.stderr
    return {k["name"]: k for k in json.loads(out.stdout)}


def arn(key):
    return f"arn:aws:kms:::key/{key['id']}"


def test_sse_kms_keys_and_who_may_use_them(server, s3, bucket):
    tag = os.urandom(3).hex()
    alice, alice_id = new_user(server, f"kms-alice-{tag}")
    bob, _ = new_user(server, f"kms-bob-{tag}")
    team = kms_key(server, "team", alice_id)
    assert team["users"] == [alice_id]
    assert listed_keys(server)[team["name"]]["id"] == team["id"]
    # A taken name is refused, and so are reserved ones, with the reason.
    out = admin(server, "kms", "key", "create", team["name"])
    assert out.returncode != 0 and "exists" in out.stderr, out.stderr
    out = admin(server, "kms", "key", "create", "aws/mine")
    assert out.returncode != 0 and "reserved" in out.stderr, out.stderr

    name = f"kms-{tag}"
    alice.create_bucket(Bucket=name)
    policy = {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Principal": "*", "Action": ["s3:GetObject", "s3:PutObject"],
         "Resource": f"arn:aws:s3:::{name}/*"}]}
    alice.put_bucket_policy(Bucket=name, Policy=json.dumps(policy))
    body = pattern(2 * BLOCK + 321, seed=3)
    # The key named by its alias, its id and its ARN: the answer names its ARN.
    for ref in [f"alias/{team['name']}", team["id"], arn(team)]:
        put = alice.put_object(Bucket=name, Key="k", Body=body, ServerSideEncryption="aws:kms", SSEKMSKeyId=ref)
        assert (put["ServerSideEncryption"], put["SSEKMSKeyId"]) == ("aws:kms", arn(team)), ref
    # Not the plaintext's MD5 (as S3: an SSE-KMS object's ETag is no content MD5).
    assert put["ETag"] != '"%s"' % hashlib.md5(body).hexdigest()
    got = alice.get_object(Bucket=name, Key="k")
    assert got["Body"].read() == body
    assert (got["ServerSideEncryption"], got["SSEKMSKeyId"]) == ("aws:kms", arn(team))
    assert got["ETag"] == put["ETag"]
    head = alice.head_object(Bucket=name, Key="k")
    assert (head["ServerSideEncryption"], head["SSEKMSKeyId"], head["ContentLength"]) == \
        ("aws:kms", arn(team), len(body))
    r = alice.get_object(Bucket=name, Key="k", Range=f"bytes={BLOCK - 3}-{BLOCK + 3}")
    assert r["Body"].read() == body[BLOCK - 3:BLOCK + 4]
    listed = alice.list_objects_v2(Bucket=name)["Contents"]
    assert [(o["Key"], o["Size"]) for o in listed] == [("k", len(body))]
    # Root keys may use any key.
    assert s3.get_object(Bucket=name, Key="k")["Body"].read() == body

    # bob and anonymous callers may read and write the bucket, but not use the key.
    anon = server.client(signature_version=botocore.UNSIGNED)
    alice.put_object(Bucket=name, Key="plain", Body=b"plain")
    assert bob.get_object(Bucket=name, Key="plain")["Body"].read() == b"plain"
    assert anon.get_object(Bucket=name, Key="plain")["Body"].read() == b"plain"
    assert code_of(bob.get_object, Bucket=name, Key="k") == ("AccessDenied", 403)
    assert code_of(bob.head_object, Bucket=name, Key="k")[1] == 403
    assert code_of(anon.get_object, Bucket=name, Key="k") == ("AccessDenied", 403)
    assert code_of(bob.put_object, Bucket=name, Key="by-bob", Body=b"x", ServerSideEncryption="aws:kms",
                   SSEKMSKeyId=team["id"]) == ("AccessDenied", 403)
    assert code_of(bob.copy_object, Bucket=name, Key="by-bob", CopySource={"Bucket": name, "Key": "k"}) \
        == ("AccessDenied", 403)
    assert code_of(alice.head_object, Bucket=name, Key="by-bob")[1] == 404

    # The default key (aws/s3, made on first use) is everyone's.
    put = bob.put_object(Bucket=name, Key="default", Body=b"d", ServerSideEncryption="aws:kms")
    default = listed_keys(server)["aws/s3"]
    assert default["users"] == ["*"] and put["SSEKMSKeyId"] == arn(default)
    assert alice.get_object(Bucket=name, Key="default")["Body"].read() == b"d"
    assert code_of(anon.get_object, Bucket=name, Key="default") == ("AccessDenied", 403)

    # An unknown key is S3's KMS.NotFoundException; a key id without aws:kms, a dual-layer
    # or an encryption context are refused; nothing is stored.
    assert code_of(alice.put_object, Bucket=name, Key="bad", Body=b"x", ServerSideEncryption="aws:kms",
                   SSEKMSKeyId="alias/no-such-key") == ("KMS.NotFoundException", 400)
    assert code_of(alice.put_object, Bucket=name, Key="bad", Body=b"x", ServerSideEncryption="AES256",
                   SSEKMSKeyId=team["id"]) == ("InvalidArgument", 400)
    assert code_of(alice.put_object, Bucket=name, Key="bad", Body=b"x",
                   ServerSideEncryption="aws:kms:dsse") == ("NotImplemented", 501)
    assert code_of(alice.put_object, Bucket=name, Key="bad", Body=b"x", ServerSideEncryption="aws:kms",
                   SSEKMSEncryptionContext="eyJhIjoiYiJ9") == ("NotImplemented", 501)
    assert code_of(alice.create_multipart_upload, Bucket=name, Key="bad", ServerSideEncryption="aws:kms",
                   SSEKMSKeyId="alias/no-such-key") == ("KMS.NotFoundException", 400)
    assert code_of(alice.head_object, Bucket=name, Key="bad")[1] == 404
    assert "Uploads" not in alice.list_multipart_uploads(Bucket=name)
    # Bucket keys change nothing here and are taken with SSE-KMS.
    put = alice.put_object(Bucket=name, Key="bk", Body=b"b", ServerSideEncryption="aws:kms",
                           SSEKMSKeyId=team["id"], BucketKeyEnabled=True)
    assert put["SSEKMSKeyId"] == arn(team)

    # Batch GET gives an encrypted object an error entry, never its ciphertext.
    got = {s.name: s for s in server.packrat().batch_get(name, ["k", "plain"])}
    assert got["plain"].data == b"plain"
    assert got["k"].error is not None and not got["k"].data
    conftest.empty_bucket(alice, name)


def test_sse_kms_copies_in_every_direction(server, s3, bucket):
    """Copies between plain, SSE-S3 and SSE-KMS (under a named key and the default key), in
    every direction, read back whole; a copy onto itself changes SSE-KMS keys in place."""
    key = kms_key(server, "copies")
    body = pattern(BLOCK + 4099, seed=11)
    kinds = {
        "plain": {},
        "s3": {"ServerSideEncryption": "AES256"},
        "kms": {"ServerSideEncryption": "aws:kms", "SSEKMSKeyId": key["id"]},
        "kms-default": {"ServerSideEncryption": "aws:kms"},
    }
    for src, how in kinds.items():
        s3.put_object(Bucket=bucket, Key=f"src-{src}", Body=body, **how)
    for src in kinds:
        for dst, how in kinds.items():
            r = s3.copy_object(Bucket=bucket, Key=f"{src}-to-{dst}", CopySource={"Bucket": bucket, "Key": f"src-{src}"},
                               **how)
            got = s3.get_object(Bucket=bucket, Key=f"{src}-to-{dst}")
            assert got["Body"].read() == body, (src, dst)
            assert r.get("ServerSideEncryption") == how.get("ServerSideEncryption"), (src, dst)
            assert got.get("ServerSideEncryption") == how.get("ServerSideEncryption"), (src, dst)
            if dst == "kms":
                assert got["SSEKMSKeyId"] == arn(key) and r["SSEKMSKeyId"] == arn(key)
            else:
                assert ("SSEKMSKeyId" in got) == (dst == "kms-default"), (src, dst)
    # In place: the default key to the named one, with new metadata.
    s3.copy_object(Bucket=bucket, Key="src-kms-default", CopySource={"Bucket": bucket, "Key": "src-kms-default"},
                   Metadata={"m": "1"}, MetadataDirective="REPLACE", **kinds["kms"])
    got = s3.get_object(Bucket=bucket, Key="src-kms-default")
    assert got["Body"].read() == body and got["SSEKMSKeyId"] == arn(key) and got["Metadata"] == {"m": "1"}


def test_sse_kms_multipart_and_part_copies(server, s3, bucket):
    key = kms_key(server, "parts")
    a, b = os.urandom(5 * 1024 * 1024), os.urandom(5 * 1024 * 1024 + 5)  # parts but the last are >= 5 MiB
    s3.put_object(Bucket=bucket, Key="s3-src", Body=b, ServerSideEncryption="AES256")
    s3.put_object(Bucket=bucket, Key="kms-src", Body=b, ServerSideEncryption="aws:kms")
    up = s3.create_multipart_upload(Bucket=bucket, Key="mp", ServerSideEncryption="aws:kms", SSEKMSKeyId=key["id"])
    assert (up["ServerSideEncryption"], up["SSEKMSKeyId"]) == ("aws:kms", arn(key))
    uid = up["UploadId"]
    p1 = s3.upload_part(Bucket=bucket, Key="mp", UploadId=uid, PartNumber=1, Body=a)
    assert p1["SSEKMSKeyId"] == arn(key)
    p2 = s3.upload_part_copy(Bucket=bucket, Key="mp", UploadId=uid, PartNumber=2,
                             CopySource={"Bucket": bucket, "Key": "kms-src"}, CopySourceRange=f"bytes=0-{len(b) - 1}")
    p3 = s3.upload_part_copy(Bucket=bucket, Key="mp", UploadId=uid, PartNumber=3,
                             CopySource={"Bucket": bucket, "Key": "s3-src"})
    parts = [{"PartNumber": 1, "ETag": p1["ETag"]}, {"PartNumber": 2, "ETag": p2["CopyPartResult"]["ETag"]},
             {"PartNumber": 3, "ETag": p3["CopyPartResult"]["ETag"]}]
    done = s3.complete_multipart_upload(Bucket=bucket, Key="mp", UploadId=uid, MultipartUpload={"Parts": parts})
    assert (done["ServerSideEncryption"], done["SSEKMSKeyId"]) == ("aws:kms", arn(key))
    got = s3.get_object(Bucket=bucket, Key="mp")
    assert got["Body"].read() == a + b + b and got["SSEKMSKeyId"] == arn(key)
    assert s3.head_object(Bucket=bucket, Key="mp")["ContentLength"] == len(a) + 2 * len(b)
    r = s3.get_object(Bucket=bucket, Key="mp", Range=f"bytes={len(a) - 2}-{len(a) + 2}")
    assert r["Body"].read() == (a + b)[len(a) - 2:len(a) + 3]
    # A multipart SSE-KMS object copied to SSE-S3 and back to plain.
    s3.copy_object(Bucket=bucket, Key="mp-s3", CopySource={"Bucket": bucket, "Key": "mp"}, ServerSideEncryption="AES256")
    assert s3.get_object(Bucket=bucket, Key="mp-s3")["Body"].read() == a + b + b


def test_sse_kms_bucket_default(server, s3, bucket):
    key = kms_key(server, "default")
    rule = {"ApplyServerSideEncryptionByDefault": {"SSEAlgorithm": "aws:kms", "KMSMasterKeyID": f"alias/{key['name']}"},
            "BucketKeyEnabled": True}
    s3.put_bucket_encryption(Bucket=bucket, ServerSideEncryptionConfiguration={"Rules": [rule]})
    shown = s3.get_bucket_encryption(Bucket=bucket)["ServerSideEncryptionConfiguration"]["Rules"][0]
    assert shown == rule
    s3.put_object(Bucket=bucket, Key="a", Body=b"by default")
    head = s3.head_object(Bucket=bucket, Key="a")
    assert (head["ServerSideEncryption"], head["SSEKMSKeyId"]) == ("aws:kms", arn(key))
    s3.put_object(Bucket=bucket, Key="plain-src", Body=b"copied")  # also under the default
    s3.copy_object(Bucket=bucket, Key="copy", CopySource={"Bucket": bucket, "Key": "plain-src"})
    assert s3.head_object(Bucket=bucket, Key="copy")["SSEKMSKeyId"] == arn(key)
    up = s3.create_multipart_upload(Bucket=bucket, Key="mp")
    assert up["SSEKMSKeyId"] == arn(key)
    s3.abort_multipart_upload(Bucket=bucket, Key="mp", UploadId=up["UploadId"])
    # A write's own encryption wins.
    s3.put_object(Bucket=bucket, Key="s3", Body=b"x", ServerSideEncryption="AES256")
    assert "SSEKMSKeyId" not in s3.head_object(Bucket=bucket, Key="s3")
    assert s3.get_object(Bucket=bucket, Key="a")["Body"].read() == b"by default"
    # aws:kms without a key: the default key.
    s3.put_bucket_encryption(Bucket=bucket, ServerSideEncryptionConfiguration={
        "Rules": [{"ApplyServerSideEncryptionByDefault": {"SSEAlgorithm": "aws:kms"}}]})
    s3.put_object(Bucket=bucket, Key="b", Body=b"b")
    assert s3.head_object(Bucket=bucket, Key="b")["SSEKMSKeyId"] == arn(listed_keys(server)["aws/s3"])
    # An unknown key is refused, the configuration untouched.
    bad = {"Rules": [{"ApplyServerSideEncryptionByDefault": {"SSEAlgorithm": "aws:kms", "KMSMasterKeyID": "nope"}}]}
    assert code_of(s3.put_bucket_encryption, Bucket=bucket, ServerSideEncryptionConfiguration=bad) \
        == ("KMS.NotFoundException", 400)
    assert "KMSMasterKeyID" not in \
        s3.get_bucket_encryption(Bucket=bucket)["ServerSideEncryptionConfiguration"]["Rules"][0][
            "ApplyServerSideEncryptionByDefault"]
    s3.delete_bucket_encryption(Bucket=bucket)


@pytest.mark.local_only("restarts its own packrat serve; SSE-KMS through a cluster: the tests above")
def test_sse_kms_is_ciphertext_on_disk_and_survives_a_restart(tmp_path):
    srv = Server(tmp_path / "data").start()
    key = kms_key(srv, "restart")
    c = srv.client()
    c.create_bucket(Bucket="kmsrestart")
    body = pattern(2 * BLOCK + 7, seed=13)
    c.put_object(Bucket="kmsrestart", Key="a", Body=body, ServerSideEncryption="aws:kms", SSEKMSKeyId=key["id"])
    disk = stored_bytes(tmp_path / "data")
    assert body[:64] not in disk and body[BLOCK:BLOCK + 64] not in disk
    srv.stop()
    srv.start()
    c = srv.client()
    got = c.get_object(Bucket="kmsrestart", Key="a")
    assert got["Body"].read() == body and got["SSEKMSKeyId"] == arn(key)
    assert listed_keys(srv)[key["name"]]["id"] == key["id"]
    srv.stop()


@pytest.mark.local_only("starts its own https packrat serve")
def test_sse_kms_and_sse_c_copies(tls):
    """SSE-C (which needs https) to SSE-KMS and back, and the two asked together refused."""
    c = tls_client(tls)
    c.create_bucket(Bucket="kmsssec")
    k = os.urandom(32)
    ssec = {"SSECustomerAlgorithm": "AES256", "SSECustomerKey": k}
    src_c = {"CopySourceSSECustomerAlgorithm": "AES256", "CopySourceSSECustomerKey": k}
    body = pattern(BLOCK + 3, seed=17)
    c.put_object(Bucket="kmsssec", Key="c", Body=body, **ssec)
    c.copy_object(Bucket="kmsssec", Key="c-to-kms", CopySource={"Bucket": "kmsssec", "Key": "c"},
                  ServerSideEncryption="aws:kms", **src_c)
    got = c.get_object(Bucket="kmsssec", Key="c-to-kms")
    assert got["Body"].read() == body and got["ServerSideEncryption"] == "aws:kms"
    c.copy_object(Bucket="kmsssec", Key="kms-to-c", CopySource={"Bucket": "kmsssec", "Key": "c-to-kms"}, **ssec)
    assert c.get_object(Bucket="kmsssec", Key="kms-to-c", **ssec)["Body"].read() == body
    # An SSE-C key sent for an SSE-KMS object, and SSE-KMS with SSE-C on one write: refused.
    assert code_of(c.get_object, Bucket="kmsssec", Key="c-to-kms", **ssec) == ("InvalidRequest", 400)
    assert code_of(c.put_object, Bucket="kmsssec", Key="both", Body=b"x", ServerSideEncryption="aws:kms",
                   **ssec) == ("InvalidArgument", 400)
