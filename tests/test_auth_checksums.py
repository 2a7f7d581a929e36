"""Signatures (header, presigned, streaming), checksums and access control, over raw sockets
and boto3."""

import base64
import hashlib
import json
import os
import subprocess
import time
import urllib.error
import urllib.request
import zlib

import pytest
from awscrt import checksums
from botocore.exceptions import ClientError

import conftest
from sigv4_client import Signed, host_of, send, unsigned_chunked_body

AK, SK = conftest.ROOT_AK, conftest.ROOT_SK


def code(e):
    return e.value.response["Error"]["Code"]


def b64(b):
    return base64.b64encode(b).decode()


CHECKSUMS = {
    "CRC32": lambda d: b64(zlib.crc32(d).to_bytes(4, "big")),
    "CRC32C": lambda d: b64(checksums.crc32c(d).to_bytes(4, "big")),
    "CRC64NVME": lambda d: b64(checksums.crc64nvme(d).to_bytes(8, "big")),
    "SHA1": lambda d: b64(hashlib.sha1(d).digest()),
    "SHA256": lambda d: b64(hashlib.sha256(d).digest()),
}


@pytest.mark.parametrize("alg", sorted(CHECKSUMS))
def test_flexible_checksums_stored_and_returned(s3, bucket, alg):
    data = os.urandom(100_000)
    r = s3.put_object(Bucket=bucket, Key="c", Body=data, ChecksumAlgorithm=alg)
    want = CHECKSUMS[alg](data)
    assert r["Checksum" + alg] == want
    g = s3.get_object(Bucket=bucket, Key="c", ChecksumMode="ENABLED")
    assert g["Checksum" + alg] == want
    assert g["Body"].read() == data
    h = s3.head_object(Bucket=bucket, Key="c", ChecksumMode="ENABLED")
    assert h["Checksum" + alg] == want


def raw_put(server, bucket, key, body, headers, payload_hash=None):
    ph = payload_hash or hashlib.sha256(body).hexdigest()
    s = Signed(host_of(server.endpoint), "PUT", f"/{bucket}/{key}", [], headers, ph, AK, SK)
    return send(server.endpoint, "PUT", s.path, s.headers, body), s


@pytest.mark.parametrize("alg", sorted(CHECKSUMS))
def test_wrong_checksum_is_bad_digest_and_not_stored(server, s3, bucket, alg):
    wrong = CHECKSUMS[alg](b"something else")
    (st, _, body), _ = raw_put(server, bucket, "bad", b"payload", {f"x-amz-checksum-{alg.lower()}": wrong})
    assert st == 400 and b"<Code>BadDigest</Code>" in body
    with pytest.raises(ClientError) as e:
        s3.head_object(Bucket=bucket, Key="bad")
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404


def test_content_md5_checked(s3, bucket):
    with pytest.raises(ClientError) as e:
        s3.put_object(Bucket=bucket, Key="m", Body=b"abc", ContentMD5=b64(hashlib.md5(b"abd").digest()))
    assert code(e) == "BadDigest"
    s3.put_object(Bucket=bucket, Key="m", Body=b"abc", ContentMD5=b64(hashlib.md5(b"abc").digest()))


def test_payload_sha256_mismatch(server, s3, bucket):
    (st, _, body), _ = raw_put(server, bucket, "h", b"abc", {}, payload_hash=hashlib.sha256(b"abd").hexdigest())
    assert st == 400 and b"XAmzContentSHA256Mismatch" in body
    with pytest.raises(ClientError):
        s3.head_object(Bucket=bucket, Key="h")


def test_unsigned_payload_trailer_checksum(server, s3, bucket):
    data = os.urandom(200_000)
    crc = CHECKSUMS["CRC32"](data)
    body = unsigned_chunked_body(data, 8192, [("x-amz-checksum-crc32", crc)])
    hdrs = {"content-encoding": "aws-chunked", "x-amz-decoded-content-length": str(len(data)),
            "x-amz-trailer": "x-amz-checksum-crc32"}
    (st, h, _), _ = raw_put(server, bucket, "t", body, hdrs, payload_hash="STREAMING-UNSIGNED-PAYLOAD-TRAILER")
    assert st == 200, h
    g = s3.get_object(Bucket=bucket, Key="t", ChecksumMode="ENABLED")
    assert g["Body"].read() == data and g["ChecksumCRC32"] == crc
    assert "ContentEncoding" not in g  # aws-chunked is a transfer detail, not stored
    bad = unsigned_chunked_body(data, 8192, [("x-amz-checksum-crc32", CHECKSUMS["CRC32"](b"x"))])
    (st, _, body), _ = raw_put(server, bucket, "t2", bad, hdrs, payload_hash="STREAMING-UNSIGNED-PAYLOAD-TRAILER")
    assert st == 400 and b"BadDigest" in body


