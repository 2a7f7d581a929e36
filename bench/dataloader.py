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
a training transform would; "packed" (opt-in: --kinds) is "bytes" with a batch's samples
collated into one tensor, so the DataLoader moves one shared-memory segment per batch to the
main process rather than one per sample. The loader host's CPU per sample (this process and its
DataLoader workers), its page faults and context switches, and the server's CPU come from
/proc. "cold" modes drop the page cache (as root: all of it, the server's segment files too;
the server's own caches in memory stay) after the workers started. Every mode runs ROUNDS
times, the order alternating, and the table gives the medians and the spread."""

import argparse
import io
import json
import os
import random
import statistics
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


def packed_collate(batch):
    # The batch's bytes as one tensor and each sample's length: one shared-memory segment per
    # batch on its way to the main process, rather than one per sample.
    return (torch.cat([b for b, _ in batch]), torch.tensor([len(b) for b, _ in batch]),
            torch.tensor([lab for _, lab in batch]))


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


def stat_of(pid):
    """The fields of /proc/PID/stat after the command name (the state is [0])."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def cpu_of(pids):
    """CPU seconds (user + system) the processes have used."""
    total = 0
    for pid in pids:
        fields = stat_of(pid)
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def events_of(pids):
    """(minor page faults, context switches) of the processes: faults from /proc/PID/stat,
    switches (voluntary and not) summed over each process's threads."""
    faults = switches = 0
    for pid in pids:
        faults += int(stat_of(pid)[7])
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{task}/status") as f:
                    for line in f:
                        if "ctxt_switches:" in line:
                            switches += int(line.split()[1])
            except FileNotFoundError:  # a thread that ended meanwhile
                pass
    return faults, switches


def drop_cache(root, rels):
    """The page cache dropped: all of it as root (`/proc/sys/vm/drop_caches`, so the server's
    segment files too), else the local files' pages only (the server's then stay cached, and
    its cold runs are not cold: said in the output)."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        for rel in rels:
            fd = os.open(os.path.join(root, rel), os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
        return False


def build(mode, kind, a, rels, keys, epoch):
    transform = to_image if kind == "decode" else to_bytes
    collate = {"decode": None, "bytes": bytes_collate, "packed": packed_collate}[kind]
    common = dict(batch_size=a.batch, num_workers=a.workers, collate_fn=collate, persistent_workers=True)
    factory = ClientFactory(a.endpoint)
    mode = mode.removesuffix(" cold").removesuffix(" warm")
    if mode == "local":
        return DataLoader(LocalFiles(a.root, rels, transform), shuffle=True, **common)
    if mode == "boto3 GET":
        return DataLoader(Boto3Gets(a.endpoint, keys, transform), shuffle=True, **common)
    if mode == "s3torchconnector":
        from s3torchconnector import S3ClientConfig, S3MapDataset

        ds = S3MapDataset.from_prefix(f"s3://{BUCKET}/img/", region=REGION, endpoint=a.endpoint,
                                      transform=S3tcTransform(transform),
                                      s3client_config=S3ClientConfig(force_path_style=True))
        return DataLoader(ds, shuffle=True, **common)
    if mode == "packrat map":
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


MODES = ["local warm", "local cold", "boto3 GET", "s3torchconnector", "packrat map warm",
         "packrat map cold", "packrat epoch stream warm", "packrat epoch stream cold",
         "WebDataset shards"]


def run(mode, kind, a, rels, keys, epoch):
    want = a.decode_samples if kind == "decode" else a.samples
    cold = None
    if mode == "local warm":
        for rel in rels:  # into the page cache
            with open(os.path.join(a.root, rel), "rb") as f:
                f.read()
    loader = build(mode, kind, a, rels, keys, epoch)
    start = time.monotonic()
    for i, _ in enumerate(loader):
        if i + 1 >= 2 * a.workers:
            break
    first = time.monotonic() - start
    if mode.endswith(" cold"):
        # After the workers started (their imports read files too), before the measured pass.
        cold = drop_cache(a.root, rels)
    # The loader host: this process and its DataLoader workers (persistent, so alive through
    # the pass).
    loader_pids = [os.getpid()] + [w.pid for w in loader._iterator._workers]
    server0, loader0, events0 = cpu_of([a.server_pid]), cpu_of(loader_pids), events_of(loader_pids)
    t0 = time.monotonic()
    n = 0
    for batch in loader:
        n += len(batch[-1])
        if n >= want:
            break
    secs = time.monotonic() - t0
    server, host = cpu_of([a.server_pid]) - server0, cpu_of(loader_pids) - loader0
    faults, switches = (b - a0 for b, a0 in zip(events_of(loader_pids), events0))
    del loader
    remote = not mode.startswith("local")
    return dict(mode=mode, kind=kind, samples=n, seconds=secs, samples_per_sec=n / secs,
                first_batch_seconds=first, cache_dropped=cold,
                loader_cpu_us_per_sample=host * 1e6 / n,
                loader_faults_per_sample=faults / n, loader_switches_per_sample=switches / n,
                server_cpu_us_per_sample=(server * 1e6 / n) if remote else None)


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
    p.add_argument("--kinds", default="bytes,decode",
                   help="bytes (a tensor per sample), decode (224x224), packed (bytes, a batch's "
                        "samples in one tensor)")
    p.add_argument("--skip-upload", action="store_true")
    p.add_argument("--json", help="append each result as a JSON line to this file")
    p.add_argument("--rounds", type=int, default=3, help="rounds, the order of modes alternating")
    a = p.parse_args()
    torch.set_num_threads(1)
    os.makedirs(a.root, exist_ok=True)
    # The dataset is made and uploaded on every core; the measured passes run on the cores this
    # process was started on (bench/dataloader.sh pins it to one).
    pinned = os.sched_getaffinity(0)
    os.sched_setaffinity(0, range(os.cpu_count()))
    rels = make_dataset(a.root, a.images)
    keys = [f"img/{r}" for r in rels]
    s3 = boto3.client("s3", endpoint_url=a.endpoint, region_name=REGION)
    if not a.skip_upload:
        upload(ClientFactory(a.endpoint)(), s3, a.root, rels)
    os.sched_setaffinity(0, pinned)
    results = []
    modes = a.modes.split(",")
    for rnd in range(1, a.rounds + 1):
        # Alternated: odd rounds in the listed order, even rounds reversed.
        order = modes if rnd % 2 else modes[::-1]
        for kind in a.kinds.split(","):
            for epoch, mode in enumerate(order):
                r = run(mode, kind, a, rels, keys, epoch + 100 * rnd)
                r["round"] = rnd
                results.append(r)
                cpu = f"{r['server_cpu_us_per_sample']:.1f}" if r["server_cpu_us_per_sample"] is not None else "-"
                print(f"round {rnd} {kind:6s} {mode:26s} start-up {r['first_batch_seconds']:5.2f} s, then "
                      f"{r['samples']:6d} samples {r['seconds']:6.2f} s {r['samples_per_sec']:8.0f} samples/s, "
                      f"loader CPU {r['loader_cpu_us_per_sample']:.0f} µs/sample "
                      f"({r['loader_faults_per_sample']:.1f} faults, {r['loader_switches_per_sample']:.2f} switches), "
                      f"server CPU {cpu} µs/sample"
                      + ("" if r["cache_dropped"] is not False else " (only the local files' cache dropped: not root)"),
                      flush=True)
                if a.json:
                    with open(a.json, "a") as f:
                        f.write(json.dumps(r) + "\n")
    print()
    print(f"medians of {a.rounds} rounds (spread: lowest-highest); \"vs local\": against local files "
          "with the page cache in the same state (warm, or dropped for the cold modes)")
    print("| reader | samples/s, bytes | vs local | samples/s, decoded 224x224 | vs local | "
          "loader CPU µs/sample, bytes | server CPU µs/sample, bytes |")
    print("|---|---|---|---|---|---|---|")

    def cell(mode, kind, field, fmt="{:,.0f}"):
        vals = [r[field] for r in results if r["mode"] == mode and r["kind"] == kind and r[field] is not None]
        if not vals:
            return "-", None
        m = statistics.median(vals)
        spread = f" ({fmt.format(min(vals))}-{fmt.format(max(vals))})" if len(vals) > 1 else ""
        return fmt.format(m) + spread, m

    def versus(mode, kind):
        _, rate = cell(mode, kind, "samples_per_sec")
        _, local = cell("local cold" if mode.endswith(" cold") else "local warm", kind, "samples_per_sec")
        return f"{rate / local:.2f}x" if rate and local else "-"

    for mode in modes:
        b, _ = cell(mode, "bytes", "samples_per_sec")
        d, _ = cell(mode, "decode", "samples_per_sec")
        host, _ = cell(mode, "bytes", "loader_cpu_us_per_sample")
        server, _ = cell(mode, "bytes", "server_cpu_us_per_sample", "{:.1f}")
        print(f"| {mode} | {b} | {versus(mode, 'bytes')} | {d} | {versus(mode, 'decode')} | {host} | {server} |")
    if "packed" in a.kinds.split(","):
        print()
        print("| reader | samples/s, packed | vs local | loader CPU µs/sample, packed | server CPU µs/sample, packed |")
        print("|---|---|---|---|---|")
        for mode in modes:
            b, _ = cell(mode, "packed", "samples_per_sec")
            host, _ = cell(mode, "packed", "loader_cpu_us_per_sample")
            server, _ = cell(mode, "packed", "server_cpu_us_per_sample", "{:.1f}")
            print(f"| {mode} | {b} | {versus(mode, 'packed')} | {host} | {server} |")


if __name__ == "__main__":
    main()
