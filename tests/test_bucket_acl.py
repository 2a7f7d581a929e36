"""Bucket ACLs and Object Ownership as S3 clients expect them, against the real binary: the
canned bucket ACLs (`private`, `public-read`, `public-read-write`, `authenticated-read`), grant
headers and AccessControlPolicy bodies naming users by canonical id and the AllUsers and
AuthenticatedUsers groups (an unknown id is 400 InvalidArgument), `x-amz-object-ownership` on
CreateBucket and the server-wide `--default-object-ownership`, and users whose canonical id is
chosen at creation (`packrat admin key create --user-id`)."""

import os
import uuid

import botocore
import pytest
from botocore.exceptions import ClientError

import conftest
from test_auth_checksums import admin, parse_key
from test_bucket_policy import code_of

ALL_USERS = "http://acs.amazonaws.com/groups/global/AllUsers"
AUTHENTICATED = "http://acs.amazonaws.com/groups/global/AuthenticatedUsers"


def grants(acl):
    return sorted((g["Grantee"].get("ID") or g["Grantee"]["URI"], g["Permission"]) for g in acl["Grants"])


def new_user(server, name, *extra):
    out = admin(server, "key", "create", "--name", name, *extra)
    assert out.returncode == 0, out.stderr
    ak, sk = parse_key(out)
    client = server.client(ak, sk)
    return client, client.list_buckets()["Owner"]["ID"]


@pytest.fixture
def people(server):
    """alice owns a bucket; bob and carol are other users; anon signs nothing."""
    tag = os.urandom(3).hex()
    alice, alice_id = new_user(server, f"alice-{tag}")
    bob, bob_id = new_user(server, f"bob-{tag}")
    carol, _ = new_user(server, f"carol-{tag}")
    name = f"acl-{tag}"
    alice.create_bucket(Bucket=name)
    anon = server.client(signature_version=botocore.UNSIGNED)
    yield alice, bob, carol, anon, name, (alice_id, bob_id)
    conftest.empty_bucket(alice, name)


def test_canned_bucket_acls(people):
    alice, bob, carol, anon, name, (alice_id, _) = people
    alice.put_object(Bucket=name, Key="k", Body=b"v")
    # public-read-write: anyone lists, reads, writes and deletes objects; nothing more.
    alice.put_bucket_acl(Bucket=name, ACL="public-read-write")
    assert grants(alice.get_bucket_acl(Bucket=name)) == sorted(
        [(alice_id, "FULL_CONTROL"), (ALL_USERS, "READ"), (ALL_USERS, "WRITE")])
    anon.put_object(Bucket=name, Key="from-anon", Body=b"a")
    bob.put_object(Bucket=name, Key="from-bob", Body=b"b")
    assert anon.get_object(Bucket=name, Key="from-bob")["Body"].read() == b"b"
    assert {o["Key"] for o in anon.list_objects_v2(Bucket=name)["Contents"]} == {"k", "from-anon", "from-bob"}
    anon.delete_object(Bucket=name, Key="from-anon")
    assert code_of(bob.put_bucket_acl, Bucket=name, ACL="private") == "AccessDenied"
    assert code_of(bob.get_bucket_acl, Bucket=name) == "AccessDenied"
    assert code_of(anon.put_bucket_policy, Bucket=name, Policy="{}") == "AccessDenied"
    assert code_of(bob.delete_bucket, Bucket=name) == "AccessDenied"
    # authenticated-read: any user reads and lists, nobody anonymous, nobody writes.
    alice.put_bucket_acl(Bucket=name, ACL="authenticated-read")
    assert grants(alice.get_bucket_acl(Bucket=name)) == sorted([(alice_id, "FULL_CONTROL"), (AUTHENTICATED, "READ")])
    assert carol.get_object(Bucket=name, Key="k")["Body"].read() == b"v"
    assert carol.list_objects_v2(Bucket=name)["KeyCount"] == 2
    assert code_of(anon.get_object, Bucket=name, Key="k") == "AccessDenied"
    assert code_of(carol.put_object, Bucket=name, Key="c", Body=b"c") == "AccessDenied"
    # public-read opens reads to everyone, signed or not; private closes all again.
    alice.put_bucket_acl(Bucket=name, ACL="public-read")
    assert grants(alice.get_bucket_acl(Bucket=name)) == sorted([(alice_id, "FULL_CONTROL"), (ALL_USERS, "READ")])
    assert anon.get_object(Bucket=name, Key="k")["Body"].read() == b"v"
    assert bob.get_object(Bucket=name, Key="k")["Body"].read() == b"v"
    alice.put_bucket_acl(Bucket=name, ACL="private")
    assert grants(alice.get_bucket_acl(Bucket=name)) == [(alice_id, "FULL_CONTROL")]
    for client in (anon, bob):
        assert code_of(client.get_object, Bucket=name, Key="k") == "AccessDenied"
    assert code_of(alice.put_bucket_acl, Bucket=name, ACL="no-such-acl") == "InvalidArgument"
    # Block Public Access refuses the public ones and leaves the ACL as it was.
    alice.put_public_access_block(Bucket=name, PublicAccessBlockConfiguration={"BlockPublicAcls": True})
    for acl in ("public-read-write", "authenticated-read", "public-read"):
        assert code_of(alice.put_bucket_acl, Bucket=name, ACL=acl) == "AccessDenied", acl
    assert grants(alice.get_bucket_acl(Bucket=name)) == [(alice_id, "FULL_CONTROL")]


