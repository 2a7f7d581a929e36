"""Data-loader pieces: datasets that split an epoch across DataLoader workers and distributed
ranks, and read it through epoch streams or batch GET.

Nothing here imports torch at module load. The datasets are plain Python (tested without
torch); `.as_torch()` wraps one in the matching `torch.utils.data` class for a `DataLoader`.

- `EpochDataset` (iterable): one epoch stream per DataLoader worker per epoch. The server
  permutes the whole prefix, gives every rank the same number of samples and keeps the files
  of one sample together; the client resumes a broken stream where it stopped.
- `MapDataset` (map-style, `__len__` and `__getitem__`): a list of keys; a DataLoader batch is
  fetched with one batch GET (`__getitems__`, which PyTorch's DataLoader calls with a batch's
  indices), so `shuffle=True`, `DistributedSampler` and any sampler work as with local files.
- `BatchDataset` (iterable): a key list, shuffled per epoch and fetched `batch_size` keys per
  batch GET.
"""

import os
import random
import sys
from typing import Callable, Iterator, List, Optional, Sequence, Tuple

from .client import PackratClient, Sample


def _torch_context() -> Tuple[int, int, int, int]:
    """(rank, world size, worker id, workers) from torch if it is loaded, else from the
    RANK / WORLD_SIZE environment (as torchrun sets), with one worker."""
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    worker, workers = 0, 1
    if "torch" in sys.modules:
        import torch.distributed as dist
        from torch.utils.data import get_worker_info

        if dist.is_available() and dist.is_initialized():
            rank, world = dist.get_rank(), dist.get_world_size()
        info = get_worker_info()
        if info is not None:
            worker, workers = info.id, info.num_workers
    return rank, world, worker, workers


def shard_for_worker(rank: int, world: int, worker: int, workers: int) -> Tuple[int, int]:
    """The shard `(i, n)` one DataLoader worker of one rank reads of a key list: every (rank,
    worker) pair gets its own shard of `world * workers`, so together they read it once."""
    if not (0 <= rank < world and 0 <= worker < workers):
        raise ValueError(f"rank {rank}/{world}, worker {worker}/{workers} out of range")
    return rank * workers + worker, world * workers


class _Base:
    def __init__(self, client_factory: Callable[[], PackratClient], bucket: str, seed: int = 0,
                 transform: Optional[Callable[[Sample], object]] = None,
                 context: Optional[Tuple[int, int, int, int]] = None):
        # A factory, not a client: each DataLoader worker process builds its own connections.
        self.client_factory = client_factory
        self.bucket = bucket
        self.seed = seed
        self.epoch = 0
        self.transform = transform
        self.context = context
        self._client = None

    def set_epoch(self, epoch: int) -> None:
        """A new epoch gets a new order (the order is fixed by seed and epoch)."""
        self.epoch = epoch

    def _ctx(self) -> Tuple[int, int, int, int]:
        return self.context or _torch_context()

    def _shard(self) -> Tuple[int, int]:
        return shard_for_worker(*self._ctx())

    def client(self) -> PackratClient:
        # Built on first use in the process that uses it (a DataLoader worker).
        if self._client is None or self._client_pid != os.getpid():
            self._client = self.client_factory()
            self._client_pid = os.getpid()
        return self._client

    def __getstate__(self):
        # Connections are not sent to worker processes; each builds its own.
        d = dict(self.__dict__)
        d["_client"] = None
        return d

    def _out(self, s):
        if isinstance(s, list):
            for part in s:
                if not part.ok:
                    raise RuntimeError(f"packrat could not read {part.name}: {part.error[0]}: {part.error[1]}")
            return self.transform(s) if self.transform else s
        if not s.ok:
            raise RuntimeError(f"packrat could not read {s.name}: {s.error[0]}: {s.error[1]}")
        return self.transform(s) if self.transform else s

    def as_torch(self):
        """This dataset as a `torch.utils.data.IterableDataset` (imports torch)."""
        from torch.utils.data import IterableDataset

        inner = self

        class _TorchDataset(IterableDataset):
            def __iter__(self):
                return iter(inner)

            def set_epoch(self, epoch):
                inner.set_epoch(epoch)

        return _TorchDataset()


