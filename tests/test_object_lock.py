"""Object Lock (issue 20): buckets created with Object Lock (versioning on for good), the bucket's
configuration and default retention, GOVERNANCE and COMPLIANCE retention on PUT, copy,
multipart and later (PutObjectRetention, by version too), legal holds, and what a lock refuses:
removing a protected version (DeleteObject and DeleteObjects with a version id), shortening
COMPLIANCE retention, shortening or removing GOVERNANCE retention without the bypass, and the
bypass itself when a bucket policy denies it. boto3 and aws-cli, against a real server and
(PACKRAT_TEST_TARGET=cluster) through a cluster gateway.

Retention that must run out in a test lasts a few seconds; GOVERNANCE retention is removed with
the bypass, so every test leaves its bucket empty and deleted."""

import datetime
import json
import time

import pytest

from conftest import Server
from test_awscli import aws
from test_bucket_policy import code_of, user

_n = [0]


def lock_bucket(s3, **kw):
    _n[0] += 1
    name = f"lock-{_n[0]}-{int(time.time() * 1000) % 10**8}"
    s3.create_bucket(Bucket=name, ObjectLockEnabledForBucket=True, **kw)
    return name


def ahead(seconds):
    return datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=seconds)


def drop(s3, bucket):
    """Removes every version (with the bypass, GOVERNANCE retention allows it) and the bucket."""
    listed = s3.list_object_versions(Bucket=bucket)
    for v in listed.get("Versions", []) + listed.get("DeleteMarkers", []):
        s3.delete_object(Bucket=bucket, Key=v["Key"], VersionId=v["VersionId"], BypassGovernanceRetention=True)
    s3.delete_bucket(Bucket=bucket)


def test_a_bucket_without_object_lock_refuses_lock_requests(s3, bucket):
    assert code_of(s3.get_object_lock_configuration, Bucket=bucket) == "ObjectLockConfigurationNotFoundError"
    # Object Lock needs versioning enabled first.
    config = {"ObjectLockEnabled": "Enabled"}
    assert code_of(s3.put_object_lock_configuration, Bucket=bucket, ObjectLockConfiguration=config) == "InvalidBucketState"
    # A write asking for a lock is refused, not stored unprotected.
    assert code_of(s3.put_object, Bucket=bucket, Key="k", Body=b"x", ObjectLockMode="GOVERNANCE",
                   ObjectLockRetainUntilDate=ahead(60)) == "InvalidRequest"
    assert code_of(s3.put_object, Bucket=bucket, Key="k", Body=b"x", ObjectLockLegalHoldStatus="ON") == "InvalidRequest"
    assert code_of(s3.head_object, Bucket=bucket, Key="k") == "404"
    s3.put_object(Bucket=bucket, Key="k", Body=b"x")
    assert code_of(s3.put_object_retention, Bucket=bucket, Key="k",
                   Retention={"Mode": "GOVERNANCE", "RetainUntilDate": ahead(60)}) == "InvalidRequest"
    assert code_of(s3.get_object_legal_hold, Bucket=bucket, Key="k") == "InvalidRequest"
    # Enabled on an existing bucket once versioning is on.
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    s3.put_object_lock_configuration(Bucket=bucket, ObjectLockConfiguration=config)
    assert s3.get_object_lock_configuration(Bucket=bucket)["ObjectLockConfiguration"] == config
    # Versioning cannot be suspended under Object Lock.
    assert code_of(s3.put_bucket_versioning, Bucket=bucket,
                   VersioningConfiguration={"Status": "Suspended"}) == "InvalidBucketState"
    assert s3.get_bucket_versioning(Bucket=bucket)["Status"] == "Enabled"
    listed = s3.list_object_versions(Bucket=bucket)
    for v in listed.get("Versions", []):
        s3.delete_object(Bucket=bucket, Key=v["Key"], VersionId=v["VersionId"])


