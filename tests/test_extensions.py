"""packrat's data-loader extensions, driven through the Python client (sdk-examples/python)
against the real binary: batch GET, TAR members, batch PUT, epoch streams, multi-range reads,
and the dataset's split across workers and ranks. Also run against a cluster gateway (scripts/test.sh's
cluster step)."""

import hashlib
import io
import json
import os
import random
import subprocess
import tarfile
import urllib.parse
import urllib.request

import pytest

import conftest
from conftest import Server
from packrat_client import BatchDataset, EpochDataset, PackratError, shard_for_worker
from sigv4_client import signed_request


def sha(b):
    return hashlib.sha256(b).hexdigest()


@pytest.fixture(scope="module")
def pc(server):
    return server.packrat()


@pytest.fixture(scope="module")
def dataset(server, s3):
    """A bucket of objects of mixed sizes: tiny, 4 KiB-ish, up to 200 KiB, one empty and one
    of 3 MiB (several records), plus a TAR shard."""
    name = "ext-" + os.urandom(4).hex()
    s3.create_bucket(Bucket=name)
    rng = random.Random(7)
    objs = {}
    for i in range(300):
        size = rng.choice([1, 100, 4096, 4096, 10_000, 65_536, 200_000])
        objs[f"train/{i:05d}.bin"] = rng.randbytes(size)
    objs["train/empty"] = b""
    objs["big/three-mib"] = rng.randbytes(3 * 1024 * 1024 + 17)
    for k, v in objs.items():
        s3.put_object(Bucket=name, Key=k, Body=v)
    # A TAR shard of 50 members, one with a long name.
    members = {f"{i:06d}.cls": rng.randbytes(rng.randint(0, 3000)) for i in range(50)}
    members["deep/" + "x" * 150 + ".jpg"] = rng.randbytes(5000)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for n, d in members.items():
            info = tarfile.TarInfo(n)
            info.size = len(d)
            tf.addfile(info, io.BytesIO(d))
    s3.put_object(Bucket=name, Key="shards/s-0001.tar", Body=buf.getvalue())
    yield name, objs, members
    conftest.empty_bucket(s3, name)


def test_batch_get_request_order_contents_tags_and_errors(pc, dataset, s3):
    name, objs, _ = dataset
    keys = list(objs)
    random.Random(1).shuffle(keys)
    items = [{"key": k, "tag": f"t{i}"} for i, k in enumerate(keys)]
    items.insert(5, {"key": "train/missing", "tag": "gone"})
    items.append({"key": "train/00001.bin", "range": "bytes=0-0"})
    got = list(pc.batch_get(name, items))
    assert [s.name for s in got] == [i["key"] for i in items]
    for it, s in zip(items, got):
        if it["key"] == "train/missing":
            assert s.error[0] == "NoSuchKey" and s.tag == "gone" and s.data == b""
            continue
        want = objs[it["key"]][:1] if "range" in it else objs[it["key"]]
        assert s.ok and sha(s.data) == sha(want), it
        if "tag" in it:
            assert s.tag == it["tag"]
    head = s3.head_object(Bucket=name, Key=keys[0])
    first = got[0] if got[0].name == keys[0] else got[1]
    assert '"' + first.etag + '"' == head["ETag"]
    # Every entry carries its object's ETag (single PUTs: the MD5 of the whole object).
    for s in got:
        if s.ok:
            assert s.etag == hashlib.md5(objs[s.name]).hexdigest(), s.name


