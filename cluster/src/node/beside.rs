//! The node's side of its S3 read endpoint (`packrat node --s3-listen`): the store beside it
//! in its process (`crate::store::Beside`) calls the node's handler in-process, and looks keys
//! up here directly, with the gates and read checks a request from a gateway meets.

use super::*;

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
}
