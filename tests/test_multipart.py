"""Multipart uploads through boto3: parts, completion rules, listings, copies, checksums."""

import base64
import hashlib
import os
import uuid
import zlib

import pytest
from botocore.exceptions import ClientError

MiB = 1024 * 1024


def code(e):
    return e.value.response["Error"]["Code"]


def multipart_etag(parts):
    return '"%s-%d"' % (hashlib.md5(b"".join(hashlib.md5(p).digest() for p in parts)).hexdigest(), len(parts))


def upload(s3, bucket, key, parts, **create):
    uid = s3.create_multipart_upload(Bucket=bucket, Key=key, **create)["UploadId"]
    done = []
    for i, p in enumerate(parts, 1):
        r = s3.upload_part(Bucket=bucket, Key=key, UploadId=uid, PartNumber=i, Body=p)
        done.append({"PartNumber": i, "ETag": r["ETag"]})
    return uid, done


def test_multipart_roundtrip_etag_and_ranges(s3, bucket):
    parts = [os.urandom(5 * MiB), os.urandom(5 * MiB + 3), os.urandom(1234)]
    uid, done = upload(s3, bucket, "mp", parts, ContentType="video/mp4", Metadata={"a": "1"})
    r = s3.complete_multipart_upload(Bucket=bucket, Key="mp", UploadId=uid, MultipartUpload={"Parts": done})
    assert r["ETag"] == multipart_etag(parts)
    data = b"".join(parts)
    g = s3.get_object(Bucket=bucket, Key="mp")
    assert g["Body"].read() == data
    assert g["ContentType"] == "video/mp4" and g["Metadata"] == {"a": "1"}
    assert s3.get_object(Bucket=bucket, Key="mp", Range="bytes=5242870-5242890")["Body"].read() == data[5242870:5242891]
    p2 = s3.get_object(Bucket=bucket, Key="mp", PartNumber=2)
    assert p2["Body"].read() == parts[1] and p2["PartsCount"] == 3
    with pytest.raises(ClientError) as e:
        s3.list_parts(Bucket=bucket, Key="mp", UploadId=uid)
    assert code(e) == "NoSuchUpload"


def test_completing_twice_answers_with_the_object(s3, bucket):
    """S3 answers a second CompleteMultipartUpload of the same upload and parts with the
    object it made (a client retrying after a lost answer); anything else stays NoSuchUpload."""
    parts = [b"p" * 100]
    uid, done = upload(s3, bucket, "twice", parts)
    first = s3.complete_multipart_upload(Bucket=bucket, Key="twice", UploadId=uid, MultipartUpload={"Parts": done})
    again = s3.complete_multipart_upload(Bucket=bucket, Key="twice", UploadId=uid, MultipartUpload={"Parts": done})
    assert again["ETag"] == first["ETag"] == multipart_etag(parts)
    assert again["Key"] == "twice" and again["Bucket"] == bucket
    other = [{"PartNumber": 1, "ETag": '"%s"' % hashlib.md5(b"other").hexdigest()}]
    for asked in [other, done + [{"PartNumber": 2, "ETag": done[0]["ETag"]}]]:
        with pytest.raises(ClientError) as e:
            s3.complete_multipart_upload(Bucket=bucket, Key="twice", UploadId=uid, MultipartUpload={"Parts": asked})
        assert code(e) == "NoSuchUpload", asked
    # Another upload's id, or the key overwritten since: the upload is gone.
    uid2, done2 = upload(s3, bucket, "twice", parts)
    s3.abort_multipart_upload(Bucket=bucket, Key="twice", UploadId=uid2)
    with pytest.raises(ClientError) as e:
        s3.complete_multipart_upload(Bucket=bucket, Key="twice", UploadId=uid2, MultipartUpload={"Parts": done2})
    assert code(e) == "NoSuchUpload"
    # A copy onto another key is not the upload's object.
    s3.copy_object(Bucket=bucket, Key="copy", CopySource={"Bucket": bucket, "Key": "twice"})
    with pytest.raises(ClientError) as e:
        s3.complete_multipart_upload(Bucket=bucket, Key="copy", UploadId=uid, MultipartUpload={"Parts": done})
    assert code(e) == "NoSuchUpload"
    s3.put_object(Bucket=bucket, Key="twice", Body=b"new")
    with pytest.raises(ClientError) as e:
        s3.complete_multipart_upload(Bucket=bucket, Key="twice", UploadId=uid, MultipartUpload={"Parts": done})
    assert code(e) == "NoSuchUpload"
    assert s3.get_object(Bucket=bucket, Key="twice")["Body"].read() == b"new"