def test_batch_get_entry_names_are_safe_to_extract_and_errors_unmistakable(server, pc, s3, bucket, tmp_path):
    """Keys that `tar -x` would write outside its directory (`../x`, `/x`, `a/../../x`) come as
    `__key__/<percent-encoded>` entries with the exact key in `packrat.key`; a real key under
    `__error__/` is never taken for an error entry; the client gives back exact keys."""
    hostile = {
        "../escape.txt": b"dot-dot",
        "/abs.txt": b"absolute",
        "a/../../up.txt": b"climbs",
        "__error__/looks-like-an-error": b"I am data",
        "__key__/x": b"reserved prefix",
        "ok/fine.txt": b"plain",
    }
    # Raw signed PUTs: the paths go on the wire as written, with no client normalising them.
    for k, v in hostile.items():
        st, _, body = signed_request(server.endpoint, "PUT", f"/{bucket}/" + urllib.parse.quote(k, safe="/"), body=v)
        assert st == 200, (k, body)
    items = [{"key": k} for k in hostile] + [{"key": "../missing"}]
    req = json.dumps({"items": items}).encode()
    st, _, tar_bytes = signed_request(server.endpoint, "POST", f"/{bucket}", "batch=", body=req)
    assert st == 200
    with tarfile.open(fileobj=io.BytesIO(tar_bytes), mode="r:") as tf:
        members = tf.getmembers()
    names = [m.name for m in members]
    for n in names:
        assert not n.startswith("/") and ".." not in n.split("/"), n
    by_key = {m.pax_headers.get("packrat.key", m.name): m for m in members}
    assert set(by_key) == set(hostile) | {"../missing"}
    assert by_key["ok/fine.txt"].name == "ok/fine.txt" and "packrat.key" not in by_key["ok/fine.txt"].pax_headers
    assert by_key["../escape.txt"].name == "__key__/..%2Fescape.txt"
    assert "packrat.error" not in by_key["__error__/looks-like-an-error"].pax_headers
    assert by_key["../missing"].pax_headers["packrat.error"] == "NoSuchKey"
    assert by_key["../missing"].name.startswith("__error__/__key__/")
    # GNU tar extracts all of it inside its own directory.
    inner = tmp_path / "a" / "b" / "out"
    inner.mkdir(parents=True)
    (tmp_path / "reply.tar").write_bytes(tar_bytes)
    subprocess.run(["tar", "-xf", str(tmp_path / "reply.tar"), "-C", str(inner)], check=True)
    outside = [p for p in tmp_path.rglob("*") if p.is_file() and inner not in p.parents]
    assert sorted(p.name for p in outside) == ["reply.tar"]
    # The client answers exact keys; only the missing one is an error.
    got = {sm.name: sm for sm in pc.batch_get(bucket, list(hostile) + ["../missing"])}
    assert set(got) == set(hostile) | {"../missing"}
    for k, v in hostile.items():
        assert got[k].ok and got[k].data == v, k
    assert got["../missing"].error[0] == "NoSuchKey"


def test_batch_get_of_many_blocks_of_keys(pc, dataset):
    # Keys are looked up in blocks of 1024: more than two blocks, every key several times,
    # and absent keys in some blocks only (a block the record cache cannot answer whole is
    # read from the index; the others from the cache).
    name, objs, _ = dataset
    keys = sorted(objs) * 8
    random.Random(3).shuffle(keys)
    keys.insert(100, "train/absent-a")
    keys.insert(2100, "train/absent-b")
    got = list(pc.batch_get(name, [{"key": k} for k in keys]))
    assert [s.name for s in got] == keys
    for k, s in zip(keys, got):
        if k.startswith("train/absent"):
            assert s.error[0] == "NoSuchKey"
        else:
            assert s.ok and sha(s.data) == sha(objs[k]) and s.etag == hashlib.md5(objs[k]).hexdigest(), k


def test_batch_get_storage_order_and_ranges(pc, dataset):
    name, objs, _ = dataset
    items = [{"key": k} for k in objs]
    items += [
        {"key": "big/three-mib", "range": "bytes=1048570-1048585", "tag": "across-records"},
        {"key": "train/00002.bin", "range": "bytes=-3"},
        {"key": "train/00003.bin", "range": "bytes=1-"},
        {"key": "train/00004.bin", "range": "bytes=999999999-"},
    ]
    got = list(pc.batch_get(name, items, order="storage"))
    assert len(got) == len(items)
    assert sorted(s.name for s in got) == sorted(i["key"] for i in items)
    by_tag = {s.tag: s for s in got if s.tag}
    assert by_tag["across-records"].data == objs["big/three-mib"][1048570:1048586]
    whole = {s.name: s for s in got if s.ok and s.tag is None and s.name not in
             ("train/00002.bin", "train/00003.bin")}
    for k, s in whole.items():
        assert sha(s.data) == sha(objs[k]), k
    ranged = [s for s in got if s.name == "train/00002.bin"]
    assert any(s.data == objs["train/00002.bin"][-3:] for s in ranged)
    ranged = [s for s in got if s.name == "train/00003.bin"]
    assert any(s.data == objs["train/00003.bin"][1:] for s in ranged)
    unsatisfiable = [s for s in got if s.name == "train/00004.bin" and not s.ok]
    assert unsatisfiable and unsatisfiable[0].error[0] == "InvalidRange"


