"""Restart and crash: acknowledged writes survive a clean restart and kill -9 under load."""

import hashlib
import json
import os
import random
import subprocess
import threading
import time

import pytest
from botocore.exceptions import ClientError, HTTPClientError
from botocore.exceptions import ConnectionError as BotoConnectionError

import conftest

CRASH_CYCLES = int(os.environ.get("PACKRAT_CRASH_CYCLES", "20"))


def start_with_uring(data_dir):
    """A server whose every read goes through io_uring, so that path is tested end to end;
    a kernel without io_uring gets the default backend instead."""
    try:
        return conftest.Server(data_dir, extra_args=["--io-backend", "uring"]).start()
    except RuntimeError:
        return conftest.Server(data_dir).start()


def test_data_survives_clean_restart(workdir):
    srv = start_with_uring(workdir / "restart")
    c = srv.client()
    c.create_bucket(Bucket="keep")
    blobs = {f"k{i}": os.urandom(random.randint(0, 3 * 1024 * 1024 if i % 10 == 0 else 5000)) for i in range(60)}
    for k, v in blobs.items():
        c.put_object(Bucket="keep", Key=k, Body=v, Metadata={"n": k})
    uid = c.create_multipart_upload(Bucket="keep", Key="pending")["UploadId"]
    c.upload_part(Bucket="keep", Key="pending", UploadId=uid, PartNumber=1, Body=b"p" * 100)
    srv.stop()
    srv.start()
    c = srv.client()
    for k, v in blobs.items():
        g = c.get_object(Bucket="keep", Key=k)
        assert g["Body"].read() == v and g["Metadata"] == {"n": k}
    assert len(c.list_objects_v2(Bucket="keep")["Contents"]) == 60
    parts = c.list_parts(Bucket="keep", Key="pending", UploadId=uid)["Parts"]
    assert [p["Size"] for p in parts] == [100]
    srv.stop()


# What a request cut by the kill looks like to botocore: no HTTP response at all (a reset or
# closed connection, a refused reconnect, a timeout). Any of these before the kill, and any
# HTTP error at all, is a failure of the test.
CUT_BY_KILL = (HTTPClientError, BotoConnectionError)

ABSENT = None  # the state of a key with no object


class Load:
    """Mixed load from several threads: PUT, overwrite, DELETE, DeleteObjects, CopyObject and
    multipart uploads (create, parts, complete). Each thread works on its own keys, so the
    state every key must have is known: `state[key]` is the md5 of its acknowledged body, or
    ABSENT once a delete of it was acknowledged; `inflight[key]` is (old, new) for a key whose
    request had not been answered when the server died. A thread's error other than a cut
    connection after the kill is kept in `errors` and fails the test."""

    def __init__(self, srv, bucket, cycle, threads=8):
        self.srv, self.bucket, self.cycle = srv, bucket, cycle
        self.state = {}
        self.inflight = {}
        self.errors = []
        self.killed = threading.Event()  # set just before the kill: cut requests expected
        self.puts = 0            # acknowledged writes (PUT, overwrite, copy, multipart)
        self.ops = {"put": 0, "overwrite": 0, "delete": 0, "delete_objects": 0, "copy": 0, "multipart": 0}
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.run, args=(t,), daemon=True) for t in range(threads)]

    def _begin(self, changes):
        """changes: key -> the state the request gives it."""
        with self.lock:
            for key, new in changes.items():
                self.inflight[key] = (self.state.get(key, ABSENT), new)

    def _done(self, op, keys):
        with self.lock:
            for key in keys:
                self.state[key] = self.inflight.pop(key)[1]
            self.ops[op] += 1
            if op not in ("delete", "delete_objects"):
                self.puts += 1

    def run(self, t):
        c = self.srv.client()  # one attempt per call: a retry would hide a 500 before the kill
        rnd = random.Random(self.cycle * 1000 + t)
        i = 0
        mine = []
        b = self.bucket
        try:
            while not self.stop.is_set():
                i += 1
                r = rnd.random()
                if mine and r < 0.08:
                    key = mine.pop(rnd.randrange(len(mine)))
                    self._begin({key: ABSENT})
                    c.delete_object(Bucket=b, Key=key)
                    self._done("delete", [key])
                elif len(mine) >= 3 and r < 0.12:
                    keys = [mine.pop(rnd.randrange(len(mine))) for _ in range(3)]
                    self._begin({k: ABSENT for k in keys})
                    out = c.delete_objects(Bucket=b, Delete={"Objects": [{"Key": k} for k in keys], "Quiet": True})
                    assert not out.get("Errors"), out["Errors"]
                    self._done("delete_objects", keys)
                elif mine and r < 0.20:
                    key = rnd.choice(mine)
                    body = rnd.randbytes(rnd.choice([1000, 30000]))
                    self._begin({key: hashlib.md5(body).hexdigest()})
                    c.put_object(Bucket=b, Key=key, Body=body)
                    self._done("overwrite", [key])
                elif mine and r < 0.26:
                    src = rnd.choice(mine)
                    with self.lock:
                        md5 = self.state[src]
                    key = f"c{self.cycle:03d}/t{t}/copy{i:06d}"
                    self._begin({key: md5})
                    c.copy_object(Bucket=b, Key=key, CopySource={"Bucket": b, "Key": src})
                    self._done("copy", [key])
                    mine.append(key)
                elif r < 0.28:
                    key = f"c{self.cycle:03d}/t{t}/mp{i:06d}"
                    parts = [rnd.randbytes(5 * 1024 * 1024), rnd.randbytes(rnd.randint(1, 100000))]
                    self._begin({key: hashlib.md5(b"".join(parts)).hexdigest()})
                    uid = c.create_multipart_upload(Bucket=b, Key=key)["UploadId"]
                    done = []
                    for n, p in enumerate(parts, 1):
                        e = c.upload_part(Bucket=b, Key=key, UploadId=uid, PartNumber=n, Body=p)["ETag"]
                        done.append({"PartNumber": n, "ETag": e})
                    c.complete_multipart_upload(Bucket=b, Key=key, UploadId=uid,
                                                MultipartUpload={"Parts": done})
                    self._done("multipart", [key])
                    mine.append(key)
                else:
                    key = f"c{self.cycle:03d}/t{t}/{i:06d}"
                    size = rnd.choice([1024, 4096, 20000, 150000]) if rnd.random() > 0.03 else 2 * 1024 * 1024 + 1
                    body = rnd.randbytes(size)
                    self._begin({key: hashlib.md5(body).hexdigest()})
                    c.put_object(Bucket=b, Key=key, Body=body)
                    self._done("put", [key])
                    mine.append(key)
        except CUT_BY_KILL as e:
            if not self.killed.is_set():
                self.errors.append(f"thread {t}: connection failed before the kill: {e!r}")
        except Exception as e:  # noqa: BLE001 - every other failure is kept and fails the test
            self.errors.append(f"thread {t}: {e!r}")

    def start(self):
        for th in self.threads:
            th.start()

    def join(self):
        self.stop.set()
        for th in self.threads:
            th.join(timeout=60)
            assert not th.is_alive(), "a load thread hung after the kill"