def test_signed_streaming_payload(server, s3, bucket):
    data = os.urandom(150_000)
    hdrs = {"content-encoding": "aws-chunked", "x-amz-decoded-content-length": str(len(data))}
    host = host_of(server.endpoint)
    s = Signed(host, "PUT", f"/{bucket}/ss", [], hdrs, "STREAMING-AWS4-HMAC-SHA256-PAYLOAD", AK, SK)
    st, _, body = send(server.endpoint, "PUT", s.path, s.headers, s.signed_chunked_body(data))
    assert st == 200, body
    assert s3.get_object(Bucket=bucket, Key="ss")["Body"].read() == data
    # A modified chunk fails its chunk signature and nothing is stored.
    s = Signed(host, "PUT", f"/{bucket}/ss2", [], hdrs, "STREAMING-AWS4-HMAC-SHA256-PAYLOAD", AK, SK)
    st, _, body = send(server.endpoint, "PUT", s.path, s.headers, s.signed_chunked_body(data, tamper_chunk=1))
    assert st == 403 and b"SignatureDoesNotMatch" in body
    with pytest.raises(ClientError):
        s3.head_object(Bucket=bucket, Key="ss2")


def test_signed_streaming_payload_with_signed_trailer(server, s3, bucket):
    data = os.urandom(70_000)
    crc = CHECKSUMS["CRC32C"](data)
    hdrs = {"content-encoding": "aws-chunked", "x-amz-decoded-content-length": str(len(data)),
            "x-amz-trailer": "x-amz-checksum-crc32c"}
    s = Signed(host_of(server.endpoint), "PUT", f"/{bucket}/st", [], hdrs,
               "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER", AK, SK)
    body = s.signed_chunked_body(data, trailers=[("x-amz-checksum-crc32c", crc)])
    st, _, rb = send(server.endpoint, "PUT", s.path, s.headers, body)
    assert st == 200, rb
    g = s3.get_object(Bucket=bucket, Key="st", ChecksumMode="ENABLED")
    assert g["Body"].read() == data and g["ChecksumCRC32C"] == crc


def test_signature_failures(server, bucket):
    host = host_of(server.endpoint)
    ph = hashlib.sha256(b"").hexdigest()

    def get(sk=SK, ak=AK, **kw):
        s = Signed(host, "GET", f"/{bucket}", [("list-type", "2")], {}, ph, ak, sk, **kw)
        return s, send(server.endpoint, "GET", s.path, s.headers)

    _, (st, h, body) = get(sk="wrong-secret-000000")
    assert st == 403 and b"SignatureDoesNotMatch" in body and h["x-amz-request-id"]
    _, (st, _, body) = get(ak="NOSUCHKEY")
    assert st == 403 and b"InvalidAccessKeyId" in body
    from sigv4_client import amz_now
    _, (st, _, body) = get(amz_date=amz_now(-3600))
    assert st == 403 and b"RequestTimeTooSkewed" in body
    _, (st, _, body) = get(amz_date=amz_now(+3600))
    assert st == 403 and b"RequestTimeTooSkewed" in body
    _, (st, _, body) = get(scope_region="eu-west-1")
    assert st == 400 and b"AuthorizationHeaderMalformed" in body
    _, (st, _, body) = get(service="ec2")
    assert st in (400, 403)
    # A signed header changed in transit.
    s = Signed(host, "PUT", f"/{bucket}/k", [], {"x-amz-meta-a": "1"}, hashlib.sha256(b"x").hexdigest(), AK, SK)
    s.headers["x-amz-meta-a"] = "2"
    st, _, body = send(server.endpoint, "PUT", s.path, s.headers, b"x")
    assert st == 403 and b"SignatureDoesNotMatch" in body
    # Unsigned requests are refused.
    st, _, body = send(server.endpoint, "GET", f"/{bucket}?list-type=2", {"host": host})
    assert st == 403 and b"AccessDenied" in body


