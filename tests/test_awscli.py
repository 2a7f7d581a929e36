"""aws-cli against the real server: s3 cp/sync/ls/rm with many small files and a multipart
file, and s3api calls."""

import filecmp
import json
import os
import shutil
import subprocess

import pytest

import conftest


def aws(server, *args, check=True):
    env = conftest.aws_env()
    exe = shutil.which("aws") or "aws"
    out = subprocess.run([exe, "--endpoint-url", server.endpoint, *args], env=env, capture_output=True, text=True, timeout=600)
    if check:
        assert out.returncode == 0, out.stderr
    return out


@pytest.fixture
def tree(tmp_path):
    src = tmp_path / "src"
    for i in range(200):
        d = src / f"d{i % 7}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"f{i:04d}.bin").write_bytes(os.urandom(1 + (i * 137) % 9000))
    (src / "big.bin").write_bytes(os.urandom(19 * 1024 * 1024 + 3))
    return src


def test_sync_cp_ls_rm(server, bucket, tree, tmp_path):
    aws(server, "s3", "sync", str(tree), f"s3://{bucket}/data/", "--only-show-errors")
    ls = aws(server, "s3", "ls", "--recursive", f"s3://{bucket}/data/").stdout.splitlines()
    assert len(ls) == 201
    # A second sync finds nothing to do.
    again = aws(server, "s3", "sync", str(tree), f"s3://{bucket}/data/")
    assert "upload:" not in again.stdout
    back = tmp_path / "back"
    aws(server, "s3", "cp", "--recursive", f"s3://{bucket}/data/", str(back), "--only-show-errors")
    cmp = filecmp.dircmp(tree, back)
    assert not cmp.diff_files and not cmp.left_only and not cmp.right_only
    for sub in cmp.subdirs.values():
        assert not sub.diff_files and not sub.left_only and not sub.right_only
    assert (back / "big.bin").read_bytes() == (tree / "big.bin").read_bytes()
    top = aws(server, "s3", "ls", f"s3://{bucket}/data/").stdout
    assert "PRE d0/" in top and "big.bin" in top
    aws(server, "s3", "cp", str(tree / "d0" / "f0000.bin"), f"s3://{bucket}/single.bin", "--only-show-errors")
    aws(server, "s3", "rm", "--recursive", f"s3://{bucket}/data/d1/", "--only-show-errors")
    ls = aws(server, "s3", "ls", "--recursive", f"s3://{bucket}/").stdout.splitlines()
    assert len(ls) == 201 - len(list((tree / "d1").iterdir())) + 1
    aws(server, "s3", "rm", "--recursive", f"s3://{bucket}/", "--only-show-errors")
    assert aws(server, "s3", "ls", "--recursive", f"s3://{bucket}/", check=False).stdout.strip() == ""