def test_batch_get_abort_stops_at_first_failure(pc, dataset):
    name, objs, _ = dataset
    items = ["train/00000.bin", "nope", "train/00001.bin"]
    got = list(pc.batch_get(name, items, on_error="abort"))
    assert [s.ok for s in got] == [True, False]
    assert got[1].name == "nope"


def test_tar_members(pc, dataset):
    name, _, members = dataset
    names = list(members)
    items = [{"key": "shards/s-0001.tar", "member": m} for m in names]
    items.append({"key": "shards/s-0001.tar", "member": "000003.cls", "range": "bytes=1-4"})
    items.append({"key": "shards/s-0001.tar", "member": "no-such-member"})
    for _ in range(2):  # the second time reads through the stored member index
        got = list(pc.batch_get(name, items))
        for m, s in zip(names, got):
            assert s.name == f"shards/s-0001.tar/{m}"
            assert s.data == members[m]
        assert got[-2].data == members["000003.cls"][1:5]
        assert got[-1].error[0] == "NoSuchKey"


def test_member_of_non_tar_is_a_clear_400(pc, dataset):
    name, _, _ = dataset
    with pytest.raises(PackratError) as e:
        list(pc.batch_get(name, [{"key": "train/00000.bin", "member": "a"}]))
    assert e.value.status == 400 and e.value.code == "InvalidRequest"
    assert "not a TAR" in e.value.message


def raw_batch(server, bucket, body):
    return signed_request(server.endpoint, "POST", f"/{bucket}", query="batch=", body=body,
                          headers={"content-type": "application/json"})


def test_batch_bad_input_is_a_clear_400(server, dataset):
    name, _, _ = dataset
    cases = [
        (b"{not json", "MalformedJSON"),
        (b'{"items": [{"key": "a", "colour": "red"}]}', "MalformedJSON"),
        (b'{"items": [{"key": "a"}], "order": "random"}', "MalformedJSON"),
        (b'{"items": "a"}', "MalformedJSON"),
        (b'{"items": [{"key": "a", "range": "bytes=5-1"}]}', "InvalidArgument"),
        (b'{"items": [{"key": "a", "range": "0-10"}]}', "InvalidArgument"),
        (b'{"items": [{"key": "a", "range": "bytes=0-1,5-6"}]}', "InvalidArgument"),
        (b'{"items": [{"key": ""}]}', "InvalidArgument"),
    ]
    for body, code in cases:
        status, _, text = raw_batch(server, name, body)
        assert status == 400, (body, status, text)
        assert f"<Code>{code}</Code>" in text.decode(), (body, text)


def test_batch_limits(workdir):
    srv = Server(workdir / "batch-limits", ["--batch-items-max", "3", "--batch-bytes-max", "1000"]).start()
    try:
        s3 = srv.client()
        s3.create_bucket(Bucket="lim")
        for i in range(4):
            s3.put_object(Bucket="lim", Key=f"k{i}", Body=b"x" * 400)
        pc = srv.packrat()
        assert len(list(pc.batch_get("lim", ["k0", "k1"]))) == 2
        with pytest.raises(PackratError) as e:
            list(pc.batch_get("lim", ["k0", "k1", "k2", "k3"]))
        assert e.value.status == 400 and "--batch-items-max" in e.value.message
        with pytest.raises(PackratError) as e:
            list(pc.batch_get("lim", ["k0", "k1", "k2"]))
        assert e.value.code == "EntityTooLarge" and "--batch-bytes-max" in e.value.message
        # Ranges count only what they ask for.
        got = list(pc.batch_get("lim", [{"key": f"k{i}", "range": "bytes=0-9"} for i in range(3)]))
        assert [len(s.data) for s in got] == [10, 10, 10]
    finally:
        srv.stop()


def test_batch_needs_read_permission(server, dataset):
    name, _, _ = dataset
    other = server.packrat(ak="NOSUCHKEY", sk="whatever-secret")
    with pytest.raises(PackratError) as e:
        list(other.batch_get(name, ["train/00000.bin"]))
    assert e.value.status == 403
    # Anonymous: a private bucket is refused.
    req = urllib.request.Request(f"{server.endpoint}/{name}?batch", data=b'{"items":[]}', method="POST")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req)
    assert e.value.code == 403


