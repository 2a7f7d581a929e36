"""Object versioning (issue 20): PutBucketVersioning and GetBucketVersioning, versioned
overwrite and delete (delete markers), GET, HEAD, copy and delete by versionId,
ListObjectVersions with paging, suspended buckets and their "null" version, DeleteObjects with
version ids, a bucket that is not empty while versions remain, and versions that survive a
restart and a compaction of the segments they live in. boto3 and aws-cli, against a real server.

A bucket that never had versioning behaves as before: no x-amz-version-id, an empty
GetBucketVersioning, and every object listed as its "null" version."""

import datetime
import hashlib
import io
import json
import os
import subprocess
import tarfile

import pytest
from botocore.exceptions import ClientError

import conftest
from conftest import Server
from test_awscli import aws
from test_bucket_policy import code_of
from test_compaction import admin as compaction_admin

def enable(s3, bucket, status="Enabled"):
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": status})


def versions_of(s3, bucket, **kw):
    """Every (key, version id, is latest, is delete marker, size) in listing order, read one
    small page at a time, so the paging markers are exercised."""
    out, kw = [], dict(kw)
    while True:
        page = s3.list_object_versions(Bucket=bucket, MaxKeys=2, **kw)
        entries = [(v["Key"], v["VersionId"], v["IsLatest"], False, v["Size"]) for v in page.get("Versions", [])]
        entries += [(d["Key"], d["VersionId"], d["IsLatest"], True, 0) for d in page.get("DeleteMarkers", [])]
        out += entries
        if not page["IsTruncated"]:
            # boto3 splits pages into versions and markers: put them in key order (within a
            # key by version id, which grows with time; "null" first).
            return sorted(out, key=lambda e: (e[0], "" if e[1] == "null" else e[1]))
        kw["KeyMarker"] = page["NextKeyMarker"]
        if page.get("NextVersionIdMarker"):
            kw["VersionIdMarker"] = page["NextVersionIdMarker"]
        else:
            kw.pop("VersionIdMarker", None)


def remove_every_version(s3, bucket):
    for v in versions_of(s3, bucket):
        s3.delete_object(Bucket=bucket, Key=v[0], VersionId=v[1])
    s3.delete_bucket(Bucket=bucket)


def test_an_unversioned_bucket_answers_as_before(s3, bucket):
    assert "Status" not in s3.get_bucket_versioning(Bucket=bucket)
    put = s3.put_object(Bucket=bucket, Key="k", Body=b"v1")
    assert "VersionId" not in put
    assert "VersionId" not in s3.head_object(Bucket=bucket, Key="k")
    # Its one version is "null", by that name too.
    assert s3.get_object(Bucket=bucket, Key="k", VersionId="null")["Body"].read() == b"v1"
    assert code_of(s3.get_object, Bucket=bucket, Key="k", VersionId="0000000000000001") == "NoSuchVersion"
    assert code_of(s3.get_object, Bucket=bucket, Key="k", VersionId="not-an-id") == "InvalidArgument"
    listed = s3.list_object_versions(Bucket=bucket)
    assert [(v["Key"], v["VersionId"], v["IsLatest"]) for v in listed["Versions"]] == [("k", "null", True)]
    # A delete removes it: nothing is kept.
    assert "DeleteMarker" not in s3.delete_object(Bucket=bucket, Key="k")
    assert s3.list_object_versions(Bucket=bucket).get("Versions", []) == []
    # Versioning cannot be "turned off" by a document; MFA delete is not offered.
    assert code_of(s3.put_bucket_versioning, Bucket=bucket,
                   VersioningConfiguration={"Status": "Off"}) == "MalformedXML"
    assert code_of(s3.put_bucket_versioning, Bucket=bucket,
                   VersioningConfiguration={"Status": "Enabled", "MFADelete": "Enabled"},
                   MFA="serial 123456") == "NotImplemented"
    assert "Status" not in s3.get_bucket_versioning(Bucket=bucket)


