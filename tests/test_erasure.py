"""Erasure coding against the real binary: six disk directories with --ec 4+2, 10,000 objects of
mixed sizes (1 KiB to 20 MiB, some multipart). Segments seal and are encoded; then whole disk
directories are deleted, shards are corrupted, and more disks are lost than the code covers.
Every read is checked byte for byte: the server serves the right bytes or a clear error, never
wrong data."""

import concurrent.futures as cf
import hashlib
import json
import os
import random
import shutil
import subprocess
import time
import urllib.request

from boto3.s3.transfer import TransferConfig
from botocore.exceptions import ClientError

import conftest
from conftest import Server

# Objects written and read back five times: mostly small, one in 100 medium, one in 1000 of
# 5 to 20 MiB (multipart from 8 MiB). PACKRAT_EC_TEST_OBJECTS=10000 is the long mode
# (docs/reliability.md); the default keeps three large objects and some 25 sealed segments.
OBJECTS = int(os.environ.get("PACKRAT_EC_TEST_OBJECTS", "3000"))
BUCKET = "ecdata"


def admin(srv, *args, check=True):
    env = dict(os.environ, PACKRAT_ROOT_ACCESS_KEY=conftest.ROOT_AK, PACKRAT_ROOT_SECRET_KEY=conftest.ROOT_SK)
    out = subprocess.run([conftest.BIN, "admin", "--endpoint", srv.endpoint, *args],
                         capture_output=True, text=True, timeout=600, env=env)
    if check:
        assert out.returncode == 0, out.stdout + out.stderr
    return out


def status(srv):
    return json.loads(admin(srv, "status").stdout)


def sizes():
    """Mostly small samples, some medium, a few large (two of them multipart)."""
    rnd = random.Random(5)
    out = []
    for i in range(OBJECTS):
        if i % 1000 == 999:
            out.append(rnd.randint(5 << 20, 20 << 20))
        elif i % 100 == 50:
            out.append(rnd.randint(64 << 10, 2 << 20))
        else:
            out.append(rnd.randint(1 << 10, 16 << 10))
    return out


def body(i, n):
    return random.Random(i * 7919 + n).randbytes(n)


def key(i):
    return f"samples/{i:05d}.bin"


def wait_until(cond, timeout=60, what="condition"):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def read_all(srv, expected, allow_lost=False):
    """GETs every object and compares its md5. Returns (ok, lost) counts; a lost object is a
    clean 500 InternalError, and only allowed with allow_lost."""
    def check(chunk):
        c = srv.client()
        ok = lost = 0
        for k, md5 in chunk:
            try:
                got = c.get_object(Bucket=BUCKET, Key=k)["Body"].read()
            except ClientError as e:
                code = e.response["Error"]["Code"]
                status = e.response["ResponseMetadata"]["HTTPStatusCode"]
                assert allow_lost and code == "InternalError" and status == 500, (k, code, status)
                lost += 1
                continue
            assert hashlib.md5(got).hexdigest() == md5, f"wrong bytes for {k}"
            ok += 1
        return ok, lost

    items = sorted(expected.items())
    chunks = [items[i::8] for i in range(8)]
    with cf.ThreadPoolExecutor(8) as ex:
        results = list(ex.map(check, chunks))
    return sum(r[0] for r in results), sum(r[1] for r in results)


def check_ranges_and_batch(srv, expected, sizes_by_key):
    c = srv.client()
    rnd = random.Random(11)
    for k in rnd.sample(sorted(expected), 50):
        n = sizes_by_key[k]
        a = rnd.randrange(n)
        b = min(n - 1, a + rnd.randrange(1, 200_000))
        got = c.get_object(Bucket=BUCKET, Key=k, Range=f"bytes={a}-{b}")["Body"].read()
        i = int(k.split("/")[1].split(".")[0])
        assert got == body(i, n)[a:b + 1], k
    small = [k for k in sorted(expected) if sizes_by_key[k] <= 16 << 10][:500]
    got = {s.name: s for s in srv.packrat().batch_get(BUCKET, small, order="storage")}
    assert len(got) == len(small)
    for k in small:
        assert got[k].error is None, (k, got[k].error)
        assert hashlib.md5(got[k].data).hexdigest() == expected[k], k


