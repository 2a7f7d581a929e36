"""packrat_client: packrat's extensions for data loaders, from Python.

Every call is an ordinary S3-style request signed with botocore's SigV4 signer and the usual
boto3 credentials (environment, profile, or explicit keys), sent to the usual endpoint:

    from packrat_client import PackratClient
    pc = PackratClient(endpoint_url="http://127.0.0.1:9000")
    for s in pc.batch_get("data", [{"key": "train/000001.jpg"}, {"key": "train/000002.jpg"}]):
        print(s.name, len(s.data), s.etag)

Nothing here needs torch; `packrat_client.dataset` holds the data-loader pieces and imports
torch only when a torch dataset is asked for.
"""

from .client import (
    AccessDenied,
    InvalidRequest,
    NoSuchBucket,
    NoSuchKey,
    PackratClient,
    PackratError,
    RetryPolicy,
    Sample,
    StreamChanged,
    Unavailable,
)
from .dataset import BatchDataset, EpochDataset, MapDataset, shard_for_worker

__all__ = [
    "PackratClient",
    "PackratError",
    "AccessDenied",
    "InvalidRequest",
    "NoSuchBucket",
    "NoSuchKey",
    "StreamChanged",
    "Unavailable",
    "RetryPolicy",
    "Sample",
    "EpochDataset",
    "MapDataset",
    "BatchDataset",
    "shard_for_worker",
]
