"""Object ACLs against the real binary.

With S3's default Object Ownership, "bucket owner enforced" (packrat's too), objects have no
ACLs of their own: a write that asks for an object ACL or grant is refused with 400
AccessControlListNotSupported and stores nothing (before, the header was ignored and the client
believed it had granted access); the ACLs that say what already holds are accepted; GetObjectAcl
answers what holds.

With `ObjectWriter` or `BucketOwnerPreferred` (PutBucketOwnershipControls), objects carry ACLs:
canned ACLs, `x-amz-grant-*` headers and PutObjectAcl bodies, on PutObject, CopyObject,
multipart uploads and PutObjectAcl; the grants open GET, HEAD and the ACL itself to the users
and groups they name, across two users and to anonymous callers, under the bucket policy's
explicit Deny and the bucket's Block Public Access."""

import json
import urllib.error
import urllib.request

import pytest
from botocore.exceptions import ClientError

from test_awscli import aws
from test_bucket_policy import anonymous_get, arn_user, code_of, two_users  # noqa: F401 (fixture)

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


ALL_USERS = "http://acs.amazonaws.com/groups/global/AllUsers"


def owner_id(client):
    return client.list_buckets()["Owner"]["ID"]


def ownership(client, bucket, value):
    client.put_bucket_ownership_controls(Bucket=bucket, OwnershipControls={"Rules": [{"ObjectOwnership": value}]})
    rules = client.get_bucket_ownership_controls(Bucket=bucket)["OwnershipControls"]["Rules"]
    assert rules == [{"ObjectOwnership": value}]