def test_presigned_urls(server, s3, bucket):
    v4 = server.client(signature_version="s3v4")
    s3.put_object(Bucket=bucket, Key="p", Body=b"presigned body")
    url = v4.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "p"}, ExpiresIn=60)
    assert "X-Amz-Signature" in url
    assert urllib.request.urlopen(url).read() == b"presigned body"
    # The default (legacy SigV2 query) presigned URLs boto3 generates work too.
    url2 = s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "p"}, ExpiresIn=60)
    assert urllib.request.urlopen(url2).read() == b"presigned body"
    put = v4.generate_presigned_url("put_object", Params={"Bucket": bucket, "Key": "up"}, ExpiresIn=60)
    req = urllib.request.Request(put, data=b"uploaded", method="PUT")
    assert urllib.request.urlopen(req).status == 200
    assert s3.get_object(Bucket=bucket, Key="up")["Body"].read() == b"uploaded"
    short = v4.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "p"}, ExpiresIn=1)
    time.sleep(2.2)
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(short)
    assert e.value.code == 403 and b"expired" in e.value.read()
    tampered = url.replace("/p?", "/other?")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(tampered)
    assert e.value.code == 403


def http_error(url):
    """The status and body of a request that must fail."""
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(url)
    return e.value.code, e.value.read()