def test_configuration_and_default_retention(s3):
    b = lock_bucket(s3)
    assert s3.get_bucket_versioning(Bucket=b)["Status"] == "Enabled"
    got = s3.get_object_lock_configuration(Bucket=b)["ObjectLockConfiguration"]
    assert got == {"ObjectLockEnabled": "Enabled"}
    bad = [
        ({"ObjectLockEnabled": "Enabled", "Rule": {"DefaultRetention": {"Mode": "GOVERNANCE", "Days": 0}}}, "InvalidRetentionPeriod"),
        ({"ObjectLockEnabled": "Enabled", "Rule": {"DefaultRetention": {"Mode": "GOVERNANCE", "Years": -1}}}, "InvalidRetentionPeriod"),
        ({"ObjectLockEnabled": "Enabled", "Rule": {"DefaultRetention": {"Mode": "governance", "Days": 1}}}, "MalformedXML"),
        ({"ObjectLockEnabled": "Disabled", "Rule": {"DefaultRetention": {"Mode": "GOVERNANCE", "Days": 1}}}, "MalformedXML"),
        ({"ObjectLockEnabled": "Enabled", "Rule": {"DefaultRetention": {"Mode": "GOVERNANCE", "Days": 1, "Years": 1}}}, "MalformedXML"),
        ({"ObjectLockEnabled": "Enabled", "Rule": {"DefaultRetention": {"Mode": "FOREVER", "Days": 1}}}, "MalformedXML"),
        ({"ObjectLockEnabled": "Enabled", "Rule": {"DefaultRetention": {"Mode": "GOVERNANCE", "Years": 101}}}, "InvalidRetentionPeriod"),
        ({"Rule": {"DefaultRetention": {"Mode": "GOVERNANCE", "Days": 1}}}, "MalformedXML"),
    ]
    for config, code in bad:
        assert code_of(s3.put_object_lock_configuration, Bucket=b, ObjectLockConfiguration=config) == code, config
    assert s3.get_object_lock_configuration(Bucket=b)["ObjectLockConfiguration"] == got, "refusals change nothing"
    config = {"ObjectLockEnabled": "Enabled", "Rule": {"DefaultRetention": {"Mode": "GOVERNANCE", "Days": 2}}}
    s3.put_object_lock_configuration(Bucket=b, ObjectLockConfiguration=config)
    assert s3.get_object_lock_configuration(Bucket=b)["ObjectLockConfiguration"] == config
    # A version written without a lock of its own gets the default: two days from its write.
    before = datetime.datetime.now(datetime.timezone.utc)
    put = s3.put_object(Bucket=b, Key="k", Body=b"v1")
    head = s3.head_object(Bucket=b, Key="k")
    assert head["ObjectLockMode"] == "GOVERNANCE"
    until = head["ObjectLockRetainUntilDate"]
    assert datetime.timedelta(days=2) - datetime.timedelta(seconds=5) < until - before < datetime.timedelta(days=2, seconds=5)
    assert "ObjectLockLegalHoldStatus" not in head
    got = s3.get_object_retention(Bucket=b, Key="k")["Retention"]
    assert got == {"Mode": "GOVERNANCE", "RetainUntilDate": until}
    assert code_of(s3.get_object_legal_hold, Bucket=b, Key="k") == "NoSuchObjectLockConfiguration"
    # One given on the write wins over the default.
    s3.put_object(Bucket=b, Key="own", Body=b"x", ObjectLockMode="GOVERNANCE", ObjectLockRetainUntilDate=ahead(3600))
    assert s3.head_object(Bucket=b, Key="own")["ObjectLockRetainUntilDate"] < until
    assert code_of(s3.delete_object, Bucket=b, Key="k", VersionId=put["VersionId"]) == "AccessDenied"
    # Years are kept as years.
    config["Rule"]["DefaultRetention"] = {"Mode": "COMPLIANCE", "Years": 1}
    s3.put_object_lock_configuration(Bucket=b, ObjectLockConfiguration=config)
    assert s3.get_object_lock_configuration(Bucket=b)["ObjectLockConfiguration"] == config
    # Bad lock headers on a write.
    assert code_of(s3.put_object, Bucket=b, Key="x", Body=b"x", ObjectLockMode="GOVERNANCE") == "InvalidArgument"
    assert code_of(s3.put_object, Bucket=b, Key="x", Body=b"x", ObjectLockMode="GOVERNANCE",
                   ObjectLockRetainUntilDate=ahead(-60)) == "InvalidArgument"
    config["Rule"]["DefaultRetention"] = {"Mode": "GOVERNANCE", "Days": 1}
    s3.put_object_lock_configuration(Bucket=b, ObjectLockConfiguration=config)
    drop(s3, b)