def test_object_writer_acls_across_two_users(server, two_users):
    alice, bob, name, _, tag, _ = two_users
    alice_id, bob_id = owner_id(alice), owner_id(bob)
    ownership(alice, name, "ObjectWriter")
    # A canned public-read object in a private bucket: anyone reads it, nothing else opens.
    alice.put_object(Bucket=name, Key="pub", Body=b"public", ACL="public-read")
    alice.put_object(Bucket=name, Key="priv", Body=b"private")
    assert anonymous_get(server, f"/{name}/pub") == (200, b"public")
    assert anonymous_get(server, f"/{name}/priv")[0] == 403
    assert anonymous_get(server, f"/{name}/no-such-key")[0] == 403, "no key's existence leaks"
    assert anonymous_get(server, f"/{name}?list-type=2")[0] == 403, "object ACLs never open listings"
    assert anonymous_get(server, f"/{name}/pub?acl")[0] == 403, "READ is not READ_ACP"
    assert grants(alice.get_object_acl(Bucket=name, Key="pub")) == sorted(
        [(alice_id, "FULL_CONTROL"), (ALL_USERS, "READ")])
    # A grant to one user by id: bob reads that object, and only that one.
    alice.put_object(Bucket=name, Key="for-bob", Body=b"hi bob", GrantRead=f'id="{bob_id}"')
    assert bob.get_object(Bucket=name, Key="for-bob")["Body"].read() == b"hi bob"
    assert bob.head_object(Bucket=name, Key="for-bob")["ContentLength"] == 6
    assert bob.get_object(Bucket=name, Key="for-bob", Range="bytes=3-5")["Body"].read() == b"bob"
    assert bob.get_object_attributes(Bucket=name, Key="for-bob", ObjectAttributes=["ObjectSize"])["ObjectSize"] == 6
    assert code_of(bob.get_object, Bucket=name, Key="priv") == "AccessDenied"
    assert code_of(bob.get_object, Bucket=name, Key="no-such-key") == "AccessDenied"
    assert code_of(bob.get_object_acl, Bucket=name, Key="for-bob") == "AccessDenied"
    assert code_of(bob.put_object_acl, Bucket=name, Key="for-bob", ACL="public-read") == "AccessDenied"
    assert code_of(bob.delete_object, Bucket=name, Key="for-bob") == "AccessDenied", "ACLs grant no delete"
    acl = alice.get_object_acl(Bucket=name, Key="for-bob")
    assert acl["Owner"]["ID"] == alice_id and grants(acl) == [(bob_id, "READ")]
    # bob copies what he may read into his own bucket; not what he may not.
    bobs = f"bob-{tag}"
    bob.copy_object(Bucket=bobs, Key="copied", CopySource={"Bucket": name, "Key": "for-bob"})
    assert bob.get_object(Bucket=bobs, Key="copied")["Body"].read() == b"hi bob"
    assert code_of(bob.copy_object, Bucket=bobs, Key="stolen",
                   CopySource={"Bucket": name, "Key": "priv"}) == "AccessDenied"
    # PutObjectAcl: a canned ACL, then a body that gives bob full control, who then opens it.
    alice.put_object_acl(Bucket=name, Key="priv", ACL="authenticated-read")
    assert bob.get_object(Bucket=name, Key="priv")["Body"].read() == b"private"
    assert anonymous_get(server, f"/{name}/priv")[0] == 403
    alice.put_object_acl(Bucket=name, Key="priv", AccessControlPolicy={
        "Owner": {"ID": alice_id},
        "Grants": [{"Grantee": {"Type": "CanonicalUser", "ID": alice_id}, "Permission": "FULL_CONTROL"},
                   {"Grantee": {"Type": "CanonicalUser", "ID": bob_id}, "Permission": "FULL_CONTROL"}]})
    assert grants(bob.get_object_acl(Bucket=name, Key="priv")) == sorted(
        [(alice_id, "FULL_CONTROL"), (bob_id, "FULL_CONTROL")])
    bob.put_object_acl(Bucket=name, Key="priv", ACL="public-read")
    assert anonymous_get(server, f"/{name}/priv") == (200, b"private")
    assert alice.get_object_acl(Bucket=name, Key="priv")["Owner"]["ID"] == alice_id, "the owner stays"
    # A copy gets the ACL it asks for, never its source's.
    alice.copy_object(Bucket=name, Key="pub-copy", CopySource={"Bucket": name, "Key": "pub"})
    assert anonymous_get(server, f"/{name}/pub-copy")[0] == 403
    # A multipart upload's ACL reaches the object it makes.
    up = alice.create_multipart_upload(Bucket=name, Key="mp", ACL="public-read")
    part = alice.upload_part(Bucket=name, Key="mp", UploadId=up["UploadId"], PartNumber=1, Body=b"multi")
    alice.complete_multipart_upload(Bucket=name, Key="mp", UploadId=up["UploadId"], MultipartUpload={
        "Parts": [{"PartNumber": 1, "ETag": part["ETag"]}]})
    assert anonymous_get(server, f"/{name}/mp") == (200, b"multi")
    # The bucket policy's explicit Deny beats any grant.
    deny = {"Statement": [{"Effect": "Deny", "Principal": {"AWS": arn_user(f"bob-{tag}")},
                           "Action": "s3:GetObject", "Resource": f"arn:aws:s3:::{name}/for-bob"}]}
    alice.put_bucket_policy(Bucket=name, Policy=json.dumps(deny))
    assert code_of(bob.get_object, Bucket=name, Key="for-bob") == "AccessDenied"
    alice.delete_bucket_policy(Bucket=name)
    assert bob.get_object(Bucket=name, Key="for-bob")["Body"].read() == b"hi bob"