def test_versioned_overwrite_delete_and_restore(s3):
    bucket = "versioned-basic"
    s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket=bucket, Key="k", Body=b"before versioning")
    enable(s3, bucket)
    assert s3.get_bucket_versioning(Bucket=bucket)["Status"] == "Enabled"
    v1 = s3.put_object(Bucket=bucket, Key="k", Body=b"one")["VersionId"]
    v2 = s3.put_object(Bucket=bucket, Key="k", Body=b"two")["VersionId"]
    assert v1 != v2 and "null" not in (v1, v2)
    got = s3.get_object(Bucket=bucket, Key="k")
    assert got["Body"].read() == b"two" and got["VersionId"] == v2
    # Every version reads by id, the one from before versioning as "null".
    for vid, body in ((v1, b"one"), (v2, b"two"), ("null", b"before versioning")):
        r = s3.get_object(Bucket=bucket, Key="k", VersionId=vid)
        assert (r["Body"].read(), r["VersionId"]) == (body, vid)
        assert s3.head_object(Bucket=bucket, Key="k", VersionId=vid)["ContentLength"] == len(body)
    # A range of an old version.
    assert s3.get_object(Bucket=bucket, Key="k", VersionId=v1, Range="bytes=1-2")["Body"].read() == b"ne"
    assert [(k, v, latest) for k, v, latest, _, _ in versions_of(s3, bucket)] == \
        [("k", "null", False), ("k", v1, False), ("k", v2, True)]

    # A delete adds a marker: the key is gone, its versions stay.
    d = s3.delete_object(Bucket=bucket, Key="k")
    assert d["DeleteMarker"] is True
    marker = d["VersionId"]
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=bucket, Key="k")
    assert e.value.response["Error"]["Code"] == "NoSuchKey"
    assert e.value.response["ResponseMetadata"]["HTTPHeaders"]["x-amz-delete-marker"] == "true"
    assert e.value.response["ResponseMetadata"]["HTTPHeaders"]["x-amz-version-id"] == marker
    # The marker itself cannot be read (405), and the listing hides the key.
    assert code_of(s3.get_object, Bucket=bucket, Key="k", VersionId=marker) == "MethodNotAllowed"
    assert s3.list_objects_v2(Bucket=bucket)["KeyCount"] == 0
    assert s3.get_object(Bucket=bucket, Key="k", VersionId=v2)["Body"].read() == b"two"
    markers = s3.list_object_versions(Bucket=bucket)["DeleteMarkers"]
    assert [(m["Key"], m["VersionId"], m["IsLatest"]) for m in markers] == [("k", marker, True)]

    # Deleting the marker brings the newest version back.
    r = s3.delete_object(Bucket=bucket, Key="k", VersionId=marker)
    assert r["DeleteMarker"] is True and r["VersionId"] == marker
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"two"
    # Deleting the current version for good makes the one before it current.
    s3.delete_object(Bucket=bucket, Key="k", VersionId=v2)
    assert code_of(s3.get_object, Bucket=bucket, Key="k", VersionId=v2) == "NoSuchVersion"
    got = s3.get_object(Bucket=bucket, Key="k")
    assert (got["Body"].read(), got["VersionId"]) == (b"one", v1)
    assert s3.list_objects_v2(Bucket=bucket)["Contents"][0]["Size"] == 3

    # Copy from an old version, and a copy names the version it read and the one it made.
    c = s3.copy_object(Bucket=bucket, Key="copy", CopySource={"Bucket": bucket, "Key": "k", "VersionId": "null"})
    assert c["CopySourceVersionId"] == "null" and c["VersionId"] not in ("null", v1)
    assert s3.get_object(Bucket=bucket, Key="copy")["Body"].read() == b"before versioning"

    # A bucket with versions left is not empty; once every version is gone it can go.
    for v in versions_of(s3, bucket):
        s3.delete_object(Bucket=bucket, Key=v[0])
    assert s3.list_objects_v2(Bucket=bucket)["KeyCount"] == 0
    assert code_of(s3.delete_bucket, Bucket=bucket) == "BucketNotEmpty"
    remove_every_version(s3, bucket)
    assert code_of(s3.head_bucket, Bucket=bucket) == "404"


def test_suspended_versioning_keeps_one_null_version(s3):
    bucket = "versioned-suspended"
    s3.create_bucket(Bucket=bucket)
    enable(s3, bucket)
    kept = s3.put_object(Bucket=bucket, Key="k", Body=b"kept")["VersionId"]
    enable(s3, bucket, "Suspended")
    assert s3.get_bucket_versioning(Bucket=bucket)["Status"] == "Suspended"
    assert s3.put_object(Bucket=bucket, Key="k", Body=b"null-1")["VersionId"] == "null"
    assert s3.put_object(Bucket=bucket, Key="k", Body=b"null-2")["VersionId"] == "null"
    # The second null replaced the first; the version from before the suspension stays.
    assert sorted((v, latest) for _, v, latest, _, _ in versions_of(s3, bucket)) == \
        sorted([("null", True), (kept, False)])
    assert s3.get_object(Bucket=bucket, Key="k", VersionId="null")["Body"].read() == b"null-2"
    # A delete while suspended makes a null delete marker, which replaces the null object.
    d = s3.delete_object(Bucket=bucket, Key="k")
    assert (d["DeleteMarker"], d["VersionId"]) == (True, "null")
    listed = s3.list_object_versions(Bucket=bucket)
    assert [v["VersionId"] for v in listed["Versions"]] == [kept]
    assert [m["VersionId"] for m in listed["DeleteMarkers"]] == ["null"]
    assert s3.get_object(Bucket=bucket, Key="k", VersionId=kept)["Body"].read() == b"kept"
    remove_every_version(s3, bucket)


