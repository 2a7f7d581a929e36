//! A gateway's lookups of object metadata: sent alone while a node has few under way,
//! gathered into one request (`POST /g`) while it is busy (see [`ClusterStore::lookup`]).

use super::{ClusterStore, Target};
use crate::placement::pg_of;
use crate::wire::Call;
use crate::wire::meta_codec::{META_CODEC_HEADER, META_CODEC_V1};
use crate::wire::{
    Answer, GATHER_ITEMS_MAX, GatherItem, Gathered, META_HEADER, NearRead, READ_TIMEOUT, WireMeta,
    encode,
};
use bytes::{Bytes, BytesMut};
use http::Method;

use packrat_store_api::{Bucket, ObjectInfo, StoreError, StoreResult};
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// Lookups to one node under way before more are gathered (see [`ClusterStore::lookup`]).
const GATHER_AFTER: usize = 2;

/// A gathered request to a node of at least this many lookups means the node is busy: until a
/// request finds none waiting, one lookup (or gathered request) is under way, not
/// [`GATHER_AFTER`], so the rest gather into fewer, larger requests.
const GATHER_DEEP: usize = 4;

/// The lookups to one node: how many are under way (alone or gathered), and those waiting.
#[derive(Default)]
pub(super) struct Gather(std::sync::Mutex<GatherState>);

#[derive(Default)]
struct GatherState {
    in_flight: usize,
    waiting: Vec<Waiting>,
    /// Lookups in the last gathered request sent (0 once a lookup ends with none waiting).
    last_gathered: usize,
}

impl GatherState {
    /// How many lookups (or gathered requests) may be under way at once.
    fn places(&self) -> usize {
        if self.last_gathered >= GATHER_DEEP {
            1
        } else {
            GATHER_AFTER
        }
    }

    /// Takes a place for a lookup to send alone now, if one is free.
    fn take_place(&mut self) -> bool {
        let free = self.in_flight < self.places();
        if free {
            self.in_flight += 1;
        }
        free
    }

    /// A lookup or gathered request under way ended (`failed`: a gathered request that got
    /// no answer): what goes in its place.
    fn end(&mut self, failed: bool) -> Ended {
        if failed {
            self.in_flight -= 1;
            self.last_gathered = 0;
            return Ended::Dropped(std::mem::take(&mut self.waiting));
        }
        if self.waiting.is_empty() {
            self.in_flight -= 1;
            self.last_gathered = 0;
            return Ended::Freed;
        }
        if self.in_flight > self.places() {
            // A busy node: this place is given up, and the lookups waiting go with the next
            // request under way to end (there is one: `in_flight` stays above 0).
            self.in_flight -= 1;
            return Ended::Freed;
        }
        let n = self.waiting.len().min(GATHER_ITEMS_MAX);
        self.last_gathered = n;
        Ended::Next(self.waiting.drain(..n).collect())
    }
}

/// What takes the place of a lookup or gathered request that ended ([`GatherState::end`]).
enum Ended {
    /// Nothing: the place is free (or given up to the other one under way).
    Freed,
    /// Nothing, and the lookups that waited are handed back to be dropped: each asks alone.
    Dropped(Vec<Waiting>),
    /// These waiting lookups, sent as one request.
    Next(Vec<Waiting>),
}