def test_who_owns_a_written_object(server, two_users):
    """ObjectWriter: the writer owns what it writes (and reads it back, though the policy gave
    it only s3:PutObject); BucketOwnerPreferred: the bucket's owner owns what is written with
    bucket-owner-full-control. The bucket's owner keeps full control of every object in its
    bucket (packrat has no accounts; see docs/s3-compatibility.md)."""
    alice, bob, name, _, tag, _ = two_users
    alice_id, bob_id = owner_id(alice), owner_id(bob)
    drop = {"Statement": [{"Effect": "Allow", "Principal": {"AWS": arn_user(f"bob-{tag}")},
                           "Action": "s3:PutObject", "Resource": f"arn:aws:s3:::{name}/drop/*"}]}
    alice.put_bucket_policy(Bucket=name, Policy=json.dumps(drop))
    ownership(alice, name, "ObjectWriter")
    bob.put_object(Bucket=name, Key="drop/by-bob", Body=b"bob's")
    acl = bob.get_object_acl(Bucket=name, Key="drop/by-bob")
    assert acl["Owner"]["ID"] == bob_id and grants(acl) == [(bob_id, "FULL_CONTROL")]
    assert bob.get_object(Bucket=name, Key="drop/by-bob")["Body"].read() == b"bob's"
    assert alice.get_object(Bucket=name, Key="drop/by-bob")["Body"].read() == b"bob's"
    bob.put_object(Bucket=name, Key="drop/shared", Body=b"s", ACL="bucket-owner-full-control")
    acl = alice.get_object_acl(Bucket=name, Key="drop/shared")
    assert acl["Owner"]["ID"] == bob_id
    assert grants(acl) == sorted([(bob_id, "FULL_CONTROL"), (alice_id, "FULL_CONTROL")])
    ownership(alice, name, "BucketOwnerPreferred")
    bob.put_object(Bucket=name, Key="drop/preferred", Body=b"p", ACL="bucket-owner-full-control")
    acl = alice.get_object_acl(Bucket=name, Key="drop/preferred")
    assert acl["Owner"]["ID"] == alice_id and grants(acl) == [(alice_id, "FULL_CONTROL")]
    assert code_of(bob.get_object, Bucket=name, Key="drop/preferred") == "AccessDenied"
    bob.put_object(Bucket=name, Key="drop/kept", Body=b"k")
    assert bob.get_object_acl(Bucket=name, Key="drop/kept")["Owner"]["ID"] == bob_id
    alice.delete_bucket_policy(Bucket=name)


def test_bad_acls_are_refused_and_nothing_changes(server, two_users):
    alice, bob, name, _, _, _ = two_users
    bob_id = owner_id(bob)
    ownership(alice, name, "ObjectWriter")
    refused = {
        "InvalidArgument": [{"GrantRead": 'id="no-such-user"'}, {"ACL": "no-such-canned-acl"},
                            {"GrantRead": 'uri="http://acs.amazonaws.com/groups/s3/LogDelivery"'}],
        "UnresolvableGrantByEmailAddress": [{"GrantRead": 'emailAddress="bob@example.com"'}],
        "InvalidRequest": [{"ACL": "public-read", "GrantRead": f'id="{bob_id}"'}],
        "MalformedACLError": [{"GrantRead": "bob"}],
    }
    for want, cases in refused.items():
        for kw in cases:
            assert code_of(alice.put_object, Bucket=name, Key="k", Body=b"x", **kw) == want, kw
            assert missing(alice, name, "k"), kw
    alice.put_object(Bucket=name, Key="k", Body=b"x")
    before = alice.get_object_acl(Bucket=name, Key="k")["Grants"]
    assert code_of(alice.put_object_acl, Bucket=name, Key="k", AccessControlPolicy={
        "Owner": {"ID": bob_id},
        "Grants": [{"Grantee": {"Type": "CanonicalUser", "ID": bob_id}, "Permission": "WRITE"}]}) == "MalformedACLError"
    assert code_of(alice.put_object_acl, Bucket=name, Key="k", GrantRead='id="nobody"') == "InvalidArgument"
    assert code_of(alice.put_object_acl, Bucket=name, Key="nope", ACL="private") == "NoSuchKey"
    assert alice.get_object_acl(Bucket=name, Key="k")["Grants"] == before


