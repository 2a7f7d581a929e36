"""Test harness: starts the real `packrat` binary on a free loopback port and hands out
boto3 clients. Nothing here mocks S3 or storage."""

import http.client
import os
import pathlib
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
import uuid

import boto3
import pytest
from botocore.config import Config

ROOT = pathlib.Path(__file__).resolve().parent.parent
# The Python client (sdk-examples/python) is tested as users get it: installed with pip (the
# README's setup does `pip install ./sdk-examples/python`), never from the source tree.
TARGET_DIR = pathlib.Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
BIN = os.environ.get("PACKRAT_BIN", str(TARGET_DIR / "debug" / "packrat"))
ROOT_AK = "PKTESTROOTKEY"
ROOT_SK = "test-root-secret-0123456789abcdef"
REGION = "us-east-1"
# PACKRAT_TEST_TARGET=cluster runs the client tests against a gateway of a three-node cluster
# (etcd, `packrat node` x3 with R=3, `packrat gateway`) instead of `packrat serve`; tests of
# what a cluster cannot do yet are marked `local_only` and skipped there, saying why.
CLUSTER_MODE = os.environ.get("PACKRAT_TEST_TARGET") == "cluster"


# PyTorch readers run in the opt-in torch mode only (torch is a multi-gigabyte install; see
# tests/test_torch.py): without torch the module is not collected, and the header says so.
try:
    import torch  # noqa: F401

    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False
collect_ignore = [] if HAVE_TORCH else ["test_torch.py"]


TORCH_MODE = ("torch mode on: tests/test_torch.py collected" if HAVE_TORCH else
              "torch mode off: tests/test_torch.py (s3torchconnector, DataLoader workers) not "
              "collected; see the README's opt-in torch mode")


def pytest_report_header(config):
    return TORCH_MODE


def pytest_terminal_summary(terminalreporter):
    # Also at the end, where `-q` (scripts/test.sh) still prints it.
    terminalreporter.write_line(TORCH_MODE)


class Server:
    """One packrat process over a data directory; can be stopped, killed and restarted."""

    def __init__(self, data_dir, extra_args=(), extra_env=None, sticky_port=False):
        self.data_dir = str(data_dir)
        self.extra_args = list(extra_args)
        self.extra_env = dict(extra_env or {})
        # Restart on the port of the first start (for a server other processes point at).
        self.sticky_port = sticky_port
        self.listen = "127.0.0.1:0"
        self.proc = None
        self.endpoint = None
        self.log_path = os.path.join(os.path.dirname(self.data_dir), os.path.basename(self.data_dir) + ".log")

    # Every Server object, so that what a test started is stopped even when the test fails.
    instances = []

    def start(self, timeout=60):
        if self not in Server.instances:
            Server.instances.append(self)
        env = dict(os.environ)
        env["PACKRAT_ROOT_ACCESS_KEY"] = ROOT_AK
        env["PACKRAT_ROOT_SECRET_KEY"] = ROOT_SK
        env.setdefault("PACKRAT_LOG", "info")
        env.update(self.extra_env)
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            self.argv(),
            stdout=subprocess.PIPE,
            stderr=log,
            env=env,
        )
        log.close()
        deadline = time.time() + timeout
        buf = b""
        while time.time() < deadline:
            r, _, _ = select.select([self.proc.stdout], [], [], 0.5)
            if r:
                chunk = os.read(self.proc.stdout.fileno(), 4096)
                if not chunk:
                    break
                buf += chunk
                for line in buf.decode(errors="replace").splitlines():
                    if "listening on http://" in line or "listening on https://" in line:
                        self.endpoint = line.split("listening on ", 1)[1].strip()
                        if self.sticky_port:
                            self.listen = self.endpoint.split("://", 1)[1]
                        return self
            if self.proc.poll() is not None:
                break
        raise RuntimeError(f"packrat did not start: {buf!r}; log: {self.log_path}")

    def argv(self):
        return [BIN, "serve", "--data-dir", self.data_dir, "--listen", self.listen, *self.extra_args]

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def kill9(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
        self.proc = None

    def packrat(self, ak=ROOT_AK, sk=ROOT_SK, **options):
        """A packrat_client.PackratClient (the extensions' Python client) for this server."""
        from packrat_client import PackratClient

        return PackratClient(endpoint_url=self.endpoint, region_name=REGION,
                             aws_access_key_id=ak, aws_secret_access_key=sk, **options)

    def client(self, ak=ROOT_AK, sk=ROOT_SK, **config):
        # One attempt per call (botocore's `max_attempts` counts retries, `total_max_attempts`
        # attempts): a retry would hide a 500, a reset or an injected fault from the test.
        opts = {
            "s3": {"addressing_style": "path"},
            "retries": {"total_max_attempts": 1, "mode": "standard"},
            "connect_timeout": 10,
            "read_timeout": 120,
        }
        opts.update(config)
        cfg = Config(**opts)
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=ak,
            aws_secret_access_key=sk,
            region_name=REGION,
            config=cfg,
        )


