"""One rank of test_torch.py's two-rank test, started by torchrun (`torch.distributed.run
--standalone --nproc-per-node 2`) as a training job starts its ranks: gloo on this machine, two
DataLoader workers per rank, reading one epoch of `train/` with packrat's map dataset under
`DistributedSampler` and with its epoch stream (which takes its rank from torch.distributed and
its worker from the DataLoader). Writes the keys it read, in order, to OUT.<rank> as JSON.

    torch_ranks.py ENDPOINT BUCKET OUT     (credentials from AWS_ACCESS_KEY_ID / _SECRET_ACCESS_KEY)
"""

import json
import sys

import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler

from packrat_client import EpochDataset, MapDataset, PackratClient


class Connect:
    def __init__(self, endpoint):
        self.endpoint = endpoint

    def __call__(self):
        return PackratClient(self.endpoint, region_name="us-east-1")


def name(sample):
    return sample.name


def keys_of(batches):
    return [k for batch in batches for k in batch]


def main():
    endpoint, bucket, out = sys.argv[1:4]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    connect = Connect(endpoint)
    ds = MapDataset.from_prefix(connect, bucket, "train/", transform=name).as_torch()
    sampler = DistributedSampler(ds, shuffle=True, seed=3)
    sampler.set_epoch(1)
    mapped = keys_of(DataLoader(ds, batch_size=32, sampler=sampler, num_workers=2, collate_fn=list))
    stream = EpochDataset(connect, bucket, "train/", seed=5, transform=name).as_torch()
    stream.set_epoch(1)
    streamed = keys_of(DataLoader(stream, batch_size=32, num_workers=2, collate_fn=list))
    with open(f"{out}.{rank}", "w") as f:
        json.dump({"rank": rank, "world": dist.get_world_size(), "map": mapped, "stream": streamed}, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
