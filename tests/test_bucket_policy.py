"""Bucket policies against the real binary: Put/Get/DeleteBucketPolicy through boto3 and aws-cli,
allow and deny across two users (objects, listings with s3:prefix, copy sources, DeleteObjects,
batch GET and epoch streams), anonymous access granted by a policy, conditions (aws:SourceIp,
aws:SecureTransport), the owner's way back from a policy that denies everything, and malformed
policies refused with the stored one untouched."""

import json
import os
import urllib.error
import urllib.request

import botocore
import pytest
from botocore.exceptions import ClientError

import conftest
from packrat_client import AccessDenied
from sigv4_client import signed_request
from test_auth_checksums import admin, parse_key
from test_awscli import aws


def code_of(fn, *args, **kw):
    with pytest.raises(ClientError) as e:
        fn(*args, **kw)
    return e.value.response["Error"]["Code"]


def user(server, name):
    out = admin(server, "key", "create", "--name", name)
    assert out.returncode == 0, out.stderr
    ak, sk = parse_key(out)
    return server.client(ak, sk), (ak, sk)


@pytest.fixture
def two_users(server):
    """alice owns a bucket; bob has keys of his own and, until a policy says so, no access."""
    tag = os.urandom(3).hex()
    alice, _ = user(server, f"alice-{tag}")
    bob, bob_keys = user(server, f"bob-{tag}")
    name = f"pol-{tag}"
    alice.create_bucket(Bucket=name)
    bob.create_bucket(Bucket=f"bob-{tag}")
    yield alice, bob, name, f"bob-{tag}", tag, bob_keys
    conftest.empty_bucket(alice, name)
    conftest.empty_bucket(bob, f"bob-{tag}")


def arn_user(name):
    return f"arn:aws:iam:::user/{name}"