impl Gather {
    fn lock(&self) -> std::sync::MutexGuard<'_, GatherState> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A lookup waiting to be gathered; its answer comes on `tx` (dropped: ask alone).
pub(super) struct Waiting {
    item: GatherItem,
    tx: tokio::sync::oneshot::Sender<Gathered>,
}

/// A place among a node's lookups under way; given up (to the lookups waiting, or freed)
/// when dropped, so a caller that goes away midway cannot leave the others waiting.
struct Turn {
    store: Arc<ClusterStore>,
    gather: Arc<Gather>,
    node: String,
    /// The gathered request of this place failed (a node that does not answer, a changed
    /// epoch): the lookups waiting are not sent after it to the same node, each asks alone.
    failed: bool,
}

impl Drop for Turn {
    fn drop(&mut self) {
        self.store.turn_over(
            self.gather.clone(),
            std::mem::take(&mut self.node),
            self.failed,
        );
    }
}

impl ClusterStore {
    /// An object's metadata from a committed replica of its PG, with its bytes when it has at
    /// most `inline_max` of them.
    ///
    /// Lookups are gathered per node: while [`GATHER_AFTER`] lookups to the member picked are
    /// under way, more wait, and go to it together as one request (`POST /g`) when one of
    /// those ends. Once such a request held [`GATHER_DEEP`] or more, one is under way instead
    /// of two, until a request ends with none waiting. Alone, a lookup is sent at once, so a
    /// lightly loaded gateway adds no wait; loaded, a node answers many lookups for one
    /// request's work and one round trip on each side (on loopback, a GET's two extra hops
    /// cost the gateway and the node more than the node's lookup and read). An item the node
    /// cannot answer as a plain reader (a dirty copy, a refusal, an error) is asked again
    /// alone, where those are followed.
    pub(crate) async fn lookup(
        &self,
        bucket: &Bucket,
        key: &str,
        inline_max: u64,
    ) -> StoreResult<Option<ObjectInfo>> {
        let map = self.map();
        let pg = pg_of(bucket.id, key, map.pgs);
        self.serves_here(&map, pg, key)?;
        // Beside a node that serves the PG: its own lookup, with no request in between.
        if let Some(me) = &self.beside {
            match (me.reads)(bucket.id, pg, key.to_string(), inline_max).await {
                NearRead::Found(meta, inline)
                    if inline.as_ref().is_none_or(|b| b.len() as u64 == meta.size) =>
                {
                    return Ok(Some(self.info_of(
                        bucket,
                        key,
                        pg,
                        me.id.clone(),
                        *meta,
                        inline,
                    )));
                }
                NearRead::Missing => return Ok(None),
                _ => return self.lookup_alone(bucket, key, pg, inline_max, None).await,
            }
        }
        let (Some(node), Some(me)) = (self.pick_reader(&map, pg), self.me.upgrade()) else {
            return self.lookup_alone(bucket, key, pg, inline_max, None).await;
        };
        let gather = self.gather_of(&node);
        let waiting = {
            let mut state = gather.lock();
            if state.take_place() {
                None
            } else {
                let (tx, rx) = tokio::sync::oneshot::channel();
                state.waiting.push(Waiting {
                    item: GatherItem {
                        bid: bucket.id,
                        pg,
                        inline: inline_max,
                        key: key.to_string(),
                    },
                    tx,
                });
                Some(rx)
            }
        };
        let Some(rx) = waiting else {
            let _turn = Turn {
                store: me,
                gather,
                node: node.clone(),
                failed: false,
            };
            return self
                .lookup_alone(bucket, key, pg, inline_max, Some(node))
                .await;
        };
        match rx.await {
            Ok(Gathered::Found { meta, inline })
                if inline.as_ref().is_none_or(|b| b.len() as u64 == meta.size) =>
            {
                Ok(Some(self.info_of(bucket, key, pg, node, *meta, inline)))
            }
            Ok(Gathered::Missing) => Ok(None),
            // Refused, failed, or a gathered request that could not be sent: alone.
            _ => {
                self.gathered_alone.fetch_add(1, Ordering::Relaxed);
                self.lookup_alone(bucket, key, pg, inline_max, None).await
            }
        }
    }

    /// The gathering state of lookups to `node`.
    pub(super) fn gather_of(&self, node: &str) -> Arc<Gather> {
        if let Some(g) = self.gathers.read().ok().and_then(|g| g.get(node).cloned()) {
            return g;
        }
        let mut all = self.gathers.write().unwrap_or_else(|p| p.into_inner());
        all.entry(node.to_string()).or_default().clone()
    }

    /// A lookup to `node` ended: the lookups waiting for it go as one request, which takes
    /// over its place among those under way; with none waiting, the place is freed. After a
    /// gathered request that `failed`, the place is freed and every lookup waiting is dropped
    /// (each then asks alone, where another member is tried).
    pub(super) fn turn_over(self: &Arc<Self>, gather: Arc<Gather>, node: String, failed: bool) {
        let ended = gather.lock().end(failed);
        let batch = match ended {
            Ended::Next(batch) => batch,
            Ended::Freed => return,
            Ended::Dropped(waiting) => {
                // Dropped outside the lock: each of these lookups then asks alone.
                drop(waiting);
                return;
            }
        };
        // Outside a runtime (one shutting down), the waiting lookups are dropped: each then
        // asks alone, or is gone with its caller.
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            gather.lock().in_flight -= 1;
            return;
        };
        let mut turn = Turn {
            store: self.clone(),
            gather,
            node,
            failed: false,
        };
        rt.spawn(async move {
            turn.failed = !turn.store.send_gathered(&turn.node, batch).await;
            drop(turn);
        });
    }

    /// Sends gathered lookups to `node` as one request and hands each waiting lookup its
    /// answer; if the request fails, each is dropped and asks alone, and `false` is returned.
    pub(super) async fn send_gathered(&self, node: &str, batch: Vec<Waiting>) -> bool {
        let map = self.map();
        let Some(addr) = map.addr(node) else {
            return false;
        };
        let mut body = BytesMut::new();
        for w in &batch {
            w.item.put(&mut body);
        }
        let answers = match self
            .client
            .send(
                Call {
                    method: Method::POST,
                    path: "/g",
                    headers: &[(META_CODEC_HEADER, META_CODEC_V1.to_string())],
                    body: body.freeze(),
                },
                addr,
                map.epoch,
                READ_TIMEOUT,
            )
            .await
        {
            Ok(ans) if ans.status == 200 => match ans.bytes().await {
                Ok(b) => Gathered::parse_all(b, batch.len()),
                Err(e) => Err(e),
            },
            Ok(ans) => Err(ans.error().await),
            Err(e) => Err(e),
        };
        match answers {
            Ok(answers) => {
                self.gathered_requests.fetch_add(1, Ordering::Relaxed);
                self.gathered_lookups
                    .fetch_add(batch.len() as u64, Ordering::Relaxed);
                for (w, a) in batch.into_iter().zip(answers) {
                    let _ = w.tx.send(a);
                }
                true
            }
            Err(e) => {
                tracing::debug!("gathered lookups to {node}: {e}; each asks alone");
                false
            }
        }
    }