def test_entity_too_small_invalid_part_and_order(s3, bucket):
    uid, done = upload(s3, bucket, "small", [b"a" * 100, b"b" * 100])
    with pytest.raises(ClientError) as e:
        s3.complete_multipart_upload(Bucket=bucket, Key="small", UploadId=uid, MultipartUpload={"Parts": done})
    assert code(e) == "EntityTooSmall"
    bad = [{"PartNumber": 1, "ETag": '"00000000000000000000000000000000"'}]
    with pytest.raises(ClientError) as e:
        s3.complete_multipart_upload(Bucket=bucket, Key="small", UploadId=uid, MultipartUpload={"Parts": bad})
    assert code(e) == "InvalidPart"
    with pytest.raises(ClientError) as e:
        s3.complete_multipart_upload(Bucket=bucket, Key="small", UploadId=uid, MultipartUpload={"Parts": done[::-1]})
    assert code(e) == "InvalidPartOrder"
    # A single small part is fine: only parts before the last have a minimum.
    r = s3.complete_multipart_upload(Bucket=bucket, Key="small", UploadId=uid, MultipartUpload={"Parts": done[:1]})
    assert s3.get_object(Bucket=bucket, Key="small")["Body"].read() == b"a" * 100
    assert r["ETag"].endswith('-1"')


def test_abort_list_parts_and_uploads(s3, bucket):
    uid, done = upload(s3, bucket, "x/one", [b"1" * 10, b"2" * 20, b"3" * 30])
    uid2, _ = upload(s3, bucket, "x/two", [b"z"])
    uid3, _ = upload(s3, bucket, "y/three", [b"z"])
    lp = s3.list_parts(Bucket=bucket, Key="x/one", UploadId=uid, MaxParts=2)
    assert [p["PartNumber"] for p in lp["Parts"]] == [1, 2] and lp["IsTruncated"]
    lp = s3.list_parts(Bucket=bucket, Key="x/one", UploadId=uid, PartNumberMarker=lp["NextPartNumberMarker"])
    assert [(p["PartNumber"], p["Size"]) for p in lp["Parts"]] == [(3, 30)]
    lu = s3.list_multipart_uploads(Bucket=bucket)
    assert sorted((u["Key"], u["UploadId"]) for u in lu["Uploads"]) == sorted([("x/one", uid), ("x/two", uid2), ("y/three", uid3)])
    lu = s3.list_multipart_uploads(Bucket=bucket, Prefix="x/")
    assert sorted(u["Key"] for u in lu["Uploads"]) == ["x/one", "x/two"]
    lu = s3.list_multipart_uploads(Bucket=bucket, Delimiter="/")
    assert sorted(p["Prefix"] for p in lu["CommonPrefixes"]) == ["x/", "y/"]
    for k, u in [("x/one", uid), ("x/two", uid2), ("y/three", uid3)]:
        s3.abort_multipart_upload(Bucket=bucket, Key=k, UploadId=u)
    with pytest.raises(ClientError) as e:
        s3.upload_part(Bucket=bucket, Key="x/one", UploadId=uid, PartNumber=4, Body=b"late")
    assert code(e) == "NoSuchUpload"
    with pytest.raises(ClientError) as e:
        s3.abort_multipart_upload(Bucket=bucket, Key="x/one", UploadId="nonsense")
    assert code(e) == "NoSuchUpload"
    assert "Uploads" not in s3.list_multipart_uploads(Bucket=bucket)


def test_delete_bucket_aborts_its_uploads(s3):
    """DeleteBucket drops the uploads in progress of a bucket that holds nothing else (as S3
    and Ceph do: a client that left an upload open can still clean up); a bucket that holds an
    object is refused and keeps its uploads."""
    name = "t-" + uuid.uuid4().hex[:20]
    s3.create_bucket(Bucket=name)
    uid, _ = upload(s3, name, "a/left-open", [b"1" * 100])
    s3.put_object(Bucket=name, Key="kept", Body=b"x")
    with pytest.raises(ClientError) as e:
        s3.delete_bucket(Bucket=name)
    assert code(e) == "BucketNotEmpty"
    assert [u["UploadId"] for u in s3.list_multipart_uploads(Bucket=name)["Uploads"]] == [uid]
    s3.delete_object(Bucket=name, Key="kept")
    s3.create_multipart_upload(Bucket=name, Key="b/never-sent")
    s3.delete_bucket(Bucket=name)
    assert name not in [b["Name"] for b in s3.list_buckets()["Buckets"]]
    with pytest.raises(ClientError) as e:
        s3.upload_part(Bucket=name, Key="a/left-open", UploadId=uid, PartNumber=2, Body=b"late")
    assert code(e) == "NoSuchBucket"
    # The name is free again, with no upload of the old bucket in it.
    s3.create_bucket(Bucket=name)
    assert "Uploads" not in s3.list_multipart_uploads(Bucket=name)
    s3.delete_bucket(Bucket=name)