def test_erasure_coding_survives_lost_and_corrupt_disks(workdir):
    root = workdir / "ec"
    root.mkdir()
    disks = [root / f"disk{i}" for i in range(6)]
    args = ["--ec", "4+2", "--segment-size", str(4 << 20), "--seal-idle", "1",
            "--compact-interval", "0", "--scrub-interval", "0"]
    for d in disks:
        args += ["--disk", str(d)]
    srv = Server(root / "data", args).start()
    expected, sizes_by_key = {}, {}
    try:
        s3 = srv.client()
        s3.create_bucket(Bucket=BUCKET)
        all_sizes = sizes()
        multipart = TransferConfig(multipart_threshold=8 << 20, multipart_chunksize=5 << 20)

        def put(chunk):
            c = srv.client()
            out = {}
            for i in chunk:
                n = all_sizes[i]
                data = body(i, n)
                if n >= 8 << 20:
                    import io
                    c.upload_fileobj(io.BytesIO(data), BUCKET, key(i), Config=multipart)
                else:
                    c.put_object(Bucket=BUCKET, Key=key(i), Body=data)
                out[key(i)] = (hashlib.md5(data).hexdigest(), n)
            return out

        t0 = time.time()
        with cf.ThreadPoolExecutor(8) as ex:
            for part in ex.map(put, [range(OBJECTS)[j::8] for j in range(8)]):
                for k, (md5, n) in part.items():
                    expected[k] = md5
                    sizes_by_key[k] = n
        logical = sum(sizes_by_key.values())
        print(f"wrote {len(expected)} objects, {logical / 1e6:.0f} MB in {time.time() - t0:.1f}s")

        # Segments seal (full, or idle for a second) and are encoded; the copies go.
        st = wait_until(lambda: (lambda s: s if s["erasure"]["segments_sealed"] == 0
                                 and s["active_segment_bytes"] <= 32 else None)(status(srv)),
                        timeout=120, what="every segment sealed and encoded")
        ec = st["erasure"]
        assert ec["k"] == 4 and ec["m"] == 2 and len(ec["disks"]) == 6
        assert ec["segments_encoded"] >= logical // (5 << 20), ec
        assert all(d["online"] and d["shards"] > 0 for d in ec["disks"]), ec
        overhead = st["segment_disk_bytes"] / logical
        print(f"space: {st['segment_disk_bytes']} bytes on disk for {logical} logical: {overhead:.3f}x (ideal 1.5x)")
        assert overhead < 1.5 * 1.05, overhead
        ok, lost = read_all(srv, expected)
        assert (ok, lost) == (len(expected), 0)
        assert status(srv)["degraded_reads"] == 0

        # Two whole disk directories lost while stopped: everything still reads.
        srv.stop()
        shutil.rmtree(disks[1])
        shutil.rmtree(disks[4])
        # Offline verify reads through the same fallbacks, writing nothing.
        env = dict(os.environ, PACKRAT_ROOT_ACCESS_KEY=conftest.ROOT_AK, PACKRAT_ROOT_SECRET_KEY=conftest.ROOT_SK)
        out = subprocess.run([conftest.BIN, "admin", "--data-dir", str(root / "data"), "verify", "--json",
                              "--ec", "4+2", "--disk", ",".join(str(d) for d in disks)],
                             capture_output=True, text=True, timeout=600, env=env)
        assert out.returncode == 0, out.stdout + out.stderr
        report = json.loads(out.stdout)
        assert report["problem_count"] == 0 and report["degraded_reads"] > 0, report
        assert report["objects"] == len(expected)
        assert not disks[1].exists() and not disks[4].exists()
        srv.start()
        ok, lost = read_all(srv, expected)
        assert (ok, lost) == (len(expected), 0)
        check_ranges_and_batch(srv, expected, sizes_by_key)
        st = status(srv)
        # Degraded segments are repaired in the background within a second of a read finding
        # them: either some are still degraded, or shards were already rebuilt.
        assert st["degraded_reads"] > 0, st
        assert st["erasure"]["segments_degraded"] > 0 or st["shards_rebuilt"] > 0, st

        # Repair restores full redundancy (the two directories were recreated empty).
        out = admin(srv, "scrub")
        print(out.stdout.strip())
        assert "full redundancy" in out.stdout, out.stdout + out.stderr
        st = status(srv)
        assert st["erasure"]["segments_degraded"] == 0 and st["shards_rebuilt"] > 0, st

        # Two other disks lost: everything still reads.
        srv.stop()
        shutil.rmtree(disks[0])
        shutil.rmtree(disks[5])
        srv.start()
        ok, lost = read_all(srv, expected)
        assert (ok, lost) == (len(expected), 0)
        admin(srv, "scrub")

        # Bytes flipped inside every shard on one disk: reads are still right, the corruption
        # is reported, and scrub repairs it.
        srv.stop()
        flipped = 0
        for f in (disks[2] / "shards").iterdir():
            b = bytearray(f.read_bytes())
            for at in range(4096, len(b), 3001):
                b[at] ^= 0x5A
                flipped += 1
            f.write_bytes(bytes(b))
        assert flipped > 1000
        srv.start()
        ok, lost = read_all(srv, expected)
        assert (ok, lost) == (len(expected), 0)
        st = status(srv)
        assert st["shard_faults_found"] > 0 and st["degraded_reads"] > 0, st
        out = admin(srv, "scrub")
        print(out.stdout.strip())
        # The scrub rebuilds what the background repair has not already fixed.
        assert "full redundancy" in out.stdout, out.stdout
        assert status(srv)["shards_rebuilt"] > 0
        out = admin(srv, "scrub")
        assert "0 shards missing, 0 corrupt; 0 rebuilt" in out.stdout, out.stdout
        # For scripts: the report as one JSON document, and nothing else on stdout.
        r = json.loads(admin(srv, "scrub", "--output", "json").stdout)
        assert (r["shards_missing"], r["shards_corrupt"], r["shards_rebuilt"], r["unrepairable"]) \
            == (0, 0, 0, []) and r["segments_checked"] > 0, r

        # M + 1 = 3 disks lost: objects whose bytes need a rebuild fail with a clear 500,
        # the rest is served, and new writes work.
        srv.stop()
        for d in disks[:3]:
            shutil.rmtree(d)
        srv.start()
        ok, lost = read_all(srv, expected, allow_lost=True)
        print(f"with 3 of 6 disks lost: {ok} objects served, {lost} failed cleanly")
        assert ok > 0 and lost > 0
        assert status(srv)["erasure"]["segments_unrecoverable"] > 0
        s3 = srv.client()
        s3.put_object(Bucket=BUCKET, Key="after/loss", Body=b"still writable")
        assert s3.get_object(Bucket=BUCKET, Key="after/loss")["Body"].read() == b"still writable"
    finally:
        srv.stop()