def aws_env(**extra):
    """The environment for aws-cli and example scripts: root credentials, no user config."""
    env = dict(os.environ)
    env.update(
        AWS_ACCESS_KEY_ID=ROOT_AK,
        AWS_SECRET_ACCESS_KEY=ROOT_SK,
        AWS_DEFAULT_REGION=REGION,
        AWS_CONFIG_FILE=os.devnull,
        AWS_SHARED_CREDENTIALS_FILE=os.devnull,
        **extra,
    )
    return env


@pytest.fixture(autouse=True)
def stop_servers_a_test_started():
    """Stops the servers a test started and left running (a failed assertion before its
    `srv.stop()`), so none outlives its test. Servers of wider fixtures, started before the
    test, are left alone."""
    before = list(Server.instances)
    yield
    for srv in Server.instances:
        if srv not in before and srv.proc is not None:
            srv.stop()
    Server.instances[:] = [srv for srv in Server.instances if srv in before]


@pytest.fixture(scope="session")
def workdir():
    d = tempfile.mkdtemp(prefix="packrat-tests-")
    yield pathlib.Path(d)
    if os.environ.get("PACKRAT_KEEP_TEST_DATA") != "1":
        shutil.rmtree(d, ignore_errors=True)


def pytest_configure(config):
    config.addinivalue_line("markers", "local_only: needs `packrat serve` (not yet through a cluster gateway)")


def pytest_collection_modifyitems(config, items):
    if CLUSTER_MODE:
        default = "not yet through a cluster gateway (docs/s3-compatibility.md)"
        for item in items:
            marker = item.get_closest_marker("local_only")
            if marker is not None:
                # `@pytest.mark.local_only("why")` says why where the default does not.
                item.add_marker(pytest.mark.skip(reason=marker.args[0] if marker.args else default))


@pytest.fixture(scope="session")
def server(workdir):
    if CLUSTER_MODE:
        from cluster import start_cluster

        etcd, nodes, (gateway,) = start_cluster(workdir / "shared-cluster", s3=True)
        yield gateway
        for p in [gateway, *nodes]:
            p.stop()
        etcd.stop()
        return
    s = Server(workdir / "shared").start()
    yield s
    s.stop()


@pytest.fixture(scope="session")
def s3(server):
    return server.client()


def empty_bucket(client, name):
    try:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=name):
            keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
            if keys:
                client.delete_objects(Bucket=name, Delete={"Objects": keys, "Quiet": True})
        for u in client.list_multipart_uploads(Bucket=name).get("Uploads", []):
            client.abort_multipart_upload(Bucket=name, Key=u["Key"], UploadId=u["UploadId"])
        client.delete_bucket(Bucket=name)
    except Exception:
        pass


@pytest.fixture
def bucket(s3):
    name = "t-" + uuid.uuid4().hex[:20]
    s3.create_bucket(Bucket=name)
    yield name
    empty_bucket(s3, name)


def console_request(srv, method, path, headers=None, body=None):
    """One plain HTTP request to a server, as the web console's page makes them: (status,
    lower-cased headers, body)."""
    u = urllib.parse.urlparse(srv.endpoint)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
    c.request(method, path, body=body, headers=headers or {})
    r = c.getresponse()
    out = (r.status, {k.lower(): v for k, v in r.getheaders()}, r.read())
    c.close()
    return out