def test_sigv2_header_signed_requests(server, s3, bucket):
    """boto3 with signature_version="s3" signs every request with SigV2 in the Authorization
    header: PUT (Content-MD5 checked), GET, HEAD, listings, copies, multipart and delete work;
    a wrong secret is SignatureDoesNotMatch, an unknown key InvalidAccessKeyId, a date more than
    15 minutes off RequestTimeTooSkewed; and an extension's parameter, which SigV2 would leave
    unsigned, is refused."""
    import datetime
    import urllib.parse

    from botocore.auth import HmacV1Auth
    from botocore.compat import HTTPHeaders
    from botocore.credentials import Credentials

    v2 = server.client(signature_version="s3")
    body = os.urandom(50_000)
    v2.put_object(Bucket=bucket, Key="v2/a", Body=body, ContentMD5=base64.b64encode(hashlib.md5(body).digest()).decode())
    assert v2.get_object(Bucket=bucket, Key="v2/a")["Body"].read() == body
    assert v2.head_object(Bucket=bucket, Key="v2/a")["ContentLength"] == len(body)
    v2.copy_object(Bucket=bucket, Key="v2/b", CopySource={"Bucket": bucket, "Key": "v2/a"})
    assert [o["Key"] for o in v2.list_objects_v2(Bucket=bucket, Prefix="v2/")["Contents"]] == ["v2/a", "v2/b"]
    uid = v2.create_multipart_upload(Bucket=bucket, Key="v2/m")["UploadId"]
    p = v2.upload_part(Bucket=bucket, Key="v2/m", UploadId=uid, PartNumber=1, Body=b"part")
    v2.complete_multipart_upload(Bucket=bucket, Key="v2/m", UploadId=uid,
                                 MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": p["ETag"]}]})
    assert s3.get_object(Bucket=bucket, Key="v2/m")["Body"].read() == b"part"
    v2.delete_object(Bucket=bucket, Key="v2/b")
    with pytest.raises(ClientError) as e:
        v2.put_object(Bucket=bucket, Key="v2/bad-md5", Body=b"x", ContentMD5=base64.b64encode(hashlib.md5(b"y").digest()).decode())
    assert code(e) == "BadDigest"
    wrong = server.client(signature_version="s3", ak=conftest.ROOT_AK, sk="not-the-secret")
    with pytest.raises(ClientError) as e:
        wrong.get_object(Bucket=bucket, Key="v2/a")
    assert code(e) == "SignatureDoesNotMatch"
    with pytest.raises(ClientError) as e:
        server.client(signature_version="s3", ak="AKNOBODY", sk="whatever-secret").list_buckets()
    assert code(e) == "InvalidAccessKeyId"

    def raw(path, date):
        # Signed here rather than by add_auth, which would date the request now.
        url = server.endpoint + path
        h = HTTPHeaders()
        h["Date"] = date
        sig = HmacV1Auth(Credentials(conftest.ROOT_AK, conftest.ROOT_SK)).get_signature(
            "GET", urllib.parse.urlsplit(url), h)
        r = urllib.request.Request(url, headers={"Date": date, "Authorization": f"AWS {conftest.ROOT_AK}:{sig}"})
        try:
            with urllib.request.urlopen(r) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as err:
            return err.code, err.read()

    now = datetime.datetime.now(datetime.timezone.utc)
    fmt = "%a, %d %b %Y %H:%M:%S GMT"
    assert raw(f"/{bucket}/v2/a", now.strftime(fmt)) == (200, body)
    status, text = raw(f"/{bucket}/v2/a", (now - datetime.timedelta(minutes=20)).strftime(fmt))
    assert status == 403 and b"RequestTimeTooSkewed" in text
    status, text = raw(f"/{bucket}?" + urllib.parse.urlencode({"epoch": "0"}), now.strftime(fmt))
    assert status == 403 and b"SigV4" in text, text


def test_sigv2_presigned_urls_sign_what_they_select(server, s3, bucket):
    """boto3's legacy (SigV2) presigned URLs work for objects and bucket listings; every part
    of them is checked; the extensions, whose parameters SigV2 would not sign, refuse them; and
    they live at most seven days."""
    v2 = server.client(signature_version="s3")
    for k in ["secret/a", "secret/b", "pub/x"]:
        s3.put_object(Bucket=bucket, Key=k, Body=b"bytes of " + k.encode())
    url = v2.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "pub/x"}, ExpiresIn=300)
    assert "AWSAccessKeyId=" in url and "X-Amz-Signature" not in url
    assert urllib.request.urlopen(url).read() == b"bytes of pub/x"
    # Bucket listings (botocore signs the bucket as "/bucket/"), v1 and v2, with a prefix.
    for op, params in [
        ("list_objects", {"Bucket": bucket}),
        ("list_objects", {"Bucket": bucket, "Prefix": "pub/"}),
        ("list_objects_v2", {"Bucket": bucket}),
    ]:
        listing = urllib.request.urlopen(v2.generate_presigned_url(op, Params=params, ExpiresIn=300)).read()
        assert b"<Key>pub/x</Key>" in listing, (op, params)
    # Each part tampered with.
    status, body = http_error(url.replace("Signature=", "Signature=A"))
    assert status == 403 and b"SignatureDoesNotMatch" in body
    expires = url.split("Expires=")[1].split("&")[0]
    status, body = http_error(url.replace(f"Expires={expires}", f"Expires={int(expires) + 1}"))
    assert status == 403 and b"SignatureDoesNotMatch" in body
    status, body = http_error(url.replace(f"AWSAccessKeyId={AK}", "AWSAccessKeyId=PKNOSUCHKEY"))
    assert status == 403 and b"InvalidAccessKeyId" in body
    status, body = http_error(url.replace("/pub/x?", "/secret/a?"))
    assert status == 403 and b"SignatureDoesNotMatch" in body
    status, body = http_error(url + "&acl")
    assert status == 403 and b"SignatureDoesNotMatch" in body
    # A listing URL turned into an epoch stream or a batch GET of what it does not sign.
    listing = v2.generate_presigned_url("list_objects", Params={"Bucket": bucket}, ExpiresIn=300)
    for extra in ["&stream=&prefix=secret/&shard=0/1&seed=1", "&stream=", "&batch="]:
        status, body = http_error(listing + extra)
        assert status == 403 and b"AccessDenied" in body and b"SigV4" in body, extra
        assert b"bytes of" not in body
    # At most seven days ahead; expired is expired.
    far = v2.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "pub/x"}, ExpiresIn=8 * 86400)
    status, body = http_error(far)
    assert status == 400 and b"AuthorizationQueryParametersError" in body
    week = v2.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "pub/x"}, ExpiresIn=7 * 86400 - 60)
    assert urllib.request.urlopen(week).read() == b"bytes of pub/x"
    old = v2.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "pub/x"}, ExpiresIn=-10)
    status, body = http_error(old)
    assert status == 403 and b"expired" in body