    /// One lookup in a request of its own, tried on `first` before the member picked.
    pub(super) async fn lookup_alone(
        &self,
        bucket: &Bucket,
        key: &str,
        pg: u32,
        inline_max: u64,
        mut first: Option<String>,
    ) -> StoreResult<Option<ObjectInfo>> {
        let path = format!(
            "/o/{}/{pg}/{}?meta&inline={inline_max}",
            bucket.id,
            encode(key)
        );
        let mut tries = 0;
        loop {
            let (ans, node) = self
                .call_via(
                    pg,
                    Target::Reader,
                    first.take(),
                    Call::new(Method::GET, &path),
                )
                .await?;
            return match ans.status {
                200 => match Self::meta_answer(ans).await {
                    Ok((meta, inline)) => {
                        Ok(Some(self.info_of(bucket, key, pg, node, meta, inline)))
                    }
                    // Damaged or cut on its way: asked again, of the next member in turn.
                    Err(StoreError::Unavailable(_)) if tries < 2 => {
                        tries += 1;
                        continue;
                    }
                    Err(e) => Err(e),
                },
                404 => Ok(None),
                _ => Err(ans.error().await),
            };
        }
    }

    /// A node's answer with an object's metadata: in a header with the bytes as the body
    /// (a small object), or as the body.
    pub(super) async fn meta_answer(ans: Answer) -> StoreResult<(WireMeta, Option<Bytes>)> {
        let header = ans.headers.get(META_HEADER).map(|v| v.as_bytes().to_vec());
        let (meta, inline) = match header {
            Some(h) => {
                let meta: WireMeta = serde_json::from_slice(&h)
                    .map_err(|e| StoreError::internal("storage node answer", e))?;
                (meta, Some(ans.bytes().await?))
            }
            None => (ans.json().await?, None),
        };
        if inline.as_ref().is_some_and(|b| b.len() as u64 != meta.size) {
            return Err(StoreError::Unavailable(
                "storage node: a short answer".into(),
            ));
        }
        Ok((meta, inline))
    }
}

#[cfg(test)]
mod tests {
    use super::super::INLINE_MAX;
    use super::*;

    fn waiting(n: usize) -> (Vec<Waiting>, Vec<tokio::sync::oneshot::Receiver<Gathered>>) {
        (0..n)
            .map(|i| {
                let (tx, rx) = tokio::sync::oneshot::channel();
                let item = GatherItem {
                    bid: 1,
                    pg: 0,
                    inline: INLINE_MAX,
                    key: format!("k{i}"),
                };
                (Waiting { item, tx }, rx)
            })
            .unzip()
    }

    fn next_len(e: Ended) -> usize {
        match e {
            Ended::Next(b) => b.len(),
            Ended::Freed => panic!("freed, expected a batch"),
            Ended::Dropped(_) => panic!("dropped, expected a batch"),
        }
    }

    #[test]
    fn a_busy_node_gets_one_request_under_way_and_a_failure_sends_the_waiting_alone() {
        let mut s = GatherState::default();
        // Two places while the node's requests are small.
        assert!(s.take_place() && s.take_place());
        assert!(!s.take_place());
        let (w, _rx5) = waiting(5);
        s.waiting.extend(w);
        assert_eq!(
            next_len(s.end(false)),
            5,
            "all five go in the ended one's place"
        );
        assert_eq!((s.in_flight, s.places()), (2, 1));
        // Busy: the next to end gives its place up rather than send the waiting ones ...
        let (w, _rx3) = waiting(3);
        s.waiting.extend(w);
        assert!(matches!(s.end(false), Ended::Freed));
        assert_eq!((s.in_flight, s.waiting.len()), (1, 3));
        assert!(!s.take_place(), "one place while busy");
        // ... and the one left under way sends them when it ends; three is not busy.
        assert_eq!(next_len(s.end(false)), 3);
        assert_eq!((s.in_flight, s.places()), (1, 2));
        assert!(s.take_place());
        // A gathered request that failed: the lookups waiting are handed back, dropped, and
        // each then asks alone; its place is freed.
        let (w, mut rx2) = waiting(2);
        s.waiting.extend(w);
        match s.end(true) {
            Ended::Dropped(d) => assert_eq!(d.len(), 2),
            _ => panic!("a failed request must hand its waiting lookups back"),
        }
        for rx in &mut rx2 {
            assert!(
                rx.try_recv().is_err(),
                "a dropped lookup sees its sender gone"
            );
        }
        assert_eq!(s.in_flight, 1);
        assert!(
            matches!(s.end(false), Ended::Freed),
            "none waiting: the place is freed"
        );
        assert_eq!((s.in_flight, s.last_gathered), (0, 0));
    }
}
