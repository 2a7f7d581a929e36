"""TLS on the server (`--tls-cert`/`--tls-key`, rustls): boto3, aws-cli and the admin CLI over
https with a CA made for the test (openssl), plain http refused on the TLS port, a certificate
replaced and reloaded by SIGHUP, a broken reload that keeps the old one, and a key that does
not match its certificate refused at start."""

import hashlib
import os
import signal
import socket
import ssl
import subprocess
import time

import pytest
from botocore.exceptions import ConnectionClosedError, EndpointConnectionError, SSLError

import conftest
from conftest import ROOT_AK, ROOT_SK, Server


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_ca(d):
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
            "-days", "2", "-subj", "/CN=packrat test CA", cwd=d)
    return d / "ca.pem"


def make_cert(d, name):
    """A server certificate for 127.0.0.1 and localhost, signed by the test CA."""
    (d / f"{name}.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
            "-subj", f"/CN={name}", cwd=d)
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext", cwd=d)
    return d / f"{name}.pem", d / f"{name}.key"


def served_cert_sha256(endpoint, ca):
    host, port = endpoint.split("://", 1)[1].split(":")
    ctx = ssl.create_default_context(cafile=str(ca))
    with socket.create_connection((host, int(port)), timeout=10) as raw:
        with ctx.wrap_socket(raw, server_hostname=host) as tls:
            return hashlib.sha256(tls.getpeercert(binary_form=True)).hexdigest()


def pem_sha256(path):
    return hashlib.sha256(ssl.PEM_cert_to_DER_cert(path.read_text())).hexdigest()