def test_public_read_bucket(server, s3, bucket):
    s3.put_object(Bucket=bucket, Key="pub", Body=b"hello")
    url = f"{server.endpoint}/{bucket}/pub"
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(url)
    assert e.value.code == 403
    s3.put_bucket_acl(Bucket=bucket, ACL="public-read")
    assert urllib.request.urlopen(url).read() == b"hello"
    grants = s3.get_bucket_acl(Bucket=bucket)["Grants"]
    assert any(g["Permission"] == "READ" for g in grants)
    req = urllib.request.Request(f"{server.endpoint}/{bucket}/anon", data=b"x", method="PUT")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req)
    assert e.value.code == 403
    s3.put_bucket_acl(Bucket=bucket, ACL="private")
    with pytest.raises(urllib.error.HTTPError):
        urllib.request.urlopen(url)


@pytest.mark.local_only
def test_anonymous_readers_of_a_public_bucket_get_objects_and_listings_only(server, s3, bucket):
    """public-read opens a bucket's objects and listings to anonymous callers, not its ACL,
    location, lifecycle rules, object tags or multipart uploads and parts."""
    s3.put_object(Bucket=bucket, Key="pub", Body=b"hello", Tagging="owner=alice&project=secret")
    s3.put_bucket_lifecycle_configuration(Bucket=bucket, LifecycleConfiguration={"Rules": [
        {"ID": "private-rule", "Status": "Enabled", "Filter": {"Prefix": "tmp/"}, "Expiration": {"Days": 3}}]})
    upload = s3.create_multipart_upload(Bucket=bucket, Key="in-progress")["UploadId"]
    s3.put_bucket_acl(Bucket=bucket, ACL="public-read")
    base = f"{server.endpoint}/{bucket}"
    r = urllib.request.urlopen(f"{base}/pub")
    assert r.read() == b"hello"
    assert r.headers.get("x-amz-tagging-count") is None
    assert b"<Key>pub</Key>" in urllib.request.urlopen(f"{base}?list-type=2").read()
    for what in ["?acl", "?location", "?lifecycle", "?uploads", "/pub?tagging",
                 f"/in-progress?uploadId={upload}"]:
        status, body = http_error(base + what)
        assert status == 403 and b"AccessDenied" in body, what
        for secret in [b"private-rule", b"project", b"in-progress", b"OwnerID", b"<ID>"]:
            assert secret not in body, (what, secret)
    # The owner still reads all of it.
    assert s3.get_object(Bucket=bucket, Key="pub")["TagCount"] == 2
    assert s3.get_object_tagging(Bucket=bucket, Key="pub")["TagSet"]
    assert s3.get_bucket_lifecycle_configuration(Bucket=bucket)["Rules"][0]["ID"] == "private-rule"
    assert s3.list_parts(Bucket=bucket, Key="in-progress", UploadId=upload).get("Parts", []) == []
    s3.abort_multipart_upload(Bucket=bucket, Key="in-progress", UploadId=upload)


def admin(server, *args, data_dir=None):
    env = dict(os.environ, PACKRAT_ROOT_ACCESS_KEY=AK, PACKRAT_ROOT_SECRET_KEY=SK)
    where = ["--data-dir", data_dir] if data_dir else ["--endpoint", server.endpoint]
    out = subprocess.run([conftest.BIN, "admin", *where, *args], env=env, capture_output=True, text=True, timeout=60)
    return out


def parse_key(out):
    fields = dict(line.strip().split(": ", 1) for line in out.stdout.splitlines() if ": " in line)
    return fields["access key"], fields["secret key"]


