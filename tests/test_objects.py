"""Buckets, objects, listings, copies and conditional requests through boto3."""

import base64
import datetime
import hashlib
import os
import urllib.error
import urllib.parse
import urllib.request

import pytest
from botocore.exceptions import ClientError


def code(e):
    return e.value.response["Error"]["Code"]


def status(e):
    return e.value.response["ResponseMetadata"]["HTTPStatusCode"]


def test_list_buckets_pages(server):
    """ListBuckets with max-buckets answers pages in name order resumed by the continuation
    token (none on the last page), filtered by prefix; without max-buckets, all at once."""
    import uuid

    s3 = server.client()
    tag = uuid.uuid4().hex[:8]
    names = sorted(f"pages-{tag}-{i:02d}" for i in range(7))
    for n in names:
        s3.create_bucket(Bucket=n)
    try:
        got, token, pages = [], None, 0
        while True:
            kw = {"MaxBuckets": 3, "Prefix": f"pages-{tag}-"}
            if token:
                kw["ContinuationToken"] = token
            r = s3.list_buckets(**kw)
            pages += 1
            assert r["Prefix"] == f"pages-{tag}-"
            got += [b["Name"] for b in r["Buckets"]]
            token = r.get("ContinuationToken")
            if not token:
                break
            assert len(r["Buckets"]) == 3
        assert (got, pages) == (names, 3)
        every = [b["Name"] for b in s3.list_buckets()["Buckets"]]
        assert set(names) <= set(every) and "ContinuationToken" not in s3.list_buckets()
        assert [b["Name"] for b in s3.list_buckets(MaxBuckets=2, Prefix=names[-1])["Buckets"]] == names[-1:]
        # Past botocore's own checks, as another client may send them.
        unchecked = server.client(parameter_validation=False)
        for bad in [{"MaxBuckets": 0}, {"MaxBuckets": 10001}, {"ContinuationToken": "%%%"}]:
            with pytest.raises(ClientError) as e:
                unchecked.list_buckets(**bad)
            assert code(e) == "InvalidArgument", bad
    finally:
        for n in names:
            s3.delete_bucket(Bucket=n)


