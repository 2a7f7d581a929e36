"""Train a tiny classifier on scikit-learn's digits, one file per sample, read four ways:

  local      the files in a local directory (the baseline any loader is held to)
  boto3      one GetObject per sample (what S3 costs a training job today)
  stream     packrat epoch streams (EpochDataset: one request per DataLoader worker and epoch)
  batch      packrat batch GET (BatchDataset: one request per 256 samples)

Each way runs the same training loop (PyTorch DataLoader, 2 workers, a 64-32-10 MLP) for a few
epochs and reports samples/s and the final accuracy on a held-out split. The samples are
uploaded once, each as its own object: a label byte and 64 pixel bytes.

    pip install ./sdk-examples/python torch scikit-learn
    python sdk-examples/python/train_digits.py --endpoint http://127.0.0.1:9000

Credentials come from the usual places (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, profile).
"""

import argparse
import os
import tempfile
import time

import boto3
import numpy as np
import torch
from botocore.config import Config
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from packrat_client import BatchDataset, EpochDataset, PackratClient

PREFIX = "digits/train/"


def encode(label, pixels):
    return bytes([int(label)]) + pixels.astype(np.uint8).tobytes()


def decode(data):
    return torch.tensor(list(data[1:]), dtype=torch.float32) / 16.0, int(data[0])


class LocalFiles(IterableDataset):
    def __init__(self, paths, seed):
        self.paths, self.seed, self.epoch = paths, seed, 0

    def __iter__(self):
        info = get_worker_info()
        w, n = (info.id, info.num_workers) if info else (0, 1)
        order = np.random.default_rng(self.seed + self.epoch).permutation(len(self.paths))
        for i in order[w::n]:
            with open(self.paths[i], "rb") as f:
                yield decode(f.read())


class PerObjectGets(IterableDataset):
    def __init__(self, endpoint, bucket, keys, seed):
        self.endpoint, self.bucket, self.keys, self.seed, self.epoch = endpoint, bucket, keys, seed, 0

    def __iter__(self):
        info = get_worker_info()
        w, n = (info.id, info.num_workers) if info else (0, 1)
        s3 = boto3.client("s3", endpoint_url=self.endpoint, config=Config(s3={"addressing_style": "path"}))
        order = np.random.default_rng(self.seed + self.epoch).permutation(len(self.keys))
        for i in order[w::n]:
            yield decode(s3.get_object(Bucket=self.bucket, Key=self.keys[i])["Body"].read())


def train(name, dataset, test_x, test_y, epochs, workers):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    seen = 0
    started = time.perf_counter()
    for epoch in range(epochs):
        dataset.epoch = epoch
        if hasattr(dataset, "set_epoch"):
            dataset.set_epoch(epoch)
        for x, y in DataLoader(dataset, batch_size=64, num_workers=workers):
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            opt.step()
            seen += len(y)
    secs = time.perf_counter() - started
    with torch.no_grad():
        acc = (model(test_x).argmax(1) == test_y).float().mean().item()
    print(f"{name:<8} {seen:>7} samples in {secs:6.2f} s  {seen / secs:>9.0f} samples/s  accuracy {acc:.3f}")
    return seen / secs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--endpoint", default=os.environ.get("AWS_ENDPOINT_URL", "http://127.0.0.1:9000"))
    ap.add_argument("--bucket", default="digits")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()

    digits = load_digits()
    n = len(digits.target)
    order = np.random.default_rng(0).permutation(n)
    train_idx, test_idx = order[: int(n * 0.8)], order[int(n * 0.8):]
    test_x = torch.tensor(digits.data[test_idx], dtype=torch.float32) / 16.0
    test_y = torch.tensor(digits.target[test_idx])

    s3 = boto3.client("s3", endpoint_url=args.endpoint, config=Config(s3={"addressing_style": "path"}))
    try:
        s3.create_bucket(Bucket=args.bucket)
    except s3.exceptions.BucketAlreadyOwnedByYou:
        pass
    keys = [f"{PREFIX}{i:05d}.bin" for i in train_idx]
    local = tempfile.mkdtemp(prefix="digits-")
    paths = []
    pc = PackratClient(endpoint_url=args.endpoint)
    # Upload as one batch PUT (a TAR extracted into one object per sample); keep local copies.
    members = {}
    for i, k in zip(train_idx, keys):
        data = encode(digits.target[i], digits.data[i])
        members[k[len(PREFIX):]] = data
        p = os.path.join(local, k.rsplit("/", 1)[1])
        with open(p, "wb") as f:
            f.write(data)
        paths.append(p)
    summary = pc.batch_put_tar(args.bucket, PREFIX + "upload.tar", members)
    print(f"uploaded {summary['objects']} samples ({summary['bytes']} bytes) in one batch PUT")

    factory = lambda: PackratClient(endpoint_url=args.endpoint)  # noqa: E731
    to_xy = lambda s: decode(s.data)  # noqa: E731
    rates = {
        "local": train("local", LocalFiles(paths, 1), test_x, test_y, args.epochs, args.workers),
        "boto3": train("boto3", PerObjectGets(args.endpoint, args.bucket, keys, 1), test_x, test_y,
                       args.epochs, args.workers),
        "stream": train("stream", EpochDataset(factory, args.bucket, PREFIX, seed=1, transform=to_xy).as_torch(),
                        test_x, test_y, args.epochs, args.workers),
        "batch": train("batch", BatchDataset(factory, args.bucket, keys, seed=1, transform=to_xy).as_torch(),
                       test_x, test_y, args.epochs, args.workers),
    }
    print("relative to per-object boto3 GETs: " +
          ", ".join(f"{k} {v / rates['boto3']:.1f}x" for k, v in rates.items()))


if __name__ == "__main__":
    main()
