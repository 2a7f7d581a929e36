"""packrat with plain boto3: create a bucket, upload samples, list them, read one back.

    PACKRAT_ENDPOINT=http://127.0.0.1:9000 \
    AWS_ACCESS_KEY_ID=... AWS_SECRET_ACCESS_KEY=... python3 sdk-examples/boto3_quickstart.py
"""

import os

import boto3
from botocore.config import Config


def main():
    s3 = boto3.client(
        "s3",
        endpoint_url=os.environ.get("PACKRAT_ENDPOINT", "http://127.0.0.1:9000"),
        region_name=os.environ.get("AWS_DEFAULT_REGION", "us-east-1"),
        config=Config(s3={"addressing_style": "path"}),
    )
    bucket = os.environ.get("PACKRAT_EXAMPLE_BUCKET", "quickstart")
    existing = [b["Name"] for b in s3.list_buckets()["Buckets"]]
    if bucket not in existing:
        s3.create_bucket(Bucket=bucket)
    for i in range(10):
        s3.put_object(Bucket=bucket, Key=f"train/{i:05d}.txt", Body=f"sample {i}\n".encode())
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="train/")["Contents"]]
    print(f"{len(keys)} samples under train/: {keys[0]} .. {keys[-1]}")
    body = s3.get_object(Bucket=bucket, Key="train/00003.txt", Range="bytes=0-5")["Body"].read()
    print(f"first bytes of train/00003.txt: {body!r}")


if __name__ == "__main__":
    main()