def test_block_public_access_and_back_to_enforced(server, two_users):
    alice, bob, name, _, _, _ = two_users
    ownership(alice, name, "BucketOwnerPreferred")
    alice.put_object(Bucket=name, Key="pub", Body=b"p", ACL="public-read")
    alice.put_object(Bucket=name, Key="auth", Body=b"a", ACL="authenticated-read")
    assert anonymous_get(server, f"/{name}/pub") == (200, b"p")
    alice.put_public_access_block(Bucket=name, PublicAccessBlockConfiguration={"IgnorePublicAcls": True})
    assert anonymous_get(server, f"/{name}/pub")[0] == 403
    assert code_of(bob.get_object, Bucket=name, Key="auth") == "AccessDenied", "AuthenticatedUsers is public too"
    alice.put_public_access_block(Bucket=name, PublicAccessBlockConfiguration={"BlockPublicAcls": True})
    assert anonymous_get(server, f"/{name}/pub") == (200, b"p")
    assert code_of(alice.put_object, Bucket=name, Key="new", Body=b"n", ACL="public-read") == "AccessDenied"
    assert missing(alice, name, "new")
    assert code_of(alice.put_object_acl, Bucket=name, Key="auth", ACL="public-read") == "AccessDenied"
    alice.put_object(Bucket=name, Key="new", Body=b"n", ACL="bucket-owner-read")
    alice.delete_public_access_block(Bucket=name)
    # Back to BucketOwnerEnforced: ACLs stop counting and object ACLs are refused again.
    alice.delete_bucket_ownership_controls(Bucket=name)
    rules = alice.get_bucket_ownership_controls(Bucket=name)["OwnershipControls"]["Rules"]
    assert rules == [{"ObjectOwnership": "BucketOwnerEnforced"}]
    assert anonymous_get(server, f"/{name}/pub")[0] == 403
    assert code_of(bob.get_object, Bucket=name, Key="auth") == "AccessDenied"
    assert code_of(alice.put_object, Bucket=name, Key="k", Body=b"x", ACL="public-read") == NOT_SUPPORTED
    assert grants(alice.get_object_acl(Bucket=name, Key="pub")) == [(owner_id(alice), "FULL_CONTROL")]


def test_acl_of_a_version(server, two_users):
    alice, bob, name, _, _, _ = two_users
    bob_id = owner_id(bob)
    ownership(alice, name, "ObjectWriter")
    alice.put_bucket_versioning(Bucket=name, VersioningConfiguration={"Status": "Enabled"})
    old = alice.put_object(Bucket=name, Key="v", Body=b"old", GrantRead=f'id="{bob_id}"')["VersionId"]
    new = alice.put_object(Bucket=name, Key="v", Body=b"new")["VersionId"]
    assert bob.get_object(Bucket=name, Key="v", VersionId=old)["Body"].read() == b"old"
    assert code_of(bob.get_object, Bucket=name, Key="v") == "AccessDenied"
    assert grants(alice.get_object_acl(Bucket=name, Key="v", VersionId=old)) == [(bob_id, "READ")]
    out = alice.put_object_acl(Bucket=name, Key="v", VersionId=new, GrantRead=f'id="{bob_id}"')
    assert out["ResponseMetadata"]["HTTPHeaders"]["x-amz-version-id"] == new
    assert bob.get_object(Bucket=name, Key="v")["Body"].read() == b"new"
    assert code_of(alice.put_object_acl, Bucket=name, Key="v", VersionId=old, ACL="private") == "NotImplemented"
    for v in (old, new):
        alice.delete_object(Bucket=name, Key="v", VersionId=v)


def test_awscli_object_acls(server, s3, bucket, tmp_path):
    aws(server, "s3api", "put-bucket-ownership-controls", "--bucket", bucket, "--ownership-controls",
        json.dumps({"Rules": [{"ObjectOwnership": "ObjectWriter"}]}))
    got = json.loads(aws(server, "s3api", "get-bucket-ownership-controls", "--bucket", bucket).stdout)
    assert got["OwnershipControls"]["Rules"] == [{"ObjectOwnership": "ObjectWriter"}]
    f = tmp_path / "f.txt"
    f.write_bytes(b"data")
    aws(server, "s3", "cp", str(f), f"s3://{bucket}/f.txt", "--acl", "public-read")
    assert anonymous_get(server, f"/{bucket}/f.txt") == (200, b"data")
    got = json.loads(aws(server, "s3api", "get-object-acl", "--bucket", bucket, "--key", "f.txt").stdout)
    assert ALL_USERS in [g["Grantee"].get("URI") for g in got["Grants"]]
    aws(server, "s3api", "put-object-acl", "--bucket", bucket, "--key", "f.txt", "--acl", "private")
    assert anonymous_get(server, f"/{bucket}/f.txt")[0] == 403
    aws(server, "s3api", "delete-bucket-ownership-controls", "--bucket", bucket)
