"""The readers ML users already run, unmodified, against the real binary (issue 19, item 4):
fsspec/s3fs, PyArrow's S3 filesystem over a Parquet dataset, and WebDataset reading TAR shards
and an epoch stream through presigned URLs. s3torchconnector needs PyTorch and is tested in
tests/test_torch.py, in the opt-in torch mode (README)."""

import io
import json
import random
import tarfile

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
import s3fs
import webdataset as wds
from botocore.auth import S3SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from conftest import REGION, ROOT_AK, ROOT_SK


@pytest.fixture(scope="module")
def bucket(server, s3):
    name = "readers"
    s3.create_bucket(Bucket=name)
    return name


def presign(endpoint, path_and_query, expires=600):
    req = AWSRequest(method="GET", url=endpoint + path_and_query)
    S3SigV4QueryAuth(Credentials(ROOT_AK, ROOT_SK), "s3", REGION, expires=expires).add_auth(req)
    return req.prepare().url


def test_s3fs_lists_reads_ranges_writes_and_deletes(server, bucket):
    fs = s3fs.S3FileSystem(key=ROOT_AK, secret=ROOT_SK, endpoint_url=server.endpoint,
                           client_kwargs={"region_name": REGION}, use_listings_cache=False)
    rng = random.Random(1)
    blobs = {f"{bucket}/fs/d{i % 3}/f{i}.bin": rng.randbytes(rng.randint(0, 300_000)) for i in range(12)}
    for path, data in blobs.items():
        fs.pipe(path, data)
    assert sorted(fs.find(f"{bucket}/fs/")) == sorted(blobs)
    assert sorted(fs.ls(f"{bucket}/fs/")) == [f"{bucket}/fs/d{i}" for i in range(3)]
    assert sorted(fs.glob(f"{bucket}/fs/d1/*.bin")) == sorted(p for p in blobs if "/d1/" in p)
    for path, data in blobs.items():
        assert fs.cat(path) == data
        assert fs.info(path)["size"] == len(data)
    big = max(blobs, key=lambda p: len(blobs[p]))
    with fs.open(big, "rb", block_size=64 * 1024) as f:
        f.seek(100_000)
        assert f.read(5000) == blobs[big][100_000:105_000]
    # A multipart upload through s3fs (5 MiB parts).
    data = rng.randbytes(12 * 1024 * 1024 + 5)
    with fs.open(f"{bucket}/fs/large.bin", "wb", block_size=5 * 1024 * 1024) as f:
        f.write(data)
    assert fs.cat(f"{bucket}/fs/large.bin") == data
    fs.rm(f"{bucket}/fs/", recursive=True)
    assert fs.find(f"{bucket}/fs/") == []
    with pytest.raises(FileNotFoundError):
        fs.cat(f"{bucket}/fs/d0/f0.bin")


def test_pyarrow_writes_and_reads_a_partitioned_parquet_dataset(server, bucket):
    host = server.endpoint.split("://", 1)[1]
    fs = pafs.S3FileSystem(access_key=ROOT_AK, secret_key=ROOT_SK, endpoint_override=host, scheme="http",
                           region=REGION)
    n = 50_000
    table = pa.table({
        "id": pa.array(range(n), pa.int64()),
        "label": pa.array([i % 10 for i in range(n)], pa.int32()),
        "split": pa.array(["train" if i % 5 else "val" for i in range(n)]),
        "text": pa.array([f"sample {i} " * (i % 7) for i in range(n)]),
    })
    pads.write_dataset(table, f"{bucket}/parquet", filesystem=fs, format="parquet",
                       partitioning=["split"], partitioning_flavor="hive", max_rows_per_file=20_000, max_rows_per_group=5_000)
    infos = fs.get_file_info(pafs.FileSelector(f"{bucket}/parquet", recursive=True))
    assert any(i.path.endswith(".parquet") and "split=val" in i.path for i in infos)
    ds = pads.dataset(f"{bucket}/parquet", filesystem=fs, format="parquet", partitioning="hive")
    back = ds.to_table().sort_by("id")
    assert back.num_rows == n
    assert back.column("text").to_pylist() == table.column("text").to_pylist()
    # Predicate and column pushdown: only the val partition's files, ranged reads of columns.
    val = ds.to_table(columns=["id", "label"], filter=pads.field("split") == "val")
    assert sorted(val.column("id").to_pylist()) == list(range(0, n, 5))
    one = pq.ParquetFile(fs.open_input_file(next(i.path for i in infos if i.path.endswith(".parquet"))))
    assert one.metadata.num_rows > 0


def _shard(samples):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for key, parts in samples:
            for ext, data in parts.items():
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_webdataset_reads_tar_shards_through_presigned_urls(server, s3, bucket):
    rng = random.Random(2)
    want = {}
    urls = []
    for s in range(3):
        samples = []
        for i in range(40):
            key = f"s{s}/{i:05d}"
            parts = {"jpg": rng.randbytes(rng.randint(100, 20_000)), "cls": str(i % 4).encode()}
            samples.append((key, parts))
            want[key] = parts
        s3.put_object(Bucket=bucket, Key=f"wds/shard-{s:04d}.tar", Body=_shard(samples))
        urls.append(presign(server.endpoint, f"/{bucket}/wds/shard-{s:04d}.tar"))
    got = {}
    for sample in wds.WebDataset(urls, shardshuffle=False, empty_check=False):
        got[sample["__key__"]] = {"jpg": sample["jpg"], "cls": sample["cls"]}
    assert got == want


def test_webdataset_reads_an_epoch_stream_through_a_presigned_url(server, s3, bucket):
    rng = random.Random(3)
    want = {}
    for i in range(90):
        key = f"epoch/c{i % 3}/{i:05d}"
        want[key] = {"jpg": rng.randbytes(rng.randint(100, 9000)), "json": json.dumps({"i": i}).encode()}
        for ext, data in want[key].items():
            s3.put_object(Bucket=bucket, Key=f"{key}.{ext}", Body=data)
    seen = {}
    order = []
    for rank in range(3):
        url = presign(server.endpoint,
                      f"/{bucket}?stream=&prefix=epoch%2F&shard={rank}%2F3&seed=9&epoch=1")
        for sample in wds.WebDataset(url, shardshuffle=False, empty_check=False):
            # Every sample arrives whole: WebDataset groups consecutive entries by basename.
            assert set(sample) >= {"__key__", "jpg", "json"}, sample.keys()
            seen[sample["__key__"]] = {"jpg": sample["jpg"], "json": sample["json"]}
            order.append(sample["__key__"])
    assert seen == want
    assert len(order) == 90, "90 samples over 3 ranks: 30 each, none twice"
    assert order != sorted(order)