def test_create_owned_bucket_elsewhere_is_409(workdir):
    """Outside us-east-1, creating a bucket you already own is 409 BucketAlreadyOwnedByYou,
    and another user's bucket is 409 BucketAlreadyExists wherever it is."""
    import boto3
    from botocore.config import Config
    from conftest import ROOT_AK, ROOT_SK, Server

    srv = Server(workdir / "eu-region", extra_args=["--region", "eu-west-1"]).start()
    s3 = boto3.client("s3", endpoint_url=srv.endpoint, region_name="eu-west-1",
                      aws_access_key_id=ROOT_AK, aws_secret_access_key=ROOT_SK,
                      config=Config(s3={"addressing_style": "path"},
                                    retries={"total_max_attempts": 1, "mode": "standard"}))
    try:
        s3.create_bucket(Bucket="mine", CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
        with pytest.raises(ClientError) as e:
            s3.create_bucket(Bucket="mine", CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
        assert (code(e), status(e)) == ("BucketAlreadyOwnedByYou", 409)
    finally:
        srv.stop()


def _raw_put(endpoint, path, chunks, headers):
    """A PUT signed with SigV4 (unsigned payload) and sent on a real socket: the body in
    `chunks` with `Transfer-Encoding: chunked` and no Content-Length when `chunks` is a list;
    no body and no length at all when it is None. Answers (status, body)."""
    import http.client

    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials
    from conftest import REGION, ROOT_AK, ROOT_SK

    req = AWSRequest(method="PUT", url=endpoint + path, data=b"",
                     headers={"x-amz-content-sha256": "UNSIGNED-PAYLOAD", **headers})
    SigV4Auth(Credentials(ROOT_AK, ROOT_SK), "s3", REGION).add_auth(req)
    u = urllib.parse.urlparse(endpoint)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    c.putrequest("PUT", path, skip_accept_encoding=True)
    for k, v in req.headers.items():
        c.putheader(k, v)
    if chunks is not None:
        c.putheader("Transfer-Encoding", "chunked")
    c.endheaders()
    for chunk in chunks or []:
        c.send(b"%x\r\n%s\r\n" % (len(chunk), chunk))
    if chunks is not None:
        c.send(b"0\r\n\r\n")
    r = c.getresponse()
    out = (r.status, r.read())
    c.close()
    return out


def test_put_with_transfer_encoding_chunked(server, s3, bucket):
    """A PUT whose body comes with Transfer-Encoding: chunked and no Content-Length (as curl
    and some HTTP libraries send a stream) is stored whole; an UploadPart too. A PUT with
    neither is still 411 MissingContentLength."""
    chunks = [b"hello ", os.urandom(200_000), b" world"]
    status_, body = _raw_put(server.endpoint, f"/{bucket}/streamed", chunks, {})
    assert status_ == 200, body
    assert s3.get_object(Bucket=bucket, Key="streamed")["Body"].read() == b"".join(chunks)
    uid = s3.create_multipart_upload(Bucket=bucket, Key="parts")["UploadId"]
    status_, body = _raw_put(server.endpoint, f"/{bucket}/parts?partNumber=1&uploadId={uid}",
                             chunks, {})
    assert status_ == 200, body
    part = s3.list_parts(Bucket=bucket, Key="parts", UploadId=uid)["Parts"][0]
    s3.complete_multipart_upload(Bucket=bucket, Key="parts", UploadId=uid, MultipartUpload={
        "Parts": [{"PartNumber": 1, "ETag": part["ETag"]}]})
    assert s3.get_object(Bucket=bucket, Key="parts")["Body"].read() == b"".join(chunks)
    status_, body = _raw_put(server.endpoint, f"/{bucket}/no-length", None, {})
    assert status_ == 411 and b"MissingContentLength" in body, (status_, body)


def test_bucket_lifecycle(s3):
    name = "lifecycle-bucket-1"
    s3.create_bucket(Bucket=name)
    assert name in [b["Name"] for b in s3.list_buckets()["Buckets"]]
    s3.head_bucket(Bucket=name)
    loc = s3.get_bucket_location(Bucket=name)
    assert loc["LocationConstraint"] in (None, "")
    # Creating it again: S3's legacy answer in us-east-1 (this server's region) is 200, and
    # nothing changes (see test_create_owned_bucket_elsewhere_is_409 for other regions).
    r = s3.create_bucket(Bucket=name)
    assert r["ResponseMetadata"]["HTTPStatusCode"] == 200
    s3.put_object(Bucket=name, Key="k", Body=b"x")
    s3.create_bucket(Bucket=name)
    assert s3.get_object(Bucket=name, Key="k")["Body"].read() == b"x"
    with pytest.raises(ClientError) as e:
        s3.delete_bucket(Bucket=name)
    assert code(e) == "BucketNotEmpty" and status(e) == 409
    s3.delete_object(Bucket=name, Key="k")
    s3.delete_bucket(Bucket=name)
    with pytest.raises(ClientError) as e:
        s3.head_bucket(Bucket=name)
    assert status(e) == 404
    with pytest.raises(ClientError) as e:
        s3.list_objects_v2(Bucket=name)
    assert code(e) == "NoSuchBucket"


@pytest.mark.parametrize("name", ["ab", "UPPER-case", "bad_underscore", "-dash", "192.168.0.1", "a..b", "x" * 64])
def test_invalid_bucket_names(s3, name):
    with pytest.raises(ClientError) as e:
        s3.create_bucket(Bucket=name)
    assert code(e) == "InvalidBucketName"


def test_put_get_head_delete_with_metadata(s3, bucket):
    body = os.urandom(5000)
    r = s3.put_object(
        Bucket=bucket,
        Key="dir/obj.bin",
        Body=body,
        ContentType="image/jpeg",
        ContentEncoding="identity",
        ContentDisposition='attachment; filename="a.jpg"',
        ContentLanguage="en",
        CacheControl="max-age=60",
        Expires=datetime.datetime(2030, 1, 1, tzinfo=datetime.timezone.utc),
        Metadata={"label": "7", "Mixed-Case": "v"},
    )
    assert r["ETag"] == '"%s"' % hashlib.md5(body).hexdigest()
    g = s3.get_object(Bucket=bucket, Key="dir/obj.bin")
    assert g["Body"].read() == body
    assert g["ContentType"] == "image/jpeg"
    assert g["ContentEncoding"] == "identity"
    assert g["ContentDisposition"] == 'attachment; filename="a.jpg"'
    assert g["ContentLanguage"] == "en"
    assert g["CacheControl"] == "max-age=60"
    assert g["Metadata"] == {"label": "7", "mixed-case": "v"}
    assert g["ResponseMetadata"]["HTTPHeaders"]["x-amz-request-id"]
    h = s3.head_object(Bucket=bucket, Key="dir/obj.bin")
    assert h["ContentLength"] == 5000 and h["ETag"] == r["ETag"]
    s3.delete_object(Bucket=bucket, Key="dir/obj.bin")
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=bucket, Key="dir/obj.bin")
    assert code(e) == "NoSuchKey"
    with pytest.raises(ClientError) as e:
        s3.head_object(Bucket=bucket, Key="dir/obj.bin")
    assert status(e) == 404
    # Deleting a missing key succeeds, as in S3.
    assert s3.delete_object(Bucket=bucket, Key="never-was")["ResponseMetadata"]["HTTPStatusCode"] == 204


def test_non_ascii_metadata_round_trips_as_rfc2047_words(server, s3, bucket):
    """S3 stores RFC 2047 encoded words decoded and answers a non-ASCII value as one UTF-8
    word: a word boto3 sends comes back meaning the same text, and raw UTF-8 bytes that a
    client signs come back as a word."""
    from email.header import decode_header, make_header

    from sigv4_client import signed_request

    def text(word):
        return str(make_header(decode_header(word)))

    sent = {"b": "=?UTF-8?B?Y2Fmw6kg5pel5pys?=", "q": "=?utf-8?Q?caf=C3=A9_au_lait?=", "plain": "ascii =?x"}
    s3.put_object(Bucket=bucket, Key="words", Body=b"1", Metadata=sent)
    for got in [s3.head_object(Bucket=bucket, Key="words")["Metadata"],
                s3.get_object(Bucket=bucket, Key="words")["Metadata"]]:
        assert got["plain"] == "ascii =?x"
        assert got["b"].startswith("=?UTF-8?B?") and text(got["b"]) == "café 日本"
        assert text(got["q"]) == "café au lait"
    status, _, body = signed_request(server.endpoint, "PUT", f"/{bucket}/raw", body=b"2",
                                     headers={"x-amz-meta-city": "Zürich"})
    assert status == 200, body
    got = s3.head_object(Bucket=bucket, Key="raw")["Metadata"]["city"]
    assert got.isascii() and text(got) == "Zürich"
    # A copy keeps the stored text.
    s3.copy_object(Bucket=bucket, Key="copied", CopySource={"Bucket": bucket, "Key": "raw"})
    assert text(s3.head_object(Bucket=bucket, Key="copied")["Metadata"]["city"]) == "Zürich"


def test_empty_and_multi_chunk_objects(s3, bucket):
    s3.put_object(Bucket=bucket, Key="empty", Body=b"")
    assert s3.get_object(Bucket=bucket, Key="empty")["Body"].read() == b""
    big = os.urandom(3 * 1024 * 1024 + 17)
    s3.put_object(Bucket=bucket, Key="big", Body=big)
    assert s3.get_object(Bucket=bucket, Key="big")["Body"].read() == big
    r = s3.get_object(Bucket=bucket, Key="big", Range="bytes=1048570-2097160")
    assert r["Body"].read() == big[1048570:2097161]
    assert r["ContentRange"] == "bytes 1048570-2097160/%d" % len(big)


ODD_KEYS = [
    "a b c",
    "plus+and%percent",
    "question?hash#amp&eq=",
    "unicodé/日本語/🙂",
    "trailing/slash/",
    "../../etc/passwd",
    "~tilde!*'()",
    "k" * 1024,
]


@pytest.mark.parametrize("key", ODD_KEYS)
def test_odd_keys_roundtrip_and_list(s3, bucket, key):
    s3.put_object(Bucket=bucket, Key=key, Body=key.encode())
    assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == key.encode()
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]]
    assert keys == [key]
    # boto3 asks for encoding-type=url itself and decodes; asked explicitly, it leaves
    # the decoding to the caller.
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, EncodingType="url")["Contents"]]
    assert [urllib.parse.unquote(k) for k in keys] == [key]


