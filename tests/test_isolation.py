"""Per-user isolation for every operation: another user's key, and an anonymous caller, get
403 AccessDenied from every S3 operation and every packrat extension on a bucket that is not
theirs (no policy, canned ACL private), including copy sources, UploadPartCopy, batch GET,
epoch streams, multipart, tagging, lifecycle, CORS, policies and ACLs; and the owner's bucket is
unchanged afterwards. An operation missing from these lists is an operation nobody checked."""

import json
import os

import botocore
import pytest
import urllib3

import conftest
from packrat_client import AccessDenied
from test_bucket_policy import code_of as denied
from test_bucket_policy import user
from test_post_object import post

LIFECYCLE = {"Rules": [{"ID": "r", "Status": "Enabled", "Filter": {"Prefix": "tmp/"},
                        "Expiration": {"Days": 1}}]}
CORS = {"CORSRules": [{"AllowedOrigins": ["*"], "AllowedMethods": ["GET"]}]}


@pytest.fixture
def victim(server):
    """alice's private bucket with an object (tagged), and mallory with a bucket of his own."""
    tag = os.urandom(3).hex()
    alice, _ = user(server, f"alice-{tag}")
    mallory, keys = user(server, f"mallory-{tag}")
    name, own = f"iso-{tag}", f"mal-{tag}"
    alice.create_bucket(Bucket=name)
    alice.put_object(Bucket=name, Key="k", Body=b"alice's bytes", Tagging="t=1")
    mallory.create_bucket(Bucket=own)
    yield alice, mallory, keys, name, own
    conftest.empty_bucket(alice, name)
    conftest.empty_bucket(mallory, own)