def test_list_multipart_uploads_pages(s3, bucket):
    """Pages of MaxUploads, resumed with the markers S3 returns, give every upload once, in key
    then upload order; with a delimiter, a common prefix is one entry and never repeated. (In a
    cluster the uploads are spread over the nodes that head their PGs, and merged.)"""
    keys = ["a/1", "a/2", "a/3", "b", "c/1", "c/2", "d", "d"]
    made = sorted((k, s3.create_multipart_upload(Bucket=bucket, Key=k)["UploadId"]) for k in keys)

    def pages(**extra):
        seen, prefixes, marker = [], [], {}
        for _ in range(20):
            r = s3.list_multipart_uploads(Bucket=bucket, MaxUploads=2, **marker, **extra)
            entries = len(r.get("Uploads", [])) + len(r.get("CommonPrefixes", []))
            assert 0 < entries <= 2, r
            seen += [(u["Key"], u["UploadId"]) for u in r.get("Uploads", [])]
            prefixes += [p["Prefix"] for p in r.get("CommonPrefixes", [])]
            if not r["IsTruncated"]:
                return seen, prefixes
            marker = {"KeyMarker": r["NextKeyMarker"], "UploadIdMarker": r.get("NextUploadIdMarker", "")}
        raise AssertionError("the pages do not end")

    seen, prefixes = pages()
    assert seen == made and prefixes == []
    seen, prefixes = pages(Delimiter="/")
    assert seen == [u for u in made if "/" not in u[0]] and prefixes == ["a/", "c/"]
    for k, u in made:
        s3.abort_multipart_upload(Bucket=bucket, Key=k, UploadId=u)


def test_upload_part_copy(s3, bucket):
    src = os.urandom(6 * MiB)
    s3.put_object(Bucket=bucket, Key="src", Body=src)
    uid = s3.create_multipart_upload(Bucket=bucket, Key="dst")["UploadId"]
    r1 = s3.upload_part_copy(Bucket=bucket, Key="dst", UploadId=uid, PartNumber=1,
                             CopySource={"Bucket": bucket, "Key": "src"}, CopySourceRange="bytes=0-5242879")
    r2 = s3.upload_part_copy(Bucket=bucket, Key="dst", UploadId=uid, PartNumber=2,
                             CopySource={"Bucket": bucket, "Key": "src"}, CopySourceRange="bytes=5242880-6291455")
    parts = [{"PartNumber": 1, "ETag": r1["CopyPartResult"]["ETag"]}, {"PartNumber": 2, "ETag": r2["CopyPartResult"]["ETag"]}]
    s3.complete_multipart_upload(Bucket=bucket, Key="dst", UploadId=uid, MultipartUpload={"Parts": parts})
    assert s3.get_object(Bucket=bucket, Key="dst")["Body"].read() == src


@pytest.mark.parametrize("asked,error,http", [
    ("bytes=0-21", "InvalidRange", 416),     # past the end: never cut to the object, as a GET is
    ("bytes=5-5", "InvalidRange", 416),      # the first byte past the end
    ("bytes=3-1", "InvalidArgument", 400),   # last before first
    ("bytes=0-", "InvalidArgument", 400),    # a GET's open range is not a copy range
    ("bytes=-2", "InvalidArgument", 400),
    ("0-2", "InvalidArgument", 400),
    ("bytes=0-1,2-3", "InvalidArgument", 400),
])
def test_upload_part_copy_range_must_lie_in_the_source(s3, bucket, asked, error, http):
    s3.put_object(Bucket=bucket, Key="five", Body=b"12345")
    uid = s3.create_multipart_upload(Bucket=bucket, Key="dst")["UploadId"]
    with pytest.raises(ClientError) as e:
        s3.upload_part_copy(Bucket=bucket, Key="dst", UploadId=uid, PartNumber=1,
                            CopySource={"Bucket": bucket, "Key": "five"}, CopySourceRange=asked)
    assert (code(e), e.value.response["ResponseMetadata"]["HTTPStatusCode"]) == (error, http)
    assert "Parts" not in s3.list_parts(Bucket=bucket, Key="dst", UploadId=uid)
    # The last byte exactly: copied.
    r = s3.upload_part_copy(Bucket=bucket, Key="dst", UploadId=uid, PartNumber=1,
                            CopySource={"Bucket": bucket, "Key": "five"}, CopySourceRange="bytes=1-4")
    s3.complete_multipart_upload(Bucket=bucket, Key="dst", UploadId=uid, MultipartUpload={
        "Parts": [{"PartNumber": 1, "ETag": r["CopyPartResult"]["ETag"]}]})
    assert s3.get_object(Bucket=bucket, Key="dst")["Body"].read() == b"2345"