def test_policy_allows_and_denies_across_two_users(server, two_users):
    alice, bob, name, bobs, tag, _ = two_users
    for k in ("shared/a.txt", "shared/secret.txt", "private/x", "shared/tmp/1", "shared/tmp/2"):
        alice.put_object(Bucket=name, Key=k, Body=k.encode())
    # Without a policy bob reaches nothing.
    assert code_of(bob.get_object, Bucket=name, Key="shared/a.txt") == "AccessDenied"
    policy = {"Version": "2012-10-17", "Statement": [
        {"Sid": "ReadShared", "Effect": "Allow", "Principal": {"AWS": [arn_user(f"bob-{tag}")]},
         "Action": ["s3:GetObject"], "Resource": f"arn:aws:s3:::{name}/shared/*"},
        {"Sid": "ListShared", "Effect": "Allow", "Principal": {"AWS": arn_user(f"bob-{tag}")},
         "Action": "s3:ListBucket", "Resource": f"arn:aws:s3:::{name}",
         "Condition": {"StringLike": {"s3:prefix": "shared/*"}}},
        {"Sid": "Scratch", "Effect": "Allow", "Principal": {"AWS": arn_user(f"bob-{tag}")},
         "Action": "s3:DeleteObject", "Resource": f"arn:aws:s3:::{name}/shared/tmp/1"},
        {"Sid": "NoSecrets", "Effect": "Deny", "Principal": "*",
         "Action": "s3:GetObject", "Resource": f"arn:aws:s3:::{name}/shared/secret*"},
    ]}
    alice.put_bucket_policy(Bucket=name, Policy=json.dumps(policy))
    assert json.loads(alice.get_bucket_policy(Bucket=name)["Policy"]) == policy

    assert bob.get_object(Bucket=name, Key="shared/a.txt")["Body"].read() == b"shared/a.txt"
    assert bob.head_object(Bucket=name, Key="shared/a.txt")["ContentLength"] == 12
    assert code_of(bob.get_object, Bucket=name, Key="private/x") == "AccessDenied"
    assert code_of(bob.get_object, Bucket=name, Key="shared/secret.txt") == "AccessDenied"
    assert code_of(bob.put_object, Bucket=name, Key="shared/new", Body=b"1") == "AccessDenied"
    # The explicit deny binds the owner too; the root key is the administrator and is not bound.
    assert code_of(alice.get_object, Bucket=name, Key="shared/secret.txt") == "AccessDenied"
    assert server.client().get_object(Bucket=name, Key="shared/secret.txt")["Body"].read() == b"shared/secret.txt"
    # Listings: only with the granted prefix.
    got = bob.list_objects_v2(Bucket=name, Prefix="shared/")
    assert [o["Key"] for o in got["Contents"]] == ["shared/a.txt", "shared/secret.txt", "shared/tmp/1", "shared/tmp/2"]
    assert code_of(bob.list_objects_v2, Bucket=name) == "AccessDenied"
    assert code_of(bob.list_objects_v2, Bucket=name, Prefix="private/") == "AccessDenied"
    # Configuration stays the owner's.
    assert code_of(bob.get_bucket_policy, Bucket=name) == "AccessDenied"
    assert code_of(bob.put_bucket_policy, Bucket=name, Policy=json.dumps(policy)) == "AccessDenied"
    assert code_of(bob.get_bucket_acl, Bucket=name) == "AccessDenied"
    # A copy source is read as a GetObject of its key.
    bob.copy_object(Bucket=bobs, Key="mine", CopySource={"Bucket": name, "Key": "shared/a.txt"})
    assert bob.get_object(Bucket=bobs, Key="mine")["Body"].read() == b"shared/a.txt"
    assert code_of(bob.copy_object, Bucket=bobs, Key="nope",
                   CopySource={"Bucket": name, "Key": "private/x"}) == "AccessDenied"
    # DeleteObjects judges each key.
    out = bob.delete_objects(Bucket=name, Delete={"Objects": [{"Key": "shared/tmp/1"}, {"Key": "shared/tmp/2"}]})
    assert [d["Key"] for d in out.get("Deleted", [])] == ["shared/tmp/1"]
    assert [(e["Key"], e["Code"]) for e in out["Errors"]] == [("shared/tmp/2", "AccessDenied")]
    assert alice.get_object(Bucket=name, Key="shared/tmp/2")["Body"].read() == b"shared/tmp/2"
    assert code_of(alice.head_object, Bucket=name, Key="shared/tmp/1") == "404"

    alice.delete_bucket_policy(Bucket=name)
    assert code_of(alice.get_bucket_policy, Bucket=name) == "NoSuchBucketPolicy"
    assert code_of(bob.get_object, Bucket=name, Key="shared/a.txt") == "AccessDenied"


@pytest.mark.local_only
def test_batch_get_and_epoch_streams_judge_every_key(server, two_users):
    alice, _, name, _, tag, (bak, bsk) = two_users
    for i in range(4):
        alice.put_object(Bucket=name, Key=f"train/{i}.bin", Body=bytes([i]) * 10)
    alice.put_object(Bucket=name, Key="held-out/0.bin", Body=b"h" * 10)
    bob = server.packrat(bak, bsk)
    with pytest.raises(AccessDenied):
        list(bob.batch_get(name, ["train/0.bin"]))
    alice.put_bucket_policy(Bucket=name, Policy=json.dumps({"Statement": [
        {"Effect": "Allow", "Principal": {"AWS": arn_user(f"bob-{tag}")},
         "Action": "s3:GetObject", "Resource": f"arn:aws:s3:::{name}/train/*"},
        {"Effect": "Allow", "Principal": {"AWS": arn_user(f"bob-{tag}")},
         "Action": "s3:ListBucket", "Resource": f"arn:aws:s3:::{name}"}]}))
    got = {s.name: s.data for s in bob.batch_get(name, ["train/0.bin", "train/3.bin"])}
    assert got == {"train/0.bin": b"\0" * 10, "train/3.bin": b"\3" * 10}
    # One key outside the grant refuses the whole batch before anything is read, naming it.
    with pytest.raises(AccessDenied) as e:
        list(bob.batch_get(name, ["train/0.bin", "held-out/0.bin"]))
    assert "held-out/0.bin" in str(e.value)
    samples = list(bob.stream_samples(name, prefix="train/"))
    assert len(samples) == 4
    with pytest.raises(AccessDenied) as e:
        list(bob.stream_samples(name, prefix=""))
    assert "held-out/0.bin" in str(e.value)


