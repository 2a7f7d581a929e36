"""Server-side encryption (issue 20, item 2): SSE-C over https with boto3 and aws-cli (round
trips, ranges across the 64 KiB blocks, a missing and a wrong key, the key's MD5, plain http
refused), SSE-S3 (bytes on disk are ciphertext, a restart still decrypts, Content-MD5 and
checksums checked on the plaintext), copies between every pair of encryption kinds, encrypted
multipart uploads (SSE-C and SSE-S3 parts, part copies into and out of them, ranges across parts,
boto3's and aws-cli's multipart transfers), listings that show the plaintext size, and the paths
that do not decrypt (batch GET, epoch streams) refusing instead of serving ciphertext or
storing plaintext."""

import base64
import hashlib
import os
import pathlib

import pytest
from botocore.exceptions import ClientError

import conftest
from conftest import Server
from test_tls import make_ca, make_cert

BLOCK = 64 * 1024


def code_of(fn, *args, **kw):
    with pytest.raises(ClientError) as e:
        fn(*args, **kw)
    return e.value.response["Error"]["Code"], e.value.response["ResponseMetadata"]["HTTPStatusCode"]


def stored_bytes(data_dir):
    """Every byte of the server's segment files (where object bytes live)."""
    out = b""
    for p in sorted(pathlib.Path(data_dir).rglob("*")):
        if p.is_file() and "segments" in p.parts:
            out += p.read_bytes()
    return out