def read_state(client, bucket, key):
    """The md5 of the key's body, or ABSENT if the server answers 404 NoSuchKey (any other
    error raises)."""
    try:
        body = client.get_object(Bucket=bucket, Key=key)["Body"].read()
    except ClientError as e:
        if e.response["Error"]["Code"] == "NoSuchKey" and e.response["ResponseMetadata"]["HTTPStatusCode"] == 404:
            return ABSENT
        raise
    return hashlib.md5(body).hexdigest()


def verify(client, bucket, state):
    for key, want in state.items():
        got = read_state(client, bucket, key)
        assert got == want, f"{key}: read {got or 'NoSuchKey'}, acknowledged {want or 'a delete'}"


def settle_inflight(client, bucket, inflight):
    """Each key with a request in flight at the kill reads back as its old or its new state,
    nothing else; returns the states read, which the later cycles then expect."""
    settled = {}
    for key, (old, new) in inflight.items():
        got = read_state(client, bucket, key)
        assert got in (old, new), f"{key} (in flight at the kill): read {got}, expected {old} or {new}"
        settled[key] = got
    return settled


def tree_snapshot(root):
    """Every file and directory under root with its size and modification time."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            st = os.lstat(os.path.join(dirpath, n))
            out.append((os.path.relpath(os.path.join(dirpath, n), root), st.st_size, st.st_mtime_ns))
    return sorted(out)


def offline_verify(data_dir, ec_args, snapshot_root):
    """`admin verify --json` on a stopped server's directory; asserts it changed nothing."""
    before = tree_snapshot(snapshot_root)
    out = subprocess.run([conftest.BIN, "admin", "--data-dir", data_dir, "verify", "--json", *ec_args],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert tree_snapshot(snapshot_root) == before, "the offline verifier changed the data directory"
    return json.loads(out.stdout)


@pytest.mark.parametrize("layout", ["single-disk", "ec-4+2"])
def test_kill9_under_concurrent_put_load(workdir, layout):
    # Small segments so the crash cycles also cross segment rotations.
    # Background compaction every second, so kills also land in the middle of moves.
    # With erasure coding on six disk directories, segments idle for a second are sealed and
    # encoded, so kills also land in the middle of seals.
    cycles = CRASH_CYCLES if layout == "single-disk" else max(1, CRASH_CYCLES // 2)
    data = workdir / f"crash-{layout}"
    ec_args = []
    if layout.startswith("ec"):
        data.mkdir()
        ec_args = ["--ec", "4+2"]
        for i in range(6):
            ec_args += ["--disk", str(data / f"disk{i}")]
    srv = conftest.Server(data / "data" if ec_args else data, extra_args=[
        "--segment-size", str(4 * 1024 * 1024), "--compact-interval", "1", "--compact-threshold", "0.7",
        *ec_args, *(["--seal-idle", "1"] if ec_args else []),
    ]).start()
    srv.client().create_bucket(Bucket="crash")
    state = {}               # every key ever written: its md5, or ABSENT
    rnd = random.Random(7)
    total_acked = 0
    inflight_checked = 0
    ops = {}
    last_verify = {}
    for cycle in range(cycles):
        load = Load(srv, "crash", cycle)
        load.start()
        time.sleep(rnd.uniform(0.4, 1.2))
        load.killed.set()
        srv.kill9()  # the server dies with requests in flight
        load.join()
        assert not load.errors, load.errors
        with load.lock:
            state.update(load.state)
            inflight = dict(load.inflight)
            total_acked += load.puts
            for k, v in load.ops.items():
                ops[k] = ops.get(k, 0) + v
        # Offline, on the raw post-kill directory, without changing a byte of it: the index
        # and the segments agree, and the index holds every acknowledged object (and at most
        # the in-flight ones besides).
        report = offline_verify(srv.data_dir, ec_args, data)
        present = sum(1 for k, v in state.items() if v is not ABSENT and k not in inflight)
        maybe = sum(1 for old, new in inflight.values() if old is not ABSENT or new is not ABSENT)
        assert present <= report["objects"] <= present + maybe, (report, present, maybe)
        last_verify = report
        # The server recovers the raw directory by itself, then the checks read through it.
        srv.start()
        c = srv.client()
        verify(c, "crash", {k: v for k, v in load.state.items() if k not in inflight})
        state.update(settle_inflight(c, "crash", inflight))
        inflight_checked += len(inflight)
    assert total_acked > cycles * 20, "the load generator acknowledged too little to mean anything"
    c = srv.client()
    verify(c, "crash", state)
    listed = set()
    for page in c.get_paginator("list_objects_v2").paginate(Bucket="crash"):
        listed |= {o["Key"] for o in page.get("Contents", [])}
    assert listed == {k for k, v in state.items() if v is not ABSENT}
    log = open(srv.log_path).read()
    runs = log.count("compaction finished")
    print(f"\ncompaction runs completed during the test: {runs}")
    if ec_args:
        print(f"segments encoded during the test: {log.count('segment encoded into shards')}")
    deleted = sum(1 for v in state.values() if v is ABSENT)
    print(f"\ncrash test ({layout}): {cycles} kill -9 cycles, {total_acked} acknowledged writes, "
          f"{len(state) - deleted} objects verified, {deleted} deletes verified as NoSuchKey, "
          f"{inflight_checked} keys in flight at a kill read back as their old or new state; "
          f"acknowledged operations: {ops}\nlast offline verify: {last_verify}")
    srv.stop()


def test_offline_verify_reads_only_and_refuses_what_is_not_a_stopped_store(workdir):
    def run_verify(path):
        return subprocess.run([conftest.BIN, "admin", "--data-dir", str(path), "verify", "--json"],
                              capture_output=True, text=True, timeout=120)

    # An empty directory, a missing one and a foreign one are refused, and nothing is created.
    empty = workdir / "verify-empty"
    empty.mkdir()
    out = run_verify(empty)
    assert out.returncode != 0 and "no packrat index" in out.stderr, out.stderr
    assert list(empty.iterdir()) == []
    out = run_verify(workdir / "verify-missing")
    assert out.returncode != 0 and "not a directory" in out.stderr, out.stderr
    assert not (workdir / "verify-missing").exists()
    foreign = workdir / "verify-foreign"
    (foreign / "index").mkdir(parents=True)
    (foreign / "index" / "CURRENT").write_text("MANIFEST-000001\n")
    out = run_verify(foreign)
    assert out.returncode != 0 and "not a packrat index" in out.stderr, out.stderr

    # A running server's directory is refused (its index is in use).
    srv = conftest.Server(workdir / "verify-data").start()
    c = srv.client()
    c.create_bucket(Bucket="va-one")
    c.create_bucket(Bucket="va-two")
    for i in range(7):
        c.put_object(Bucket="va-one" if i % 2 else "va-two", Key=f"k{i}", Body=os.urandom(1000 + i))
    uid = c.create_multipart_upload(Bucket="va-one", Key="pending")["UploadId"]
    c.upload_part(Bucket="va-one", Key="pending", UploadId=uid, PartNumber=1, Body=b"p" * 100)
    c.delete_object(Bucket="va-one", Key="k1")
    out = run_verify(srv.data_dir)
    assert out.returncode != 0 and "in use" in out.stderr, out.stderr

    # Killed: the raw directory verifies with the counts the test wrote, and is left unchanged.
    srv.kill9()
    report = offline_verify(srv.data_dir, [], srv.data_dir)
    assert (report["buckets"], report["objects"], report["parts"]) == (2, 6, 1), report
    assert report["records_checked"] == 7 and report["problem_count"] == 0, report