def test_bucket_grants_to_users_and_groups(people):
    alice, bob, carol, anon, name, (alice_id, bob_id) = people
    alice.put_object(Bucket=name, Key="k", Body=b"v")
    # WRITE alone: bob writes and deletes objects, and cannot list or read them.
    alice.put_bucket_acl(Bucket=name, GrantWrite=f'id="{bob_id}"')
    bob.put_object(Bucket=name, Key="drop", Body=b"d")
    assert alice.get_object(Bucket=name, Key="drop")["Body"].read() == b"d"
    assert code_of(bob.get_object, Bucket=name, Key="k") == "AccessDenied"
    assert code_of(bob.list_objects_v2, Bucket=name) == "AccessDenied"
    assert code_of(carol.put_object, Bucket=name, Key="c", Body=b"c") == "AccessDenied"
    # A body: READ and READ_ACP to bob, READ to every user.
    acl = alice.get_bucket_acl(Bucket=name)
    acl["Grants"] = [
        {"Grantee": {"Type": "CanonicalUser", "ID": alice_id}, "Permission": "FULL_CONTROL"},
        {"Grantee": {"Type": "CanonicalUser", "ID": bob_id}, "Permission": "READ_ACP"},
        {"Grantee": {"Type": "Group", "URI": AUTHENTICATED}, "Permission": "READ"},
    ]
    alice.put_bucket_acl(Bucket=name, AccessControlPolicy={"Grants": acl["Grants"], "Owner": acl["Owner"]})
    assert grants(bob.get_bucket_acl(Bucket=name)) == sorted(
        [(alice_id, "FULL_CONTROL"), (bob_id, "READ_ACP"), (AUTHENTICATED, "READ")])
    assert carol.get_object(Bucket=name, Key="k")["Body"].read() == b"v"
    assert code_of(bob.put_object, Bucket=name, Key="x", Body=b"x") == "AccessDenied"
    assert code_of(bob.put_bucket_acl, Bucket=name, ACL="public-read") == "AccessDenied"
    assert code_of(anon.get_object, Bucket=name, Key="k") == "AccessDenied"
    # Grants S3 refuses leave the ACL as it was.
    before = grants(alice.get_bucket_acl(Bucket=name))
    for kw, code in [({"GrantRead": 'id="no-such-user-id"'}, "InvalidArgument"),
                     ({"GrantRead": 'emailAddress="bob@example.com"'}, "UnresolvableGrantByEmailAddress"),
                     ({"GrantRead": 'uri="http://acs.amazonaws.com/groups/s3/LogDelivery"'}, "InvalidArgument"),
                     ({"GrantRead": f'id="{bob_id}"', "ACL": "private"}, "InvalidRequest")]:
        assert code_of(alice.put_bucket_acl, Bucket=name, **kw) == code, kw
    assert grants(alice.get_bucket_acl(Bucket=name)) == before