def test_epoch_streams_partition_and_are_seeded(pc, dataset, s3):
    name, objs, _ = dataset
    prefix_keys = {k for k in objs if k.startswith("train/")}
    shards = []
    for i in range(4):
        got = list(pc.stream_epoch(name, "train/", shard=(i, 4), seed=42, tail="drop"))
        assert all(s.ok for s in got)
        for s in got:
            assert sha(s.data) == sha(objs[s.name])
        shards.append([s.name for s in got])
    # 301 samples over 4 ranks, the tail dropped: 75 each, one left out.
    assert [len(sh) for sh in shards] == [75] * 4
    union = [k for sh in shards for k in sh]
    assert len(union) == len(set(union)), "shards overlap"
    assert len(prefix_keys - set(union)) == 1
    # The same seed gives the same order; another seed another order.
    again = [s.name for s in pc.stream_epoch(name, "train/", shard=(1, 4), seed=42, tail="drop")]
    assert again == shards[1]
    other = [s.name for s in pc.stream_epoch(name, "train/", shard=(1, 4), seed=43, tail="drop")]
    assert other != shards[1]
    # Not simply key order; key order when asked.
    assert shards[0] != sorted(shards[0])
    ordered = [s.name for s in pc.stream_epoch(name, "train/", order="sorted")]
    assert ordered == sorted(prefix_keys)
    # Everything, one shard; and an empty prefix set.
    assert len(list(pc.stream_epoch(name, "", seed=1))) == len(objs) + 1
    assert list(pc.stream_epoch(name, "nothing-here/")) == []


def test_epoch_stream_bad_parameters(server, dataset):
    name, _, _ = dataset
    for q in ["stream=&shard=4/4", "stream=&shard=x", "stream=&shard=1/0", "stream=&seed=-1",
              "stream=&window=16", "stream=&on_error=maybe", "stream=&worker=2/2",
              "stream=&epoch=x", "stream=&start=-1", "stream=&order=random", "stream=&group=dir",
              "stream=&tail=keep", "stream=&listing=xyz", "stream=&listing=%2B123456789abcdef"]:
        status, _, text = signed_request(server.endpoint, "GET", f"/{name}", query=q)
        assert status == 400 and b"InvalidArgument" in text, (q, status, text)


def test_batch_put_extracts_tar_atomically(pc, s3, bucket):
    rng = random.Random(3)
    members = {f"img/{i:04d}.jpg": rng.randbytes(rng.randint(0, 70_000)) for i in range(200)}
    members["big.bin"] = rng.randbytes(2_500_000)
    summary = pc.batch_put_tar(bucket, "upload/batch.tar", members)
    assert summary["objects"] == len(members) and summary["prefix"] == "upload/"
    assert summary["bytes"] == sum(len(v) for v in members.values())
    for k, v in members.items():
        body = s3.get_object(Bucket=bucket, Key="upload/" + k)["Body"].read()
        assert body == v, k
    head = s3.head_object(Bucket=bucket, Key="upload/img/0001.jpg")
    assert head["ETag"] == '"' + hashlib.md5(members["img/0001.jpg"]).hexdigest() + '"'
    # An explicit prefix; directories are skipped and reported.
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        d = tarfile.TarInfo("dir")
        d.type = tarfile.DIRTYPE
        tf.addfile(d)
        f = tarfile.TarInfo("dir/a.txt")
        f.size = 3
        tf.addfile(f, io.BytesIO(b"abc"))
    summary = pc.batch_put_tar(bucket, "ignored.tar", buf.getvalue(), prefix="other")
    assert summary["objects"] == 1 and summary["skipped"] == ["dir/"]
    assert s3.get_object(Bucket=bucket, Key="other/dir/a.txt")["Body"].read() == b"abc"
    # boto3 with the header MinIO clients send works the same way.
    s3.put_object(Bucket=bucket, Key="via-boto3/x.tar", Body=buf.getvalue(),
                  Metadata={"snowball-auto-extract": "true"})
    assert s3.get_object(Bucket=bucket, Key="via-boto3/dir/a.txt")["Body"].read() == b"abc"


def test_corrupt_tar_upload_commits_nothing(pc, s3, bucket):
    tar = io.BytesIO()
    with tarfile.open(fileobj=tar, mode="w") as tf:
        for i in range(20):
            info = tarfile.TarInfo(f"m{i}")
            info.size = 1000
            tf.addfile(info, io.BytesIO(b"z" * 1000))
    raw = tar.getvalue()
    # Each member is a header block and two data blocks.
    truncated = raw[: 512 * 25 + 100]  # inside member 8's data
    flipped = bytearray(raw)
    flipped[512 * 12 + 3] ^= 0x01  # member 4's header: its checksum fails
    for bad in (truncated, bytes(flipped), b"definitely not a tar" * 40):
        with pytest.raises(PackratError) as e:
            pc.batch_put_tar(bucket, "c/x.tar", bad)
        assert e.value.status == 400 and "TAR" in e.value.message
        assert s3.list_objects_v2(Bucket=bucket, Prefix="c/")["KeyCount"] == 0