def test_governance_retention_protects_until_bypassed(s3):
    b = lock_bucket(s3)
    v1 = s3.put_object(Bucket=b, Key="k", Body=b"v1", ObjectLockMode="GOVERNANCE",
                       ObjectLockRetainUntilDate=ahead(3600))["VersionId"]
    head = s3.head_object(Bucket=b, Key="k", VersionId=v1)
    assert head["ObjectLockMode"] == "GOVERNANCE"
    # Removing the version is refused; the bytes stay.
    assert code_of(s3.delete_object, Bucket=b, Key="k", VersionId=v1) == "AccessDenied"
    out = s3.delete_objects(Bucket=b, Delete={"Objects": [{"Key": "k", "VersionId": v1}]})
    assert [e["Code"] for e in out.get("Errors", [])] == ["AccessDenied"]
    assert s3.get_object(Bucket=b, Key="k", VersionId=v1)["Body"].read() == b"v1"
    # A delete without a version id only stacks a marker; an overwrite only a new version.
    assert s3.delete_object(Bucket=b, Key="k")["DeleteMarker"] is True
    v2 = s3.put_object(Bucket=b, Key="k", Body=b"v2")["VersionId"]
    assert s3.get_object(Bucket=b, Key="k", VersionId=v1)["Body"].read() == b"v1"
    # Shortening or removing needs the bypass; lengthening or hardening does not.
    shorter = {"Mode": "GOVERNANCE", "RetainUntilDate": ahead(60)}
    assert code_of(s3.put_object_retention, Bucket=b, Key="k", VersionId=v1, Retention=shorter) == "AccessDenied"
    longer = ahead(7200)
    s3.put_object_retention(Bucket=b, Key="k", VersionId=v1, Retention={"Mode": "GOVERNANCE", "RetainUntilDate": longer})
    got = s3.get_object_retention(Bucket=b, Key="k", VersionId=v1)["Retention"]
    assert got["Mode"] == "GOVERNANCE" and abs((got["RetainUntilDate"] - longer).total_seconds()) < 1
    s3.put_object_retention(Bucket=b, Key="k", VersionId=v1, Retention=shorter, BypassGovernanceRetention=True)
    # The current version had none; it gets one by key alone.
    s3.put_object_retention(Bucket=b, Key="k", Retention={"Mode": "GOVERNANCE", "RetainUntilDate": ahead(600)})
    assert s3.get_object_retention(Bucket=b, Key="k", VersionId=v2)["Retention"]["Mode"] == "GOVERNANCE"
    assert code_of(s3.delete_object, Bucket=b, Key="k", VersionId=v2) == "AccessDenied"
    # With the bypass, the version goes.
    s3.delete_object(Bucket=b, Key="k", VersionId=v1, BypassGovernanceRetention=True)
    assert code_of(s3.head_object, Bucket=b, Key="k", VersionId=v1) == "404"
    # Retention of a version that is not there, or of a delete marker.
    assert code_of(s3.get_object_retention, Bucket=b, Key="k", VersionId="0000000000000001") == "NoSuchVersion"
    assert code_of(s3.get_object_retention, Bucket=b, Key="nope") == "NoSuchKey"
    drop(s3, b)