def test_s3api_calls(server, tmp_path):
    name = "awscli-s3api-bucket"
    aws(server, "s3api", "create-bucket", "--bucket", name)
    f = tmp_path / "x.txt"
    f.write_bytes(b"hello s3api")
    put = json.loads(aws(server, "s3api", "put-object", "--bucket", name, "--key", "x.txt", "--body", str(f),
                         "--content-type", "text/plain", "--metadata", "k=v").stdout)
    assert put["ETag"]
    head = json.loads(aws(server, "s3api", "head-object", "--bucket", name, "--key", "x.txt").stdout)
    assert head["ContentLength"] == 11 and head["Metadata"] == {"k": "v"} and head["ContentType"] == "text/plain"
    lst = json.loads(aws(server, "s3api", "list-objects-v2", "--bucket", name).stdout)
    assert [o["Key"] for o in lst["Contents"]] == ["x.txt"]
    out = tmp_path / "out.txt"
    aws(server, "s3api", "get-object", "--bucket", name, "--key", "x.txt", "--range", "bytes=6-", str(out))
    assert out.read_bytes() == b"s3api"
    missing = aws(server, "s3api", "get-object", "--bucket", name, "--key", "nope", str(out), check=False)
    assert missing.returncode != 0 and "NoSuchKey" in missing.stderr
    # Object tagging.
    aws(server, "s3api", "put-object-tagging", "--bucket", name, "--key", "x.txt",
        "--tagging", json.dumps({"TagSet": [{"Key": "split", "Value": "train"}]}))
    tags = json.loads(aws(server, "s3api", "get-object-tagging", "--bucket", name, "--key", "x.txt").stdout)
    assert tags["TagSet"] == [{"Key": "split", "Value": "train"}]
    aws(server, "s3api", "delete-object-tagging", "--bucket", name, "--key", "x.txt")
    tags = json.loads(aws(server, "s3api", "get-object-tagging", "--bucket", name, "--key", "x.txt").stdout)
    assert tags["TagSet"] == []
    # Bucket tagging and CORS.
    aws(server, "s3api", "put-bucket-tagging", "--bucket", name,
        "--tagging", json.dumps({"TagSet": [{"Key": "team", "Value": "vision"}]}))
    tags = json.loads(aws(server, "s3api", "get-bucket-tagging", "--bucket", name).stdout)
    assert tags["TagSet"] == [{"Key": "team", "Value": "vision"}]
    aws(server, "s3api", "delete-bucket-tagging", "--bucket", name)
    missing = aws(server, "s3api", "get-bucket-tagging", "--bucket", name, check=False)
    assert missing.returncode != 0 and "NoSuchTagSet" in missing.stderr
    rules = {"CORSRules": [{"AllowedOrigins": ["https://app.example.com"], "AllowedMethods": ["GET"],
                            "ExposeHeaders": ["ETag"]}]}
    aws(server, "s3api", "put-bucket-cors", "--bucket", name, "--cors-configuration", json.dumps(rules))
    assert json.loads(aws(server, "s3api", "get-bucket-cors", "--bucket", name).stdout) == rules
    aws(server, "s3api", "delete-bucket-cors", "--bucket", name)
    missing = aws(server, "s3api", "get-bucket-cors", "--bucket", name, check=False)
    assert missing.returncode != 0 and "NoSuchCORSConfiguration" in missing.stderr
    # Block Public Access: set, read back, in force (a public ACL refused), removed.
    pab = {"BlockPublicAcls": True, "IgnorePublicAcls": False, "BlockPublicPolicy": True,
           "RestrictPublicBuckets": False}
    aws(server, "s3api", "put-public-access-block", "--bucket", name,
        "--public-access-block-configuration", json.dumps(pab))
    got = json.loads(aws(server, "s3api", "get-public-access-block", "--bucket", name).stdout)
    assert got["PublicAccessBlockConfiguration"] == pab
    public = aws(server, "s3api", "put-bucket-acl", "--bucket", name, "--acl", "public-read", check=False)
    assert public.returncode != 0 and "AccessDenied" in public.stderr
    aws(server, "s3api", "delete-public-access-block", "--bucket", name)
    missing = aws(server, "s3api", "get-public-access-block", "--bucket", name, check=False)
    assert missing.returncode != 0 and "NoSuchPublicAccessBlockConfiguration" in missing.stderr
    # Object Ownership (tests/test_object_acl.py: object ACLs with aws-cli).
    enforced = {"Rules": [{"ObjectOwnership": "BucketOwnerEnforced"}]}
    aws(server, "s3api", "put-bucket-ownership-controls", "--bucket", name,
        "--ownership-controls", json.dumps(enforced))
    got = json.loads(aws(server, "s3api", "get-bucket-ownership-controls", "--bucket", name).stdout)
    assert got["OwnershipControls"] == enforced
    bad = aws(server, "s3api", "put-bucket-ownership-controls", "--bucket", name, "--ownership-controls",
              json.dumps({"Rules": [{"ObjectOwnership": "Nobody"}]}), check=False)
    assert bad.returncode != 0 and "MalformedXML" in bad.stderr
    aws(server, "s3api", "delete-object", "--bucket", name, "--key", "x.txt")
    aws(server, "s3api", "delete-bucket", "--bucket", name)
    assert name not in aws(server, "s3", "ls").stdout
