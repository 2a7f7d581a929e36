""""Feeding GPUs": a PyTorch DataLoader (4 workers, batch 256) over one image dataset, read from
local files and from packrat in each way a training job can, with and without JPEG decoding.
Run by bench/dataloader.sh, which starts the server; see docs/benchmarks.md for figures.

The dataset: IMAGES JPEGs of about 100 KiB in 100 class folders (ImageFolder layout), made from
the two real photographs scikit-learn ships (`load_sample_images`), each randomly cropped,
flipped and re-encoded. The same files are uploaded under `img/`, and packed as WebDataset
shards of 1,000 samples (`.jpg` + `.cls`) under `wds/`.

Each mode reads SAMPLES samples (DECODE_SAMPLES with decoding) in a shuffled order from a fresh
DataLoader with persistent workers: a warm-up pass of 2 batches per worker starts the workers
(about a second each, importing torch; reported as "start-up"), then the clock runs over a new
pass, from creating its iterator (the pipeline fills again) to the last batch. "bytes" ends at a
uint8 tensor of the file's bytes; "decode" decodes the JPEG and resizes it to 224x224 (PIL), as
a training transform would. Server CPU per sample comes from /proc/PID/stat."""

import argparse
import io
import json
import os
import random
import tarfile
import time
from concurrent.futures import ProcessPoolExecutor

import boto3
import numpy as np
import torch
from botocore.config import Config
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from packrat_client import EpochDataset, MapDataset, PackratClient

REGION = "us-east-1"
BUCKET = "dataloader"
CLASSES = 100
SHARD = 1000


def make_image(args):
    i, root = args
    from sklearn.datasets import load_sample_images

    photos = make_image.photos = getattr(make_image, "photos", None) or load_sample_images().images
    rng = random.Random(i)
    photo = photos[i % len(photos)]
    h, w = photo.shape[:2]
    ch, cw = rng.randint(360, h), rng.randint(480, w)
    y, x = rng.randint(0, h - ch), rng.randint(0, w - cw)
    img = Image.fromarray(photo[y:y + ch, x:x + cw])
    if rng.random() < 0.5:
        img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=rng.randint(96, 98))
    rel = f"c{i % CLASSES:03d}/{i:06d}.jpg"
    path = os.path.join(root, rel)
    with open(path, "wb") as f:
        f.write(buf.getvalue())
    return rel, len(buf.getvalue())


def make_dataset(root, n):
    """The images under root/ (made once; reused when already there)."""
    marker = os.path.join(root, f".complete-{n}")
    if os.path.exists(marker):
        rels = sorted(os.path.relpath(os.path.join(d, f), root)
                      for d, _, fs in os.walk(root) for f in fs if f.endswith(".jpg"))
        return rels
    for c in range(CLASSES):
        os.makedirs(os.path.join(root, f"c{c:03d}"), exist_ok=True)
    t0 = time.monotonic()
    with ProcessPoolExecutor(os.cpu_count()) as pool:
        made = list(pool.map(make_image, [(i, root) for i in range(n)], chunksize=256))
    size = sum(s for _, s in made)
    print(f"made {n} JPEGs, {size / n / 1024:.1f} KiB on average, in {time.monotonic() - t0:.0f} s", flush=True)
    open(marker, "w").close()
    return sorted(r for r, _ in made)


def upload(client, s3, root, rels):
    """img/<rel> per file (batch PUT of 1,000 files per TAR) and wds/shard-NNNN.tar shards."""
    try:
        s3.create_bucket(Bucket=BUCKET)
    except s3.exceptions.BucketAlreadyOwnedByYou:
        pass
    t0 = time.monotonic()
    for start in range(0, len(rels), SHARD):
        part = rels[start:start + SHARD]
        files = {}
        for rel in part:
            with open(os.path.join(root, rel), "rb") as f:
                files[rel] = f.read()
        client.batch_put_tar(BUCKET, "img/upload.tar", files, prefix="img/")
        # The WebDataset shard: shuffled members, `<key>.jpg` and `<key>.cls` per sample.
        order = list(files)
        random.Random(start).shuffle(order)
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tf:
            for rel in order:
                stem = rel[:-4].replace("/", "_")
                for ext, data in (("jpg", files[rel]), ("cls", rel[1:4].encode())):
                    info = tarfile.TarInfo(f"{stem}.{ext}")
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))
        s3.put_object(Bucket=BUCKET, Key=f"wds/shard-{start // SHARD:04d}.tar", Body=buf.getvalue())
    print(f"uploaded {len(rels)} objects and {len(range(0, len(rels), SHARD))} shards in "
          f"{time.monotonic() - t0:.0f} s", flush=True)


