"""Data-loader pieces: iterables that split an epoch across DataLoader workers and distributed
ranks, and read it through epoch streams or batch GET.

Nothing here imports torch at module load. `EpochDataset` and `BatchDataset` are plain
iterables (tested without torch); `.as_torch()` wraps one in a `torch.utils.data.IterableDataset`
for a `DataLoader`, which then runs one iterator per worker process, each reading its own share.
"""

import os
import random
from typing import Callable, Iterator, List, Optional, Tuple

from .client import PackratClient, Sample


def _torch_context() -> Tuple[int, int, int, int]:
    """(rank, world size, worker id, workers) from torch if it is loaded, else from the
    RANK / WORLD_SIZE environment (as torchrun sets), with one worker."""
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    worker, workers = 0, 1
    try:
        import sys

        if "torch" in sys.modules:
            import torch.distributed as dist
            from torch.utils.data import get_worker_info

            if dist.is_available() and dist.is_initialized():
                rank, world = dist.get_rank(), dist.get_world_size()
            info = get_worker_info()
            if info is not None:
                worker, workers = info.id, info.num_workers
    except ImportError:
        pass
    return rank, world, worker, workers


def shard_for_worker(rank: int, world: int, worker: int, workers: int) -> Tuple[int, int]:
    """The shard `(i, n)` one DataLoader worker of one rank reads: every (rank, worker) pair
    gets its own shard of `world * workers`, so together they read the epoch exactly once."""
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

    def set_epoch(self, epoch: int) -> None:
        """A new epoch gets a new order (the seed is combined with the epoch)."""
        self.epoch = epoch

    def _shard(self) -> Tuple[int, int]:
        return shard_for_worker(*(self.context or _torch_context()))

    def _out(self, s: Sample):
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
    """Every object under `prefix`, each epoch, through epoch streams: one streamed request per
    worker per epoch, no listing and no per-sample request."""

    def __init__(self, client_factory, bucket: str, prefix: str, seed: int = 0,
                 window: Optional[int] = None, **kw):
        super().__init__(client_factory, bucket, seed, **kw)
        self.prefix = prefix
        self.window = window

    def __iter__(self) -> Iterator:
        shard = self._shard()
        client = self.client_factory()
        for s in client.stream_epoch(self.bucket, self.prefix, shard=shard,
                                     seed=self.seed * 1_000_003 + self.epoch, window=self.window):
            yield self._out(s)


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
        client = self.client_factory()
        for at in range(0, len(keys), self.batch_size):
            for s in client.batch_get(self.bucket, keys[at : at + self.batch_size], order=self.order):
                yield self._out(s)