def test_compliance_retention_cannot_be_shortened_or_bypassed(s3):
    b = lock_bucket(s3)
    until = ahead(4)
    v1 = s3.put_object(Bucket=b, Key="c", Body=b"kept", ObjectLockMode="COMPLIANCE",
                       ObjectLockRetainUntilDate=until)["VersionId"]
    assert code_of(s3.delete_object, Bucket=b, Key="c", VersionId=v1, BypassGovernanceRetention=True) == "AccessDenied"
    for retention in [
        {"Mode": "COMPLIANCE", "RetainUntilDate": ahead(2)},
        {"Mode": "GOVERNANCE", "RetainUntilDate": ahead(3600)},
    ]:
        assert code_of(s3.put_object_retention, Bucket=b, Key="c", VersionId=v1, Retention=retention,
                       BypassGovernanceRetention=True) == "AccessDenied", retention
    # Lengthening is allowed (by a second).
    until = until + datetime.timedelta(seconds=1)
    s3.put_object_retention(Bucket=b, Key="c", VersionId=v1, Retention={"Mode": "COMPLIANCE", "RetainUntilDate": until})
    assert s3.get_object(Bucket=b, Key="c", VersionId=v1)["Body"].read() == b"kept"
    # Once its date has passed, the version can go.
    time.sleep(max(0.0, (until - datetime.datetime.now(datetime.timezone.utc)).total_seconds()) + 0.5)
    s3.delete_object(Bucket=b, Key="c", VersionId=v1)
    drop(s3, b)


def test_legal_hold_holds_whatever_the_retention(s3):
    b = lock_bucket(s3)
    v1 = s3.put_object(Bucket=b, Key="h", Body=b"x", ObjectLockLegalHoldStatus="ON")["VersionId"]
    assert s3.head_object(Bucket=b, Key="h")["ObjectLockLegalHoldStatus"] == "ON"
    assert s3.get_object_legal_hold(Bucket=b, Key="h")["LegalHold"] == {"Status": "ON"}
    assert code_of(s3.get_object_retention, Bucket=b, Key="h") == "NoSuchObjectLockConfiguration"
    assert code_of(s3.delete_object, Bucket=b, Key="h", VersionId=v1, BypassGovernanceRetention=True) == "AccessDenied"
    assert code_of(s3.put_object_legal_hold, Bucket=b, Key="h", LegalHold={"Status": "MAYBE"}) == "MalformedXML"
    # A hold on an older version, by id.
    v2 = s3.put_object(Bucket=b, Key="h", Body=b"y")["VersionId"]
    s3.put_object_legal_hold(Bucket=b, Key="h", VersionId=v1, LegalHold={"Status": "OFF"})
    s3.put_object_legal_hold(Bucket=b, Key="h", VersionId=v2, LegalHold={"Status": "ON"})
    assert s3.get_object_legal_hold(Bucket=b, Key="h", VersionId=v1)["LegalHold"] == {"Status": "OFF"}
    s3.delete_object(Bucket=b, Key="h", VersionId=v1)
    assert code_of(s3.delete_object, Bucket=b, Key="h", VersionId=v2) == "AccessDenied"
    s3.put_object_legal_hold(Bucket=b, Key="h", LegalHold={"Status": "OFF"})
    drop(s3, b)