# ---------------------------------------------------------------- transforms

def to_bytes(data, label):
    return torch.frombuffer(bytearray(data), dtype=torch.uint8), label


def to_image(data, label):
    img = Image.open(io.BytesIO(data)).convert("RGB").resize((224, 224), Image.Resampling.BILINEAR)
    return torch.from_numpy(np.array(img)).permute(2, 0, 1), label


def label_of(key):
    return int(key.rsplit("/", 2)[-2][1:])


def bytes_collate(batch):
    # Variable-length byte tensors are not stacked.
    return [b for b, _ in batch], torch.tensor([lab for _, lab in batch])


# ---------------------------------------------------------------- datasets

class LocalFiles(Dataset):
    def __init__(self, root, rels, transform):
        self.root, self.rels, self.transform = root, rels, transform

    def __len__(self):
        return len(self.rels)

    def __getitem__(self, i):
        with open(os.path.join(self.root, self.rels[i]), "rb") as f:
            return self.transform(f.read(), label_of(self.rels[i]))


class Boto3Gets(Dataset):
    """One GetObject per sample, a boto3 client per worker process."""

    def __init__(self, endpoint, keys, transform):
        self.endpoint, self.keys, self.transform, self.s3, self.pid = endpoint, keys, transform, None, None

    def __len__(self):
        return len(self.keys)

    def __getitem__(self, i):
        if self.pid != os.getpid():
            self.s3 = boto3.client("s3", endpoint_url=self.endpoint, region_name=REGION,
                                   config=Config(max_pool_connections=4))
            self.pid = os.getpid()
        data = self.s3.get_object(Bucket=BUCKET, Key=self.keys[i])["Body"].read()
        return self.transform(data, label_of(self.keys[i]))


class S3tcTransform:
    def __init__(self, transform):
        self.transform = transform

    def __call__(self, reader):
        return self.transform(reader.read(), label_of(reader.key))


class PackratTransform:
    def __init__(self, transform):
        self.transform = transform

    def __call__(self, s):
        return self.transform(s.data, label_of(s.name))


class WdsTransform:
    def __init__(self, transform):
        self.transform = transform

    def __call__(self, sample):
        return self.transform(sample["jpg"], int(sample["cls"]))


