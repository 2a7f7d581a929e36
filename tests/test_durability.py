"""Restart and crash: acknowledged writes survive a clean restart and kill -9 under load."""

import hashlib
import os
import random
import subprocess
import threading
import time

import pytest
from botocore.exceptions import ClientError

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


class Load:
    """Mixed load from several threads: PUT, overwrite, DELETE, DeleteObjects, CopyObject and
    multipart uploads (create, parts, complete). Records only what the server acknowledged.
    Each thread works on its own keys, so the expected state of every key is known."""

    def __init__(self, srv, bucket, cycle, threads=8):
        self.srv, self.bucket, self.cycle = srv, bucket, cycle
        self.acked = {}          # key -> md5 of the acknowledged body
        self.deleted = set()     # keys whose DELETE was acknowledged
        self.uncertain = set()   # keys with a request in flight at the crash
        self.puts = 0            # acknowledged writes (PUT, overwrite, copy, multipart)
        self.ops = {"put": 0, "overwrite": 0, "delete": 0, "delete_objects": 0, "copy": 0, "multipart": 0}
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.run, args=(t,), daemon=True) for t in range(threads)]

    def _begin(self, *keys):
        with self.lock:
            self.uncertain.update(keys)

    def _written(self, op, key, md5):
        with self.lock:
            self.uncertain.discard(key)
            self.deleted.discard(key)
            self.acked[key] = md5
            self.puts += 1
            self.ops[op] += 1

    def _removed(self, op, keys):
        with self.lock:
            for key in keys:
                self.uncertain.discard(key)
                self.acked.pop(key, None)
                self.deleted.add(key)
            self.ops[op] += 1

    def run(self, t):
        c = self.srv.client()
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
                    self._begin(key)
                    c.delete_object(Bucket=b, Key=key)
                    self._removed("delete", [key])
                elif len(mine) >= 3 and r < 0.12:
                    keys = [mine.pop(rnd.randrange(len(mine))) for _ in range(3)]
                    self._begin(*keys)
                    c.delete_objects(Bucket=b, Delete={"Objects": [{"Key": k} for k in keys], "Quiet": True})
                    self._removed("delete_objects", keys)
                elif mine and r < 0.20:
                    key = rnd.choice(mine)
                    body = rnd.randbytes(rnd.choice([1000, 30000]))
                    self._begin(key)
                    c.put_object(Bucket=b, Key=key, Body=body)
                    self._written("overwrite", key, hashlib.md5(body).hexdigest())
                elif mine and r < 0.26:
                    src = rnd.choice(mine)
                    with self.lock:
                        md5 = self.acked.get(src)
                    key = f"c{self.cycle:03d}/t{t}/copy{i:06d}"
                    self._begin(key)
                    c.copy_object(Bucket=b, Key=key, CopySource={"Bucket": b, "Key": src})
                    self._written("copy", key, md5)
                    mine.append(key)
                elif r < 0.28:
                    key = f"c{self.cycle:03d}/t{t}/mp{i:06d}"
                    parts = [rnd.randbytes(5 * 1024 * 1024), rnd.randbytes(rnd.randint(1, 100000))]
                    self._begin(key)
                    uid = c.create_multipart_upload(Bucket=b, Key=key)["UploadId"]
                    done = []
                    for n, p in enumerate(parts, 1):
                        e = c.upload_part(Bucket=b, Key=key, UploadId=uid, PartNumber=n, Body=p)["ETag"]
                        done.append({"PartNumber": n, "ETag": e})
                    c.complete_multipart_upload(Bucket=b, Key=key, UploadId=uid,
                                                MultipartUpload={"Parts": done})
                    self._written("multipart", key, hashlib.md5(b"".join(parts)).hexdigest())
                    mine.append(key)
                else:
                    key = f"c{self.cycle:03d}/t{t}/{i:06d}"
                    size = rnd.choice([1024, 4096, 20000, 150000]) if rnd.random() > 0.03 else 2 * 1024 * 1024 + 1
                    body = rnd.randbytes(size)
                    self._begin(key)
                    c.put_object(Bucket=b, Key=key, Body=body)
                    self._written("put", key, hashlib.md5(body).hexdigest())
                    mine.append(key)
        except Exception:
            return  # the server died under us; whatever was in flight stays uncertain

    def start(self):
        for th in self.threads:
            th.start()

    def join(self):
        self.stop.set()
        for th in self.threads:
            th.join(timeout=60)


def verify(client, bucket, acked, deleted, uncertain):
    for key, md5 in acked.items():
        if key in uncertain:
            continue
        body = client.get_object(Bucket=bucket, Key=key)["Body"].read()
        assert hashlib.md5(body).hexdigest() == md5, f"{key} corrupted"
    for key in deleted - uncertain:
        with pytest.raises(ClientError):
            client.head_object(Bucket=bucket, Key=key)


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
    all_acked, all_deleted, all_uncertain = {}, set(), set()
    rnd = random.Random(7)
    total_acked = 0
    ops = {}
    last_verify = ""
    for cycle in range(cycles):
        load = Load(srv, "crash", cycle)
        load.start()
        time.sleep(rnd.uniform(0.4, 1.2))
        srv.kill9()  # the server dies with requests in flight
        load.join()
        # Offline, before the restart: the index and the segments agree (no acknowledged
        # object points at a torn or missing record).
        out = subprocess.run([conftest.BIN, "admin", "--data-dir", srv.data_dir, "verify", *ec_args],
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stdout + out.stderr
        last_verify = out.stdout
        with load.lock:
            all_acked.update(load.acked)
            for k in load.deleted:
                all_acked.pop(k, None)
            all_deleted |= load.deleted
            all_uncertain |= load.uncertain
            total_acked += load.puts
            for k, v in load.ops.items():
                ops[k] = ops.get(k, 0) + v
        srv.start()
        c = srv.client()
        # Everything acknowledged in this cycle reads back intact right after the restart.
        verify(c, "crash", {k: v for k, v in load.acked.items() if k not in load.deleted}, load.deleted, all_uncertain)
    assert total_acked > cycles * 20, "the load generator acknowledged too little to mean anything"
    c = srv.client()
    verify(c, "crash", all_acked, all_deleted, all_uncertain)
    listed = set()
    for page in c.get_paginator("list_objects_v2").paginate(Bucket="crash"):
        listed |= {o["Key"] for o in page.get("Contents", [])}
    assert set(all_acked) - all_uncertain <= listed
    assert not (listed & (all_deleted - all_uncertain))
    log = open(srv.log_path).read()
    runs = log.count("compaction finished")
    print(f"\ncompaction runs completed during the test: {runs}")
    if ec_args:
        print(f"segments encoded during the test: {log.count('segment encoded into shards')}")
    print(f"\ncrash test ({layout}): {cycles} kill -9 cycles, {total_acked} acknowledged writes, "
          f"{len(all_acked)} objects verified, {len(all_deleted)} acknowledged deletes verified; "
          f"acknowledged operations: {ops}\nlast offline verify:\n{last_verify}")
    srv.stop()
