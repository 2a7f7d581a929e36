#!/usr/bin/env python3
"""A reader loop without a DataLoader: one process reads N samples of about 110 KiB into
memory, nothing else, and reports its own CPU per sample (time.process_time, best of three
passes; the server's CPU is not counted). Readers: local files (open/read/close), packrat's
batch GET (256 keys a request) and epoch stream (packrat_client, with its native reader and
in pure Python), and boto3 get_object (a quarter of the samples: it is slow). Issue 65's measure of what a loader host pays per sample.

    packrat serve --data-dir /tmp/rl-data --listen 127.0.0.1:9712 &
    AWS_ACCESS_KEY_ID=... AWS_SECRET_ACCESS_KEY=... bench/reader_loop.py --endpoint http://127.0.0.1:9712

Pin it to one core (`taskset -c 0`) and the server to the other to see a training host's view.
The first run uploads the samples (bucket `reader-loop`) and writes the local copies."""

import argparse
import os
import sys
import time

import boto3
from botocore.config import Config
from packrat_client import PackratClient


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--endpoint", default="http://127.0.0.1:9712")
    ap.add_argument("--samples", type=int, default=2000)
    ap.add_argument("--size", type=int, default=110 * 1024)
    ap.add_argument("--local-dir", default="/tmp/packrat-reader-loop")
    a = ap.parse_args()
    creds = dict(region_name=os.environ.get("AWS_DEFAULT_REGION", "us-east-1"),
                 aws_access_key_id=os.environ["AWS_ACCESS_KEY_ID"],
                 aws_secret_access_key=os.environ["AWS_SECRET_ACCESS_KEY"])
    native = PackratClient(endpoint_url=a.endpoint, native=True, **creds)
    pure = PackratClient(endpoint_url=a.endpoint, native=False, **creds)
    s3 = boto3.client("s3", endpoint_url=a.endpoint, config=Config(s3={"addressing_style": "path"}), **creds)
    bucket, n = "reader-loop", a.samples
    keys = [f"s/{i:06d}.jpg" for i in range(n)]
    if bucket not in [b["Name"] for b in s3.list_buckets()["Buckets"]]:
        s3.create_bucket(Bucket=bucket)
        os.makedirs(a.local_dir, exist_ok=True)
        for k in keys:
            body = os.urandom(a.size)
            s3.put_object(Bucket=bucket, Key=k, Body=body)
            with open(os.path.join(a.local_dir, k.replace("/", "_")), "wb") as f:
                f.write(body)

    def files():
        total = 0
        for k in keys:
            with open(os.path.join(a.local_dir, k.replace("/", "_")), "rb") as f:
                total += len(f.read())
        return total, n

    def batch(client):
        def run():
            total = 0
            for start in range(0, n, 256):
                total += sum(len(s.data) for s in client.batch_get(bucket, keys[start:start + 256]))
            return total, n
        return run

    def stream(client):
        return lambda: (sum(len(s.data) for s in client.stream_epoch(bucket, prefix="s/")), n)

    def boto():
        some = keys[: max(1, n // 4)]
        return sum(len(s3.get_object(Bucket=bucket, Key=k)["Body"].read()) for k in some), len(some)

    print(f"| reader ({n} samples of {a.size} bytes) | client CPU per sample |\n|---|---|")
    readers = [("local files, open/read/close", files),
               ("packrat_client batch GET, 256 a request (native reader)", batch(native)),
               ("packrat_client batch GET, 256 a request (pure Python)", batch(pure)),
               ("packrat_client epoch stream (native reader)", stream(native)),
               ("packrat_client epoch stream (pure Python)", stream(pure)),
               ("boto3 get_object", boto)]
    for name, fn in readers:
        fn()  # warm: page cache, connections
        best = None
        for _ in range(3):
            t = time.process_time()
            got, count = fn()
            cpu = time.process_time() - t
            if got != count * a.size:
                sys.exit(f"{name}: read {got} bytes, not {count * a.size}")
            best = cpu if best is None else min(best, cpu)
        print(f"| {name} | {best / count * 1e6:,.0f} µs |")


if __name__ == "__main__":
    main()