def test_listing_pages_delimiters_and_delete_objects_with_versions(s3):
    bucket = "versioned-listing"
    s3.create_bucket(Bucket=bucket)
    enable(s3, bucket)
    made = {}
    for key in ("a", "b/1", "b/2", "c"):
        made[key] = [s3.put_object(Bucket=bucket, Key=key, Body=f"{key}-{i}".encode())["VersionId"] for i in range(3)]
    s3.delete_object(Bucket=bucket, Key="c")
    listed = versions_of(s3, bucket)
    assert len(listed) == 13
    for key, ids in made.items():
        assert sorted(v for k, v, _, marker, _ in listed if k == key and not marker) == sorted(ids)
    latest = {k: v for k, v, is_latest, _, _ in listed if is_latest}
    assert latest["a"] == made["a"][-1] and latest["c"] not in made["c"]
    # Prefix and delimiter, as ListObjects does them.
    page = s3.list_object_versions(Bucket=bucket, Delimiter="/")
    assert [p["Prefix"] for p in page["CommonPrefixes"]] == ["b/"]
    assert {v["Key"] for v in page["Versions"]} == {"a", "c"}
    page = s3.list_object_versions(Bucket=bucket, Prefix="b/")
    assert len(page["Versions"]) == 6
    # A version-id marker needs a key marker.
    assert code_of(s3.list_object_versions, Bucket=bucket, VersionIdMarker=made["a"][0]) == "InvalidArgument"
    # DeleteObjects: by version (for good) and without (a marker).
    r = s3.delete_objects(Bucket=bucket, Delete={"Objects": [
        {"Key": "a", "VersionId": made["a"][0]}, {"Key": "b/1"}, {"Key": "a", "VersionId": "zz"}]})
    deleted = {(d["Key"], d.get("VersionId")): d for d in r["Deleted"]}
    assert ("a", made["a"][0]) in deleted
    assert deleted[("b/1", None)]["DeleteMarker"] is True and deleted[("b/1", None)]["DeleteMarkerVersionId"]
    assert [(e["Key"], e["Code"]) for e in r["Errors"]] == [("a", "InvalidArgument")]
    assert code_of(s3.get_object, Bucket=bucket, Key="a", VersionId=made["a"][0]) == "NoSuchVersion"
    assert code_of(s3.get_object, Bucket=bucket, Key="b/1") == "NoSuchKey"
    # GetObjectTagging names a version: the tags of that version, not the current one's.
    s3.put_object(Bucket=bucket, Key="t", Body=b"t-0", Tagging="gen=0")
    first = s3.head_object(Bucket=bucket, Key="t")["VersionId"]
    s3.put_object(Bucket=bucket, Key="t", Body=b"t-1", Tagging="gen=1")
    got = s3.get_object_tagging(Bucket=bucket, Key="t", VersionId=first)
    assert got["TagSet"] == [{"Key": "gen", "Value": "0"}] and got["VersionId"] == first
    got = s3.get_object_tagging(Bucket=bucket, Key="t")
    assert got["TagSet"] == [{"Key": "gen", "Value": "1"}] and got["VersionId"] != first
    assert code_of(s3.get_object_tagging, Bucket=bucket, Key="a", VersionId=made["a"][0]) == "NoSuchVersion"
    assert code_of(s3.get_object_tagging, Bucket=bucket, Key="a", VersionId="zz") == "InvalidArgument"
    marker = [v for _, v, _, is_marker, _ in versions_of(s3, bucket, Prefix="b/1") if is_marker]
    assert code_of(s3.get_object_tagging, Bucket=bucket, Key="b/1", VersionId=marker[0]) == "MethodNotAllowed"
    # Object ACLs by version: what holds (ACLs disabled, as S3's default), for the version named.
    acl = s3.get_object_acl(Bucket=bucket, Key="a", VersionId=made["a"][1])
    assert [g["Permission"] for g in acl["Grants"]] == ["FULL_CONTROL"]
    assert acl["ResponseMetadata"]["HTTPHeaders"]["x-amz-version-id"] == made["a"][1]
    s3.put_object_acl(Bucket=bucket, Key="a", VersionId=made["a"][1], ACL="private")
    assert code_of(s3.put_object_acl, Bucket=bucket, Key="a", VersionId=made["a"][1],
                   ACL="public-read") == "AccessControlListNotSupported"
    assert code_of(s3.get_object_acl, Bucket=bucket, Key="a", VersionId=made["a"][0]) == "NoSuchVersion"
    assert code_of(s3.get_object_acl, Bucket=bucket, Key="b/1", VersionId=marker[0]) == "MethodNotAllowed"
    remove_every_version(s3, bucket)