def anonymous_get(server, path):
    try:
        with urllib.request.urlopen(server.endpoint + path, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_a_policy_can_open_objects_to_anonymous_readers(server, two_users):
    alice, _, name, _, _, _ = two_users
    alice.put_object(Bucket=name, Key="pub/hello.txt", Body=b"hello")
    alice.put_object(Bucket=name, Key="priv/no.txt", Body=b"no")
    assert anonymous_get(server, f"/{name}/pub/hello.txt")[0] == 403
    alice.put_bucket_policy(Bucket=name, Policy=json.dumps({"Version": "2012-10-17", "Statement": [
        {"Sid": "PublicRead", "Effect": "Allow", "Principal": "*", "Action": ["s3:GetObject"],
         "Resource": [f"arn:aws:s3:::{name}/pub/*"]}]}))
    assert anonymous_get(server, f"/{name}/pub/hello.txt") == (200, b"hello")
    status, body = anonymous_get(server, f"/{name}/priv/no.txt")
    assert status == 403 and b"<Code>AccessDenied</Code>" in body
    assert anonymous_get(server, f"/{name}?list-type=2")[0] == 403  # listing not granted
    anon = server.client(signature_version=botocore.UNSIGNED)
    assert anon.get_object(Bucket=name, Key="pub/hello.txt")["Body"].read() == b"hello"
    assert code_of(anon.put_object, Bucket=name, Key="pub/w", Body=b"w") == "AccessDenied"
    alice.delete_bucket_policy(Bucket=name)
    assert anonymous_get(server, f"/{name}/pub/hello.txt")[0] == 403


def test_public_access_block(server, two_users):
    """Put/Get/DeletePublicAccessBlock and what each setting does: IgnorePublicAcls takes
    anonymous reads away from a public-read ACL, BlockPublicAcls refuses a public ACL,
    BlockPublicPolicy refuses a public policy (one open to "*" from anywhere) and takes a
    policy for named users or fixed networks, RestrictPublicBuckets takes anonymous reads away
    from a public policy while the server's users keep them; deleting the settings gives all
    back."""
    alice, bob, name, _, tag, _ = two_users
    alice.put_object(Bucket=name, Key="pub/x", Body=b"x")
    assert code_of(alice.get_public_access_block, Bucket=name) == "NoSuchPublicAccessBlockConfiguration"

    def block(**settings):
        alice.put_public_access_block(Bucket=name, PublicAccessBlockConfiguration=settings)
        return alice.get_public_access_block(Bucket=name)["PublicAccessBlockConfiguration"]

    alice.put_bucket_acl(Bucket=name, ACL="public-read")
    assert anonymous_get(server, f"/{name}/pub/x") == (200, b"x")
    got = block(IgnorePublicAcls=True)
    assert got == {"BlockPublicAcls": False, "IgnorePublicAcls": True, "BlockPublicPolicy": False,
                   "RestrictPublicBuckets": False}, got
    assert anonymous_get(server, f"/{name}/pub/x")[0] == 403
    assert anonymous_get(server, f"/{name}?list-type=2")[0] == 403
    block(BlockPublicAcls=True)
    assert anonymous_get(server, f"/{name}/pub/x") == (200, b"x"), "the ACL counts again"
    assert code_of(alice.put_bucket_acl, Bucket=name, ACL="public-read") == "AccessDenied"
    alice.put_bucket_acl(Bucket=name, ACL="private")
    assert code_of(alice.put_bucket_acl, Bucket=name, ACL="public-read") == "AccessDenied"
    # BlockPublicPolicy: a policy open to anyone is refused; one for a named user, or for "*"
    # from fixed networks only, is not public.
    public = {"Statement": [{"Effect": "Allow", "Principal": "*", "Action": "s3:GetObject",
                             "Resource": f"arn:aws:s3:::{name}/pub/*"}]}
    block(BlockPublicPolicy=True)
    assert code_of(alice.put_bucket_policy, Bucket=name, Policy=json.dumps(public)) == "AccessDenied"
    assert code_of(alice.get_bucket_policy, Bucket=name) == "NoSuchBucketPolicy"
    fenced = {"Statement": [{**public["Statement"][0],
                             "Condition": {"IpAddress": {"aws:SourceIp": "127.0.0.0/8"}}}]}
    alice.put_bucket_policy(Bucket=name, Policy=json.dumps(fenced))
    named = {"Statement": [{**public["Statement"][0], "Principal": {"AWS": arn_user(f"bob-{tag}")}}]}
    alice.put_bucket_policy(Bucket=name, Policy=json.dumps(named))
    # RestrictPublicBuckets: a public policy stays, but anonymous callers get nothing of it.
    alice.delete_public_access_block(Bucket=name)
    alice.put_bucket_policy(Bucket=name, Policy=json.dumps(public))
    assert anonymous_get(server, f"/{name}/pub/x") == (200, b"x")
    block(RestrictPublicBuckets=True)
    assert anonymous_get(server, f"/{name}/pub/x")[0] == 403
    assert bob.get_object(Bucket=name, Key="pub/x")["Body"].read() == b"x", "a user of this server keeps it"
    # Bad settings are refused and the stored ones kept; nobody but the owner reaches them.
    doc = b"<PublicAccessBlockConfiguration><BlockPublicAcls>yes</BlockPublicAcls></PublicAccessBlockConfiguration>"
    st, _, body = signed_request(server.endpoint, "PUT", f"/{name}", "publicAccessBlock=", body=doc)
    assert st == 400 and b"<Code>MalformedXML</Code>" in body, body
    assert code_of(bob.get_public_access_block, Bucket=name) == "AccessDenied"
    assert code_of(bob.delete_public_access_block, Bucket=name) == "AccessDenied"
    assert alice.get_public_access_block(Bucket=name)["PublicAccessBlockConfiguration"]["RestrictPublicBuckets"]
    alice.delete_public_access_block(Bucket=name)
    assert code_of(alice.get_public_access_block, Bucket=name) == "NoSuchPublicAccessBlockConfiguration"
    assert anonymous_get(server, f"/{name}/pub/x") == (200, b"x")
    alice.delete_bucket_policy(Bucket=name)


def test_tagging_a_version_is_its_own_action(server, two_users):
    """Put/DeleteObjectTagging with a versionId are s3:PutObjectVersionTagging and
    s3:DeleteObjectVersionTagging, as in S3: granting one does not grant the other."""
    alice, bob, name, _, tag, _ = two_users
    alice.put_bucket_versioning(Bucket=name, VersioningConfiguration={"Status": "Enabled"})
    vid = alice.put_object(Bucket=name, Key="k", Body=b"v")["VersionId"]
    tags = {"TagSet": [{"Key": "by", "Value": "bob"}]}
    alice.put_bucket_policy(Bucket=name, Policy=json.dumps({"Statement": [
        {"Effect": "Allow", "Principal": {"AWS": arn_user(f"bob-{tag}")},
         "Action": ["s3:PutObjectVersionTagging", "s3:GetObjectVersionTagging"],
         "Resource": f"arn:aws:s3:::{name}/*"}]}))
    assert code_of(bob.put_object_tagging, Bucket=name, Key="k", Tagging=tags) == "AccessDenied"
    assert code_of(bob.get_object_tagging, Bucket=name, Key="k") == "AccessDenied"
    assert bob.put_object_tagging(Bucket=name, Key="k", VersionId=vid, Tagging=tags)["VersionId"] == vid
    assert bob.get_object_tagging(Bucket=name, Key="k", VersionId=vid)["TagSet"] == tags["TagSet"]
    assert code_of(bob.delete_object_tagging, Bucket=name, Key="k", VersionId=vid) == "AccessDenied"
    alice.delete_bucket_policy(Bucket=name)
    assert code_of(bob.put_object_tagging, Bucket=name, Key="k", VersionId=vid, Tagging=tags) == "AccessDenied"
    assert alice.get_object_tagging(Bucket=name, Key="k")["TagSet"] == tags["TagSet"]
    alice.delete_object(Bucket=name, Key="k", VersionId=vid)


def test_tags_on_a_write_need_put_object_tagging(server, two_users):
    """A write that sets tags (PutObject's x-amz-tagging, CreateMultipartUpload's, CopyObject's
    REPLACE tagging directive) also needs s3:PutObjectTagging, as in S3: bob, allowed
    s3:PutObject alone, writes untagged objects but no tagged ones, and nothing is stored
    for a refused one; allowed tagging too, he writes both. A Deny of tagging binds the owner."""
    alice, bob, name, _, tag, _ = two_users
    alice.put_object(Bucket=name, Key="src", Body=b"source")

    def allow(*actions):
        alice.put_bucket_policy(Bucket=name, Policy=json.dumps({"Statement": [
            {"Effect": "Allow", "Principal": {"AWS": arn_user(f"bob-{tag}")},
             "Action": ["s3:PutObject", "s3:GetObject", *actions], "Resource": f"arn:aws:s3:::{name}/*"}]}))

    def writes(key):
        return {
            "put": lambda: bob.put_object(Bucket=name, Key=key, Body=b"b", Tagging="by=bob"),
            "multipart": lambda: bob.create_multipart_upload(Bucket=name, Key=key, Tagging="by=bob"),
            "copy": lambda: bob.copy_object(Bucket=name, Key=key, CopySource={"Bucket": name, "Key": "src"},
                                            TaggingDirective="REPLACE", Tagging="by=bob"),
        }

    allow()
    bob.put_object(Bucket=name, Key="plain", Body=b"b")
    for what, write in writes("refused").items():
        with pytest.raises(ClientError) as e:
            write()
        assert e.value.response["Error"]["Code"] == "AccessDenied", what
    with pytest.raises(ClientError):
        alice.head_object(Bucket=name, Key="refused")
    assert alice.list_multipart_uploads(Bucket=name).get("Uploads", []) == []
    allow("s3:PutObjectTagging")
    for what, write in writes("tagged").items():
        write()
        if what != "multipart":
            assert alice.get_object_tagging(Bucket=name, Key="tagged")["TagSet"] == [{"Key": "by", "Value": "bob"}]
    for u in alice.list_multipart_uploads(Bucket=name).get("Uploads", []):
        alice.abort_multipart_upload(Bucket=name, Key=u["Key"], UploadId=u["UploadId"])
    # An explicit Deny of tagging binds the bucket's owner too; an untagged write still goes.
    alice.put_bucket_policy(Bucket=name, Policy=json.dumps({"Statement": [
        {"Effect": "Deny", "Principal": "*", "Action": "s3:PutObjectTagging", "Resource": f"arn:aws:s3:::{name}/*"}]}))
    assert code_of(alice.put_object, Bucket=name, Key="owner", Body=b"o", Tagging="a=1") == "AccessDenied"
    alice.put_object(Bucket=name, Key="owner", Body=b"o")
    alice.delete_bucket_policy(Bucket=name)


def test_conditions_source_ip_and_secure_transport(server, two_users):
    alice, bob, name, _, tag, _ = two_users
    alice.put_object(Bucket=name, Key="k", Body=b"v")

    def grant(condition):
        alice.put_bucket_policy(Bucket=name, Policy=json.dumps({"Statement": [
            {"Effect": "Allow", "Principal": {"AWS": arn_user(f"bob-{tag}")}, "Action": "s3:GetObject",
             "Resource": f"arn:aws:s3:::{name}/*", "Condition": condition}]}))

    grant({"IpAddress": {"aws:SourceIp": "10.0.0.0/8"}})
    assert code_of(bob.get_object, Bucket=name, Key="k") == "AccessDenied"
    grant({"IpAddress": {"aws:SourceIp": ["127.0.0.0/8", "::1/128"]}})
    assert bob.get_object(Bucket=name, Key="k")["Body"].read() == b"v"
    # These tests speak plain http: a grant that needs TLS does not apply.
    grant({"Bool": {"aws:SecureTransport": "true"}})
    assert code_of(bob.get_object, Bucket=name, Key="k") == "AccessDenied"
    # A deny of plain http binds the owner as well.
    alice.put_bucket_policy(Bucket=name, Policy=json.dumps({"Statement": [
        {"Effect": "Deny", "Principal": "*", "Action": "s3:*", "Resource": [f"arn:aws:s3:::{name}", f"arn:aws:s3:::{name}/*"],
         "Condition": {"Bool": {"aws:SecureTransport": "false"}}}]}))
    assert code_of(alice.get_object, Bucket=name, Key="k") == "AccessDenied"
    assert code_of(alice.list_objects_v2, Bucket=name) == "AccessDenied"
    # ... but never out of the policy itself: the owner reads, replaces and deletes it.
    assert "SecureTransport" in alice.get_bucket_policy(Bucket=name)["Policy"]
    alice.delete_bucket_policy(Bucket=name)
    assert alice.get_object(Bucket=name, Key="k")["Body"].read() == b"v"


def test_conditions_on_request_headers_and_request_tags(server, two_users):
    """`s3:x-amz-*` keys read the request's headers, `s3:RequestObjectTag/KEY` the tags it
    sets (its x-amz-tagging header, PutObjectTagging's body, a form's field)."""
    alice, bob, name, _, tag, _ = two_users
    bob_arn = arn_user(f"bob-{tag}")
    alice.put_bucket_policy(Bucket=name, Policy=json.dumps({"Version": "2012-10-17", "Statement": [
        {"Sid": "EncryptedOnly", "Effect": "Deny", "Principal": "*", "Action": "s3:PutObject",
         "Resource": f"arn:aws:s3:::{name}/*",
         "Condition": {"StringNotEquals": {"s3:x-amz-server-side-encryption": "AES256"}}},
        {"Sid": "TeamTagged", "Effect": "Allow", "Principal": {"AWS": bob_arn},
         "Action": ["s3:PutObject", "s3:PutObjectTagging"], "Resource": f"arn:aws:s3:::{name}/*",
         "Condition": {"StringEquals": {"s3:RequestObjectTag/team": "ml"}}},
        {"Sid": "NoClassB", "Effect": "Deny", "Principal": "*", "Action": "s3:PutObject",
         "Resource": f"arn:aws:s3:::{name}/*",
         "Condition": {"StringEquals": {"s3:x-amz-storage-class": "GLACIER"}}},
    ]}))
    # The owner too is held to the Deny on the header.
    assert code_of(alice.put_object, Bucket=name, Key="plain", Body=b"x") == "AccessDenied"
    alice.put_object(Bucket=name, Key="sealed", Body=b"x", ServerSideEncryption="AES256")
    assert code_of(alice.put_object, Bucket=name, Key="cold", Body=b"x", ServerSideEncryption="AES256",
                   StorageClass="GLACIER") == "AccessDenied"
    # bob may write only what he tags team=ml, and only encrypted.
    assert code_of(bob.put_object, Bucket=name, Key="b1", Body=b"x", ServerSideEncryption="AES256") == "AccessDenied"
    assert code_of(bob.put_object, Bucket=name, Key="b1", Body=b"x", ServerSideEncryption="AES256",
                   Tagging="team=web") == "AccessDenied"
    assert code_of(bob.put_object, Bucket=name, Key="b1", Body=b"x", Tagging="team=ml") == "AccessDenied"
    bob.put_object(Bucket=name, Key="b1", Body=b"x", ServerSideEncryption="AES256", Tagging="team=ml&x=1")
    assert alice.get_object_tagging(Bucket=name, Key="b1")["TagSet"] == [
        {"Key": "team", "Value": "ml"}, {"Key": "x", "Value": "1"}]
    # PutObjectTagging is judged by the tags in its body.
    bob.put_object_tagging(Bucket=name, Key="b1", Tagging={"TagSet": [{"Key": "team", "Value": "ml"}]})
    assert code_of(bob.put_object_tagging, Bucket=name, Key="b1",
                   Tagging={"TagSet": [{"Key": "team", "Value": "web"}]}) == "AccessDenied"
    assert alice.get_object_tagging(Bucket=name, Key="b1")["TagSet"] == [{"Key": "team", "Value": "ml"}]
    alice.delete_bucket_policy(Bucket=name)


def test_conditions_on_the_existing_objects_tags(server, two_users):
    """`s3:ExistingObjectTag/KEY` judges the tags of the object (or version) a request acts on;
    where many keys are judged without reading each object (batch GET), it fails closed."""
    alice, bob, name, _, tag, (bak, bsk) = two_users
    alice.put_bucket_policy(Bucket=name, Policy=json.dumps({"Statement": [
        {"Sid": "SharedOnes", "Effect": "Allow", "Principal": {"AWS": arn_user(f"bob-{tag}")},
         "Action": ["s3:GetObject", "s3:GetObjectVersion"], "Resource": f"arn:aws:s3:::{name}/*",
         "Condition": {"StringEquals": {"s3:ExistingObjectTag/share": "yes"}}},
        {"Sid": "NoSecrets", "Effect": "Deny", "Principal": "*", "Action": "s3:GetObject",
         "Resource": f"arn:aws:s3:::{name}/*",
         "Condition": {"StringEquals": {"s3:ExistingObjectTag/class": "secret"}}}]}))
    alice.put_object(Bucket=name, Key="shared", Body=b"s", Tagging="share=yes")
    alice.put_object(Bucket=name, Key="mine", Body=b"m")
    alice.put_object(Bucket=name, Key="secret", Body=b"x", Tagging="class=secret&share=yes")
    assert bob.get_object(Bucket=name, Key="shared")["Body"].read() == b"s"
    for key in ("mine", "secret", "no-such-key"):
        assert code_of(bob.get_object, Bucket=name, Key=key) == "AccessDenied", key
    # The owner too is held to the Deny, and reads the rest.
    assert code_of(alice.get_object, Bucket=name, Key="secret") == "AccessDenied"
    assert alice.get_object(Bucket=name, Key="mine")["Body"].read() == b"m"
    # Retagging changes the verdict on the next request.
    alice.put_object_tagging(Bucket=name, Key="mine", Tagging={"TagSet": [{"Key": "share", "Value": "yes"}]})
    assert bob.get_object(Bucket=name, Key="mine")["Body"].read() == b"m"
    alice.put_object_tagging(Bucket=name, Key="secret", Tagging={"TagSet": []})
    assert alice.get_object(Bucket=name, Key="secret")["Body"].read() == b"x"
    # A batch GET judges its keys without reading each object's tags: the Deny holds for all.
    with pytest.raises(AccessDenied):
        list(server.packrat(bak, bsk).batch_get(name, ["shared"]))
    alice.delete_bucket_policy(Bucket=name)


def test_get_bucket_policy_status(server, two_users):
    alice, bob, name, _, tag, _ = two_users
    assert code_of(alice.get_bucket_policy_status, Bucket=name) == "NoSuchBucketPolicy"
    named = {"Effect": "Allow", "Principal": {"AWS": arn_user(f"bob-{tag}")}, "Action": "s3:GetObject",
             "Resource": f"arn:aws:s3:::{name}/*"}
    alice.put_bucket_policy(Bucket=name, Policy=json.dumps({"Statement": [named]}))
    assert alice.get_bucket_policy_status(Bucket=name)["PolicyStatus"] == {"IsPublic": False}
    fenced = {**named, "Principal": "*", "Condition": {"IpAddress": {"aws:SourceIp": "10.0.0.0/8"}}}
    alice.put_bucket_policy(Bucket=name, Policy=json.dumps({"Statement": [fenced]}))
    assert alice.get_bucket_policy_status(Bucket=name)["PolicyStatus"] == {"IsPublic": False}
    alice.put_bucket_policy(Bucket=name, Policy=json.dumps({"Statement": [{**named, "Principal": "*"}]}))
    assert alice.get_bucket_policy_status(Bucket=name)["PolicyStatus"] == {"IsPublic": True}
    assert code_of(bob.get_bucket_policy_status, Bucket=name) == "AccessDenied"
    alice.delete_bucket_policy(Bucket=name)


def test_malformed_policies_are_refused_and_the_stored_one_kept(server, two_users):
    alice, _, name, _, _, _ = two_users
    good = json.dumps({"Statement": [{"Effect": "Allow", "Principal": "*", "Action": "s3:GetObject",
                                      "Resource": f"arn:aws:s3:::{name}/*"}]})
    alice.put_bucket_policy(Bucket=name, Policy=good)
    stmt = {"Effect": "Allow", "Principal": "*", "Action": "s3:GetObject", "Resource": f"arn:aws:s3:::{name}/*"}
    bad = [
        "{not json",
        json.dumps({"Statement": []}),
        json.dumps({"Statement": [{**stmt, "Effect": "Perhaps"}]}),
        json.dumps({"Statement": [{k: v for k, v in stmt.items() if k != "Principal"}]}),
        json.dumps({"Statement": [{**stmt, "Resource": "arn:aws:s3:::someone-elses-bucket/*"}]}),
        json.dumps({"Statement": [{**stmt, "Action": "ec2:RunInstances"}]}),
        json.dumps({"Statement": [{**stmt, "Condition": {"StringEquals": {"aws:PrincipalOrgID": "o-1"}}}]}),
        json.dumps({"Statement": [{**stmt, "Condition": {"StringEquals": {"s3:ExistingObjectTag/": "b"}}}]}),
        json.dumps({"Statement": [{**stmt, "Condition": {"StringEquals": {"s3:RequestObjectTag/": "b"}}}]}),
        json.dumps({"Statement": [{**stmt, "Principal": {"AWS": "arn:aws:iam::123456789012:root"}}]}),
        json.dumps({"Id": "x" * 21000, "Statement": [stmt]}),
    ]
    for doc in bad:
        assert code_of(alice.put_bucket_policy, Bucket=name, Policy=doc) == "MalformedPolicy", doc[:80]
    assert alice.get_bucket_policy(Bucket=name)["Policy"] == good
    alice.delete_bucket_policy(Bucket=name)
    # Deleting what is not there is fine, as in S3.
    alice.delete_bucket_policy(Bucket=name)


def test_awscli_bucket_policy_round_trip(server, bucket, tmp_path):
    doc = {"Version": "2012-10-17", "Statement": [
        {"Sid": "Pub", "Effect": "Allow", "Principal": "*", "Action": "s3:GetObject",
         "Resource": f"arn:aws:s3:::{bucket}/public/*"}]}
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(doc))
    aws(server, "s3api", "put-bucket-policy", "--bucket", bucket, "--policy", f"file://{path}")
    got = json.loads(aws(server, "s3api", "get-bucket-policy", "--bucket", bucket).stdout)
    assert json.loads(got["Policy"]) == doc
    aws(server, "s3api", "delete-bucket-policy", "--bucket", bucket)
    out = aws(server, "s3api", "get-bucket-policy", "--bucket", bucket, check=False)
    assert out.returncode != 0 and "NoSuchBucketPolicy" in out.stderr