def test_copies_and_multipart_uploads_take_the_lock_asked(s3):
    b = lock_bucket(s3)
    s3.put_object(Bucket=b, Key="src", Body=b"s" * 100, ObjectLockMode="GOVERNANCE", ObjectLockRetainUntilDate=ahead(600),
                  ObjectLockLegalHoldStatus="ON")
    # A copy never inherits its source's lock.
    s3.copy_object(Bucket=b, Key="plain", CopySource={"Bucket": b, "Key": "src"})
    head = s3.head_object(Bucket=b, Key="plain")
    assert "ObjectLockMode" not in head and "ObjectLockLegalHoldStatus" not in head
    s3.copy_object(Bucket=b, Key="held", CopySource={"Bucket": b, "Key": "src"}, ObjectLockLegalHoldStatus="ON")
    assert s3.head_object(Bucket=b, Key="held")["ObjectLockLegalHoldStatus"] == "ON"
    until = ahead(900)
    mp = s3.create_multipart_upload(Bucket=b, Key="big", ObjectLockMode="GOVERNANCE", ObjectLockRetainUntilDate=until)
    part = s3.upload_part(Bucket=b, Key="big", UploadId=mp["UploadId"], PartNumber=1, Body=b"m" * 1000)
    done = s3.complete_multipart_upload(Bucket=b, Key="big", UploadId=mp["UploadId"],
                                        MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": part["ETag"]}]})
    head = s3.head_object(Bucket=b, Key="big")
    assert head["ObjectLockMode"] == "GOVERNANCE"
    assert abs((head["ObjectLockRetainUntilDate"] - until).total_seconds()) < 1
    assert code_of(s3.delete_object, Bucket=b, Key="big", VersionId=done["VersionId"]) == "AccessDenied"
    for key in ("src", "held"):
        s3.put_object_legal_hold(Bucket=b, Key=key, LegalHold={"Status": "OFF"})
    drop(s3, b)


def test_bypass_is_a_permission_a_policy_can_deny(server):
    owner, _ = user(server, "lock-owner")
    b = lock_bucket(owner)
    v = owner.put_object(Bucket=b, Key="k", Body=b"x", ObjectLockMode="GOVERNANCE",
                         ObjectLockRetainUntilDate=ahead(600))["VersionId"]
    policy = {"Version": "2012-10-17", "Statement": [{
        "Effect": "Deny", "Principal": "*", "Action": "s3:BypassGovernanceRetention",
        "Resource": f"arn:aws:s3:::{b}/*"}]}
    owner.put_bucket_policy(Bucket=b, Policy=json.dumps(policy))
    assert code_of(owner.delete_object, Bucket=b, Key="k", VersionId=v, BypassGovernanceRetention=True) == "AccessDenied"
    out = owner.delete_objects(Bucket=b, BypassGovernanceRetention=True, Delete={"Objects": [{"Key": "k", "VersionId": v}]})
    assert [e["Code"] for e in out.get("Errors", [])] == ["AccessDenied"]
    assert code_of(owner.put_object_retention, Bucket=b, Key="k", VersionId=v, Retention={},
                   BypassGovernanceRetention=True) == "AccessDenied"
    # Reading the retention can be denied too: HEAD then leaves the lock headers out.
    policy["Statement"].append({"Effect": "Deny", "Principal": "*", "Action": "s3:GetObjectRetention",
                                "Resource": f"arn:aws:s3:::{b}/*"})
    owner.put_bucket_policy(Bucket=b, Policy=json.dumps(policy))
    assert "ObjectLockMode" not in owner.head_object(Bucket=b, Key="k")
    assert code_of(owner.get_object_retention, Bucket=b, Key="k") == "AccessDenied"
    owner.delete_bucket_policy(Bucket=b)
    assert owner.head_object(Bucket=b, Key="k")["ObjectLockMode"] == "GOVERNANCE"
    # Without the denial, the owner may bypass.
    owner.put_object_retention(Bucket=b, Key="k", VersionId=v, Retention={}, BypassGovernanceRetention=True)
    assert code_of(owner.get_object_retention, Bucket=b, Key="k") == "NoSuchObjectLockConfiguration"
    drop(owner, b)


def test_awscli_object_lock(server, s3):
    b = lock_bucket(s3)
    aws(server, "s3api", "put-object-lock-configuration", "--bucket", b, "--object-lock-configuration",
        json.dumps({"ObjectLockEnabled": "Enabled", "Rule": {"DefaultRetention": {"Mode": "GOVERNANCE", "Days": 1}}}))
    got = json.loads(aws(server, "s3api", "get-object-lock-configuration", "--bucket", b).stdout)
    assert got["ObjectLockConfiguration"]["Rule"]["DefaultRetention"] == {"Mode": "GOVERNANCE", "Days": 1}
    s3.put_object(Bucket=b, Key="k", Body=b"x")
    until = (datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(days=3)).strftime("%Y-%m-%dT%H:%M:%SZ")
    aws(server, "s3api", "put-object-retention", "--bucket", b, "--key", "k", "--retention",
        json.dumps({"Mode": "GOVERNANCE", "RetainUntilDate": until}))
    got = json.loads(aws(server, "s3api", "get-object-retention", "--bucket", b, "--key", "k").stdout)
    assert got["Retention"]["Mode"] == "GOVERNANCE" and got["Retention"]["RetainUntilDate"].startswith(until[:19])
    aws(server, "s3api", "put-object-legal-hold", "--bucket", b, "--key", "k", "--legal-hold", "Status=ON")
    got = json.loads(aws(server, "s3api", "get-object-legal-hold", "--bucket", b, "--key", "k").stdout)
    assert got["LegalHold"]["Status"] == "ON"
    vid = s3.head_object(Bucket=b, Key="k")["VersionId"]
    out = aws(server, "s3api", "delete-object", "--bucket", b, "--key", "k", "--version-id", vid,
              "--bypass-governance-retention", check=False)
    assert out.returncode != 0 and "AccessDenied" in out.stderr, "a legal hold holds against the bypass"
    aws(server, "s3api", "put-object-legal-hold", "--bucket", b, "--key", "k", "--legal-hold", "Status=OFF")
    aws(server, "s3api", "delete-object", "--bucket", b, "--key", "k", "--version-id", vid,
        "--bypass-governance-retention")
    drop(s3, b)


@pytest.mark.local_only("one server killed and restarted (test_cluster.py kills nodes)")
def test_locks_survive_kill_9(workdir):
    """The bucket's configuration and each version's lock are in the index records written
    with the acknowledged write: a kill -9 loses neither, and the refusal holds after it."""
    srv = Server(workdir / "object-lock-kill9").start()
    try:
        s3 = srv.client()
        s3.create_bucket(Bucket="locked", ObjectLockEnabledForBucket=True)
        config = {"ObjectLockEnabled": "Enabled", "Rule": {"DefaultRetention": {"Mode": "GOVERNANCE", "Days": 5}}}
        s3.put_object_lock_configuration(Bucket="locked", ObjectLockConfiguration=config)
        old = s3.put_object(Bucket="locked", Key="k", Body=b"old", ObjectLockLegalHoldStatus="ON")["VersionId"]
        new = s3.put_object(Bucket="locked", Key="k", Body=b"new")["VersionId"]
        until = s3.head_object(Bucket="locked", Key="k")["ObjectLockRetainUntilDate"]
        srv.kill9()
        srv.start()
        s3 = srv.client()
        assert s3.get_object_lock_configuration(Bucket="locked")["ObjectLockConfiguration"] == config
        assert s3.head_object(Bucket="locked", Key="k", VersionId=old)["ObjectLockLegalHoldStatus"] == "ON"
        assert s3.head_object(Bucket="locked", Key="k")["ObjectLockRetainUntilDate"] == until
        assert code_of(s3.delete_object, Bucket="locked", Key="k", VersionId=old,
                       BypassGovernanceRetention=True) == "AccessDenied"
        assert code_of(s3.delete_object, Bucket="locked", Key="k", VersionId=new) == "AccessDenied"
        assert code_of(s3.put_bucket_versioning, Bucket="locked",
                       VersioningConfiguration={"Status": "Suspended"}) == "InvalidBucketState"
        assert s3.get_object(Bucket="locked", Key="k", VersionId=old)["Body"].read() == b"old"
    finally:
        srv.stop()