def single_request_calls(c, name, own):
    """Every S3 operation of one request on bucket `name` (object `k`), as (label, thunk)."""
    b, k = {"Bucket": name}, {"Bucket": name, "Key": "k"}
    return [
        ("HeadBucket", lambda: c.head_bucket(**b)),
        ("ListObjectsV2", lambda: c.list_objects_v2(**b)),
        ("ListObjects", lambda: c.list_objects(**b)),
        ("GetBucketLocation", lambda: c.get_bucket_location(**b)),
        ("GetBucketAcl", lambda: c.get_bucket_acl(**b)),
        ("PutBucketAcl", lambda: c.put_bucket_acl(ACL="public-read", **b)),
        ("GetBucketLifecycle", lambda: c.get_bucket_lifecycle_configuration(**b)),
        ("PutBucketLifecycle", lambda: c.put_bucket_lifecycle_configuration(LifecycleConfiguration=LIFECYCLE, **b)),
        ("DeleteBucketLifecycle", lambda: c.delete_bucket_lifecycle(**b)),
        ("GetBucketTagging", lambda: c.get_bucket_tagging(**b)),
        ("PutBucketTagging", lambda: c.put_bucket_tagging(Tagging={"TagSet": [{"Key": "a", "Value": "b"}]}, **b)),
        ("DeleteBucketTagging", lambda: c.delete_bucket_tagging(**b)),
        ("GetBucketCors", lambda: c.get_bucket_cors(**b)),
        ("PutBucketCors", lambda: c.put_bucket_cors(CORSConfiguration=CORS, **b)),
        ("DeleteBucketCors", lambda: c.delete_bucket_cors(**b)),
        ("GetBucketPolicy", lambda: c.get_bucket_policy(**b)),
        ("PutBucketPolicy", lambda: c.put_bucket_policy(Policy=json.dumps({"Statement": [
            {"Effect": "Allow", "Principal": "*", "Action": "s3:*", "Resource": f"arn:aws:s3:::{name}/*"}]}), **b)),
        ("DeleteBucketPolicy", lambda: c.delete_bucket_policy(**b)),
        ("GetBucketVersioning", lambda: c.get_bucket_versioning(**b)),
        ("GetBucketEncryption", lambda: c.get_bucket_encryption(**b)),
        ("PutBucketEncryption", lambda: c.put_bucket_encryption(ServerSideEncryptionConfiguration={
            "Rules": [{"ApplyServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"}}]}, **b)),
        ("DeleteBucketEncryption", lambda: c.delete_bucket_encryption(**b)),
        ("DeleteBucket", lambda: c.delete_bucket(**b)),
        ("DeleteObjects", lambda: c.delete_objects(Delete={"Objects": [{"Key": "k"}]}, **b)),
        ("GetObject", lambda: c.get_object(**k)),
        ("GetObjectRange", lambda: c.get_object(Range="bytes=0-3", **k)),
        ("HeadObject", lambda: c.head_object(**k)),
        ("GetObjectAttributes", lambda: c.get_object_attributes(ObjectAttributes=["ETag"], **k)),
        ("PutObject", lambda: c.put_object(Body=b"x", **k)),
        ("PutObjectNewKey", lambda: c.put_object(Bucket=name, Key="new", Body=b"x")),
        ("CopyObjectInto", lambda: c.copy_object(CopySource={"Bucket": own, "Key": "mine"}, **k)),
        ("CopyObjectFrom", lambda: c.copy_object(Bucket=own, Key="stolen", CopySource={"Bucket": name, "Key": "k"})),
        ("DeleteObject", lambda: c.delete_object(**k)),
        ("GetObjectTagging", lambda: c.get_object_tagging(**k)),
        ("PutObjectTagging", lambda: c.put_object_tagging(Tagging={"TagSet": []}, **k)),
        ("DeleteObjectTagging", lambda: c.delete_object_tagging(**k)),
        ("GetObjectAcl", lambda: c.get_object_acl(**k)),
        ("PutObjectAcl", lambda: c.put_object_acl(ACL="private", **k)),
        ("GetBucketOwnershipControls", lambda: c.get_bucket_ownership_controls(**b)),
        ("PutPublicAccessBlock", lambda: c.put_public_access_block(
            PublicAccessBlockConfiguration={"BlockPublicAcls": False}, **b)),
        ("GetPublicAccessBlock", lambda: c.get_public_access_block(**b)),
        ("DeletePublicAccessBlock", lambda: c.delete_public_access_block(**b)),
        ("PutBucketOwnershipControls", lambda: c.put_bucket_ownership_controls(
            OwnershipControls={"Rules": [{"ObjectOwnership": "ObjectWriter"}]}, **b)),
        ("DeleteBucketOwnershipControls", lambda: c.delete_bucket_ownership_controls(**b)),
        ("ListMultipartUploads", lambda: c.list_multipart_uploads(**b)),
        ("PutBucketVersioning", lambda: c.put_bucket_versioning(VersioningConfiguration={"Status": "Enabled"}, **b)),
        ("ListObjectVersions", lambda: c.list_object_versions(**b)),
        ("GetObjectVersion", lambda: c.get_object(VersionId="null", **k)),
        ("HeadObjectVersion", lambda: c.head_object(VersionId="null", **k)),
        ("DeleteObjectVersion", lambda: c.delete_object(VersionId="null", **k)),
        ("GetObjectVersionTagging", lambda: c.get_object_tagging(VersionId="null", **k)),
        ("PutObjectVersionTagging", lambda: c.put_object_tagging(VersionId="null", Tagging={"TagSet": []}, **k)),
        ("DeleteObjectVersionTagging", lambda: c.delete_object_tagging(VersionId="null", **k)),
        ("GetObjectVersionAcl", lambda: c.get_object_acl(VersionId="null", **k)),
        ("PutObjectVersionAcl", lambda: c.put_object_acl(VersionId="null", ACL="private", **k)),
        ("CopyObjectVersionFrom", lambda: c.copy_object(
            Bucket=own, Key="stolen", CopySource={"Bucket": name, "Key": "k", "VersionId": "null"})),
        ("GetObjectLockConfiguration", lambda: c.get_object_lock_configuration(**b)),
        ("PutObjectLockConfiguration", lambda: c.put_object_lock_configuration(
            ObjectLockConfiguration={"ObjectLockEnabled": "Enabled"}, **b)),
        ("GetObjectRetention", lambda: c.get_object_retention(**k)),
        ("PutObjectRetention", lambda: c.put_object_retention(
            Retention={"Mode": "GOVERNANCE", "RetainUntilDate": "2099-01-01T00:00:00Z"}, **k)),
        ("GetObjectLegalHold", lambda: c.get_object_legal_hold(**k)),
        ("PutObjectLegalHold", lambda: c.put_object_legal_hold(LegalHold={"Status": "ON"}, **k)),
    ]


def assert_untouched(alice, name, keys=("k",)):
    got = alice.get_object(Bucket=name, Key="k")
    assert got["Body"].read() == b"alice's bytes"
    assert alice.get_object_tagging(Bucket=name, Key="k")["TagSet"] == [{"Key": "t", "Value": "1"}]
    assert [o["Key"] for o in alice.list_objects_v2(Bucket=name)["Contents"]] == list(keys)
    assert "Status" not in alice.get_bucket_versioning(Bucket=name)
    grants = alice.get_bucket_acl(Bucket=name)["Grants"]
    assert [g["Permission"] for g in grants] == ["FULL_CONTROL"], grants
    for call, code in ((alice.get_bucket_policy, "NoSuchBucketPolicy"),
                       (alice.get_bucket_cors, "NoSuchCORSConfiguration"),
                       (alice.get_bucket_tagging, "NoSuchTagSet"),
                       (alice.get_bucket_lifecycle_configuration, "NoSuchLifecycleConfiguration"),
                       (alice.get_object_lock_configuration, "ObjectLockConfigurationNotFoundError")):
        assert denied(call, Bucket=name) == code