def crc32_b64(b):
    return base64.b64encode(zlib.crc32(b).to_bytes(4, "big")).decode()


def test_composite_crc32_checksum(s3, bucket):
    parts = [os.urandom(5 * MiB), os.urandom(100)]
    uid = s3.create_multipart_upload(Bucket=bucket, Key="ck", ChecksumAlgorithm="CRC32")["UploadId"]
    done = []
    for i, p in enumerate(parts, 1):
        r = s3.upload_part(Bucket=bucket, Key="ck", UploadId=uid, PartNumber=i, Body=p, ChecksumAlgorithm="CRC32")
        assert r["ChecksumCRC32"] == crc32_b64(p)
        done.append({"PartNumber": i, "ETag": r["ETag"], "ChecksumCRC32": r["ChecksumCRC32"]})
    r = s3.complete_multipart_upload(Bucket=bucket, Key="ck", UploadId=uid, MultipartUpload={"Parts": done})
    raw = b"".join(zlib.crc32(p).to_bytes(4, "big") for p in parts)
    want = crc32_b64(raw) + "-2"
    assert r["ChecksumCRC32"] == want
    h = s3.head_object(Bucket=bucket, Key="ck", ChecksumMode="ENABLED")
    assert h["ChecksumCRC32"] == want and h["ChecksumType"] == "COMPOSITE"
    assert s3.get_object(Bucket=bucket, Key="ck")["Body"].read() == b"".join(parts)


def test_full_object_crc64nvme_checksum(s3, bucket):
    from awscrt import checksums

    parts = [os.urandom(5 * MiB), os.urandom(777)]
    uid = s3.create_multipart_upload(Bucket=bucket, Key="nv", ChecksumAlgorithm="CRC64NVME")["UploadId"]
    done = []
    for i, p in enumerate(parts, 1):
        r = s3.upload_part(Bucket=bucket, Key="nv", UploadId=uid, PartNumber=i, Body=p, ChecksumAlgorithm="CRC64NVME")
        done.append({"PartNumber": i, "ETag": r["ETag"], "ChecksumCRC64NVME": r["ChecksumCRC64NVME"]})
    r = s3.complete_multipart_upload(Bucket=bucket, Key="nv", UploadId=uid, MultipartUpload={"Parts": done})
    want = base64.b64encode(checksums.crc64nvme(b"".join(parts)).to_bytes(8, "big")).decode()
    assert r["ChecksumCRC64NVME"] == want
    g = s3.get_object(Bucket=bucket, Key="nv", ChecksumMode="ENABLED")
    assert g["ChecksumCRC64NVME"] == want and g["ChecksumType"] == "FULL_OBJECT"
    assert g["Body"].read() == b"".join(parts)


def test_transfer_manager_large_file(s3, bucket, tmp_path):
    from boto3.s3.transfer import TransferConfig

    data = os.urandom(21 * MiB + 11)
    src = tmp_path / "big.bin"
    src.write_bytes(data)
    cfg = TransferConfig(multipart_threshold=8 * MiB, multipart_chunksize=8 * MiB, max_concurrency=4)
    s3.upload_file(str(src), bucket, "tm/big.bin", Config=cfg)
    h = s3.head_object(Bucket=bucket, Key="tm/big.bin")
    assert h["ContentLength"] == len(data) and h["ETag"].endswith('-3"')
    dst = tmp_path / "back.bin"
    s3.download_file(bucket, "tm/big.bin", str(dst), Config=cfg)
    assert dst.read_bytes() == data