def test_create_bucket_with_an_acl_and_object_ownership(server, people):
    alice, bob, _, anon, _, (alice_id, bob_id) = people
    name = "own-" + uuid.uuid4().hex[:16]
    alice.create_bucket(Bucket=name, ObjectOwnership="ObjectWriter", GrantWrite=f'id="{bob_id}"')
    try:
        rules = alice.get_bucket_ownership_controls(Bucket=name)["OwnershipControls"]["Rules"]
        assert rules == [{"ObjectOwnership": "ObjectWriter"}]
        assert (bob_id, "WRITE") in grants(alice.get_bucket_acl(Bucket=name))
        # ACLs are on: bob's object is his, and his canned ACL opens it to anonymous readers.
        bob.put_object(Bucket=name, Key="bobs", Body=b"b", ACL="public-read")
        assert anon.get_object(Bucket=name, Key="bobs")["Body"].read() == b"b"
        assert alice.get_object_acl(Bucket=name, Key="bobs")["Owner"]["ID"] == bob_id
    finally:
        conftest.empty_bucket(alice, name)
    assert code_of(alice.create_bucket, Bucket=name + "-x", ObjectOwnership="Nobody") == "InvalidArgument"
    assert code_of(alice.head_bucket, Bucket=name + "-x") == "404"
    name = "pub-" + uuid.uuid4().hex[:16]
    alice.create_bucket(Bucket=name, ACL="public-read-write")
    try:
        anon.put_object(Bucket=name, Key="a", Body=b"a")
        assert alice.get_object(Bucket=name, Key="a")["Body"].read() == b"a"
        rules = alice.get_bucket_ownership_controls(Bucket=name)["OwnershipControls"]["Rules"]
        assert rules == [{"ObjectOwnership": "BucketOwnerEnforced"}]
    finally:
        conftest.empty_bucket(alice, name)


def test_default_object_ownership_for_new_buckets(tmp_path):
    srv = conftest.Server(tmp_path / "data", extra_args=["--default-object-ownership", "ObjectWriter"]).start()
    try:
        s3 = srv.client()
        s3.create_bucket(Bucket="acls-on")
        s3.create_bucket(Bucket="acls-off", ObjectOwnership="BucketOwnerEnforced")
        own = lambda b: s3.get_bucket_ownership_controls(Bucket=b)["OwnershipControls"]["Rules"][0]["ObjectOwnership"]
        assert (own("acls-on"), own("acls-off")) == ("ObjectWriter", "BucketOwnerEnforced")
        s3.put_object(Bucket="acls-on", Key="k", Body=b"v", ACL="public-read")
        anon = srv.client(signature_version=botocore.UNSIGNED)
        assert anon.get_object(Bucket="acls-on", Key="k")["Body"].read() == b"v"
        assert code_of(s3.put_object, Bucket="acls-off", Key="k", Body=b"v", ACL="public-read") == "AccessControlListNotSupported"
    finally:
        srv.stop()
    bad = conftest.Server(tmp_path / "bad", extra_args=["--default-object-ownership", "Everyone"])
    with pytest.raises(RuntimeError):
        bad.start(timeout=20)


def test_users_with_a_chosen_canonical_id(server):
    tag = os.urandom(3).hex()
    uid = f"migrated-{tag}-0123456789abcdef"
    dana, dana_id = new_user(server, f"dana-{tag}", "--user-id", uid)
    assert dana_id == uid
    bucket = f"dana-{tag}"
    dana.create_bucket(Bucket=bucket)
    try:
        assert dana.get_bucket_acl(Bucket=bucket)["Owner"]["ID"] == uid
        # A second key of the same user owns the same buckets.
        second, second_id = new_user(server, f"dana-{tag}", "--user-id", uid)
        assert second_id == uid
        second.put_object(Bucket=bucket, Key="k", Body=b"v")
        assert bucket in [b["Name"] for b in second.list_buckets()["Buckets"]]
        # Another user cannot claim the id, and a malformed id is refused.
        for name, given in [(f"eve-{tag}", uid), (f"eve-{tag}", "has space"), (f"eve-{tag}", "x" * 65)]:
            out = admin(server, "key", "create", "--name", name, "--user-id", given)
            assert out.returncode != 0 and "user id" in out.stderr, (given, out.stderr)
        listed = admin(server, "key", "list")
        assert f"eve-{tag}" not in listed.stdout
    finally:
        conftest.empty_bucket(dana, bucket)
