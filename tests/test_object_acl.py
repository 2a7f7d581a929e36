"""Object ACLs are disabled, as with S3's default Object Ownership "bucket owner enforced":
a write that asks for an object ACL or grant is refused with 400 AccessControlListNotSupported
and stores nothing (before, the header was ignored and the client believed it had granted
access); the ACLs that say what already holds are accepted; GetObjectAcl answers what holds;
GetBucketOwnershipControls says BucketOwnerEnforced. Access is granted with bucket policies
(tests/test_bucket_policy.py) or the bucket's canned ACL."""

import urllib.error
import urllib.request

import pytest
from botocore.exceptions import ClientError

from test_awscli import aws
from test_bucket_policy import code_of

NOT_SUPPORTED = "AccessControlListNotSupported"


def missing(s3, bucket, key):
    with pytest.raises(ClientError) as e:
        s3.head_object(Bucket=bucket, Key=key)
    return e.value.response["Error"]["Code"] == "404"


def grants(acl):
    return sorted((g["Grantee"].get("ID") or g["Grantee"].get("URI"), g["Permission"]) for g in acl["Grants"])


def test_object_acls_are_refused_and_nothing_is_stored(s3, bucket):
    owner = s3.get_bucket_acl(Bucket=bucket)["Owner"]["ID"]
    for kw in ({"ACL": "public-read"}, {"ACL": "authenticated-read"}, {"ACL": "public-read-write"},
               {"GrantRead": 'id="someone-else"'}, {"GrantFullControl": f'id="{owner}"'},
               {"GrantRead": 'uri="http://acs.amazonaws.com/groups/global/AllUsers"'}):
        assert code_of(s3.put_object, Bucket=bucket, Key="k", Body=b"x", **kw) == NOT_SUPPORTED, kw
        assert missing(s3, bucket, "k"), kw
    s3.put_object(Bucket=bucket, Key="src", Body=b"source")
    assert code_of(s3.copy_object, Bucket=bucket, Key="copy", ACL="public-read",
                   CopySource={"Bucket": bucket, "Key": "src"}) == NOT_SUPPORTED
    assert missing(s3, bucket, "copy")
    assert code_of(s3.create_multipart_upload, Bucket=bucket, Key="mp", ACL="public-read") == NOT_SUPPORTED
    assert s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
    # What already holds is accepted.
    for acl in ("private", "bucket-owner-full-control"):
        s3.put_object(Bucket=bucket, Key=acl, Body=b"ok", ACL=acl)
        assert s3.get_object(Bucket=bucket, Key=acl)["Body"].read() == b"ok"


def test_get_and_put_object_acl_answer_what_holds(server, s3, bucket):
    s3.put_object(Bucket=bucket, Key="k", Body=b"v")
    acl = s3.get_object_acl(Bucket=bucket, Key="k")
    owner = acl["Owner"]["ID"]
    assert owner == s3.get_bucket_acl(Bucket=bucket)["Owner"]["ID"]
    assert grants(acl) == [(owner, "FULL_CONTROL")]
    assert code_of(s3.get_object_acl, Bucket=bucket, Key="nope") == "NoSuchKey"
    s3.put_object_acl(Bucket=bucket, Key="k", ACL="private")
    s3.put_object_acl(Bucket=bucket, Key="k", AccessControlPolicy={
        "Owner": {"ID": owner},
        "Grants": [{"Grantee": {"Type": "CanonicalUser", "ID": owner}, "Permission": "FULL_CONTROL"}]})
    assert code_of(s3.put_object_acl, Bucket=bucket, Key="k", ACL="public-read") == NOT_SUPPORTED
    assert code_of(s3.put_object_acl, Bucket=bucket, Key="k", AccessControlPolicy={
        "Owner": {"ID": owner},
        "Grants": [{"Grantee": {"Type": "CanonicalUser", "ID": owner}, "Permission": "FULL_CONTROL"},
                   {"Grantee": {"Type": "Group", "URI": "http://acs.amazonaws.com/groups/global/AllUsers"},
                    "Permission": "READ"}]}) == NOT_SUPPORTED
    assert code_of(s3.put_object_acl, Bucket=bucket, Key="nope", ACL="private") == "NoSuchKey"
    # Nothing was opened: an anonymous GET is still refused.
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(f"{server.endpoint}/{bucket}/k", timeout=30)
    assert e.value.code == 403
    # A public-read bucket's objects are readable by anyone, and their ACL says so.
    s3.put_bucket_acl(Bucket=bucket, ACL="public-read")
    try:
        assert grants(s3.get_object_acl(Bucket=bucket, Key="k")) == sorted(
            [(owner, "FULL_CONTROL"), ("http://acs.amazonaws.com/groups/global/AllUsers", "READ")])
        with urllib.request.urlopen(f"{server.endpoint}/{bucket}/k", timeout=30) as r:
            assert r.read() == b"v"
    finally:
        s3.put_bucket_acl(Bucket=bucket, ACL="private")


def test_awscli_acl_flag_is_refused_with_the_reason(server, bucket, tmp_path):
    f = tmp_path / "f.txt"
    f.write_bytes(b"data")
    out = aws(server, "s3", "cp", str(f), f"s3://{bucket}/f.txt", "--acl", "public-read", check=False)
    assert out.returncode != 0 and NOT_SUPPORTED in out.stderr, out.stderr
    aws(server, "s3", "cp", str(f), f"s3://{bucket}/f.txt", "--acl", "bucket-owner-full-control")
    got = aws(server, "s3api", "get-object-acl", "--bucket", bucket, "--key", "f.txt").stdout
    assert "FULL_CONTROL" in got and "AllUsers" not in got