def test_users_are_isolated(server, s3):
    out = admin(server, "key", "create", "--name", "alice")
    assert out.returncode == 0, out.stderr
    a_ak, a_sk = parse_key(out)
    out = admin(server, "key", "create", "--name", "bob", "--access-key", "BOBKEY123", "--secret-key", "bob-secret-123456")
    assert out.returncode == 0, out.stderr
    alice = server.client(a_ak, a_sk)
    bob = server.client("BOBKEY123", "bob-secret-123456")
    alice.create_bucket(Bucket="alice-data")
    alice.put_object(Bucket="alice-data", Key="k", Body=b"secret")
    assert [b["Name"] for b in bob.list_buckets()["Buckets"]] == []
    owner = alice.list_buckets()["Owner"]
    assert owner["DisplayName"] == "alice"
    assert alice.list_objects_v2(Bucket="alice-data", FetchOwner=True)["Contents"][0]["Owner"]["DisplayName"] == "alice"
    for call in (lambda: bob.get_object(Bucket="alice-data", Key="k"),
                 lambda: bob.put_object(Bucket="alice-data", Key="x", Body=b"x"),
                 lambda: bob.list_objects_v2(Bucket="alice-data"),
                 lambda: bob.delete_bucket(Bucket="alice-data")):
        with pytest.raises(ClientError) as e:
            call()
        assert code(e) == "AccessDenied"
    with pytest.raises(ClientError) as e:
        bob.create_bucket(Bucket="alice-data")
    assert code(e) == "BucketAlreadyExists"
    assert "alice-data" in [b["Name"] for b in s3.list_buckets()["Buckets"]]  # root sees all
    listed = admin(server, "key", "list")
    assert "alice" in listed.stdout and "BOBKEY123" in listed.stdout and a_sk not in listed.stdout
    assert admin(server, "key", "delete", "BOBKEY123").returncode == 0
    with pytest.raises(ClientError) as e:
        bob.list_buckets()
    assert code(e) == "InvalidAccessKeyId"
    # Non-root keys cannot administer.
    env = dict(os.environ, PACKRAT_ROOT_ACCESS_KEY=a_ak, PACKRAT_ROOT_SECRET_KEY=a_sk)
    out = subprocess.run([conftest.BIN, "admin", "--endpoint", server.endpoint, "key", "list"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "AccessDenied" in out.stderr
    conftest.empty_bucket(alice, "alice-data")


@pytest.mark.local_only
def test_offline_admin_on_stopped_server(workdir):
    srv = conftest.Server(workdir / "offline")
    srv.start()
    srv.stop()
    out = admin(srv, "key", "create", "--name", "carol", "--access-key", "CAROLKEY", "--secret-key", "carol-secret-1", data_dir=srv.data_dir)
    assert out.returncode == 0, out.stderr
    srv.start()
    try:
        carol = srv.client("CAROLKEY", "carol-secret-1")
        carol.create_bucket(Bucket="carol-bucket")
        assert [b["Name"] for b in carol.list_buckets()["Buckets"]] == ["carol-bucket"]
    finally:
        srv.stop()


def files_under(path):
    for root, _dirs, files in os.walk(path):
        for f in files:
            yield os.path.join(root, f)


@pytest.mark.local_only
def test_data_directory_is_private_and_secrets_are_sealed_at_rest(workdir):
    """The data directory is 0700 and every file packrat makes in it 0600 (the master key
    included); no access key's secret is in any file of it in plaintext, whether made by the
    server, by the offline admin command, or given as the root key."""
    srv = conftest.Server(workdir / "private")
    os.makedirs(srv.data_dir, mode=0o755)
    os.chmod(srv.data_dir, 0o755)  # as a careless operator left it
    srv.start()
    try:
        out = admin(srv, "key", "create", "--name", "dave", "--access-key", "DAVEKEY", "--secret-key", "dave-secret-0123456789")
        assert out.returncode == 0, out.stderr
        dave = srv.client("DAVEKEY", "dave-secret-0123456789")
        dave.create_bucket(Bucket="dave-bucket")
        dave.put_object(Bucket="dave-bucket", Key="k", Body=b"x" * 5000)
        # Flushed, so what the index holds is in its tables as well as its log.
        out = admin(srv, "status", "--flush")
        assert out.returncode == 0, out.stderr
    finally:
        srv.stop()
    out = admin(srv, "key", "create", "--name", "erin", "--access-key", "ERINKEY", "--secret-key", "erin-secret-0123456789",
                data_dir=srv.data_dir)
    assert out.returncode == 0, out.stderr
    assert os.stat(srv.data_dir).st_mode & 0o777 == 0o700
    files = list(files_under(srv.data_dir))
    assert os.path.join(srv.data_dir, "master.key") in files
    loose = [(f, oct(os.stat(f).st_mode & 0o777)) for f in files if os.stat(f).st_mode & 0o077]
    assert loose == [], "files others can read"
    for root, dirs, _ in os.walk(srv.data_dir):
        for d in dirs:
            assert os.stat(os.path.join(root, d)).st_mode & 0o077 == 0, os.path.join(root, d)
    for secret in (SK, "dave-secret-0123456789", "erin-secret-0123456789"):
        holders = [f for f in files if secret.encode() in open(f, "rb").read()]
        assert holders == [], f"a secret in plaintext in {holders}"
    # They still work: sealed, not lost.
    srv.start()
    try:
        assert srv.client("ERINKEY", "erin-secret-0123456789").list_buckets()["Buckets"] == []
        assert srv.client("DAVEKEY", "dave-secret-0123456789").get_object(Bucket="dave-bucket", Key="k")["Body"].read() == b"x" * 5000
    finally:
        srv.stop()


@pytest.mark.local_only
def test_virtual_host_addressing(workdir):
    srv = conftest.Server(workdir / "vhost", extra_args=["--domain", "s3.test"]).start()
    try:
        srv.client().create_bucket(Bucket="vbucket")
        port = host_of(srv.endpoint).split(":")[1]
        host = f"vbucket.s3.test:{port}"
        body = b"virtual host body"
        s = Signed(host, "PUT", "/dir/k v", [], {}, hashlib.sha256(body).hexdigest(), AK, SK)
        st, _, rb = send(srv.endpoint, "PUT", s.path, s.headers, body)
        assert st == 200, rb
        s = Signed(host, "GET", "/dir/k v", [], {}, hashlib.sha256(b"").hexdigest(), AK, SK)
        st, _, rb = send(srv.endpoint, "GET", s.path, s.headers)
        assert st == 200 and rb == body
        s = Signed(host, "GET", "/", [("list-type", "2")], {}, hashlib.sha256(b"").hexdigest(), AK, SK)
        st, _, rb = send(srv.endpoint, "GET", s.path, s.headers)
        assert st == 200 and b"<Key>dir/k v</Key>" in rb
        # Path style keeps working next to it.
        assert srv.client().get_object(Bucket="vbucket", Key="dir/k v")["Body"].read() == body
    finally:
        srv.stop()


@pytest.mark.local_only
def test_admin_status(server, s3, bucket):
    import json
    s3.put_object(Bucket=bucket, Key="status-probe", Body=b"x" * 1000)
    out = admin(server, "status", "--flush")
    assert out.returncode == 0, out.stderr
    st = json.loads(out.stdout)
    assert st["segments"] >= 1 and st["appends"] >= 1 and st["syncs"] >= 1
    assert st["segment_disk_bytes"] >= 1000
    # The key count is an estimate (deletes are subtracted approximately); the SST size is not.
    assert st["index"]["objects_estimate"] >= 0 and st["index"]["sst_bytes"] > 0


def test_admin_options_go_before_or_after_the_subcommand_and_https_is_never_plain(server):
    """`--endpoint`, `--data-dir` and `--region` are accepted after the subcommand too (they
    were refused there: "unexpected argument"); an https endpoint is spoken to over TLS, never
    in plain http: against a plain-http server it fails (tests/test_tls.py has the TLS side)."""
    env = dict(os.environ, PACKRAT_ROOT_ACCESS_KEY=AK, PACKRAT_ROOT_SECRET_KEY=SK)
    env.pop("PACKRAT_ENDPOINT", None)
    run = lambda *args: subprocess.run([conftest.BIN, "admin", *args], env=env,  # noqa: E731
                                       capture_output=True, text=True, timeout=60)
    out = run("key", "create", "--name", "after", "--endpoint", server.endpoint)
    assert out.returncode == 0, out.stderr
    ak, _ = parse_key(out)
    out = run("key", "list", "--endpoint", server.endpoint, "--region", "us-east-1")
    assert out.returncode == 0 and ak in out.stdout, out.stderr
    assert run("--endpoint", server.endpoint, "key", "delete", ak).returncode == 0
    # --output json: one JSON document per command, for scripts.
    out = run("key", "create", "--name", "scripted", "--endpoint", server.endpoint, "--output", "json")
    made = json.loads(out.stdout)
    assert made["name"] == "scripted" and len(made["secret_key"]) >= 16, out.stdout
    listed = json.loads(run("--output", "json", "key", "list", "--endpoint", server.endpoint).stdout)
    assert made["access_key"] in [k["access_key"] for k in listed] and "secret_key" not in listed[0]
    out = run("key", "delete", made["access_key"], "--endpoint", server.endpoint, "--output", "json")
    assert json.loads(out.stdout) == {"deleted": made["access_key"]}
    https = server.endpoint.replace("http://", "https://")
    out = run("key", "list", "--endpoint", https)
    assert out.returncode != 0 and "cannot reach" in out.stderr, out.stderr