def test_https_with_boto3_awscli_admin_and_a_reload(tmp_path, workdir):
    certs = tmp_path / "certs"
    certs.mkdir()
    ca = make_ca(certs)
    cert, key = make_cert(certs, "server")
    live_cert, live_key = certs / "live.pem", certs / "live.key"
    live_cert.write_bytes(cert.read_bytes())
    live_key.write_bytes(key.read_bytes())
    srv = Server(workdir / "tls", extra_args=["--tls-cert", str(live_cert), "--tls-key", str(live_key)]).start()
    try:
        assert srv.endpoint.startswith("https://127.0.0.1:")
        import boto3
        from botocore.config import Config
        c = boto3.client("s3", endpoint_url=srv.endpoint, aws_access_key_id=ROOT_AK,
                         aws_secret_access_key=ROOT_SK, region_name="us-east-1", verify=str(ca),
                         config=Config(s3={"addressing_style": "path"}, retries={"total_max_attempts": 1}))
        c.create_bucket(Bucket="secure")
        c.put_object(Bucket="secure", Key="a", Body=b"over tls")
        assert c.get_object(Bucket="secure", Key="a")["Body"].read() == b"over tls"
        # Without the CA, the certificate is not trusted.
        untrusting = boto3.client("s3", endpoint_url=srv.endpoint, aws_access_key_id=ROOT_AK,
                                  aws_secret_access_key=ROOT_SK, region_name="us-east-1",
                                  config=Config(retries={"total_max_attempts": 1}))
        with pytest.raises(SSLError):
            untrusting.list_buckets()
        # Plain http to the TLS port gets no HTTP answer.
        plain = boto3.client("s3", endpoint_url=srv.endpoint.replace("https://", "http://"),
                             aws_access_key_id=ROOT_AK, aws_secret_access_key=ROOT_SK,
                             region_name="us-east-1", config=Config(retries={"total_max_attempts": 1}))
        # (rustls answers a plain request with a TLS alert, which is no HTTP response.)
        with pytest.raises((ConnectionClosedError, EndpointConnectionError)):
            plain.list_buckets()
        # aws-cli and the admin CLI with the CA.
        env = conftest.aws_env(AWS_CA_BUNDLE=str(ca))
        out = subprocess.run(["aws", "--endpoint-url", srv.endpoint, "s3", "ls", "s3://secure/"],
                             env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0 and " a" in out.stdout, out.stderr
        admin_env = dict(os.environ, PACKRAT_ROOT_ACCESS_KEY=ROOT_AK, PACKRAT_ROOT_SECRET_KEY=ROOT_SK,
                         PACKRAT_CA_CERT=str(ca))
        out = subprocess.run([conftest.BIN, "admin", "--endpoint", srv.endpoint, "key", "list"],
                             env=admin_env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and ROOT_AK in out.stdout, out.stderr
        # SIGHUP: a new certificate for new connections.
        assert served_cert_sha256(srv.endpoint, ca) == pem_sha256(cert)
        cert2, key2 = make_cert(certs, "renewed")
        live_cert.write_bytes(cert2.read_bytes())
        live_key.write_bytes(key2.read_bytes())
        srv.proc.send_signal(signal.SIGHUP)
        deadline = time.time() + 10
        while served_cert_sha256(srv.endpoint, ca) != pem_sha256(cert2):
            assert time.time() < deadline, "the renewed certificate was not served"
            time.sleep(0.1)
        # A broken reload keeps the old certificate.
        live_key.write_text("not a key")
        srv.proc.send_signal(signal.SIGHUP)
        time.sleep(0.5)
        assert served_cert_sha256(srv.endpoint, ca) == pem_sha256(cert2)
        assert c.get_object(Bucket="secure", Key="a")["Body"].read() == b"over tls"
    finally:
        srv.stop()
    assert srv.proc is None


def test_a_wrong_key_for_the_certificate_is_refused_at_start(tmp_path, workdir):
    certs = tmp_path / "certs"
    certs.mkdir()
    make_ca(certs)
    cert, _ = make_cert(certs, "one")
    _, other_key = make_cert(certs, "two")
    r = subprocess.run([conftest.BIN, "serve", "--data-dir", str(workdir / "tls-bad"), "--listen", "127.0.0.1:0",
                        "--tls-cert", str(cert), "--tls-key", str(other_key)],
                       env=dict(os.environ, PACKRAT_ROOT_ACCESS_KEY=ROOT_AK, PACKRAT_ROOT_SECRET_KEY=ROOT_SK),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "do not go together" in r.stderr, r.stderr


def test_the_python_client_over_https(tmp_path, workdir):
    certs = tmp_path / "certs"
    certs.mkdir()
    ca = make_ca(certs)
    cert, key = make_cert(certs, "server")
    srv = Server(workdir / "tls-client", extra_args=["--tls-cert", str(cert), "--tls-key", str(key)]).start()
    try:
        import boto3
        from packrat_client import PackratClient, PackratError

        s3 = boto3.client("s3", endpoint_url=srv.endpoint, aws_access_key_id=ROOT_AK,
                          aws_secret_access_key=ROOT_SK, region_name="us-east-1", verify=str(ca))
        s3.create_bucket(Bucket="pyclient")
        for i in range(5):
            s3.put_object(Bucket="pyclient", Key=f"s/{i}", Body=b"sample %d" % i)
        c = PackratClient(endpoint_url=srv.endpoint, region_name="us-east-1", aws_access_key_id=ROOT_AK,
                          aws_secret_access_key=ROOT_SK, ca_bundle=str(ca))
        got = {s.name: s.data for s in c.batch_get("pyclient", [f"s/{i}" for i in range(5)])}
        assert got == {f"s/{i}": b"sample %d" % i for i in range(5)}
        # The system's roots do not include the test CA: refused, never sent in the clear.
        untrusting = PackratClient(endpoint_url=srv.endpoint, region_name="us-east-1",
                                   aws_access_key_id=ROOT_AK, aws_secret_access_key=ROOT_SK,
                                   ca_bundle="/etc/ssl/certs/ca-certificates.crt")
        with pytest.raises(PackratError) as e:
            list(untrusting.batch_get("pyclient", ["s/0"]))
        assert e.value.code == "TLSError" and "CERTIFICATE_VERIFY_FAILED" in str(e.value), e.value
    finally:
        srv.stop()