def test_several_disks_need_ec_and_enough_disks(workdir):
    root = workdir / "ec-config"
    for args, msg in [
        (["--disk", str(root / "a"), "--disk", str(root / "b")], "need --ec"),
        (["--disk", str(root / "a"), "--disk", str(root / "b"), "--ec", "4+2"], "at least 6 disks"),
        (["--ec", "4+2"], "--ec needs --disk"),
        (["--disk", str(root / "a"), "--ec", "4"], "K+M"),
    ]:
        env = dict(os.environ, PACKRAT_ROOT_ACCESS_KEY=conftest.ROOT_AK, PACKRAT_ROOT_SECRET_KEY=conftest.ROOT_SK)
        out = subprocess.run([conftest.BIN, "serve", "--data-dir", str(root / "data"),
                              "--listen", "127.0.0.1:0", *args],
                             capture_output=True, text=True, timeout=60, env=env)
        assert out.returncode != 0 and msg in out.stderr + out.stdout, (args, out.stderr)


def test_a_disk_that_fails_while_idle_is_found_by_the_probe(workdir):
    root = workdir / "ec-probe"
    root.mkdir()
    disks = [root / f"disk{i}" for i in range(6)]
    args = ["--ec", "4+2", "--disk-probe-interval", "1"]
    for d in disks:
        args += ["--disk", str(d)]
    srv = Server(root / "data", args).start()
    try:
        s3 = srv.client()
        s3.create_bucket(Bucket=BUCKET)
        expected = {}
        for i in range(50):
            data = body(i, 5000)
            s3.put_object(Bucket=BUCKET, Key=key(i), Body=data)
            expected[key(i)] = hashlib.md5(data).hexdigest()
        assert all(d["online"] for d in status(srv)["erasure"]["disks"])
        # Disk 3 breaks while nothing touches it: its probe file can no longer be created.
        (disks[3] / ".packrat-probe").mkdir()
        st = wait_until(lambda: (s := status(srv))["disk_probe_failures"] == 1 and s, 15, "a failed probe")
        assert [d["online"] for d in st["erasure"]["disks"]] == [True, True, True, False, True, True]
        assert "disk probe failed" in open(srv.log_path).read()
        metrics = urllib.request.urlopen(f"{srv.endpoint}/metrics", timeout=10).read().decode()
        assert "packrat_disk_probe_failures_total 1" in metrics
        # Writes go on (on the other disks), and everything reads back.
        for i in range(50, 60):
            data = body(i, 5000)
            s3.put_object(Bucket=BUCKET, Key=key(i), Body=data)
            expected[key(i)] = hashlib.md5(data).hexdigest()
        assert read_all(srv, expected) == (60, 0)
        # Repaired: the next scrub takes the disk back.
        (disks[3] / ".packrat-probe").rmdir()
        admin(srv, "scrub")
        assert status(srv)["erasure"]["disks"][3]["online"]
    finally:
        srv.stop()