def test_get_ranges(pc, dataset):
    name, objs, _ = dataset
    data = objs["big/three-mib"]
    ranges = [(0, 99), (4096, 8191), (1048570, 1048600), (len(data) - 5, len(data) - 1)]
    got = pc.get_ranges(name, "big/three-mib", ranges)
    assert got == [data[a : b + 1] for a, b in ranges]
    assert pc.get_ranges(name, "train/00000.bin", [(0, 0)]) == [objs["train/00000.bin"][:1]]


def test_dataset_splits_across_workers_and_ranks(server, dataset):
    name, objs, _ = dataset
    prefix_keys = sorted(k for k in objs if k.startswith("train/"))
    factory = server.packrat
    seen = []
    for rank in range(2):
        for worker in range(2):
            ctx = (rank, 2, worker, 2)
            ds = EpochDataset(factory, name, "train/", seed=5, context=ctx)
            seen += [s.name for s in ds]
    # 301 samples, 2 ranks: 151 each, one sample read twice (tail="pad").
    assert sorted(set(seen)) == prefix_keys and len(seen) == 302
    # A new epoch reorders; the same epoch repeats.
    ds = EpochDataset(factory, name, "train/", seed=5, context=(0, 1, 0, 1))
    e0 = [s.name for s in ds]
    assert [s.name for s in ds] == e0
    ds.set_epoch(1)
    assert [s.name for s in ds] != e0
    # Batch GET datasets split a key list the same way, with a transform.
    seen = []
    for worker in range(3):
        ds = BatchDataset(factory, name, prefix_keys, seed=1, batch_size=40,
                          context=(0, 1, worker, 3), transform=lambda s: (s.name, len(s.data)))
        seen += list(ds)
    assert sorted(n for n, _ in seen) == prefix_keys
    assert all(size == len(objs[n]) for n, size in seen)
    assert shard_for_worker(1, 2, 1, 4) == (5, 8)
    with pytest.raises(ValueError):
        shard_for_worker(2, 2, 0, 1)


def test_corrupt_record_becomes_an_error_entry_never_wrong_bytes(workdir):
    srv = Server(workdir / "batch-corrupt").start()
    try:
        s3 = srv.client()
        s3.create_bucket(Bucket="rot")
        marker = b"ROT-MARKER-" + os.urandom(8).hex().encode()
        good = {f"k{i}": os.urandom(3000) for i in range(10)}
        for k, v in good.items():
            s3.put_object(Bucket="rot", Key=k, Body=v)
        s3.put_object(Bucket="rot", Key="bad", Body=marker + b"x" * 5000)
        srv.stop()
        seg_dir = os.path.join(srv.data_dir, "segments")
        hits = 0
        for name in os.listdir(seg_dir):
            path = os.path.join(seg_dir, name)
            data = bytearray(open(path, "rb").read())
            at = data.find(marker)
            if at >= 0:
                data[at + len(marker) + 100] ^= 0x01
                open(path, "wb").write(bytes(data))
                hits += 1
        assert hits == 1
        # The offline check finds the rotted record and names its object.
        out = subprocess.run([conftest.BIN, "admin", "--data-dir", srv.data_dir, "verify"],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 1 and 'object "bad"' in out.stdout and "crc32c" in out.stdout, out.stdout
        srv.start()
        pc = srv.packrat()
        items = ["k0", "bad", "k1"] + list(good)
        for order in ("request", "storage"):
            got = list(pc.batch_get("rot", items, order=order))
            by = {}
            for s in got:
                by.setdefault(s.name, []).append(s)
            assert by["bad"][0].error[0] == "InternalError"
            assert "checksum" in by["bad"][0].error[1]
            for k, v in good.items():
                assert all(s.data == v for s in by[k])
        streamed = {s.name: s for s in pc.stream_epoch("rot", "")}
        assert not streamed["bad"].ok
        assert all(streamed[k].data == v for k, v in good.items())
        assert "batch read failed" in open(srv.log_path).read()
    finally:
        srv.stop()