@pytest.mark.parametrize("ownership", ["BucketOwnerEnforced", "ObjectWriter"])
def test_other_users_and_anonymous_callers_are_refused_every_operation(server, victim, ownership):
    """Also with object ACLs enabled (ObjectWriter): an object without grants opens nothing."""
    alice, mallory, _, name, own = victim
    alice.put_bucket_ownership_controls(Bucket=name, OwnershipControls={"Rules": [{"ObjectOwnership": ownership}]})
    mallory.put_object(Bucket=own, Key="mine", Body=b"mallory's")
    anonymous = server.client(signature_version=botocore.UNSIGNED)
    for who, c in (("another user", mallory), ("anonymous", anonymous)):
        for label, call in single_request_calls(c, name, own):
            if who == "anonymous" and label.startswith("CopyObject") and label.endswith("From"):
                continue  # an anonymous caller has no bucket to copy into; CopyObjectInto covers it
            got = denied(call)
            assert got in ("AccessDenied", "403"), f"{who} {label}: {got}"
    assert_untouched(alice, name)
    assert denied(mallory.head_object, Bucket=own, Key="stolen") == "404"


@pytest.mark.local_only
def test_multipart_and_extensions_are_refused_to_other_users(server, victim):
    alice, mallory, (mak, msk), name, own = victim
    up = alice.create_multipart_upload(Bucket=name, Key="big")["UploadId"]
    mallory.put_object(Bucket=own, Key="mine", Body=b"m" * 1024)
    mine = mallory.create_multipart_upload(Bucket=own, Key="dst")["UploadId"]
    part = {"Bucket": name, "Key": "big", "UploadId": up, "PartNumber": 1}
    calls = [
        ("CreateMultipartUpload", lambda: mallory.create_multipart_upload(Bucket=name, Key="x")),
        ("UploadPart", lambda: mallory.upload_part(Body=b"p" * 1024, **part)),
        ("UploadPartCopyInto", lambda: mallory.upload_part_copy(CopySource={"Bucket": own, "Key": "mine"}, **part)),
        ("UploadPartCopyFrom", lambda: mallory.upload_part_copy(
            Bucket=own, Key="dst", UploadId=mine, PartNumber=1, CopySource={"Bucket": name, "Key": "k"})),
        ("ListParts", lambda: mallory.list_parts(Bucket=name, Key="big", UploadId=up)),
        ("CompleteMultipartUpload", lambda: mallory.complete_multipart_upload(
            Bucket=name, Key="big", UploadId=up, MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": '"x"'}]})),
        ("AbortMultipartUpload", lambda: mallory.abort_multipart_upload(Bucket=name, Key="big", UploadId=up)),
    ]
    for label, call in calls:
        assert denied(call) == "AccessDenied", label
    # alice's upload is still there and hers to finish.
    assert [u["UploadId"] for u in alice.list_multipart_uploads(Bucket=name)["Uploads"]] == [up]
    etag = alice.upload_part(Body=b"a" * 100, **part)["ETag"]
    alice.complete_multipart_upload(Bucket=name, Key="big", UploadId=up,
                                    MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": etag}]})
    assert alice.get_object(Bucket=name, Key="big")["Body"].read() == b"a" * 100
    mallory.abort_multipart_upload(Bucket=own, Key="dst", UploadId=mine)

    # packrat's extensions: batch GET and epoch streams, signed by mallory.
    pc = server.packrat(mak, msk)
    with pytest.raises(AccessDenied):
        list(pc.batch_get(name, ["k"]))
    with pytest.raises(AccessDenied):
        list(pc.stream_samples(name))
    # A presigned POST form signed by mallory for alice's bucket stores nothing.
    form = mallory.generate_presigned_post(name, "posted", ExpiresIn=300)
    r = post(form["url"], form["fields"], file=("f", b"evil", "text/plain"))
    assert r.status == 403 and b"<Code>AccessDenied</Code>" in r.data, r.data
    # A presigned GET URL signed by mallory reads nothing either.
    url = mallory.generate_presigned_url("get_object", Params={"Bucket": name, "Key": "k"}, ExpiresIn=300)
    r = urllib3.request("GET", url, timeout=30)
    assert r.status == 403 and b"<Code>AccessDenied</Code>" in r.data
    assert_untouched(alice, name, keys=("big", "k"))
