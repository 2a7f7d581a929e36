//! Requests to one node queued while the process was busy, sent together: the chain steps
//! of gateways and nodes (`POST /w`, [`crate::relay`]).
//!
//! The first request to find its node's queue empty gathers: it lets the tasks ready to run
//! go first (one yield to the runtime), then takes every request queued for that node
//! meanwhile, its own first, and its caller sends them as one (or its own alone, if none
//! came). Nothing is held back for a turn or a timer: an idle process sends each request at
//! once, a busy one sends together what arrived while the gatherer waited to run again.
//!
//! A gateway's lookups keep their own rule (`ClusterStore::lookup`: two under way, one once
//! the node's gathered requests are large, then gather): with this one, a GET at 64
//! connections cost 4-13% less CPU, but at 4 connections two lookups meeting at a node paid
//! the yield and served up to 10% fewer GETs (docs/benchmark-log.md).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

/// The queues of one kind of request, one per node.
pub(crate) struct Queues<W> {
    queues: Mutex<HashMap<String, Arc<Queue<W>>>>,
}

struct Queue<W>(Mutex<State<W>>);

struct State<W> {
    waiting: Vec<W>,
    gathering: bool,
}

impl<W> Queue<W> {
    fn lock(&self) -> MutexGuard<'_, State<W>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// What a gatherer that goes away before it has gathered does with the requests queued: sends
/// them on (a task of their own), so they are not left waiting.
pub(crate) type Dispatch<W> = Box<dyn FnOnce(Vec<W>) + Send>;

impl<W> Default for Queues<W> {
    fn default() -> Self {
        Queues {
            queues: Mutex::default(),
        }
    }
}

impl<W> Queues<W> {
    /// Queues `w` for `node`; the caller that finds the queue empty gets the [`Gatherer`]
    /// (`dispatch` is made only then).
    pub(crate) fn join(
        &self,
        node: &str,
        w: W,
        dispatch: impl FnOnce() -> Dispatch<W>,
    ) -> Option<Gatherer<W>> {
        let queue = {
            let mut all = self.queues.lock().unwrap_or_else(|p| p.into_inner());
            match all.get(node) {
                Some(q) => q.clone(),
                None => all
                    .entry(node.to_string())
                    .or_insert_with(|| {
                        Arc::new(Queue(Mutex::new(State {
                            waiting: Vec::new(),
                            gathering: false,
                        })))
                    })
                    .clone(),
            }
        };
        let lead = {
            let mut state = queue.lock();
            state.waiting.push(w);
            !std::mem::replace(&mut state.gathering, true)
        };
        lead.then(|| Gatherer {
            queue,
            dispatch: Some(dispatch()),
        })
    }
}

/// The caller that gathers a node's queue (see the module's doc).
pub(crate) struct Gatherer<W> {
    queue: Arc<Queue<W>>,
    dispatch: Option<Dispatch<W>>,
}

impl<W> Gatherer<W> {
    /// Yields once to the runtime, then takes every request queued meanwhile, its own
    /// first; the queue is open to the next gatherer.
    pub(crate) async fn gather(mut self) -> Vec<W> {
        tokio::task::yield_now().await;
        self.dispatch = None;
        self.take()
    }

    fn take(&self) -> Vec<W> {
        let mut state = self.queue.lock();
        state.gathering = false;
        std::mem::take(&mut state.waiting)
    }
}

impl<W> Drop for Gatherer<W> {
    fn drop(&mut self) {
        if let Some(dispatch) = self.dispatch.take() {
            dispatch(self.take());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first request to an empty queue gathers what queued before it took them; the next
    /// one gathers again; a gatherer dropped before it gathered hands its queue to dispatch.
    #[tokio::test]
    async fn the_first_gathers_and_a_dropped_gatherer_dispatches() {
        let q: Queues<u32> = Queues::default();
        let none = || -> Dispatch<u32> { Box::new(|_| panic!("not dispatched")) };
        let g = q.join("n", 1, none).expect("the first gathers");
        assert!(q.join("n", 2, none).is_none());
        let other = q.join("other", 9, none).expect("another node's queue");
        assert_eq!(other.gather().await, vec![9]);
        assert_eq!(g.gather().await, vec![1, 2]);
        let g = q.join("n", 3, none).expect("the next gathers again");
        assert_eq!(g.gather().await, vec![3]);

        let sent = Arc::new(Mutex::new(Vec::new()));
        let to = sent.clone();
        let g = q
            .join("n", 4, || {
                Box::new(move |batch| to.lock().unwrap().extend(batch))
            })
            .expect("gathers");
        assert!(q.join("n", 5, none).is_none());
        drop(g);
        assert_eq!(*sent.lock().unwrap(), vec![4, 5]);
        assert_eq!(
            q.join("n", 6, none).expect("open again").gather().await,
            vec![6]
        );
    }
}