def test_key_too_long(s3, bucket):
    with pytest.raises(ClientError) as e:
        s3.put_object(Bucket=bucket, Key="k" * 1025, Body=b"x")
    assert code(e) == "KeyTooLongError"


def test_ranges(s3, bucket):
    body = bytes(range(256)) * 4
    s3.put_object(Bucket=bucket, Key="r", Body=body)
    cases = {"bytes=0-9": body[0:10], "bytes=1000-": body[1000:], "bytes=-5": body[-5:], "bytes=1020-5000": body[1020:],
             # The largest last byte (found by fuzzing: it once overflowed).
             "bytes=3-18446744073709551615": body[3:]}
    for rng, want in cases.items():
        r = s3.get_object(Bucket=bucket, Key="r", Range=rng)
        assert r["ResponseMetadata"]["HTTPStatusCode"] == 206
        assert r["Body"].read() == want
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=bucket, Key="r", Range="bytes=1024-")
    assert code(e) == "InvalidRange" and status(e) == 416
    # A syntactically invalid range is ignored, as RFC 9110 says: the whole object, 200.
    r = s3.get_object(Bucket=bucket, Key="r", Range="bytes=abc")
    assert r["ResponseMetadata"]["HTTPStatusCode"] == 200 and r["Body"].read() == body