class EpochDataset(_Base):
    """Every sample under `prefix`, each epoch, through epoch streams: one streamed request per
    worker per epoch, no listing and no per-sample request. Yields a `Sample` per object, or
    with `samples=True` a list of the `Sample`s of one sample (files sharing a basename).
    `tail` is "pad" (ranks get equal counts by repeating a few samples) or "drop"."""

    def __init__(self, client_factory, bucket: str, prefix: str, seed: int = 0, samples: bool = False,
                 tail: str = "pad", order: str = "shuffle", **kw):
        super().__init__(client_factory, bucket, seed, **kw)
        self.prefix = prefix
        self.samples = samples
        self.tail = tail
        self.order = order

    def __iter__(self) -> Iterator:
        rank, world, worker, workers = self._ctx()
        groups = self.client().stream_samples(
            self.bucket, self.prefix, shard=(rank, world), worker=(worker, workers), seed=self.seed,
            epoch=self.epoch, tail=self.tail, order=self.order)
        for g in groups:
            if self.samples:
                yield self._out(g)
            else:
                for s in g:
                    yield self._out(s)


class MapDataset(_Base):
    """Map-style: sample `i` is the object `keys[i]`. With a DataLoader, a batch's samples are
    fetched by one batch GET: PyTorch calls `__getitems__` with the batch's indices (or pass
    `batch_sampler=` and use `fetch_batch`)."""

    def __init__(self, client_factory, bucket: str, keys: Sequence[str], **kw):
        super().__init__(client_factory, bucket, **kw)
        self.keys = list(keys)

    @classmethod
    def from_prefix(cls, client_factory, bucket: str, prefix: str, s3=None, **kw) -> "MapDataset":
        """Every key under `prefix` (listed once, with boto3's paginator)."""
        import boto3

        c = client_factory()
        s3 = s3 or boto3.client("s3", endpoint_url=c.endpoint_url, region_name=c.region,
                                aws_access_key_id=c._creds.access_key,
                                aws_secret_access_key=c._creds.secret_key,
                                verify=c.ca_bundle)
        keys = []
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            keys.extend(o["Key"] for o in page.get("Contents", []))
        return cls(client_factory, bucket, keys, **kw)

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, i: int):
        return self.__getitems__([i])[0]

    def __getitems__(self, indices: Sequence[int]) -> List:
        """The samples at `indices`, in that order, from one batch GET."""
        keys = [self.keys[i] for i in indices]
        # Each sample is transformed as it arrives, so a batch's raw bytes are not all held at
        # once: a transform that copies (into a tensor) lets each go before the next is read,
        # and the worker's heap does not grow by a batch and shrink again (page faults, each
        # page cleared again, measured in bench/dataloader.sh).
        got = [self._out(s) for s in self.client().batch_get(self.bucket, keys, order="request")]
        if len(got) != len(keys):
            raise RuntimeError(f"a batch GET of {len(keys)} keys answered {len(got)} entries")
        return got

    fetch_batch = __getitems__

    def as_torch(self):
        """This dataset as a `torch.utils.data.Dataset` with `__getitems__` (imports torch)."""
        from torch.utils.data import Dataset

        inner = self

        class _TorchMapDataset(Dataset):
            def __len__(self):
                return len(inner)

            def __getitem__(self, i):
                return inner[i]

            def __getitems__(self, indices):
                return inner.__getitems__(indices)

        return _TorchMapDataset()


class BatchDataset(_Base):
    """A given list of keys, each epoch, through batch GET: each worker takes its share of the
    (seeded, per-epoch) shuffled list and fetches it `batch_size` keys per request."""

    def __init__(self, client_factory, bucket: str, keys: List[str], seed: int = 0,
                 batch_size: int = 256, order: str = "storage", **kw):
        super().__init__(client_factory, bucket, seed, **kw)
        self.keys = list(keys)
        self.batch_size = batch_size
        self.order = order

    def keys_for(self, shard: Tuple[int, int]) -> List[str]:
        i, n = shard
        keys = list(self.keys)
        random.Random(self.seed * 1_000_003 + self.epoch).shuffle(keys)
        return keys[i::n]

    def __iter__(self) -> Iterator:
        keys = self.keys_for(self._shard())
        client = self.client()
        for at in range(0, len(keys), self.batch_size):
            for s in client.batch_get(self.bucket, keys[at : at + self.batch_size], order=self.order):
                yield self._out(s)