def presign(endpoint, path):
    from botocore.auth import S3SigV4QueryAuth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    req = AWSRequest(method="GET", url=endpoint + path)
    S3SigV4QueryAuth(Credentials(os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"]),
                     "s3", REGION, expires=3600).add_auth(req)
    return req.prepare().url


def server_cpu(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def drop_cache(root, rels):
    for rel in rels:
        fd = os.open(os.path.join(root, rel), os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


def build(mode, kind, a, rels, keys, epoch):
    transform = to_image if kind == "decode" else to_bytes
    collate = None if kind == "decode" else bytes_collate
    common = dict(batch_size=a.batch, num_workers=a.workers, collate_fn=collate, persistent_workers=True)
    factory = ClientFactory(a.endpoint)
    if mode in ("local warm", "local cold"):
        return DataLoader(LocalFiles(a.root, rels, transform), shuffle=True, **common)
    if mode == "boto3 GET":
        return DataLoader(Boto3Gets(a.endpoint, keys, transform), shuffle=True, **common)
    if mode == "s3torchconnector":
        from s3torchconnector import S3ClientConfig, S3MapDataset

        ds = S3MapDataset.from_prefix(f"s3://{BUCKET}/img/", region=REGION, endpoint=a.endpoint,
                                      transform=S3tcTransform(transform),
                                      s3client_config=S3ClientConfig(force_path_style=True))
        return DataLoader(ds, shuffle=True, **common)
    if mode == "packrat map (batch GET)":
        ds = MapDataset(factory, BUCKET, keys, transform=PackratTransform(transform))
        return DataLoader(ds.as_torch(), shuffle=True, **common)
    if mode == "packrat epoch stream":
        ds = EpochDataset(factory, BUCKET, "img/", seed=1, transform=PackratTransform(transform)).as_torch()
        ds.set_epoch(epoch)
        return DataLoader(ds, **common)
    if mode == "WebDataset shards":
        import webdataset as wds

        urls = [presign(a.endpoint, f"/{BUCKET}/wds/shard-{s:04d}.tar")
                for s in range((len(rels) + SHARD - 1) // SHARD)]
        ds = (wds.WebDataset(urls, shardshuffle=len(urls), empty_check=False, seed=epoch)
              .shuffle(1000).map(WdsTransform(transform)))
        return DataLoader(ds, **common)
    raise ValueError(mode)


class ClientFactory:
    def __init__(self, endpoint):
        self.endpoint = endpoint

    def __call__(self):
        return PackratClient(self.endpoint, region_name=REGION)


MODES = ["local warm", "local cold", "boto3 GET", "s3torchconnector", "packrat map (batch GET)",
         "packrat epoch stream", "WebDataset shards"]


def run(mode, kind, a, rels, keys, epoch):
    want = a.decode_samples if kind == "decode" else a.samples
    if mode == "local cold":
        drop_cache(a.root, rels)
    elif mode == "local warm":
        for rel in rels:  # into the page cache
            with open(os.path.join(a.root, rel), "rb") as f:
                f.read()
    loader = build(mode, kind, a, rels, keys, epoch)
    start = time.monotonic()
    for i, _ in enumerate(loader):
        if i + 1 >= 2 * a.workers:
            break
    first = time.monotonic() - start
    cpu0 = server_cpu(a.server_pid)
    t0 = time.monotonic()
    n = 0
    for x, y in loader:
        n += len(y)
        if n >= want:
            break
    secs = time.monotonic() - t0
    cpu = server_cpu(a.server_pid) - cpu0
    del loader
    remote = not mode.startswith("local")
    return dict(mode=mode, kind=kind, samples=n, seconds=secs, samples_per_sec=n / secs,
                first_batch_seconds=first,
                server_cpu_us_per_sample=(cpu * 1e6 / n) if remote else None)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--endpoint", required=True)
    p.add_argument("--server-pid", type=int, required=True)
    p.add_argument("--root", required=True, help="where the local JPEGs are (made if missing)")
    p.add_argument("--images", type=int, default=50_000)
    p.add_argument("--samples", type=int, default=20_480, help="samples read per mode, bytes only")
    p.add_argument("--decode-samples", type=int, default=5_120, help="samples read per mode, decoding")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--kinds", default="bytes,decode")
    p.add_argument("--skip-upload", action="store_true")
    p.add_argument("--json", help="append each result as a JSON line to this file")
    a = p.parse_args()
    torch.set_num_threads(1)
    os.makedirs(a.root, exist_ok=True)
    rels = make_dataset(a.root, a.images)
    keys = [f"img/{r}" for r in rels]
    s3 = boto3.client("s3", endpoint_url=a.endpoint, region_name=REGION)
    if not a.skip_upload:
        upload(ClientFactory(a.endpoint)(), s3, a.root, rels)
    results = []
    for kind in a.kinds.split(","):
        for epoch, mode in enumerate(a.modes.split(",")):
            r = run(mode, kind, a, rels, keys, epoch)
            results.append(r)
            cpu = f"{r['server_cpu_us_per_sample']:.1f}" if r["server_cpu_us_per_sample"] is not None else "-"
            print(f"{kind:6s} {mode:26s} start-up {r['first_batch_seconds']:5.2f} s, then "
                  f"{r['samples']:6d} samples {r['seconds']:6.2f} s {r['samples_per_sec']:8.0f} "
                  f"samples/s  server CPU {cpu} µs/sample", flush=True)
            if a.json:
                with open(a.json, "a") as f:
                    f.write(json.dumps(r) + "\n")
    print()
    print("| reader | samples/s, bytes | samples/s, decode 224x224 | server CPU µs/sample (bytes) | bytes: vs local warm | bytes: vs boto3 |")
    print("|---|---|---|---|---|---|")
    by = {(r["mode"], r["kind"]): r for r in results}

    def rate(m, k):
        return by[(m, k)]["samples_per_sec"] if (m, k) in by else None

    for mode in a.modes.split(","):
        b, d = rate(mode, "bytes"), rate(mode, "decode")
        lw, bo = rate("local warm", "bytes"), rate("boto3 GET", "bytes")
        cpu = by.get((mode, "bytes"), {}).get("server_cpu_us_per_sample")
        fmt = lambda v, f="{:,.0f}": f.format(v) if v is not None else "-"  # noqa: E731
        print(f"| {mode} | {fmt(b)} | {fmt(d)} | {fmt(cpu, '{:.1f}')} | "
              f"{fmt(b / lw if b and lw else None, '{:.2f}x')} | {fmt(b / bo if b and bo else None, '{:.1f}x')} |")


if __name__ == "__main__":
    main()