def parse_byteranges(content_type, payload):
    boundary = content_type.split("boundary=", 1)[1].encode()
    parts = []
    for chunk in payload.split(b"--" + boundary)[1:]:
        if chunk.startswith(b"--"):
            break
        head, _, data = chunk[2:].partition(b"\r\n\r\n")
        headers = dict(line.split(": ", 1) for line in head.decode().split("\r\n"))
        parts.append((headers, data[:-2]))  # each part's data ends with CRLF
    return parts


def test_multi_range_get_is_multipart_byteranges(s3, bucket):
    body = os.urandom(3 * 1024 * 1024 + 5)
    s3.put_object(Bucket=bucket, Key="mr", Body=body, ContentType="application/x-tar")
    r = s3.get_object(Bucket=bucket, Key="mr", Range="bytes=0-99,1048570-1048580,-7,999999999-")
    assert r["ResponseMetadata"]["HTTPStatusCode"] == 206
    ct = r["ContentType"]
    assert ct.startswith("multipart/byteranges; boundary=")
    payload = r["Body"].read()
    assert len(payload) == r["ContentLength"]
    parts = parse_byteranges(ct, payload)
    want = [(0, 100), (1048570, 1048581), (len(body) - 7, len(body))]  # the unsatisfiable one is dropped
    assert len(parts) == len(want)
    for (headers, data), (a, b) in zip(parts, want):
        assert headers["Content-Range"] == f"bytes {a}-{b - 1}/{len(body)}"
        assert headers["Content-Type"] == "application/x-tar"
        assert data == body[a:b]
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=bucket, Key="mr", Range="bytes=999999999-,888888888-")
    assert status(e) == 416
    # Overlapping ranges are merged: 256 copies of the whole object answer it once.
    r = s3.get_object(Bucket=bucket, Key="mr", Range="bytes=" + ",".join(["0-"] * 256))
    payload = r["Body"].read()
    assert len(payload) < len(body) + 1024
    parts = parse_byteranges(r["ContentType"], payload)
    assert [p[1] for p in parts] == [body]
    r = s3.get_object(Bucket=bucket, Key="mr", Range="bytes=100-199,0-149,500-599")
    parts = parse_byteranges(r["ContentType"], r["Body"].read())
    assert [p[0]["Content-Range"] for p in parts] == [f"bytes 0-199/{len(body)}", f"bytes 500-599/{len(body)}"]


