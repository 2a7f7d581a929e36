"""PyTorch readers against the real binary (issue 19): AWS's s3torchconnector unmodified
(S3MapDataset, S3IterableDataset, checkpoints through S3Checkpoint and torch.save/load) and
packrat's own datasets under a real multi-worker DataLoader.

PyTorch is a multi-gigabyte install, so this module runs in the opt-in torch mode only: with
the environment from `bench/requirements-torch.txt` (README, "Extensions for data loaders"),
`PACKRAT_VENV=.venv-torch scripts/test.sh tests/test_torch.py`. Without torch, conftest.py does
not collect it and says so in pytest's header."""

import collections
import hashlib
import io
import json
import os
import pathlib
import random
import subprocess
import sys

import pytest
import torch
from s3torchconnector import S3Checkpoint, S3ClientConfig, S3IterableDataset, S3MapDataset
from torch.utils.data import DataLoader

from conftest import REGION, ROOT_AK, ROOT_SK
from packrat_client import EpochDataset, MapDataset, PackratClient

SAMPLES = 600


@pytest.fixture(scope="module")
def data(server, s3):
    """A bucket of SAMPLES objects of 1 to 40 KiB under `train/cNN/`, and their digests."""
    bucket = "torch"
    s3.create_bucket(Bucket=bucket)
    rng = random.Random(19)
    blobs = {}
    for i in range(SAMPLES):
        key = f"train/c{i % 12:02d}/{i:05d}.bin"
        blobs[key] = rng.randbytes(rng.randint(1024, 40 * 1024))
    client = PackratClient(server.endpoint, region_name=REGION, aws_access_key_id=ROOT_AK,
                           aws_secret_access_key=ROOT_SK)
    assert client.batch_put_tar(bucket, "upload.tar", blobs, prefix="")["objects"] == SAMPLES
    return bucket, {k: hashlib.sha256(v).hexdigest() for k, v in blobs.items()}


@pytest.fixture
def crt_env(monkeypatch):
    # The CRT client of s3torchconnector takes credentials from the environment, like the SDKs.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ROOT_AK)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", ROOT_SK)
    return S3ClientConfig(force_path_style=True)


def digest_of(reader):
    return reader.key, hashlib.sha256(reader.read()).hexdigest()


def listify(batch):
    return batch


def test_s3torchconnector_map_dataset_reads_every_object(server, data, crt_env):
    bucket, digests = data
    ds = S3MapDataset.from_prefix(f"s3://{bucket}/train/", region=REGION, endpoint=server.endpoint,
                                  transform=digest_of, s3client_config=crt_env)
    assert len(ds) == SAMPLES
    got = {}
    loader = DataLoader(ds, batch_size=32, shuffle=True, num_workers=2, collate_fn=listify)
    for batch in loader:
        for key, digest in batch:
            assert key not in got
            got[key] = digest
    assert got == digests


def test_s3torchconnector_iterable_dataset_shards_across_workers(server, data, crt_env):
    bucket, digests = data
    ds = S3IterableDataset.from_prefix(f"s3://{bucket}/train/", region=REGION, endpoint=server.endpoint,
                                       transform=digest_of, s3client_config=crt_env,
                                       enable_sharding=True)
    seen = collections.Counter()
    got = {}
    for batch in DataLoader(ds, batch_size=50, num_workers=3, collate_fn=listify):
        for key, digest in batch:
            seen[key] += 1
            got[key] = digest
    assert max(seen.values()) == 1
    assert got == digests


def test_s3torchconnector_checkpoint_round_trip(server, data, crt_env):
    bucket, _ = data
    # 17 MB: more than the CRT client's 8 MiB part size, so the upload is multipart.
    model = torch.nn.Sequential(torch.nn.Linear(2048, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 10))
    ckpt = S3Checkpoint(region=REGION, endpoint=server.endpoint, s3client_config=crt_env)
    uri = f"s3://{bucket}/checkpoints/epoch-3.pt"
    with ckpt.writer(uri) as w:
        torch.save(model.state_dict(), w)
    with ckpt.reader(uri) as r:
        state = torch.load(io.BytesIO(r.read()), weights_only=True)
    assert state.keys() == model.state_dict().keys()
    for name, tensor in model.state_dict().items():
        assert torch.equal(state[name], tensor), name


def test_packrat_map_dataset_under_a_shuffling_dataloader(server, data):
    bucket, digests = data
    factory = lambda: PackratClient(server.endpoint, region_name=REGION, aws_access_key_id=ROOT_AK,  # noqa: E731
                                    aws_secret_access_key=ROOT_SK)
    keys = sorted(digests)
    ds = MapDataset(factory, bucket, keys, transform=lambda s: (s.name, hashlib.sha256(s.data).hexdigest()))
    got = {}
    for batch in DataLoader(ds.as_torch(), batch_size=64, shuffle=True, num_workers=4, collate_fn=listify):
        for key, digest in batch:
            assert key not in got
            got[key] = digest
    assert got == digests


def test_packrat_epoch_stream_under_dataloader_workers(server, data):
    bucket, digests = data
    factory = lambda: PackratClient(server.endpoint, region_name=REGION, aws_access_key_id=ROOT_AK,  # noqa: E731
                                    aws_secret_access_key=ROOT_SK)
    ds = EpochDataset(factory, bucket, "train/", seed=7,
                      transform=lambda s: (s.name, hashlib.sha256(s.data).hexdigest())).as_torch()
    orders = []
    for epoch in range(2):
        ds.set_epoch(epoch)
        got, order = {}, []
        for batch in DataLoader(ds, batch_size=64, num_workers=4, collate_fn=listify):
            for key, digest in batch:
                assert key not in got
                got[key] = digest
                order.append(key)
        assert got == digests
        orders.append(order)
    assert orders[0] != orders[1]


def test_two_ranks_of_two_workers_read_every_sample_once_in_equal_shares(server, data, tmp_path):
    """torchrun starts two ranks (gloo, this machine), each with two DataLoader workers: the
    map dataset under `DistributedSampler` and the epoch stream each give every sample of the
    epoch to exactly one rank, in equal counts, and the two ranks different samples."""
    bucket, digests = data
    env = dict(os.environ, AWS_ACCESS_KEY_ID=ROOT_AK, AWS_SECRET_ACCESS_KEY=ROOT_SK)
    out = tmp_path / "keys"
    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         str(pathlib.Path(__file__).with_name("torch_ranks.py")), server.endpoint, bucket, str(out)],
        env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    ranks = [json.loads(pathlib.Path(f"{out}.{r}").read_text()) for r in (0, 1)]
    assert [(r["rank"], r["world"]) for r in ranks] == [(0, 2), (1, 2)]
    for kind in ("map", "stream"):
        a, b = ranks[0][kind], ranks[1][kind]
        assert len(a) == len(b) == SAMPLES // 2, (kind, len(a), len(b))
        assert sorted(a + b) == sorted(digests), f"{kind}: every sample once across the ranks"
