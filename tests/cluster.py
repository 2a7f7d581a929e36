"""Helpers that start a packrat cluster on loopback: a private etcd (Debian's etcd-server),
storage nodes (`packrat node`) and gateways (`packrat gateway`). Used by tests/test_cluster.py
and by the cluster mode of the client tests (PACKRAT_TEST_TARGET=cluster, see conftest.py)."""

import hashlib
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.request

from conftest import BIN, ROOT_AK, ROOT_SK, Server

ETCD = shutil.which("etcd")
PGS = 64


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_etcd(url, timeout=30):
    """Waits until the etcd at `url` says it is healthy."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(url + "/health", timeout=1) as r:
                if json.load(r).get("health") == "true":
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError("etcd did not start")


class Etcd:
    """A private single-member etcd on free loopback ports with its own data directory."""

    def __init__(self, data_dir):
        self.data_dir = str(data_dir)
        self.client_port = free_port()
        self.peer_port = free_port()
        self.url = f"http://127.0.0.1:{self.client_port}"
        self.peer = f"http://127.0.0.1:{self.peer_port}"
        self.proc = None

    def argv_prefix(self):
        """What runs etcd's command (another network namespace, say)."""
        return []

    def wait_healthy(self):
        wait_for_etcd(self.url)

    def start(self):
        log = open(self.data_dir + ".log", "ab")
        self.proc = subprocess.Popen(
            [*self.argv_prefix(), ETCD, "--name", "t", "--data-dir", self.data_dir,
             "--listen-client-urls", self.url, "--advertise-client-urls", self.url,
             "--listen-peer-urls", self.peer, "--initial-advertise-peer-urls", self.peer,
             "--initial-cluster", f"t={self.peer}", "--log-level", "warn"],
            stdout=log, stderr=log)
        log.close()
        self.wait_healthy()
        return self

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=20)
        self.proc = None


class Node(Server):
    """`packrat node`: its internal API listens on a fixed port across restarts; with `s3`, so
    does its S3 read endpoint (`s3_endpoint`)."""

    def __init__(self, data_dir, etcd_url, extra_args=(), extra_env=None, s3=False):
        super().__init__(data_dir, extra_args=extra_args, extra_env=extra_env, sticky_port=True)
        self.etcd_url = etcd_url
        self.s3_endpoint = f"http://127.0.0.1:{free_port()}" if s3 else None

    def argv(self):
        s3 = ["--s3-listen", self.s3_endpoint.split("://", 1)[1]] if self.s3_endpoint else []
        return [BIN, "node", "--etcd", self.etcd_url, "--data-dir", self.data_dir,
                "--listen", self.listen, "--disk-probe-interval", "0", *s3, *self.extra_args]


class Gateway(Server):
    def __init__(self, data_dir, etcd_url):
        super().__init__(data_dir)
        self.etcd_url = etcd_url

    def argv(self):
        return [BIN, "gateway", "--etcd", self.etcd_url, "--listen", self.listen]


def cluster_cmd(etcd_url, *args, timeout=60):
    env = dict(os.environ, PACKRAT_ROOT_ACCESS_KEY=ROOT_AK, PACKRAT_ROOT_SECRET_KEY=ROOT_SK)
    return subprocess.run([BIN, "cluster", "--etcd", etcd_url, *args], env=env,
                          capture_output=True, text=True, timeout=timeout)


def status(etcd_url):
    r = cluster_cmd(etcd_url, "status")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def wait_for(what, check, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def healthy(etcd_url, nodes):
    s = status(etcd_url)
    return s["pgs_healthy"] == PGS and len(s["nodes"]) == nodes and s


def start_cluster(base, nodes=3, gateways=1, node_args=(), node_env=None, s3=False):
    """etcd, `nodes` nodes with R=3 and `gateways` gateways under `base`; waits until every PG
    has its replicas. `node_args` is a list, or a function of the node's number giving one;
    so is `node_env` (a dict of environment variables, or a function giving one). With `s3`,
    every node has an S3 read endpoint."""
    base.mkdir(parents=True, exist_ok=True)
    etcd = Etcd(base / "etcd").start()
    r = cluster_cmd(etcd.url, "init", "--pgs", str(PGS), "--replicas", "3")
    assert r.returncode == 0, r.stderr
    args = node_args if callable(node_args) else (lambda i: node_args)
    envs = node_env if callable(node_env) else (lambda i: node_env)
    started = [Node(base / f"node{i}", etcd.url, args(i), envs(i), s3=s3).start() for i in range(nodes)]
    wait_for(f"{nodes} healthy nodes", lambda: healthy(etcd.url, nodes))
    gws = [Gateway(base / f"gw{i}", etcd.url).start() for i in range(gateways)]
    return etcd, started, gws


def versioned_body(key, v, repeat):
    """Version `v` of `key`'s bytes: the key and version, then a digest of them `repeat`
    times, so that a torn body or another key's bytes are told apart from a right one."""
    head = f"{key} v{v} ".encode()
    return head + hashlib.sha256(head).hexdigest().encode() * repeat


def version_of(key, data, body):
    """The version `data` is of `key`, checked whole against `body(key, version)`."""
    head, _, rest = data.partition(b" v")
    assert head.decode() == key, (key, data[:40])
    v = int(rest.partition(b" ")[0])
    assert data == body(key, v), (key, v, "torn or wrong bytes")
    return v


def overwrite_in_turn(gw, bucket, keys, version, acked, lock, stop):
    """Writes versions 1, 2, ... of `keys` through `gw` until `stop` is set, keeping in
    `acked` (under `lock`) the newest version of each key acknowledged; a failed write
    raises."""
    c = gw.client()
    v = 0
    while not stop.is_set():
        v += 1
        for k in keys:
            c.put_object(Bucket=bucket, Key=k, Body=version(k, v))
            with lock:
                acked[k] = max(acked[k], v)