def test_conditional_reads(s3, bucket):
    etag = s3.put_object(Bucket=bucket, Key="c", Body=b"abc")["ETag"]
    past = datetime.datetime(2000, 1, 1, tzinfo=datetime.timezone.utc)
    future = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(days=1)
    assert s3.get_object(Bucket=bucket, Key="c", IfMatch=etag)["Body"].read() == b"abc"
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=bucket, Key="c", IfMatch='"nope"')
    assert status(e) == 412
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=bucket, Key="c", IfNoneMatch=etag)
    assert status(e) == 304
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=bucket, Key="c", IfModifiedSince=future)
    assert status(e) == 304
    assert s3.get_object(Bucket=bucket, Key="c", IfModifiedSince=past)["Body"].read() == b"abc"
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=bucket, Key="c", IfUnmodifiedSince=past)
    assert status(e) == 412
    with pytest.raises(ClientError) as e:
        s3.head_object(Bucket=bucket, Key="c", IfNoneMatch=etag)
    assert status(e) == 304


def test_conditional_writes(s3, bucket):
    s3.put_object(Bucket=bucket, Key="w", Body=b"1", IfNoneMatch="*")
    with pytest.raises(ClientError) as e:
        s3.put_object(Bucket=bucket, Key="w", Body=b"2", IfNoneMatch="*")
    assert status(e) == 412
    etag = s3.head_object(Bucket=bucket, Key="w")["ETag"]
    s3.put_object(Bucket=bucket, Key="w", Body=b"3", IfMatch=etag)
    with pytest.raises(ClientError) as e:
        s3.put_object(Bucket=bucket, Key="w", Body=b"4", IfMatch=etag)
    assert status(e) == 412
    with pytest.raises(ClientError) as e:
        s3.put_object(Bucket=bucket, Key="absent", Body=b"4", IfMatch=etag)
    assert code(e) == "NoSuchKey"
    assert s3.get_object(Bucket=bucket, Key="w")["Body"].read() == b"3"


def test_response_overrides(s3, bucket):
    s3.put_object(Bucket=bucket, Key="o", Body=b"x", ContentType="text/plain")
    r = s3.get_object(
        Bucket=bucket,
        Key="o",
        ResponseContentType="application/json",
        ResponseContentDisposition="inline",
        ResponseCacheControl="no-cache",
        ResponseContentLanguage="fr",
    )
    assert r["ContentType"] == "application/json"
    assert r["ContentDisposition"] == "inline"
    assert r["CacheControl"] == "no-cache"
    assert r["ContentLanguage"] == "fr"


def test_list_objects_v2_pagination_and_delimiter(s3, bucket):
    keys = sorted([f"a/{i:03d}" for i in range(25)] + [f"b/{i}/x" for i in range(5)] + ["top1", "top2"])
    for k in keys:
        s3.put_object(Bucket=bucket, Key=k, Body=b"")
    got = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, PaginationConfig={"PageSize": 7}):
        assert page["KeyCount"] <= 7
        got += [o["Key"] for o in page.get("Contents", [])]
    assert got == keys
    r = s3.list_objects_v2(Bucket=bucket, Delimiter="/")
    assert [p["Prefix"] for p in r["CommonPrefixes"]] == ["a/", "b/"]
    assert [o["Key"] for o in r["Contents"]] == ["top1", "top2"]
    r = s3.list_objects_v2(Bucket=bucket, Prefix="b/", Delimiter="/")
    assert [p["Prefix"] for p in r["CommonPrefixes"]] == [f"b/{i}/" for i in range(5)]
    # Pages of common prefixes do not repeat a prefix.
    prefixes = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Delimiter="/", PaginationConfig={"PageSize": 1}):
        prefixes += [p["Prefix"] for p in page.get("CommonPrefixes", [])]
    assert prefixes == ["a/", "b/"]
    r = s3.list_objects_v2(Bucket=bucket, StartAfter="a/020", MaxKeys=3)
    assert [o["Key"] for o in r["Contents"]] == ["a/021", "a/022", "a/023"] and r["IsTruncated"]
    r = s3.list_objects_v2(Bucket=bucket, Prefix="top", FetchOwner=True)
    assert r["Contents"][0]["Owner"]["ID"]
    assert r["Contents"][0]["StorageClass"] == "STANDARD"
    r = s3.list_objects_v2(Bucket=bucket, MaxKeys=0)
    assert r["KeyCount"] == 0


