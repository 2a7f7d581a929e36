//! The cluster manager: whichever node holds the etcd election `/packrat/manager` keeps the
//! chains in step with the nodes that are alive.
//!
//! Every half second (and at once when it wins): nodes whose lease has lapsed leave their
//! chains, live active nodes fill them ([`crate::placement::assign`], which moves as little as
//! it can), members that joined a chain catch up before they serve reads (`syncing`, cleared
//! by the node's `synced/` report), and the map is written with a new epoch if anything
//! changed. The write is a transaction that holds only while this node's election key exists,
//! so a manager that lost its lease (a hung machine) cannot overwrite its successor's map.

use crate::map::{ClusterMap, Etcd, NodeEntry, NodeState, key};
use crate::placement::{NodeSpec, assign};
use etcd_client::{Compare, CompareOp, Txn, TxnOp};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// Runs for the node's life: campaigns, and while leader, reconciles.
pub async fn run(etcd: Etcd, lease: i64, node_id: String) {
    loop {
        let won = etcd
            .client
            .clone()
            .campaign(key("manager"), node_id.clone(), lease)
            .await;
        let leader_key = match won {
            Ok(resp) => match resp.leader() {
                Some(l) => l.key().to_vec(),
                None => continue,
            },
            Err(e) => {
                tracing::debug!("manager election: {e}");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        tracing::info!("this node is the cluster manager");
        loop {
            match reconcile(&etcd, &leader_key).await {
                Ok(true) => {}
                Ok(false) => break, // no longer the leader
                Err(e) => tracing::warn!("cluster manager: {e}"),
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        tracing::info!("this node is no longer the cluster manager");
    }
}

/// The map as it should be now, from the map as it is, the registered nodes, the live ones
/// and the resync reports. `None` if nothing changes.
pub fn next_map(
    map: &ClusterMap,
    registered: &[NodeEntry],
    live: &BTreeSet<String>,
    synced: &BTreeMap<(String, u32), u64>,
) -> Option<ClusterMap> {
    let members: Vec<NodeSpec> = registered
        .iter()
        .filter(|n| n.state == NodeState::Active && live.contains(&n.id))
        .map(|n| NodeSpec {
            id: n.id.clone(),
            zone: n.zone.clone(),
            weight: n.weight,
        })
        .collect();
    let chains = assign(&map.chains, &members, map.pgs, map.replicas);
    let epoch = map.epoch + 1;
    // Members that restarted since the map last saw them.
    let restarted: BTreeSet<&str> = registered
        .iter()
        .filter(|n| {
            map.nodes
                .get(&n.id)
                .is_some_and(|seen| seen.incarnation != n.incarnation)
        })
        .map(|n| n.id.as_str())
        .collect();
    let mut syncing: BTreeMap<String, BTreeMap<u32, u64>> = BTreeMap::new();
    for (pg, chain) in chains.iter().enumerate() {
        let pg = pg as u32;
        let before = map.chain(pg);
        for id in chain {
            let since = if before.contains(id) {
                match map.syncing.get(id).and_then(|s| s.get(&pg)) {
                    Some(since) if !restarted.contains(id.as_str()) => *since,
                    _ if restarted.contains(id.as_str()) => epoch,
                    _ => continue, // caught up already
                }
            } else if before.is_empty() {
                continue; // a PG nobody held has no data to catch up on
            } else {
                epoch
            };
            if synced.get(&(id.clone(), pg)) == Some(&since) {
                continue;
            }
            syncing.entry(id.clone()).or_default().insert(pg, since);
        }
    }
    // A draining node leaves a chain only once the member that replaces it has caught up:
    // until then it stays, at the tail, so the PG keeps R caught-up copies throughout a drain.
    let mut chains = chains;
    for (pg, chain) in chains.iter_mut().enumerate() {
        let pg = pg as u32;
        let catching_up = chain
            .iter()
            .any(|id| syncing.get(id).is_some_and(|s| s.contains_key(&pg)));
        if !catching_up {
            continue;
        }
        for id in map.chain(pg) {
            let draining = registered
                .iter()
                .any(|n| n.id == *id && n.state == NodeState::Draining && live.contains(id));
            if draining && !chain.contains(id) && !map.is_syncing(id, pg) {
                chain.push(id.clone());
            }
        }
    }
    let chains = balance_heads(chains, &syncing);
    let mut nodes: BTreeMap<String, NodeEntry> = BTreeMap::new();
    for n in registered {
        if chains.iter().flatten().any(|id| *id == n.id) {
            nodes.insert(n.id.clone(), n.clone());
        }
    }
    if chains == map.chains && syncing == map.syncing && nodes == map.nodes {
        return None;
    }
    Some(ClusterMap {
        epoch,
        pgs: map.pgs,
        replicas: map.replicas,
        nodes,
        chains,
        syncing,
    })
}

/// Spreads the heads (which order and check every write of their PGs) evenly: a node with
/// more than its share of heads hands some to a caught-up member of the same chain with fewer,
/// which moves to the front. Nodes that joined one by one would otherwise leave the first one
/// head of everything. A head change is an ordinary map change: requests under way are fenced
/// by the epoch and retried on the new head.
fn balance_heads(
    mut chains: Vec<Vec<String>>,
    syncing: &BTreeMap<String, BTreeMap<u32, u64>>,
) -> Vec<Vec<String>> {
    let mut heads: BTreeMap<String, usize> = BTreeMap::new();
    for id in chains.iter().flatten() {
        heads.entry(id.clone()).or_default();
    }
    for chain in &chains {
        if let Some(h) = chain.first() {
            *heads.entry(h.clone()).or_default() += 1;
        }
    }
    if heads.is_empty() {
        return chains;
    }
    let ceil = chains.len().div_ceil(heads.len());
    for (pg, chain) in chains.iter_mut().enumerate() {
        let Some(head) = chain.first().cloned() else {
            continue;
        };
        if heads[&head] <= ceil {
            continue;
        }
        let candidate = chain[1..]
            .iter()
            .enumerate()
            .filter(|(_, id)| {
                heads[*id] < ceil
                    && !syncing
                        .get(*id)
                        .is_some_and(|s| s.contains_key(&(pg as u32)))
            })
            .min_by_key(|(_, id)| heads[*id])
            .map(|(i, _)| i + 1);
        if let Some(i) = candidate {
            let new_head = chain.remove(i);
            *heads.entry(head).or_default() -= 1;
            *heads.entry(new_head.clone()).or_default() += 1;
            chain.insert(0, new_head);
        }
    }
    chains
}

/// One round; `Ok(false)` if this node is no longer the leader.
async fn reconcile(etcd: &Etcd, leader_key: &[u8]) -> Result<bool, String> {
    let (map, rev) = etcd.map().await?;
    let registered: Vec<NodeEntry> = etcd
        .list("nodes/")
        .await?
        .iter()
        .filter_map(|(_, v)| serde_json::from_slice(v).ok())
        .collect();
    let live: BTreeSet<String> = etcd
        .list("live/")
        .await?
        .into_iter()
        .map(|(k, _)| k.trim_start_matches("live/").to_string())
        .collect();
    let mut synced = BTreeMap::new();
    for (k, v) in etcd.list("synced/").await? {
        let mut parts = k.trim_start_matches("synced/").splitn(2, '/');
        if let (Some(id), Some(pg)) = (parts.next(), parts.next())
            && let (Ok(pg), Ok(epoch)) = (pg.parse::<u32>(), String::from_utf8_lossy(&v).parse())
        {
            synced.insert((id.to_string(), pg), epoch);
        }
    }
    let Some(next) = next_map(&map, &registered, &live, &synced) else {
        return Ok(true);
    };
    let value = serde_json::to_vec(&next).map_err(|e| e.to_string())?;
    let txn = Txn::new()
        .when([
            Compare::mod_revision(key("map"), CompareOp::Equal, rev),
            Compare::version(leader_key.to_vec(), CompareOp::Greater, 0),
        ])
        .and_then([TxnOp::put(key("map"), value, None)]);
    let resp = etcd
        .client
        .clone()
        .txn(txn)
        .await
        .map_err(|e| format!("etcd: writing the map: {e}"))?;
    if !resp.succeeded() {
        // Someone else wrote the map, or this node's election key is gone.
        let still = etcd
            .client
            .clone()
            .get(leader_key.to_vec(), None)
            .await
            .map_err(|e| e.to_string())?;
        return Ok(!still.kvs().is_empty());
    }
    let down: Vec<&String> = map
        .nodes
        .keys()
        .filter(|id| !next.nodes.contains_key(*id))
        .collect();
    tracing::info!(epoch = next.epoch, left = ?down, syncing = next.syncing.len(), "cluster map updated");
    // Reports that were applied are no longer needed.
    for ((id, pg), _) in synced {
        if !next.is_syncing(&id, pg) {
            let _ = etcd.delete(&format!("synced/{id}/{pg}")).await;
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: &str) -> NodeEntry {
        NodeEntry {
            id: id.into(),
            addr: format!("{id}:1"),
            zone: None,
            weight: 1.0,
            state: NodeState::Active,
            incarnation: 1,
            classes: Vec::new(),
        }
    }

    #[test]
    fn a_dead_node_leaves_and_a_returning_one_catches_up_first() {
        let nodes = [node("a"), node("b"), node("c")];
        let all: BTreeSet<String> = ["a", "b", "c"].iter().map(|s| s.to_string()).collect();
        let first = next_map(&ClusterMap::new(8, 3), &nodes, &all, &BTreeMap::new()).unwrap();
        assert!(
            first.syncing.is_empty(),
            "a new cluster has nothing to catch up on"
        );
        assert!(first.chains.iter().all(|c| c.len() == 3));
        // Nodes that join one by one end up with equal shares of heads.
        let one = next_map(&ClusterMap::new(8, 3), &nodes[..1], &all, &BTreeMap::new()).unwrap();
        let two = next_map(&one, &nodes[..2], &all, &BTreeMap::new()).unwrap();
        let three = next_map(&two, &nodes, &all, &BTreeMap::new()).unwrap();
        let heads = |m: &ClusterMap, id: &str| m.chains.iter().filter(|c| c[0] == id).count();
        assert_eq!(
            heads(&three, "a"),
            8,
            "members still catching up never lead"
        );
        let reports: BTreeMap<(String, u32), u64> = three
            .syncing
            .iter()
            .flat_map(|(id, pgs)| pgs.iter().map(move |(pg, e)| ((id.clone(), *pg), *e)))
            .collect();
        let four = next_map(&three, &nodes, &all, &reports).unwrap();
        assert!(four.syncing.is_empty());
        assert!(
            ["a", "b", "c"]
                .iter()
                .all(|id| (2..=3).contains(&heads(&four, id)))
        );
        let without_b: BTreeSet<String> = ["a", "c"].iter().map(|s| s.to_string()).collect();
        let second = next_map(&first, &nodes, &without_b, &BTreeMap::new()).unwrap();
        assert!(
            second
                .chains
                .iter()
                .all(|c| c.len() == 2 && !c.contains(&"b".to_string()))
        );
        assert_eq!(second.epoch, first.epoch + 1);
        let third = next_map(&second, &nodes, &all, &BTreeMap::new()).unwrap();
        assert!(
            third.chains.iter().all(|c| c.last().unwrap() == "b"),
            "b rejoins at the tail"
        );
        assert_eq!(third.syncing["b"].len(), 8);
        assert_eq!(third.readers(0).count(), 2);
        // b reports PG 0..8 done for the epoch it joined at: caught up.
        let synced: BTreeMap<(String, u32), u64> = (0..8)
            .map(|pg| (("b".to_string(), pg), third.epoch))
            .collect();
        let fourth = next_map(&third, &nodes, &all, &synced).unwrap();
        assert!(fourth.syncing.is_empty());
        assert!(
            next_map(&fourth, &nodes, &all, &synced).is_none(),
            "nothing changes"
        );
        // c restarts before its lease ran out: it catches up on its PGs, in place.
        let mut again = nodes.clone();
        again[2].incarnation = 2;
        let fifth = next_map(&fourth, &again, &all, &synced).unwrap();
        assert_eq!(fifth.chains, fourth.chains);
        assert_eq!(fifth.syncing["c"].len(), 8);
        assert_eq!(fifth.syncing.len(), 1);
        // d joins and a drains: a stays in each chain it leaves until a's replacement there
        // has caught up, then goes.
        let mut four_nodes = again.to_vec();
        four_nodes.push(node("d"));
        four_nodes[0].state = NodeState::Draining;
        let mut alive = all.clone();
        alive.insert("d".to_string());
        let caught_up: BTreeMap<(String, u32), u64> = fifth.syncing["c"]
            .iter()
            .map(|(pg, e)| (("c".to_string(), *pg), *e))
            .collect();
        let sixth = next_map(&fifth, &four_nodes, &alive, &caught_up).unwrap();
        for (pg, chain) in sixth.chains.iter().enumerate() {
            assert!(
                chain.contains(&"a".to_string()),
                "PG {pg}: a left before its replacement caught up"
            );
            assert_eq!(chain.len(), 4);
            assert_eq!(sixth.readers(pg as u32).count(), 3);
        }
        let done: BTreeMap<(String, u32), u64> = sixth
            .syncing
            .iter()
            .flat_map(|(id, pgs)| pgs.iter().map(move |(pg, e)| ((id.clone(), *pg), *e)))
            .collect();
        let seventh = next_map(&sixth, &four_nodes, &alive, &done).unwrap();
        assert!(
            seventh
                .chains
                .iter()
                .all(|c| c.len() == 3 && !c.contains(&"a".to_string()))
        );
        assert!(seventh.syncing.is_empty());
    }
}
