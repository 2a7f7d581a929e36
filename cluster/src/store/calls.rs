//! Requests to the nodes: to a PG's chain (retried as the map changes while nodes fail over),
//! and one to every node at once for a listing.

use super::*;
use crate::wire::Call;

impl ClusterStore {
    /// One GET of `route?pgs=..{tail}` to each node of `by_node` with the PGs it answers for
    /// there, all at once: the pages of a listing merged by the caller. A node on another map
    /// epoch fails the listing with 503 (the client retries).
    pub(super) async fn ask_nodes<T: serde::de::DeserializeOwned>(
        &self,
        map: &ClusterMap,
        route: &str,
        by_node: &BTreeMap<String, Vec<u32>>,
        tail: &str,
    ) -> StoreResult<Vec<T>> {
        let requests = by_node.iter().map(|(node, pgs)| {
            let pgs: Vec<String> = pgs.iter().map(u32::to_string).collect();
            let path = format!("{route}?pgs={}{tail}", pgs.join(","));
            let addr = map.addr(node).unwrap_or_default().to_string();
            let client = self.client.clone();
            let epoch = map.epoch;
            async move {
                let ans = client
                    .send(Call::new(Method::GET, &path), &addr, epoch, NODE_TIMEOUT)
                    .await?;
                if ans.status != 200 {
                    return Err(match ans.status {
                        409 => StoreError::Unavailable("the cluster map changed; retry".into()),
                        _ => ans.error().await,
                    });
                }
                ans.json::<T>().await
            }
        });
        futures_util::future::try_join_all(requests).await
    }

    /// The member of `pg`'s chain the next read goes to: the caught-up members in turn.
    pub(crate) fn pick_reader(&self, map: &ClusterMap, pg: u32) -> Option<String> {
        // Beside a node, its own copies (a PG it does not serve is refused before this).
        if let Some(me) = &self.beside
            && map.readers(pg).any(|n| *n == me.id)
        {
            return Some(me.id.clone());
        }
        match map.readers(pg).count() {
            0 => None,
            n => map
                .readers(pg)
                .nth(self.next_reader.fetch_add(1, Ordering::Relaxed) % n)
                .cloned(),
        }
    }

    /// Beside a node (its S3 read endpoint), whether the node serves reads of `pg` by `map`:
    /// if not, the request is misdirected (the client routed it by another map), and is
    /// answered so rather than fetched from another node.
    pub(crate) fn serves_here(&self, map: &ClusterMap, pg: u32, key: &str) -> StoreResult<()> {
        match &self.beside {
            Some(me) if !map.readers(pg).any(|n| *n == me.id) => Err(StoreError::Misdirected {
                what: format!("{key:?} (placement group {pg})"),
                epoch: map.epoch,
            }),
            _ => Ok(()),
        }
    }

    /// Sends a request to a member of `pg`'s chain, retrying on the map as it changes while
    /// nodes fail over.
    pub(super) async fn call(
        &self,
        pg: u32,
        target: Target,
        call: Call<'_>,
    ) -> StoreResult<(Answer, String)> {
        self.call_via(pg, target, None, call).await
    }

    /// [`ClusterStore::call`], tried on `first` before the member `target` picks.
    pub(super) async fn call_via(
        &self,
        pg: u32,
        target: Target,
        mut first: Option<String>,
        call: Call<'_>,
    ) -> StoreResult<(Answer, String)> {
        let started = Instant::now();
        let mut target = target;
        let mut last_problem = String::from("no member");
        let mut fenced = false;
        // A write that met a failure after its head may have applied it (a successor lost, a
        // timeout): a later attempt then meets the write itself, and a conditional one fails
        // its condition against it.
        let mut maybe_applied = false;
        let mut rx = self.map.clone();
        loop {
            let map = rx.borrow_and_update().clone();
            // A PG waiting for a former caught-up member has nothing to serve until one is back
            // (see `ClusterMap::waiting`): say so now rather than after the failover wait.
            if let Some(ids) = map.waiting.get(&pg) {
                return Err(StoreError::Unavailable(format!(
                    "placement group {pg} waits for {} to come back (they hold its latest \
                     writes); retry later",
                    ids.join(", ")
                )));
            }
            let node = match (first.take(), target) {
                (Some(node), _) => Some(node),
                (None, Target::Head) => map.chain(pg).first().cloned(),
                (None, Target::Tail) => map.chain(pg).last().cloned(),
                (None, Target::Reader) => self.pick_reader(&map, pg),
            };
            if let Some(node) = node
                && let Some(addr) = map.addr(&node)
            {
                let timeout = match target {
                    // The whole chain answers a write.
                    Target::Head => {
                        hop_timeout(call.body.len()) * map.chain(pg).len().max(1) as u32
                    }
                    Target::Tail | Target::Reader => READ_TIMEOUT,
                };
                // Small writes go relayed with others under load (reads alone: see `Relay`).
                let sent = self
                    .relay
                    .send(call.clone(), addr, map.epoch, timeout)
                    .await;
                match sent {
                    Ok(ans) if ans.status == 409 => {
                        let r: WireRefusal = ans.json().await?;
                        if r.reason.starts_with("dirty") {
                            target = Target::Tail;
                            continue;
                        }
                        if target == Target::Tail {
                            target = Target::Reader;
                        }
                        fenced |= r.reason.starts_with(crate::node::FENCED);
                        maybe_applied |= target == Target::Head
                            && r.reason.starts_with(crate::node::CHAIN_BROKEN);
                        last_problem = format!("{node}: {}", r.reason);
                        if r.epoch > map.epoch {
                            let _ = tokio::time::timeout(
                                Duration::from_secs(1),
                                rx.wait_for(|m| m.epoch >= r.epoch),
                            )
                            .await;
                            continue;
                        }
                    }
                    // A conditional write refused after an attempt that may have landed: it
                    // may have been refused by its own first attempt, so its outcome is not
                    // known (as if the client's connection had broken), not "not applied".
                    Ok(ans) if ans.status == 412 && maybe_applied => {
                        return Err(StoreError::Unavailable(format!(
                            "an earlier attempt of this conditional write may have taken effect \
                             ({last_problem}): its outcome is unknown; read the object before \
                             trying again"
                        )));
                    }
                    Ok(ans) => return Ok((ans, node)),
                    Err(StoreError::Unavailable(why)) => {
                        maybe_applied |= target == Target::Head;
                        last_problem = why;
                    }
                    Err(e) => return Err(e),
                }
            }
            // No map will come to a gateway etcd does not answer: it waits no longer than for
            // fenced members.
            let hopeless = fenced || self.etcd_silent();
            if started.elapsed() > FAILOVER_WAIT || (hopeless && started.elapsed() > FENCED_WAIT) {
                return Err(StoreError::Unavailable(format!(
                    "placement group {pg} cannot be reached now ({last_problem}); retry later"
                )));
            }
            // Wait for the map to change (a failover), or a moment.
            let _ = tokio::time::timeout(Duration::from_millis(200), rx.changed()).await;
        }
    }
}