def test_list_objects_v1_marker(s3, bucket):
    for i in range(12):
        s3.put_object(Bucket=bucket, Key=f"k{i:02d}", Body=b"")
    got = []
    for page in s3.get_paginator("list_objects").paginate(Bucket=bucket, PaginationConfig={"PageSize": 5}):
        got += [o["Key"] for o in page.get("Contents", [])]
    assert got == [f"k{i:02d}" for i in range(12)]
    r = s3.list_objects(Bucket=bucket, Marker="k09")
    assert [o["Key"] for o in r["Contents"]] == ["k10", "k11"]


def test_delete_objects_quiet_and_verbose(s3, bucket):
    for i in range(6):
        s3.put_object(Bucket=bucket, Key=f"d{i}", Body=b"x")
    r = s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": "d0"}, {"Key": "d1"}, {"Key": "missing"}]})
    assert sorted(d["Key"] for d in r["Deleted"]) == ["d0", "d1", "missing"]
    r = s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": "d2"}, {"Key": "d3"}], "Quiet": True})
    assert "Deleted" not in r and "Errors" not in r
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]] == ["d4", "d5"]


def test_copy_object(s3, bucket):
    other = bucket + "-dst"
    s3.create_bucket(Bucket=other)
    try:
        body = os.urandom(2 * 1024 * 1024 + 5)
        s3.put_object(Bucket=bucket, Key="src", Body=body, ContentType="a/b", Metadata={"m": "1"})
        r = s3.copy_object(Bucket=other, Key="copy", CopySource={"Bucket": bucket, "Key": "src"})
        assert r["CopyObjectResult"]["ETag"] == '"%s"' % hashlib.md5(body).hexdigest()
        g = s3.get_object(Bucket=other, Key="copy")
        assert g["Body"].read() == body and g["ContentType"] == "a/b" and g["Metadata"] == {"m": "1"}
        s3.copy_object(
            Bucket=bucket, Key="src", CopySource={"Bucket": bucket, "Key": "src"},
            MetadataDirective="REPLACE", Metadata={"m": "2"}, ContentType="c/d",
        )
        h = s3.head_object(Bucket=bucket, Key="src")
        assert h["Metadata"] == {"m": "2"} and h["ContentType"] == "c/d"
        with pytest.raises(ClientError) as e:
            s3.copy_object(Bucket=bucket, Key="src", CopySource={"Bucket": bucket, "Key": "src"})
        assert code(e) == "InvalidRequest"
        with pytest.raises(ClientError) as e:
            s3.copy_object(Bucket=bucket, Key="x", CopySource={"Bucket": bucket, "Key": "nope"})
        assert code(e) == "NoSuchKey"
        s3.put_object(Bucket=bucket, Key="odd key+é", Body=b"odd")
        s3.copy_object(Bucket=bucket, Key="odd copy", CopySource={"Bucket": bucket, "Key": "odd key+é"})
        assert s3.get_object(Bucket=bucket, Key="odd copy")["Body"].read() == b"odd"
    finally:
        from conftest import empty_bucket
        empty_bucket(s3, other)


def test_unsupported_operations_say_not_implemented(s3, bucket):
    for attempt in [
        lambda: s3.put_bucket_website(Bucket=bucket, WebsiteConfiguration={"IndexDocument": {"Suffix": "index.html"}}),
        lambda: s3.put_bucket_replication(Bucket=bucket, ReplicationConfiguration={
            "Role": "arn:aws:iam::1:role/r", "Rules": [{"Status": "Enabled", "Destination": {"Bucket": "arn:aws:s3:::x"}}]}),
    ]:
        with pytest.raises(ClientError) as e:
            attempt()
        assert code(e) == "NotImplemented" and status(e) == 501