def test_tagging_names_a_version(s3, bucket):
    """Put and DeleteObjectTagging take a versionId: they change that version's tags alone (an
    older version's, or the current one's named by id, which stays current under its id, no
    version made), its bytes kept, answered with x-amz-version-id; S3's errors for a malformed
    id, a version not there and a delete marker. An unversioned bucket's object is its `null`
    version."""
    versioned = "versioned-tags"
    s3.create_bucket(Bucket=versioned)
    enable(s3, versioned)
    ids = [s3.put_object(Bucket=versioned, Key="t", Body=b"t-%d" % i, Tagging=f"gen={i}")["VersionId"]
           for i in range(3)]

    def tags(**kw):
        return s3.get_object_tagging(Bucket=versioned, Key="t", **kw)["TagSet"]

    def tag_set(**kv):
        return {"TagSet": [{"Key": k, "Value": v} for k, v in kv.items()]}

    r = s3.put_object_tagging(Bucket=versioned, Key="t", VersionId=ids[0], Tagging=tag_set(split="val"))
    assert r["VersionId"] == ids[0]
    assert tags(VersionId=ids[0]) == [{"Key": "split", "Value": "val"}]
    assert tags(VersionId=ids[1]) == [{"Key": "gen", "Value": "1"}]
    assert tags() == [{"Key": "gen", "Value": "2"}]
    assert s3.get_object(Bucket=versioned, Key="t", VersionId=ids[0])["Body"].read() == b"t-0"
    r = s3.delete_object_tagging(Bucket=versioned, Key="t", VersionId=ids[1])
    assert r["VersionId"] == ids[1] and r["ResponseMetadata"]["HTTPStatusCode"] == 204
    assert tags(VersionId=ids[1]) == [] and tags() == [{"Key": "gen", "Value": "2"}]
    # The current version named by id; and without an id, the answer names the current one.
    r = s3.put_object_tagging(Bucket=versioned, Key="t", VersionId=ids[2], Tagging=tag_set(cur="yes", n="2"))
    assert r["VersionId"] == ids[2]
    got = s3.get_object(Bucket=versioned, Key="t")
    assert (got["VersionId"], got["TagCount"], got["Body"].read()) == (ids[2], 2, b"t-2")
    assert s3.put_object_tagging(Bucket=versioned, Key="t", Tagging=tag_set(cur="no"))["VersionId"] == ids[2]
    assert tags(VersionId=ids[2]) == [{"Key": "cur", "Value": "no"}]
    assert sorted(v for _, v, _, _, _ in versions_of(s3, versioned)) == sorted(ids)
    # A malformed id, a version removed, a delete marker.
    assert code_of(s3.put_object_tagging, Bucket=versioned, Key="t", VersionId="zz",
                   Tagging=tag_set(x="y")) == "InvalidArgument"
    s3.delete_object(Bucket=versioned, Key="t", VersionId=ids[0])
    assert code_of(s3.put_object_tagging, Bucket=versioned, Key="t", VersionId=ids[0],
                   Tagging=tag_set(x="y")) == "NoSuchVersion"
    assert code_of(s3.delete_object_tagging, Bucket=versioned, Key="t", VersionId=ids[0]) == "NoSuchVersion"
    marker = s3.delete_object(Bucket=versioned, Key="t")["VersionId"]
    assert code_of(s3.put_object_tagging, Bucket=versioned, Key="t", VersionId=marker,
                   Tagging=tag_set(x="y")) == "MethodNotAllowed"
    assert code_of(s3.delete_object_tagging, Bucket=versioned, Key="t", VersionId=marker) == "MethodNotAllowed"
    assert code_of(s3.put_object_tagging, Bucket=versioned, Key="t", Tagging=tag_set(x="y")) == "NoSuchKey"
    assert tags(VersionId=ids[2]) == [{"Key": "cur", "Value": "no"}], "untouched by the refusals"
    remove_every_version(s3, versioned)
    # Unversioned: `null` names the object; no other id names anything.
    s3.put_object(Bucket=bucket, Key="plain", Body=b"p")
    s3.put_object_tagging(Bucket=bucket, Key="plain", VersionId="null", Tagging=tag_set(k="v"))
    assert s3.get_object_tagging(Bucket=bucket, Key="plain")["TagSet"] == [{"Key": "k", "Value": "v"}]
    assert code_of(s3.delete_object_tagging, Bucket=bucket, Key="plain", VersionId=ids[2]) == "NoSuchVersion"
    s3.delete_object_tagging(Bucket=bucket, Key="plain", VersionId="null")
    assert s3.get_object_tagging(Bucket=bucket, Key="plain")["TagSet"] == []


