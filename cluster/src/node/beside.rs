//! The node's side of its S3 read endpoint (`packrat node --s3-listen`): the store beside it
//! in its process (`crate::store::Beside`) calls the node's handler in-process, and looks keys
//! up here directly, and plans batch GETs in the node's own store, with the gates and read
//! checks a request from a gateway meets.

use super::*;
use crate::wire::NearPlan;
use packrat_store_api::batch::{BatchItem, BatchOrder, BatchPlan};

impl Node {
    /// This node's handler for a client in its own process (its S3 read endpoint's store):
    /// the one every connection's requests reach.
    pub(crate) fn in_process(self: &Arc<Self>) -> crate::wire::InProcess {
        let node = self.clone();
        Arc::new(move |req| Box::pin(node.clone().handle(req)))
    }

    /// This node's lookups for the store beside it (see [`Node::read_here`]).
    pub(crate) fn near_reads(self: &Arc<Self>) -> crate::wire::NearReads {
        let node = self.clone();
        Arc::new(move |bid, pg, key, inline| {
            let node = node.clone();
            Box::pin(async move { node.read_here(bid, pg, &key, inline).await })
        })
    }

    /// A lookup by the store beside this node (its S3 read endpoint), answered here with no
    /// request in between: the same checks and the same read as a gathered lookup's, by this
    /// node's own map. Anything but a committed copy or its absence is `Elsewhere`, and the
    /// store then asks the chain as a gateway does.
    pub(crate) async fn read_here(
        &self,
        bid: u64,
        pg: u32,
        key: &str,
        inline: u64,
    ) -> crate::wire::NearRead {
        use crate::wire::NearRead;
        if self.may_serve(false).is_err() {
            return NearRead::Elsewhere;
        }
        let Some(_slot) = InFlight::take(&self.in_flight) else {
            self.busy.fetch_add(1, Ordering::Relaxed);
            return NearRead::Elsewhere;
        };
        let map = self.map.borrow().clone();
        match self
            .meta_and_bytes(&map, bid, pg, key, Asker::Reader, inline)
            .await
        {
            Ok((info, bytes)) => NearRead::Found(Box::new(meta_of(&info)), bytes),
            Err(Fail::Store(StoreError::NoSuchKey)) => NearRead::Missing,
            Err(_) => NearRead::Elsewhere,
        }
    }

    /// This node's batch plans for the store beside it (see [`Node::batch_here`]).
    pub(crate) fn near_batches(self: &Arc<Self>) -> crate::wire::NearBatches {
        let node = self.clone();
        Arc::new(move |bid, pgs, items, order| {
            let node = node.clone();
            Box::pin(async move { node.batch_here(bid, pgs, items, order).await })
        })
    }

    /// A batch GET by the store beside this node (its S3 read endpoint), every item of a PG
    /// the store's map says it serves: planned in this node's own store, and read from it
    /// straight into the caller's entries (a [`NearPlan`]), where a share asked over the
    /// internal API (`Node::batch`) is framed as records with their CRCs and copied once more.
    /// The same checks as a share's: the gates, a caught-up member of each item's PG by this
    /// node's own map, and no copy dirty once the records are looked up. When any fails the
    /// items come back, and the store plans the batch as a gateway does (which asks the tail
    /// for a dirty copy, and follows a failover).
    ///
    /// The items are cloned into the plan so they can come back after it: about two small
    /// allocations per item, next to a record lookup and a copy of its bytes.
    pub(crate) async fn batch_here(
        &self,
        bid: u64,
        pgs: Vec<u32>,
        items: Vec<BatchItem>,
        order: BatchOrder,
    ) -> Result<BatchPlan, Vec<BatchItem>> {
        let planned = async {
            if self.may_serve(false).is_err() {
                return Err(items);
            }
            let Some(_slot) = InFlight::take(&self.in_flight) else {
                self.busy.fetch_add(1, Ordering::Relaxed);
                return Err(items);
            };
            let map = self.map.borrow().clone();
            // The keys whose copy here may be dirty (this node is not their PG's tail).
            let mut watched: Vec<usize> = Vec::new();
            for (i, (pg, it)) in pgs.iter().zip(&items).enumerate() {
                match self.batch_reader(&map, bid, *pg, &it.key) {
                    None => return Err(items),
                    Some(false) => watched.push(i),
                    Some(true) => {}
                }
            }
            let Ok(objects) = self.local_bucket(format!("o-{bid}")).await else {
                return Err(items);
            };
            let Ok(plan) = self.store.plan_batch(&objects, items.clone(), order).await else {
                return Err(items);
            };
            let dirty = self.dirty_among(bid, watched.iter().map(|&i| Some(items[i].key.as_str())));
            if dirty.into_iter().any(|d| d) {
                return Err(items);
            }
            Ok(BatchPlan {
                entries: plan.entries,
                bytes: plan.bytes,
                plan: Box::new(NearPlan {
                    plan,
                    store: self.store.clone(),
                }),
            })
        }
        .await;
        self.near_batches[usize::from(planned.is_err())].fetch_add(1, Ordering::Relaxed);
        planned
    }
}