def pattern(n, seed=0):
    """`n` bytes that are not all alike, so a range off by a byte is caught."""
    return bytes((i * 31 + seed + i // 997) % 251 for i in range(n))


@pytest.fixture(scope="module")
def tls(tmp_path_factory):
    """A packrat server on https with a CA made for the test, and a boto3 client trusting it."""
    d = tmp_path_factory.mktemp("sse-tls")
    ca = make_ca(d)
    cert, key = make_cert(d, "server")
    srv = Server(d / "data", extra_args=["--tls-cert", str(cert), "--tls-key", str(key)]).start()
    srv.ca = ca
    yield srv
    srv.stop()


def tls_client(srv):
    import boto3
    from botocore.config import Config
    return boto3.client("s3", endpoint_url=srv.endpoint, aws_access_key_id=conftest.ROOT_AK,
                        aws_secret_access_key=conftest.ROOT_SK, region_name=conftest.REGION,
                        verify=str(srv.ca),
                        config=Config(s3={"addressing_style": "path"}, retries={"total_max_attempts": 1}))


@pytest.mark.local_only("starts its own https packrat serve; SSE-C through a cluster: test_sse_c_through_a_cluster_gateway_over_https")
def test_sse_c_round_trip_ranges_and_wrong_keys(tls):
    c = tls_client(tls)
    c.create_bucket(Bucket="ssec")
    key = os.urandom(32)
    other = os.urandom(32)
    sse = {"SSECustomerAlgorithm": "AES256", "SSECustomerKey": key}
    size = 3 * BLOCK + 1234
    body = pattern(size)
    put = c.put_object(Bucket="ssec", Key="obj", Body=body, **sse)
    want_md5 = base64.b64encode(hashlib.md5(key).digest()).decode()
    assert put["SSECustomerAlgorithm"] == "AES256"
    assert put["SSECustomerKeyMD5"] == want_md5

    got = c.get_object(Bucket="ssec", Key="obj", **sse)
    assert got["Body"].read() == body
    assert got["ContentLength"] == size
    assert got["SSECustomerKeyMD5"] == want_md5
    head = c.head_object(Bucket="ssec", Key="obj", **sse)
    assert head["ContentLength"] == size and head["SSECustomerAlgorithm"] == "AES256"
    # Ranges inside one block, across block boundaries, the last bytes and a suffix.
    for a, z in [(0, 0), (10, 99), (BLOCK - 5, BLOCK + 5), (BLOCK, 2 * BLOCK - 1),
                 (100, 3 * BLOCK + 10), (size - 7, size - 1)]:
        r = c.get_object(Bucket="ssec", Key="obj", Range=f"bytes={a}-{z}", **sse)
        assert r["Body"].read() == body[a:z + 1], (a, z)
        assert r["ContentRange"] == f"bytes {a}-{z}/{size}"
    r = c.get_object(Bucket="ssec", Key="obj", Range="bytes=-300", **sse)
    assert r["Body"].read() == body[-300:]
    # A listing and GetObjectAttributes show the plaintext's size.
    listed = c.list_objects_v2(Bucket="ssec")["Contents"]
    assert [(o["Key"], o["Size"]) for o in listed] == [("obj", size)]
    # botocore encodes the key for GetObjectAttributes only when given as base64 text.
    attrs = c.get_object_attributes(Bucket="ssec", Key="obj", ObjectAttributes=["ObjectSize"],
                                    SSECustomerAlgorithm="AES256",
                                    SSECustomerKey=base64.b64encode(key).decode(),
                                    SSECustomerKeyMD5=want_md5)
    assert attrs["ObjectSize"] == size

    # Without the key, with another key, or with a key whose MD5 is not its own.
    assert code_of(c.get_object, Bucket="ssec", Key="obj") == ("InvalidRequest", 400)
    assert code_of(c.get_object, Bucket="ssec", Key="obj", SSECustomerAlgorithm="AES256",
                   SSECustomerKey=other) == ("AccessDenied", 403)
    assert code_of(c.head_object, Bucket="ssec", Key="obj", SSECustomerAlgorithm="AES256",
                   SSECustomerKey=other)[1] == 403
    assert code_of(c.put_object, Bucket="ssec", Key="bad-md5", Body=b"x", SSECustomerAlgorithm="AES256",
                   SSECustomerKey=base64.b64encode(key).decode(),
                   SSECustomerKeyMD5=base64.b64encode(b"0" * 16).decode()) \
        == ("InvalidArgument", 400)
    assert code_of(c.put_object, Bucket="ssec", Key="short-key", Body=b"x", SSECustomerAlgorithm="AES256",
                   SSECustomerKey=b"k" * 16) == ("InvalidArgument", 400)
    assert code_of(c.put_object, Bucket="ssec", Key="alg", Body=b"x", SSECustomerAlgorithm="AES128",
                   SSECustomerKey=key) == ("InvalidEncryptionAlgorithmError", 400)
    # A key sent for an object that is not encrypted with one.
    c.put_object(Bucket="ssec", Key="plain", Body=b"plain")
    assert code_of(c.get_object, Bucket="ssec", Key="plain", **sse) == ("InvalidRequest", 400)
    # The refused writes stored nothing; the object is intact.
    assert sorted(o["Key"] for o in c.list_objects_v2(Bucket="ssec")["Contents"]) == ["obj", "plain"]
    assert c.get_object(Bucket="ssec", Key="obj", **sse)["Body"].read() == body

    # Empty objects seal to one block and open again.
    c.put_object(Bucket="ssec", Key="empty", Body=b"", **sse)
    assert c.get_object(Bucket="ssec", Key="empty", **sse)["Body"].read() == b""
    assert c.head_object(Bucket="ssec", Key="empty", **sse)["ContentLength"] == 0

    # The stored bytes are ciphertext: no 64-byte run of the plaintext is on disk.
    disk = stored_bytes(pathlib.Path(tls.data_dir))
    assert len(disk) > size
    assert body[BLOCK:BLOCK + 64] not in disk and body[:64] not in disk


def test_sse_c_over_plain_http_is_refused(server, s3, bucket):
    code = code_of(s3.put_object, Bucket=bucket, Key="k", Body=b"secret", SSECustomerAlgorithm="AES256",
                   SSECustomerKey=os.urandom(32))
    assert code == ("InvalidRequest", 400)
    assert "Contents" not in s3.list_objects_v2(Bucket=bucket)


def test_allow_insecure_sse_c_takes_keys_over_plain_http(tmp_path):
    """`--allow-insecure-sse-c` (test rigs, loopback deployments) takes SSE-C keys without TLS;
    the connection still counts as insecure for bucket policies (aws:SecureTransport)."""
    srv = Server(tmp_path / "data", extra_args=["--allow-insecure-sse-c"]).start()
    try:
        s3 = srv.client()
        s3.create_bucket(Bucket="ssec")
        key, other = os.urandom(32), os.urandom(32)
        s3.put_object(Bucket="ssec", Key="k", Body=b"secret" * 100, SSECustomerAlgorithm="AES256",
                      SSECustomerKey=key)
        got = s3.get_object(Bucket="ssec", Key="k", SSECustomerAlgorithm="AES256", SSECustomerKey=key)
        assert got["Body"].read() == b"secret" * 100
        assert got["SSECustomerAlgorithm"] == "AES256"
        assert code_of(s3.get_object, Bucket="ssec", Key="k", SSECustomerAlgorithm="AES256",
                       SSECustomerKey=other)[1] == 403
        assert code_of(s3.get_object, Bucket="ssec", Key="k") == ("InvalidRequest", 400)
        assert b"secret" not in stored_bytes(srv.data_dir)
        # Conflicting encryption headers stay refused.
        assert code_of(s3.put_object, Bucket="ssec", Key="k2", Body=b"x", ServerSideEncryption="AES256",
                       SSECustomerAlgorithm="AES256", SSECustomerKey=key) == ("InvalidArgument", 400)
    finally:
        srv.stop()


@pytest.mark.local_only("restarts its own packrat serve; SSE-S3 through a cluster: test_sse_s3_and_bucket_default_encryption")
def test_sse_s3_is_ciphertext_on_disk_and_survives_a_restart(tmp_path):
    srv = Server(tmp_path / "data").start()
    c = srv.client()
    c.create_bucket(Bucket="sses3")
    body = pattern(2 * BLOCK + 999, seed=5)
    put = c.put_object(Bucket="sses3", Key="a", Body=body, ServerSideEncryption="AES256")
    assert put["ServerSideEncryption"] == "AES256"
    # As in S3, an SSE-S3 object's ETag is its plaintext's MD5 (rclone and others rely on it).
    md5 = '"%s"' % hashlib.md5(body).hexdigest()
    assert put["ETag"] == md5
    got = c.get_object(Bucket="sses3", Key="a")
    assert got["Body"].read() == body and got["ServerSideEncryption"] == "AES256"
    assert got["ETag"] == md5
    assert c.head_object(Bucket="sses3", Key="a")["ServerSideEncryption"] == "AES256"
    r = c.get_object(Bucket="sses3", Key="a", Range=f"bytes={BLOCK - 1}-{BLOCK + 1}")
    assert r["Body"].read() == body[BLOCK - 1:BLOCK + 2]
    # A plain object answers no encryption header.
    c.put_object(Bucket="sses3", Key="plain", Body=b"p")
    assert "ServerSideEncryption" not in c.head_object(Bucket="sses3", Key="plain")

    # Content-MD5 and flexible checksums are checked on the plaintext: a wrong one stores
    # nothing; a right one is answered.
    wrong = base64.b64encode(hashlib.md5(b"other").digest()).decode()
    assert code_of(c.put_object, Bucket="sses3", Key="bad", Body=b"data", ContentMD5=wrong,
                   ServerSideEncryption="AES256") == ("BadDigest", 400)
    sha = base64.b64encode(hashlib.sha256(b"data").digest()).decode()
    ok = c.put_object(Bucket="sses3", Key="sha", Body=b"data", ChecksumSHA256=sha, ServerSideEncryption="AES256")
    assert ok["ChecksumSHA256"] == sha
    bad_sha = base64.b64encode(hashlib.sha256(b"nope").digest()).decode()
    assert code_of(c.put_object, Bucket="sses3", Key="bad", Body=b"data", ChecksumSHA256=bad_sha,
                   ServerSideEncryption="AES256") == ("BadDigest", 400)
    assert code_of(c.head_object, Bucket="sses3", Key="bad")[1] == 404

    disk = stored_bytes(tmp_path / "data")
    assert body[:64] not in disk and body[BLOCK:BLOCK + 64] not in disk
    srv.stop()
    srv.start()
    c = srv.client()
    assert c.get_object(Bucket="sses3", Key="a")["Body"].read() == body
    listed = {o["Key"]: o["Size"] for o in c.list_objects_v2(Bucket="sses3")["Contents"]}
    assert listed == {"a": len(body), "plain": 1, "sha": 4}
    srv.stop()


@pytest.mark.local_only("starts its own https packrat serve; SSE-C through a cluster: test_sse_c_through_a_cluster_gateway_over_https")
def test_copies_between_encryption_kinds(tls):
    c = tls_client(tls)
    c.create_bucket(Bucket="ssecopy")
    k1, k2 = os.urandom(32), os.urandom(32)
    c1 = {"SSECustomerAlgorithm": "AES256", "SSECustomerKey": k1}
    c2 = {"SSECustomerAlgorithm": "AES256", "SSECustomerKey": k2}
    src1 = {"CopySourceSSECustomerAlgorithm": "AES256", "CopySourceSSECustomerKey": k1}
    body = pattern(BLOCK + 17, seed=9)
    c.put_object(Bucket="ssecopy", Key="c1", Body=body, Metadata={"m": "1"}, **c1)
    src = {"Bucket": "ssecopy", "Key": "c1"}
    # SSE-C source without its key: refused, nothing written.
    assert code_of(c.copy_object, Bucket="ssecopy", Key="x", CopySource=src) == ("InvalidRequest", 400)
    assert code_of(c.copy_object, Bucket="ssecopy", Key="x", CopySource=src, CopySourceSSECustomerAlgorithm="AES256",
                   CopySourceSSECustomerKey=k2) == ("AccessDenied", 403)
    # SSE-C -> SSE-C under another key, -> SSE-S3, -> plain.
    r = c.copy_object(Bucket="ssecopy", Key="c2", CopySource=src, **src1, **c2)
    assert r["SSECustomerKeyMD5"] == base64.b64encode(hashlib.md5(k2).digest()).decode()
    assert c.get_object(Bucket="ssecopy", Key="c2", **c2)["Body"].read() == body
    assert code_of(c.get_object, Bucket="ssecopy", Key="c2", **c1) == ("AccessDenied", 403)
    assert c.get_object(Bucket="ssecopy", Key="c2", **c2)["Metadata"] == {"m": "1"}
    r = c.copy_object(Bucket="ssecopy", Key="s3", CopySource=src, ServerSideEncryption="AES256", **src1)
    assert r["ServerSideEncryption"] == "AES256"
    assert r["CopyObjectResult"]["ETag"] == '"%s"' % hashlib.md5(body).hexdigest()
    assert c.get_object(Bucket="ssecopy", Key="s3")["Body"].read() == body
    c.copy_object(Bucket="ssecopy", Key="plain", CopySource=src, **src1)
    plain = c.get_object(Bucket="ssecopy", Key="plain")
    assert plain["Body"].read() == body and "ServerSideEncryption" not in plain
    # plain -> SSE-C; SSE-S3 -> SSE-S3 (the bytes copied as they are); SSE-S3 -> plain.
    c.copy_object(Bucket="ssecopy", Key="pc", CopySource={"Bucket": "ssecopy", "Key": "plain"}, **c2)
    assert c.get_object(Bucket="ssecopy", Key="pc", **c2)["Body"].read() == body
    c.copy_object(Bucket="ssecopy", Key="s3b", CopySource={"Bucket": "ssecopy", "Key": "s3"},
                  ServerSideEncryption="AES256")
    assert c.get_object(Bucket="ssecopy", Key="s3b")["Body"].read() == body
    c.copy_object(Bucket="ssecopy", Key="s3plain", CopySource={"Bucket": "ssecopy", "Key": "s3"})
    r = c.get_object(Bucket="ssecopy", Key="s3plain")
    assert r["Body"].read() == body and "ServerSideEncryption" not in r
    # A copy onto itself with new metadata keeps the object encrypted and readable.
    c.copy_object(Bucket="ssecopy", Key="s3", CopySource={"Bucket": "ssecopy", "Key": "s3"},
                  ServerSideEncryption="AES256", Metadata={"new": "yes"}, MetadataDirective="REPLACE")
    r = c.get_object(Bucket="ssecopy", Key="s3")
    assert r["Body"].read() == body and r["Metadata"] == {"new": "yes"} and r["ServerSideEncryption"] == "AES256"
    assert r["ETag"] == '"%s"' % hashlib.md5(body).hexdigest()
    # A plain object copied onto itself with new metadata stays plain (no encryption header).
    r = c.copy_object(Bucket="ssecopy", Key="plain", CopySource={"Bucket": "ssecopy", "Key": "plain"},
                      Metadata={"p": "1"}, MetadataDirective="REPLACE")
    assert "ServerSideEncryption" not in r and "SSECustomerAlgorithm" not in r
    # ... and one that changes SSE-C to SSE-S3 in place re-encrypts it.
    c.copy_object(Bucket="ssecopy", Key="c1", CopySource=src, ServerSideEncryption="AES256", **src1)
    assert c.get_object(Bucket="ssecopy", Key="c1")["Body"].read() == body


def test_what_does_not_decrypt_refuses(server, s3, bucket):
    s3.put_object(Bucket=bucket, Key="enc/a", Body=b"secret-a" * 100, ServerSideEncryption="AES256")
    s3.put_object(Bucket=bucket, Key="enc/b", Body=b"open-b")
    # Batch GET and epoch streams answer an error entry for the encrypted object, never its
    # ciphertext.
    got = {s.name: s for s in server.packrat().batch_get(bucket, ["enc/a", "enc/b"])}
    assert got["enc/b"].data == b"open-b"
    assert got["enc/a"].error is not None and got["enc/a"].error[0] == "InvalidRequest"
    assert not got["enc/a"].data
    streamed = {s.name: s for s in server.packrat().stream_epoch(bucket, prefix="enc/")}
    assert streamed["enc/a"].error is not None and not streamed["enc/a"].data
    assert streamed["enc/b"].data == b"open-b"
    # Dual-layer SSE-KMS: 501, nothing stored (SSE-KMS is tests/test_sse_kms.py's).
    assert code_of(s3.create_multipart_upload, Bucket=bucket, Key="mp", ServerSideEncryption="aws:kms:dsse") \
        == ("NotImplemented", 501)
    assert "Uploads" not in s3.list_multipart_uploads(Bucket=bucket)
    assert code_of(s3.put_object, Bucket=bucket, Key="kms", Body=b"x", ServerSideEncryption="aws:kms:dsse") \
        == ("NotImplemented", 501)
    assert code_of(s3.put_object, Bucket=bucket, Key="bad", Body=b"x", ServerSideEncryption="DES") \
        == ("InvalidArgument", 400)
    assert code_of(s3.head_object, Bucket=bucket, Key="kms")[1] == 404


def test_sse_s3_and_bucket_default_encryption(server, s3, bucket):
    """SSE-S3 and a bucket's default encryption, on one server and through a cluster gateway
    (whose master key is the cluster's, in etcd): the object answers AES256 and reads back."""
    body = pattern(BLOCK + 77, seed=21)
    put = s3.put_object(Bucket=bucket, Key="k", Body=body, ServerSideEncryption="AES256")
    assert put["ServerSideEncryption"] == "AES256"
    # The plaintext's MD5, as S3 shows it (through a cluster too, whose nodes keep the stored
    # bytes' MD5 beside it for their copies' checks).
    plain_md5 = '"%s"' % hashlib.md5(body).hexdigest()
    assert put["ETag"] == plain_md5, put["ETag"]
    got = s3.get_object(Bucket=bucket, Key="k")
    assert got["Body"].read() == body and got["ServerSideEncryption"] == "AES256"
    assert got["ETag"] == put["ETag"]
    r = s3.get_object(Bucket=bucket, Key="k", Range=f"bytes={BLOCK - 2}-{BLOCK + 2}")
    assert r["Body"].read() == body[BLOCK - 2:BLOCK + 3]
    aes = {"Rules": [{"ApplyServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"}}]}
    s3.put_bucket_encryption(Bucket=bucket, ServerSideEncryptionConfiguration=aes)
    s3.put_object(Bucket=bucket, Key="by-default", Body=b"default")
    head = s3.head_object(Bucket=bucket, Key="by-default")
    assert head["ServerSideEncryption"] == "AES256"
    assert s3.get_object(Bucket=bucket, Key="by-default")["Body"].read() == b"default"
    s3.delete_bucket_encryption(Bucket=bucket)
    s3.put_object(Bucket=bucket, Key="plain", Body=b"plain")
    assert "ServerSideEncryption" not in s3.head_object(Bucket=bucket, Key="plain")
    assert code_of(s3.get_bucket_encryption, Bucket=bucket) == ("ServerSideEncryptionConfigurationNotFoundError", 404)


@pytest.mark.local_only("starts its own etcd, nodes and https gateway (once, in the local run)")
def test_sse_c_through_a_cluster_gateway_over_https(tmp_path):
    """SSE-C needs no server key, so a cluster gateway (on https) serves it; the nodes keep
    only ciphertext."""
    from cluster import Gateway, start_cluster
    etcd, nodes, _ = start_cluster(tmp_path / "cl", gateways=0)
    ca = make_ca(tmp_path)
    cert, tkey = make_cert(tmp_path, "gw")
    gw = Gateway(tmp_path / "gw", etcd.url)
    gw.extra_args = ["--tls-cert", str(cert), "--tls-key", str(tkey)]
    gw.argv = lambda: Gateway.argv(gw) + gw.extra_args
    gw.start()
    gw.ca = ca
    try:
        c = tls_client(gw)
        c.create_bucket(Bucket="clssec")
        key = os.urandom(32)
        sse = {"SSECustomerAlgorithm": "AES256", "SSECustomerKey": key}
        body = pattern(2 * BLOCK + 5, seed=11)
        c.put_object(Bucket="clssec", Key="o", Body=body, **sse)
        assert c.get_object(Bucket="clssec", Key="o", **sse)["Body"].read() == body
        r = c.get_object(Bucket="clssec", Key="o", Range=f"bytes={BLOCK}-{BLOCK + 9}", **sse)
        assert r["Body"].read() == body[BLOCK:BLOCK + 10]
        assert c.list_objects_v2(Bucket="clssec")["Contents"][0]["Size"] == len(body)
        assert code_of(c.get_object, Bucket="clssec", Key="o", SSECustomerAlgorithm="AES256",
                       SSECustomerKey=os.urandom(32)) == ("AccessDenied", 403)
        assert code_of(c.get_object, Bucket="clssec", Key="o") == ("InvalidRequest", 400)
        # A multipart upload: each part sealed by the gateway, the upload's envelope kept by
        # the PG's chain, the parts' plaintext sizes listed.
        p1, p2 = pattern(5 * 1024 * 1024, seed=12), pattern(BLOCK + 3, seed=13)
        uid = c.create_multipart_upload(Bucket="clssec", Key="mp", **sse)["UploadId"]
        done = [{"PartNumber": n, "ETag": c.upload_part(Bucket="clssec", Key="mp", UploadId=uid, PartNumber=n,
                                                        Body=p, **sse)["ETag"]}
                for n, p in [(1, p1), (2, p2)]]
        listed = c.list_parts(Bucket="clssec", Key="mp", UploadId=uid)["Parts"]
        assert [(p["PartNumber"], p["Size"]) for p in listed] == [(1, len(p1)), (2, len(p2))]
        c.complete_multipart_upload(Bucket="clssec", Key="mp", UploadId=uid, MultipartUpload={"Parts": done})
        whole = p1 + p2
        assert c.get_object(Bucket="clssec", Key="mp", **sse)["Body"].read() == whole
        r = c.get_object(Bucket="clssec", Key="mp", Range=f"bytes={len(p1) - 5}-{len(p1) + 4}", **sse)
        assert r["Body"].read() == whole[len(p1) - 5:len(p1) + 5]
        assert code_of(c.get_object, Bucket="clssec", Key="mp") == ("InvalidRequest", 400)
        # SSE-S3: the data key is sealed with the cluster's master key (in etcd), so another
        # gateway, started after the write, reads the object too.
        s3body = pattern(BLOCK + 9, seed=14)
        c.put_object(Bucket="clssec", Key="s3", Body=s3body, ServerSideEncryption="AES256")
        other = Gateway(tmp_path / "gw2", etcd.url).start()
        try:
            got = other.client().get_object(Bucket="clssec", Key="s3")
            assert got["Body"].read() == s3body and got["ServerSideEncryption"] == "AES256"
        finally:
            other.stop()
        disks = [stored_bytes(pathlib.Path(n.data_dir)) for n in nodes]
        # Three replicas of the sealed object, none of them plaintext.
        assert sum(len(d) >= len(body) for d in disks) == 3
        for disk in disks:
            assert body[:64] not in disk and body[BLOCK:BLOCK + 64] not in disk
            assert p1[:64] not in disk and p2[:64] not in disk
            assert s3body[:64] not in disk
    finally:
        for p in [gw, *nodes]:
            p.stop()
        etcd.stop()


@pytest.mark.local_only("starts its own https packrat serve; SSE-C through a cluster: test_sse_c_through_a_cluster_gateway_over_https")
def test_awscli_sse_c_and_sse_s3(tls, tmp_path):
    import shutil
    import subprocess
    c = tls_client(tls)
    c.create_bucket(Bucket="ssecli")
    src = tmp_path / "f.bin"
    # Above aws-cli's 8 MiB multipart_threshold: uploaded in parts, downloaded in ranges.
    body = pattern(9 * 1024 * 1024 + 3, seed=3)
    src.write_bytes(body)
    key = os.urandom(32)
    keyfile = tmp_path / "key.bin"
    keyfile.write_bytes(key)
    env = conftest.aws_env(AWS_CA_BUNDLE=str(tls.ca))

    def aws(*args):
        out = subprocess.run([shutil.which("aws") or "aws", "--endpoint-url", tls.endpoint, *args],
                             env=env, capture_output=True, text=True, timeout=300)
        return out
    out = aws("s3", "cp", str(src), "s3://ssecli/c.bin", "--sse-c", "AES256", "--sse-c-key", f"fileb://{keyfile}")
    assert out.returncode == 0, out.stderr
    out = aws("s3", "cp", str(src), "s3://ssecli/s.bin", "--sse", "AES256")
    assert out.returncode == 0, out.stderr
    back = tmp_path / "back.bin"
    out = aws("s3", "cp", "s3://ssecli/c.bin", str(back), "--sse-c", "AES256", "--sse-c-key", f"fileb://{keyfile}")
    assert out.returncode == 0, out.stderr
    assert back.read_bytes() == body
    out = aws("s3", "cp", "s3://ssecli/s.bin", str(back))
    assert out.returncode == 0, out.stderr
    assert back.read_bytes() == body
    # Without the key, the SSE-C object is not served.
    out = aws("s3", "cp", "s3://ssecli/c.bin", str(tmp_path / "no.bin"))
    assert out.returncode != 0 and not (tmp_path / "no.bin").exists()
    head = aws("s3api", "head-object", "--bucket", "ssecli", "--key", "s.bin")
    assert head.returncode == 0 and '"ServerSideEncryption": "AES256"' in head.stdout
    ls = aws("s3", "ls", "s3://ssecli/")
    assert ls.returncode == 0 and ls.stdout.count(f" {len(body)} ") == 2, ls.stdout
    assert c.head_object(Bucket="ssecli", Key="s.bin")["ETag"].endswith('-2"')


def part_crc32(data):
    import zlib
    return base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()


@pytest.mark.local_only("starts its own https packrat serve")
def test_sse_c_multipart_upload_parts_ranges_and_keys(tls):
    c = tls_client(tls)
    c.create_bucket(Bucket="ssemp")
    key, other = os.urandom(32), os.urandom(32)
    sse = {"SSECustomerAlgorithm": "AES256", "SSECustomerKey": key}
    wrong = {"SSECustomerAlgorithm": "AES256", "SSECustomerKey": other}
    md5 = base64.b64encode(hashlib.md5(key).digest()).decode()
    up = c.create_multipart_upload(Bucket="ssemp", Key="big", **sse)
    assert up["SSECustomerAlgorithm"] == "AES256" and up["SSECustomerKeyMD5"] == md5
    uid = up["UploadId"]
    # Random bytes: other tests on this server store patterns in plaintext.
    p1 = os.urandom(5 * 1024 * 1024 + 100)
    p2 = os.urandom(3 * BLOCK + 17)
    common = {"Bucket": "ssemp", "Key": "big", "UploadId": uid}
    # Every part needs the upload's key: none is 400, another is 403; nothing is stored. (Small
    # bodies: the refusal comes before the body is read, and a big unread body closes the
    # connection.)
    assert code_of(c.upload_part, PartNumber=1, Body=b"x", **common) == ("InvalidRequest", 400)
    assert code_of(c.upload_part, PartNumber=1, Body=b"x", **common, **wrong) == ("AccessDenied", 403)
    assert "Parts" not in c.list_parts(**common)
    # Part 1 sent twice (first with other bytes): the second is the one kept, and a part's
    # plaintext checksum is checked and answered.
    c.upload_part(PartNumber=1, Body=pattern(len(p1), seed=99), **common, **sse)
    r1 = c.upload_part(PartNumber=1, Body=p1, ChecksumCRC32=part_crc32(p1), **common, **sse)
    assert r1["SSECustomerKeyMD5"] == md5 and r1["ChecksumCRC32"] == part_crc32(p1)
    assert code_of(c.upload_part, PartNumber=2, Body=p2, ChecksumCRC32=part_crc32(b"no"), **common, **sse) \
        == ("BadDigest", 400)
    r2 = c.upload_part(PartNumber=2, Body=p2, **common, **sse)
    listed = [(p["PartNumber"], p["Size"]) for p in c.list_parts(**common)["Parts"]]
    assert listed == [(1, len(p1)), (2, len(p2))]
    # Completing needs no key, but a wrong one is refused.
    parts = {"Parts": [{"PartNumber": 1, "ETag": r1["ETag"]}, {"PartNumber": 2, "ETag": r2["ETag"]}]}
    assert code_of(c.complete_multipart_upload, MultipartUpload=parts, **common, **wrong) \
        == ("AccessDenied", 403)
    done = c.complete_multipart_upload(MultipartUpload=parts, **common)
    # (boto3's CompleteMultipartUpload output has no SSE-C fields; the headers are there.)
    assert done["ResponseMetadata"]["HTTPHeaders"]["x-amz-server-side-encryption-customer-key-md5"] == md5
    body = p1 + p2
    head = c.head_object(Bucket="ssemp", Key="big", **sse)
    assert head["ContentLength"] == len(body) and head["SSECustomerKeyMD5"] == md5
    assert c.get_object(Bucket="ssemp", Key="big", **sse)["Body"].read() == body
    # Ranges inside a part, across blocks, across the two parts and at the end.
    n1 = len(p1)
    for a, z in [(0, 0), (5, BLOCK + 5), (BLOCK * 7 - 3, BLOCK * 7 + 3), (n1 - 10, n1 + 10),
                 (n1 - 1, n1), (n1, n1 + BLOCK + 1), (len(body) - 20, len(body) - 1)]:
        r = c.get_object(Bucket="ssemp", Key="big", Range=f"bytes={a}-{z}", **sse)
        assert r["Body"].read() == body[a:z + 1], (a, z)
    second = c.get_object(Bucket="ssemp", Key="big", PartNumber=2, **sse)
    assert second["Body"].read() == p2 and second["PartsCount"] == 2
    # (botocore does not encode the key for GetObjectAttributes: it is sent as S3 wants it.)
    attrs = c.get_object_attributes(Bucket="ssemp", Key="big", ObjectAttributes=["ObjectParts", "ObjectSize"],
                                    SSECustomerAlgorithm="AES256", SSECustomerKey=base64.b64encode(key).decode(),
                                    SSECustomerKeyMD5=md5)
    assert attrs["ObjectSize"] == len(body)
    assert [p["Size"] for p in attrs["ObjectParts"]["Parts"]] == [len(p1), len(p2)]
    assert c.list_objects_v2(Bucket="ssemp")["Contents"][0]["Size"] == len(body)
    # Without the key or with another: not served.
    assert code_of(c.get_object, Bucket="ssemp", Key="big") == ("InvalidRequest", 400)
    assert code_of(c.get_object, Bucket="ssemp", Key="big", Range="bytes=0-9", **wrong) == ("AccessDenied", 403)
    # A plain upload refuses a part sent with a key (it would not be encrypted).
    plain = c.create_multipart_upload(Bucket="ssemp", Key="plain")["UploadId"]
    assert code_of(c.upload_part, Bucket="ssemp", Key="plain", UploadId=plain, PartNumber=1, Body=b"x", **sse) \
        == ("InvalidRequest", 400)
    c.abort_multipart_upload(Bucket="ssemp", Key="plain", UploadId=plain)
    # The parts are ciphertext on disk.
    disk = stored_bytes(tls.data_dir)
    assert p1[BLOCK:BLOCK + 64] not in disk and p2[:64] not in disk


@pytest.mark.local_only("starts its own https packrat serve")
def test_sse_s3_multipart_part_copies_and_transfers(tls, tmp_path):
    from boto3.s3.transfer import TransferConfig
    c = tls_client(tls)
    c.create_bucket(Bucket="ssemp3")
    key = os.urandom(32)
    sse = {"SSECustomerAlgorithm": "AES256", "SSECustomerKey": key}
    up = c.create_multipart_upload(Bucket="ssemp3", Key="s3", ServerSideEncryption="AES256")
    assert up["ServerSideEncryption"] == "AES256"
    common = {"Bucket": "ssemp3", "Key": "s3", "UploadId": up["UploadId"]}
    p1 = pattern(5 * 1024 * 1024, seed=31)
    p2 = pattern(BLOCK - 1, seed=32)
    r1 = c.upload_part(PartNumber=1, Body=p1, **common)
    r2 = c.upload_part(PartNumber=2, Body=p2, **common)
    # As in S3, an SSE-S3 part's ETag is its plaintext's MD5, the object's the MD5 of those.
    assert r1["ETag"] == '"%s"' % hashlib.md5(p1).hexdigest() and r1["ServerSideEncryption"] == "AES256"
    parts = [{"PartNumber": 1, "ETag": r1["ETag"]}, {"PartNumber": 2, "ETag": r2["ETag"]}]
    done = c.complete_multipart_upload(MultipartUpload={"Parts": parts}, **common)
    want_etag = '"%s-2"' % hashlib.md5(hashlib.md5(p1).digest() + hashlib.md5(p2).digest()).hexdigest()
    assert done["ETag"] == want_etag and done["ServerSideEncryption"] == "AES256"
    body = p1 + p2
    got = c.get_object(Bucket="ssemp3", Key="s3")
    assert got["Body"].read() == body and got["ServerSideEncryption"] == "AES256"
    assert got["ETag"] == want_etag
    # Copies of it: SSE-S3 (sealed again as one piece), plain, SSE-C.
    c.copy_object(Bucket="ssemp3", Key="s3copy", CopySource={"Bucket": "ssemp3", "Key": "s3"},
                  ServerSideEncryption="AES256")
    assert c.get_object(Bucket="ssemp3", Key="s3copy")["Body"].read() == body
    c.copy_object(Bucket="ssemp3", Key="plaincopy", CopySource={"Bucket": "ssemp3", "Key": "s3"})
    assert c.get_object(Bucket="ssemp3", Key="plaincopy")["Body"].read() == body
    c.put_object(Bucket="ssemp3", Key="c", Body=p2, **sse)

    # UploadPartCopy out of encrypted objects (SSE-S3 multipart with a range across its parts,
    # SSE-C with its key) into an SSE-C upload, and out of an SSE-C object into a plain one.
    up = c.create_multipart_upload(Bucket="ssemp3", Key="mixed", **sse)
    mixed = {"Bucket": "ssemp3", "Key": "mixed", "UploadId": up["UploadId"]}
    a, z = 100, len(body) - 1
    r1 = c.upload_part_copy(PartNumber=1, CopySource={"Bucket": "ssemp3", "Key": "s3"},
                            CopySourceRange=f"bytes=0-{len(p1) - 1}", **mixed, **sse)
    r2 = c.upload_part_copy(PartNumber=2, CopySource={"Bucket": "ssemp3", "Key": "s3"},
                            CopySourceRange=f"bytes={a}-{z}", **mixed, **sse)
    src_c = {"CopySourceSSECustomerAlgorithm": "AES256", "CopySourceSSECustomerKey": key}
    assert code_of(c.upload_part_copy, PartNumber=3, CopySource={"Bucket": "ssemp3", "Key": "c"}, **mixed, **sse) \
        == ("InvalidRequest", 400)
    r3 = c.upload_part_copy(PartNumber=3, CopySource={"Bucket": "ssemp3", "Key": "c"}, **mixed, **sse, **src_c)
    parts = [{"PartNumber": i + 1, "ETag": r["CopyPartResult"]["ETag"]} for i, r in enumerate([r1, r2, r3])]
    # A part but the last is at least 5 MiB of plaintext (its sealed size does not count).
    r4 = c.upload_part_copy(PartNumber=4, CopySource={"Bucket": "ssemp3", "Key": "s3"},
                            CopySourceRange=f"bytes=0-{5 * 1024 * 1024 - 2}", **mixed, **sse)
    r5 = c.upload_part_copy(PartNumber=5, CopySource={"Bucket": "ssemp3", "Key": "c"}, **mixed, **sse, **src_c)
    short = [{"PartNumber": n, "ETag": r["CopyPartResult"]["ETag"]} for n, r in [(4, r4), (5, r5)]]
    assert code_of(c.complete_multipart_upload, MultipartUpload={"Parts": short}, **mixed) == ("EntityTooSmall", 400)
    c.complete_multipart_upload(MultipartUpload={"Parts": parts}, **mixed)
    want = p1 + body[a:z + 1] + p2
    assert c.get_object(Bucket="ssemp3", Key="mixed", **sse)["Body"].read() == want
    up = c.create_multipart_upload(Bucket="ssemp3", Key="out")
    out = {"Bucket": "ssemp3", "Key": "out", "UploadId": up["UploadId"]}
    r = c.upload_part_copy(PartNumber=1, CopySource={"Bucket": "ssemp3", "Key": "mixed"},
                           CopySourceRange=f"bytes=10-{BLOCK * 3}", **out, **src_c)
    c.complete_multipart_upload(MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": r["CopyPartResult"]["ETag"]}]},
                                **out)
    got = c.get_object(Bucket="ssemp3", Key="out")
    assert got["Body"].read() == want[10:BLOCK * 3 + 1] and "ServerSideEncryption" not in got

    # boto3's own multipart transfer, up and down (concurrent ranged GETs), with SSE-C.
    cfg = TransferConfig(multipart_threshold=5 * 1024 * 1024, multipart_chunksize=5 * 1024 * 1024)
    src = tmp_path / "f.bin"
    data = pattern(11 * 1024 * 1024 + 7, seed=33)
    src.write_bytes(data)
    c.upload_file(str(src), "ssemp3", "file", ExtraArgs=sse, Config=cfg)
    assert c.head_object(Bucket="ssemp3", Key="file", **sse)["ETag"].endswith('-3"')
    back = tmp_path / "back.bin"
    c.download_file("ssemp3", "file", str(back), ExtraArgs=sse, Config=cfg)
    assert back.read_bytes() == data


@pytest.mark.local_only("starts its own https packrat serve; default encryption through a cluster: test_sse_s3_and_bucket_default_encryption")
def test_bucket_default_encryption(tls, tmp_path):
    import io
    import shutil
    import subprocess
    import tarfile
    import urllib3
    c = tls_client(tls)
    c.create_bucket(Bucket="ssedefault")
    b = {"Bucket": "ssedefault"}

    def code_of_config(fn, **kw):
        return code_of(fn, **b, **kw)
    assert code_of_config(c.get_bucket_encryption) == ("ServerSideEncryptionConfigurationNotFoundError", 404)
    c.put_object(Key="before", Body=b"plain before", **b)
    aes = {"Rules": [{"ApplyServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"}}]}
    assert c.put_bucket_encryption(ServerSideEncryptionConfiguration=aes, **b)["ResponseMetadata"]["HTTPStatusCode"] == 200
    rule = c.get_bucket_encryption(**b)["ServerSideEncryptionConfiguration"]["Rules"][0]
    assert rule["ApplyServerSideEncryptionByDefault"] == {"SSEAlgorithm": "AES256"}
    assert rule["BucketKeyEnabled"] is False
    # Refused, the stored configuration untouched: an unknown KMS key, a KMS key with AES256,
    # two rules, no algorithm.
    kms = {"Rules": [{"ApplyServerSideEncryptionByDefault": {"SSEAlgorithm": "aws:kms", "KMSMasterKeyID": "k"}}]}
    assert code_of_config(c.put_bucket_encryption, ServerSideEncryptionConfiguration=kms) \
        == ("KMS.NotFoundException", 400)
    with_key = {"Rules": [{"ApplyServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256", "KMSMasterKeyID": "k"}}]}
    assert code_of_config(c.put_bucket_encryption, ServerSideEncryptionConfiguration=with_key) \
        == ("InvalidArgument", 400)
    assert code_of_config(c.put_bucket_encryption, ServerSideEncryptionConfiguration={"Rules": aes["Rules"] * 2}) \
        == ("MalformedXML", 400)
    assert code_of_config(c.put_bucket_encryption, ServerSideEncryptionConfiguration={"Rules": [{"BucketKeyEnabled": True}]}) \
        == ("MalformedXML", 400)
    assert c.get_bucket_encryption(**b)["ServerSideEncryptionConfiguration"]["Rules"][0] == rule

    # Every write that names no encryption is SSE-S3: PUT, copy, multipart, form upload.
    body = os.urandom(BLOCK + 100)
    assert c.put_object(Key="put", Body=body, **b)["ServerSideEncryption"] == "AES256"
    r = c.copy_object(Key="copy", CopySource={"Bucket": "ssedefault", "Key": "before"}, **b)
    assert r["ServerSideEncryption"] == "AES256"
    up = c.create_multipart_upload(Key="mp", **b)
    assert up["ServerSideEncryption"] == "AES256"
    part = c.upload_part(Key="mp", UploadId=up["UploadId"], PartNumber=1, Body=body, **b)
    c.complete_multipart_upload(Key="mp", UploadId=up["UploadId"],
                                MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": part["ETag"]}]}, **b)
    post = c.generate_presigned_post("ssedefault", "form")
    resp = urllib3.PoolManager(ca_certs=str(tls.ca)).request(
        "POST", post["url"], fields=list(post["fields"].items()) + [("file", ("f", body))], redirect=False)
    assert resp.status == 204 and resp.headers["x-amz-server-side-encryption"] == "AES256"
    for k in ["put", "copy", "mp", "form"]:
        got = c.get_object(Key=k, **b)
        assert got["ServerSideEncryption"] == "AES256", k
        assert got["Body"].read() == (b"plain before" if k == "copy" else body), k
    assert "ServerSideEncryption" not in c.head_object(Key="before", **b)
    # A write's own encryption wins (SSE-C); TAR extraction, which cannot encrypt, is refused.
    key = os.urandom(32)
    r = c.put_object(Key="ssec", Body=b"c", SSECustomerAlgorithm="AES256", SSECustomerKey=key, **b)
    assert r["SSECustomerAlgorithm"] == "AES256" and "ServerSideEncryption" not in r
    tar = io.BytesIO()
    with tarfile.open(fileobj=tar, mode="w") as tf:
        info = tarfile.TarInfo("member")
        info.size = 4
        tf.addfile(info, io.BytesIO(b"data"))
    assert code_of(c.put_object, Key="t.tar", Body=tar.getvalue(), Metadata={"snowball-auto-extract": "true"}, **b) \
        == ("NotImplemented", 501)
    assert code_of(c.head_object, Key="member", **b)[1] == 404
    disk = stored_bytes(tls.data_dir)
    assert body[:64] not in disk and body[BLOCK:BLOCK + 64] not in disk

    # aws-cli reads it; after DeleteBucketEncryption new writes are plain again.
    env = conftest.aws_env(AWS_CA_BUNDLE=str(tls.ca))
    out = subprocess.run([shutil.which("aws") or "aws", "--endpoint-url", tls.endpoint, "s3api",
                          "get-bucket-encryption", "--bucket", "ssedefault"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and '"SSEAlgorithm": "AES256"' in out.stdout, out.stderr
    assert c.delete_bucket_encryption(**b)["ResponseMetadata"]["HTTPStatusCode"] == 204
    assert code_of_config(c.get_bucket_encryption) == ("ServerSideEncryptionConfigurationNotFoundError", 404)
    assert "ServerSideEncryption" not in c.put_object(Key="after", Body=b"plain", **b)
    assert c.get_object(Key="put", **b)["Body"].read() == body


@pytest.mark.local_only("starts its own https packrat serve")
def test_form_upload_encryption_fields(tls):
    """A presigned POST whose policy names the encryption fields stores the file SSE-S3 or
    SSE-C; a field the policy does not name is refused (tests/test_post_object.py)."""
    import urllib3
    c = tls_client(tls)
    c.create_bucket(Bucket="sseform")
    pool = urllib3.PoolManager(ca_certs=str(tls.ca))
    body = os.urandom(BLOCK + 9)

    def post(key, fields):
        p = c.generate_presigned_post("sseform", key, Fields=fields,
                                      Conditions=[{k: v} for k, v in fields.items()])
        return pool.request("POST", p["url"], fields=list(p["fields"].items()) + [("file", ("f", body))],
                            redirect=False)
    r = post("s3", {"x-amz-server-side-encryption": "AES256"})
    assert r.status == 204 and r.headers["x-amz-server-side-encryption"] == "AES256", r.data
    got = c.get_object(Bucket="sseform", Key="s3")
    assert got["ServerSideEncryption"] == "AES256" and got["Body"].read() == body
    key = os.urandom(32)
    md5 = base64.b64encode(hashlib.md5(key).digest()).decode()
    r = post("c", {"x-amz-server-side-encryption-customer-algorithm": "AES256",
                   "x-amz-server-side-encryption-customer-key": base64.b64encode(key).decode(),
                   "x-amz-server-side-encryption-customer-key-md5": md5})
    assert r.status == 204 and r.headers["x-amz-server-side-encryption-customer-key-md5"] == md5, r.data
    sse = {"SSECustomerAlgorithm": "AES256", "SSECustomerKey": key}
    assert c.get_object(Bucket="sseform", Key="c", **sse)["Body"].read() == body
    assert code_of(c.get_object, Bucket="sseform", Key="c") == ("InvalidRequest", 400)
    r = post("kms", {"x-amz-server-side-encryption": "aws:kms"})
    assert r.status == 204 and r.headers["x-amz-server-side-encryption"] == "aws:kms", r.data
    assert c.get_object(Bucket="sseform", Key="kms")["Body"].read() == body
    r = post("dsse", {"x-amz-server-side-encryption": "aws:kms:dsse"})
    assert r.status == 501 and b"NotImplemented" in r.data
    assert code_of(c.head_object, Bucket="sseform", Key="dsse")[1] == 404