def test_unset_bucket_configurations_answer_as_s3_does(server, s3, bucket):
    """Reads of configurations no packrat bucket can have answer what S3 answers for a bucket
    that never had one (tools probe them all); deleting one is a no-op; only the owner asks."""
    missing = {
        s3.get_bucket_cors: "NoSuchCORSConfiguration",
        s3.get_bucket_policy: "NoSuchBucketPolicy",
        s3.get_bucket_tagging: "NoSuchTagSet",
        s3.get_bucket_encryption: "ServerSideEncryptionConfigurationNotFoundError",
        s3.get_bucket_website: "NoSuchWebsiteConfiguration",
        s3.get_object_lock_configuration: "ObjectLockConfigurationNotFoundError",
        s3.get_bucket_replication: "ReplicationConfigurationNotFoundError",
        s3.get_public_access_block: "NoSuchPublicAccessBlockConfiguration",
    }
    for call, want in missing.items():
        with pytest.raises(ClientError) as e:
            call(Bucket=bucket)
        assert code(e) == want and status(e) == 404, call
    assert "Status" not in s3.get_bucket_versioning(Bucket=bucket)
    assert "LoggingEnabled" not in s3.get_bucket_logging(Bucket=bucket)
    n = s3.get_bucket_notification_configuration(Bucket=bucket)
    assert not any(k.endswith("Configurations") for k in n)
    assert "Status" not in s3.get_bucket_accelerate_configuration(Bucket=bucket)
    assert s3.get_bucket_request_payment(Bucket=bucket)["Payer"] == "BucketOwner"
    # Objects have no ACLs of their own until asked: S3's "bucket owner enforced" Object
    # Ownership (tests/test_object_acl.py has the others).
    rules = s3.get_bucket_ownership_controls(Bucket=bucket)["OwnershipControls"]["Rules"]
    assert rules == [{"ObjectOwnership": "BucketOwnerEnforced"}]
    enforced = {"Rules": [{"ObjectOwnership": "BucketOwnerEnforced"}]}
    s3.put_bucket_ownership_controls(Bucket=bucket, OwnershipControls=enforced)
    for bad in ({"Rules": []}, {"Rules": [{"ObjectOwnership": "Nobody"}]}):
        with pytest.raises(ClientError) as e:
            s3.put_bucket_ownership_controls(Bucket=bucket, OwnershipControls=bad)
        assert code(e) == "MalformedXML", bad
    assert s3.get_bucket_ownership_controls(Bucket=bucket)["OwnershipControls"]["Rules"] == enforced["Rules"]
    for delete in [s3.delete_bucket_cors, s3.delete_bucket_policy, s3.delete_bucket_tagging,
                   s3.delete_bucket_encryption, s3.delete_bucket_website]:
        assert delete(Bucket=bucket)["ResponseMetadata"]["HTTPStatusCode"] == 204
    with pytest.raises(ClientError) as e:
        s3.get_bucket_cors(Bucket="no-such-bucket-here")
    assert code(e) == "NoSuchBucket"
    # Not for anonymous callers, even on a public-read bucket.
    s3.put_bucket_acl(Bucket=bucket, ACL="public-read")
    for sub in ["cors", "versioning", "policy"]:
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"{server.endpoint}/{bucket}?{sub}")
        assert e.value.code == 403, sub
    s3.put_bucket_acl(Bucket=bucket, ACL="private")


def test_encryption_packrat_does_not_do_is_refused_not_stored_in_plaintext(s3, bucket):
    """Dual-layer SSE-KMS and SSE-KMS encryption contexts are not implemented: asking for them
    (on a write or as a bucket's default) answers 501 NotImplemented and stores nothing
    (SSE-S3, SSE-C and SSE-KMS are tests/test_sse.py's and tests/test_sse_kms.py's)."""
    s3.put_object(Bucket=bucket, Key="plain", Body=b"plain")
    attempts = [
        lambda: s3.put_object(Bucket=bucket, Key="kms", Body=b"x", ServerSideEncryption="aws:kms:dsse"),
        lambda: s3.put_object(Bucket=bucket, Key="kms", Body=b"x", ServerSideEncryption="aws:kms",
                              SSEKMSEncryptionContext="eyJhIjoiYiJ9"),
        lambda: s3.create_multipart_upload(Bucket=bucket, Key="mp", ServerSideEncryption="aws:kms:dsse"),
        lambda: s3.put_bucket_encryption(Bucket=bucket, ServerSideEncryptionConfiguration={
            "Rules": [{"ApplyServerSideEncryptionByDefault": {"SSEAlgorithm": "aws:kms:dsse"}}]}),
        lambda: s3.copy_object(Bucket=bucket, Key="copy", CopySource={"Bucket": bucket, "Key": "plain"},
                               ServerSideEncryption="aws:kms:dsse"),
    ]
    for i, attempt in enumerate(attempts):
        with pytest.raises(ClientError) as e:
            attempt()
        assert code(e) == "NotImplemented" and status(e) == 501, i
        assert "SSE-KMS" in e.value.response["Error"]["Message"], i
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", [])}
    assert keys == {"plain"}
    assert s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []


def test_get_object_attributes(s3, bucket):
    """GetObjectAttributes names what it was asked for, from the index: ETag (unquoted), the
    stored checksum, storage class and size; a wrong attribute name is InvalidArgument."""
    body = os.urandom(70_000)
    s3.put_object(Bucket=bucket, Key="attrs", Body=body, ChecksumAlgorithm="SHA256")
    a = s3.get_object_attributes(Bucket=bucket, Key="attrs",
                                 ObjectAttributes=["ETag", "Checksum", "StorageClass", "ObjectSize"])
    assert a["ETag"] == hashlib.md5(body).hexdigest()
    assert a["ObjectSize"] == len(body) and a["StorageClass"] == "STANDARD"
    assert a["Checksum"]["ChecksumSHA256"] == base64.b64encode(hashlib.sha256(body).digest()).decode()
    assert "ObjectParts" not in a, "a single PUT has no parts"
    only = s3.get_object_attributes(Bucket=bucket, Key="attrs", ObjectAttributes=["ObjectSize"])
    assert only["ObjectSize"] == len(body) and "ETag" not in only
    with pytest.raises(ClientError) as e:
        s3.get_object_attributes(Bucket=bucket, Key="attrs", ObjectAttributes=["Colour"])
    assert e.value.response["Error"]["Code"] == "InvalidArgument"
    with pytest.raises(ClientError) as e:
        s3.get_object_attributes(Bucket=bucket, Key="missing", ObjectAttributes=["ETag"])
    assert e.value.response["Error"]["Code"] == "NoSuchKey"


@pytest.mark.local_only
def test_get_object_attributes_lists_parts(s3, bucket):
    up = s3.create_multipart_upload(Bucket=bucket, Key="parts")["UploadId"]
    sizes = [5 * 1024 * 1024, 5 * 1024 * 1024, 1234]
    parts = []
    for n, size in enumerate(sizes, 1):
        etag = s3.upload_part(Bucket=bucket, Key="parts", UploadId=up, PartNumber=n, Body=b"p" * size)["ETag"]
        parts.append({"PartNumber": n, "ETag": etag})
    s3.complete_multipart_upload(Bucket=bucket, Key="parts", UploadId=up, MultipartUpload={"Parts": parts})
    a = s3.get_object_attributes(Bucket=bucket, Key="parts", ObjectAttributes=["ObjectParts", "ETag"])
    p = a["ObjectParts"]
    assert p["TotalPartsCount"] == 3 and a["ETag"].endswith("-3")
    assert [(x["PartNumber"], x["Size"]) for x in p["Parts"]] == [(1, sizes[0]), (2, sizes[1]), (3, sizes[2])]
    page = s3.get_object_attributes(Bucket=bucket, Key="parts", ObjectAttributes=["ObjectParts"],
                                    MaxParts=2, PartNumberMarker=1)["ObjectParts"]
    assert [x["PartNumber"] for x in page["Parts"]] == [2, 3] and page["IsTruncated"] is False
    page = s3.get_object_attributes(Bucket=bucket, Key="parts", ObjectAttributes=["ObjectParts"],
                                    MaxParts=1)["ObjectParts"]
    assert [x["PartNumber"] for x in page["Parts"]] == [1] and page["IsTruncated"] is True
    assert page["NextPartNumberMarker"] == 1