@pytest.mark.local_only("a restart, a compaction and the offline verifier of one server's data directory")
def test_versions_survive_restart_and_compaction(workdir):
    """Overwritten versions live in segments whose other records are dead: a compaction moves
    their bytes out with the current objects' (so the dead space comes back), never drops them,
    and a restart finds them, every one checksum-verified."""
    srv = Server(workdir / "versions-compaction", ["--segment-size", str(1024 * 1024),
                                                   "--compact-interval", "0", "--compact-grace", "0"]).start()
    try:
        s3 = srv.client()
        s3.create_bucket(Bucket="vers-compact")
        enable(s3, "vers-compact")
        s3.create_bucket(Bucket="churn")
        written = {}
        for round_ in range(4):
            for i in range(40):
                body = os.urandom(20_000 + i)
                vid = s3.put_object(Bucket="vers-compact", Key=f"k{i:02d}", Body=body)["VersionId"]
                written[(f"k{i:02d}", vid)] = hashlib.md5(body).hexdigest()
                # Unversioned churn fills the same segments with bytes that die.
                s3.put_object(Bucket="churn", Key=f"c{i:02d}", Body=os.urandom(20_000))
        for i in range(0, 40, 3):
            s3.delete_object(Bucket="vers-compact", Key=f"k{i:02d}")
        churn_dead = 3 * 40 * 20_000
        report = compaction_admin(srv, "compact", "--threshold", "0.99")
        print("compaction:", report)
        # The segments holding noncurrent versions were compacted too: the versions moved, and
        # the churn's dead bytes came back.
        assert report["segments_removed"] > 0 and report["segments_kept"] == 0, report
        net = report["bytes_reclaimed"] - report["bytes_moved"]
        assert report["objects_moved"] > 3 * 40 and net >= 0.8 * churn_dead, report
        srv.stop()
        srv.start()
        s3 = srv.client()
        for (key, vid), md5 in written.items():
            body = s3.get_object(Bucket="vers-compact", Key=key, VersionId=vid)["Body"].read()
            assert hashlib.md5(body).hexdigest() == md5, (key, vid)
        assert len([v for v in versions_of(s3, "vers-compact") if not v[3]]) == len(written)
        srv.stop()
        # The offline verifier reads every version's records too (the deleted keys' markers
        # count as versions without bytes).
        out = subprocess.run([conftest.BIN, "admin", "--data-dir", srv.data_dir, "verify", "--json"],
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stdout + out.stderr
        report = json.loads(out.stdout)
        assert report["problems"] == [], report
        assert report["objects"] >= len(written) + 40, report
    finally:
        srv.stop()


def test_awscli_versioning(server, tmp_path):
    bucket = "versioned-cli"
    aws(server, "s3api", "create-bucket", "--bucket", bucket)
    aws(server, "s3api", "put-bucket-versioning", "--bucket", bucket,
        "--versioning-configuration", "Status=Enabled")
    got = json.loads(aws(server, "s3api", "get-bucket-versioning", "--bucket", bucket).stdout)
    assert got["Status"] == "Enabled"
    f = tmp_path / "f"
    ids = []
    for body in (b"first", b"second"):
        f.write_bytes(body)
        ids.append(json.loads(aws(server, "s3api", "put-object", "--bucket", bucket, "--key", "k",
                                  "--body", str(f), "--tagging", f"v={body.decode()}").stdout)["VersionId"])
    tags = json.loads(aws(server, "s3api", "get-object-tagging", "--bucket", bucket, "--key", "k",
                          "--version-id", ids[0]).stdout)
    assert tags == {"VersionId": ids[0], "TagSet": [{"Key": "v", "Value": "first"}]}
    aws(server, "s3api", "put-object-tagging", "--bucket", bucket, "--key", "k", "--version-id", ids[0],
        "--tagging", json.dumps({"TagSet": [{"Key": "v", "Value": "changed"}]}))
    aws(server, "s3api", "delete-object-tagging", "--bucket", bucket, "--key", "k", "--version-id", ids[1])
    for vid, want in zip(ids, ([{"Key": "v", "Value": "changed"}], [])):
        tags = json.loads(aws(server, "s3api", "get-object-tagging", "--bucket", bucket, "--key", "k",
                              "--version-id", vid).stdout)
        assert tags == {"VersionId": vid, "TagSet": want}
    acl = json.loads(aws(server, "s3api", "get-object-acl", "--bucket", bucket, "--key", "k",
                         "--version-id", ids[0]).stdout)
    assert [g["Permission"] for g in acl["Grants"]] == ["FULL_CONTROL"]
    listed = json.loads(aws(server, "s3api", "list-object-versions", "--bucket", bucket).stdout)
    assert sorted(v["VersionId"] for v in listed["Versions"]) == sorted(ids)
    out = tmp_path / "out"
    aws(server, "s3api", "get-object", "--bucket", bucket, "--key", "k", "--version-id", ids[0], str(out))
    assert out.read_bytes() == b"first"
    aws(server, "s3", "rm", f"s3://{bucket}/k")
    listed = json.loads(aws(server, "s3api", "list-object-versions", "--bucket", bucket).stdout)
    assert len(listed["DeleteMarkers"]) == 1 and len(listed["Versions"]) == 2
    for v in listed["Versions"] + listed["DeleteMarkers"]:
        aws(server, "s3api", "delete-object", "--bucket", bucket, "--key", v["Key"], "--version-id", v["VersionId"])
    aws(server, "s3api", "delete-bucket", "--bucket", bucket)


@pytest.mark.local_only("`admin tier run --days-ahead` of one server; through a cluster the nodes apply the rules on "
                       "their own schedule (test_cluster's lifecycle test covers a versioned bucket)")
def test_lifecycle_expiration_in_a_versioned_bucket_adds_delete_markers(server, s3):
    """As in S3, an expiration of a current version in a versioned bucket is a delete marker:
    the key disappears from listings and its bytes stay readable by version id."""
    from test_tiering import admin as tier_admin

    bucket = "versioned-lifecycle"
    s3.create_bucket(Bucket=bucket)
    enable(s3, bucket)
    ids = {f"logs/{i}": s3.put_object(Bucket=bucket, Key=f"logs/{i}", Body=b"log")["VersionId"] for i in range(5)}
    s3.put_bucket_lifecycle_configuration(Bucket=bucket, LifecycleConfiguration={"Rules": [
        {"ID": "logs", "Filter": {"Prefix": "logs/"}, "Status": "Enabled", "Expiration": {"Days": 3}}]})
    out = tier_admin(server, "tier", "run", "--days-ahead", "4")
    assert "5 expirations" in out.stdout, out.stdout
    assert s3.list_objects_v2(Bucket=bucket)["KeyCount"] == 0
    listed = s3.list_object_versions(Bucket=bucket)
    assert {m["Key"] for m in listed["DeleteMarkers"] if m["IsLatest"]} == set(ids)
    for key, vid in ids.items():
        assert s3.get_object(Bucket=bucket, Key=key, VersionId=vid)["Body"].read() == b"log"
    # A second run finds nothing current to expire.
    out = tier_admin(server, "tier", "run", "--days-ahead", "4")
    assert "0 expirations" in out.stdout, out.stdout
    s3.delete_bucket_lifecycle(Bucket=bucket)
    remove_every_version(s3, bucket)


HISTORY_RULES = {"Rules": [
    {"ID": "keep-one", "Filter": {"Prefix": "ds/"}, "Status": "Enabled",
     "NoncurrentVersionExpiration": {"NoncurrentDays": 3, "NewerNoncurrentVersions": 1}},
    {"ID": "gone", "Filter": {"Prefix": "gone/"}, "Status": "Enabled",
     "Expiration": {"ExpiredObjectDeleteMarker": True}, "NoncurrentVersionExpiration": {"NoncurrentDays": 3}},
    {"ID": "later", "Filter": {"Prefix": "young/"}, "Status": "Enabled",
     "NoncurrentVersionExpiration": {"NoncurrentDays": 30}}]}


def make_history(s3, bucket):
    """Versions for HISTORY_RULES: ds/a with four, gone/b with two under a delete marker,
    young/c with two. Answers each key's ids, newest first."""
    ids = {}
    for key, n in (("ds/a", 4), ("gone/b", 2), ("young/c", 2)):
        ids[key] = [s3.put_object(Bucket=bucket, Key=key, Body=b"%s-%d" % (key.encode(), i))["VersionId"]
                    for i in range(n)][::-1]
    ids["gone/b"].insert(0, s3.delete_object(Bucket=bucket, Key="gone/b")["VersionId"])
    s3.put_bucket_lifecycle_configuration(Bucket=bucket, LifecycleConfiguration=HISTORY_RULES)
    got = s3.get_bucket_lifecycle_configuration(Bucket=bucket)["Rules"]
    assert got[0]["NoncurrentVersionExpiration"] == {"NoncurrentDays": 3, "NewerNoncurrentVersions": 1}
    assert got[1]["Expiration"] == {"ExpiredObjectDeleteMarker": True}
    return ids


def history_left(s3, bucket, ids):
    """What is left of each key's history: as HISTORY_RULES leave it once due."""
    left = {}
    for key, vid, _, _, _ in versions_of(s3, bucket):
        left.setdefault(key, []).append(vid)
    return {k: sorted(v) for k, v in left.items()} == {
        "ds/a": sorted(ids["ds/a"][:2]), "young/c": sorted(ids["young/c"])} and left


@pytest.mark.local_only("`admin tier run --days-ahead` of one server; through a cluster the nodes apply the rules on "
                       "their own schedule (test_cluster's lifecycle test covers noncurrent versions)")
def test_noncurrent_versions_and_lone_delete_markers_expire(server, s3):
    """NoncurrentVersionExpiration removes versions a given time after they became noncurrent,
    keeping the NewerNoncurrentVersions newest; ExpiredObjectDeleteMarker then removes a delete
    marker left alone; a version under Object Lock stays; the current versions and the young
    noncurrent ones stay; a second run finds nothing."""
    from test_tiering import admin as tier_admin

    bucket = "versioned-history"
    s3.create_bucket(Bucket=bucket)
    enable(s3, bucket)
    ids = make_history(s3, bucket)
    held = "versioned-history-held"
    s3.create_bucket(Bucket=held, ObjectLockEnabledForBucket=True)
    until = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(days=30)
    locked = s3.put_object(Bucket=held, Key="gone/l", Body=b"locked", ObjectLockMode="GOVERNANCE",
                           ObjectLockRetainUntilDate=until)["VersionId"]
    s3.put_object(Bucket=held, Key="gone/l", Body=b"over it")
    s3.put_bucket_lifecycle_configuration(Bucket=held, LifecycleConfiguration=HISTORY_RULES)
    out = tier_admin(server, "tier", "run", "--days-ahead", "2")
    assert "0 noncurrent versions and delete markers removed" in out.stdout, out.stdout
    out = tier_admin(server, "tier", "run", "--days-ahead", "4")
    # ds/a's two oldest, gone/b's two versions and then its marker; not the locked one.
    assert "5 noncurrent versions and delete markers removed" in out.stdout, out.stdout
    assert history_left(s3, bucket, ids), versions_of(s3, bucket)
    assert s3.get_object(Bucket=bucket, Key="ds/a")["VersionId"] == ids["ds/a"][0]
    assert s3.get_object(Bucket=held, Key="gone/l", VersionId=locked)["Body"].read() == b"locked"
    out = tier_admin(server, "tier", "run", "--days-ahead", "4")
    assert "0 noncurrent versions and delete markers removed" in out.stdout, out.stdout
    s3.delete_bucket_lifecycle(Bucket=bucket)
    remove_every_version(s3, bucket)
    for v in versions_of(s3, held):
        s3.delete_object(Bucket=held, Key=v[0], VersionId=v[1], BypassGovernanceRetention=True)
    s3.delete_bucket(Bucket=held)


def tar_of(members):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name, body in members:
            info = tarfile.TarInfo(name)
            info.size = len(body)
            tf.addfile(info, io.BytesIO(body))
    return buf.getvalue()


def test_batch_put_into_a_versioned_bucket_makes_versions(s3):
    """A batch PUT (TAR auto-extract) into a bucket with versioning makes each member a new
    version of its key and keeps the one it replaces, as PutObject does; a key named twice
    in one TAR gets two versions, in TAR order, as two PUTs would make; a suspended bucket's
    members are their keys' null versions (a key named twice: the last). A bucket with Object
    Lock refuses it (its default retention would not be applied) and stores nothing."""
    bucket = "versioned-batch"
    s3.create_bucket(Bucket=bucket)
    enable(s3, bucket)
    old = s3.put_object(Bucket=bucket, Key="d/a", Body=b"old a")["VersionId"]

    def batch(b, members):
        s3.put_object(Bucket=b, Key="x.tar", Body=tar_of(members), Metadata={"snowball-auto-extract": "true"})

    batch(bucket, [("d/a", b"new a"), ("d/b", b"b one"), ("d/c", b"c"), ("d/b", b"b two")])
    listed = versions_of(s3, bucket)
    assert [(k, latest, size) for k, _, latest, _, size in listed] == [
        ("d/a", False, 5), ("d/a", True, 5), ("d/b", False, 5), ("d/b", True, 5), ("d/c", True, 1)], listed
    assert s3.get_object(Bucket=bucket, Key="d/a", VersionId=old)["Body"].read() == b"old a"
    got = s3.get_object(Bucket=bucket, Key="d/a")
    assert got["Body"].read() == b"new a" and got["VersionId"] not in ("null", old)
    assert s3.get_object(Bucket=bucket, Key="d/b")["Body"].read() == b"b two"
    first_b = listed[2][1]
    assert s3.get_object(Bucket=bucket, Key="d/b", VersionId=first_b)["Body"].read() == b"b one"
    enable(s3, bucket, "Suspended")
    batch(bucket, [("d/b", b"null one"), ("d/b", b"b null")])
    got = s3.get_object(Bucket=bucket, Key="d/b")
    assert (got["VersionId"], got["Body"].read()) == ("null", b"b null")
    assert len([v for v in versions_of(s3, bucket) if v[0] == "d/b"]) == 3
    remove_every_version(s3, bucket)
    held = "versioned-batch-held"
    s3.create_bucket(Bucket=held, ObjectLockEnabledForBucket=True)
    with pytest.raises(ClientError) as e:
        batch(held, [("k", b"v")])
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    assert "Object Lock" in e.value.response["Error"]["Message"]
    assert "Versions" not in s3.list_object_versions(Bucket=held)
    s3.delete_bucket(Bucket=held)


def test_upload_part_copy_reads_the_version_named(s3):
    """UploadPartCopy's source may name a version (`?versionId=` in x-amz-copy-source): the
    part is that version's bytes (a range of them too), and the answer names it in
    x-amz-copy-source-version-id, as CopyObject's does."""
    bucket = "versioned-part-copy"
    s3.create_bucket(Bucket=bucket)
    enable(s3, bucket)
    old_body = os.urandom(6 * 1024 * 1024)
    old = s3.put_object(Bucket=bucket, Key="src", Body=old_body)["VersionId"]
    s3.put_object(Bucket=bucket, Key="src", Body=b"newer")
    uid = s3.create_multipart_upload(Bucket=bucket, Key="dst")["UploadId"]
    source = {"Bucket": bucket, "Key": "src", "VersionId": old}
    p1 = s3.upload_part_copy(Bucket=bucket, Key="dst", UploadId=uid, PartNumber=1, CopySource=source)
    assert p1["CopySourceVersionId"] == old
    p2 = s3.upload_part_copy(Bucket=bucket, Key="dst", UploadId=uid, PartNumber=2, CopySource=source,
                             CopySourceRange="bytes=0-99")
    s3.complete_multipart_upload(Bucket=bucket, Key="dst", UploadId=uid, MultipartUpload={"Parts": [
        {"PartNumber": 1, "ETag": p1["CopyPartResult"]["ETag"]},
        {"PartNumber": 2, "ETag": p2["CopyPartResult"]["ETag"]}]})
    assert s3.get_object(Bucket=bucket, Key="dst")["Body"].read() == old_body + old_body[:100]
    s3.delete_object(Bucket=bucket, Key="src", VersionId=old)
    uid = s3.create_multipart_upload(Bucket=bucket, Key="dst2")["UploadId"]
    assert code_of(s3.upload_part_copy, Bucket=bucket, Key="dst2", UploadId=uid, PartNumber=1,
                   CopySource=source) == "NoSuchVersion"
    s3.abort_multipart_upload(Bucket=bucket, Key="dst2", UploadId=uid)
    remove_every_version(s3, bucket)
