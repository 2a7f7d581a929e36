//! The cluster manager: whichever node holds the etcd election `/packrat/manager` keeps the
//! chains in step with the nodes that are alive.
//!
//! Every half second (and at once when it wins): nodes whose lease has lapsed leave their
//! chains, live active nodes fill them ([`crate::placement::assign`], which moves as little as
//! it can), members that joined a chain catch up before they serve reads (`syncing`, cleared
//! by the node's `synced/` report), and the map is written with a new epoch if anything
//! changed. The write is a transaction that holds only while this node's election key exists,
//! so a manager that lost its lease (a hung machine) cannot overwrite its successor's map.

use crate::map::{Away, ClusterMap, Etcd, NodeEntry, NodeState, key};
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

/// The map as it should be now, from the map as it is, the registered nodes, the live ones,
/// the resync reports and the nodes whose grace period is running (see [`away_now`]).
/// `now_ms` (Unix milliseconds, this manager's clock) only stamps a node found away, for the
/// operator to read. `None` if nothing changes.
pub fn next_map(
    map: &ClusterMap,
    registered: &[NodeEntry],
    live: &BTreeSet<String>,
    synced: &BTreeMap<(String, u32), u64>,
    graced: &BTreeSet<String>,
    now_ms: u64,
) -> Option<ClusterMap> {
    let members: Vec<NodeSpec> = registered
        .iter()
        .filter(|n| n.state == NodeState::Active && live.contains(&n.id))
        .map(spec_of)
        .collect();
    // The chains without the members that stay only until a move is over (see below): they
    // are not part of the placement.
    let placed: Vec<Vec<String>> = map
        .chains
        .iter()
        .enumerate()
        .map(|(pg, chain)| {
            let leaving = map.leaving.get(&(pg as u32));
            chain
                .iter()
                .filter(|id| !leaving.is_some_and(|l| l.contains(*id)))
                .cloned()
                .collect()
        })
        .collect();
    let away = away_now(map, registered, live, graced, now_ms);
    let (chains, away) = if away.is_empty() && map.away.is_empty() {
        (assign(&placed, &members, map.pgs, map.replicas), away)
    } else {
        keep_places(map, &placed, registered, &members, away)
    };
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
            } else if before.is_empty() && map.holders(pg).is_empty() {
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
    let mut chains = chains;
    let alive = |id: &String| live.contains(id) && registered.iter().any(|n| n.id == *id);
    // A PG whose chain would have no caught-up member (every member restarted, as after a
    // power cut; or those left are newcomers) must not serve, copy from or take writes on a
    // partial copy. Its holders (the caught-up members of the last chain that had any, in
    // chain order) hold every write it acknowledged: one of them serves again as it was (a
    // restart loses nothing durable; a node whose data directory was replaced has a new id)
    // and the rest catch up from it. The one nearest the tail is taken: reads were answered
    // by the tail (and by members whose copy the tail had), each once it was durable there,
    // while a member hands a write on before its own sync, so a member nearer the head that
    // was killed may have lost a version the tail answered reads with (a source without it
    // would make a read go back). One back but placed elsewhere rejoins the chain until they
    // have. With none back, the PG waits for them, and says so in the map.
    let mut waiting: BTreeMap<u32, Vec<String>> = BTreeMap::new();
    let mut leaving: BTreeMap<u32, Vec<String>> = BTreeMap::new();
    for (pg, chain) in chains.iter_mut().enumerate() {
        let pg = pg as u32;
        let holders = map.holders(pg);
        // Caught up already; or nothing to wait for: a PG that never held anything, or one
        // in a map written before PGs waited (it keeps the old behaviour).
        if chain.iter().any(|id| !catching_up(&syncing, id, pg)) || holders.is_empty() {
            continue;
        }
        let source = match holders.iter().rev().find(|id| chain.contains(id)) {
            Some(id) => Some(id.clone()),
            None => {
                let back = holders.iter().rev().find(|id| alive(id)).cloned();
                if let Some(id) = &back {
                    chain.push(id.clone());
                    leaving.entry(pg).or_default().push(id.clone());
                }
                back
            }
        };
        match source {
            Some(id) => {
                if let Some(pgs) = syncing.get_mut(&id) {
                    pgs.remove(&pg);
                    if pgs.is_empty() {
                        syncing.remove(&id);
                    }
                }
            }
            None => {
                waiting.insert(pg, holders);
            }
        }
    }
    // A live member leaves a chain (a drain, a rebalance towards a new node) only once the
    // members that joined it have caught up: until then it stays at the tail (listed in
    // `leaving`), so the PG keeps R caught-up copies throughout a move. Without it, nodes
    // joining one that held every PG took whole chains from it, leaving those PGs with no
    // caught-up copy to read or to copy from. In a chain of newcomers it then leads (see
    // `balance_heads`).
    for (pg, chain) in chains.iter_mut().enumerate() {
        let pg = pg as u32;
        if !chain.iter().any(|id| catching_up(&syncing, id, pg)) {
            continue;
        }
        for id in map.chain(pg) {
            if alive(id) && !chain.contains(id) && !map.is_syncing(id, pg) {
                chain.push(id.clone());
                leaving.entry(pg).or_default().push(id.clone());
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
    if chains == map.chains
        && syncing == map.syncing
        && nodes == map.nodes
        && away == map.away
        && leaving == map.leaving
        && waiting == map.waiting
    {
        return None;
    }
    Some(ClusterMap {
        epoch,
        pgs: map.pgs,
        replicas: map.replicas,
        nodes,
        chains,
        syncing,
        away,
        leaving,
        waiting,
        rereplicate_after_s: map.rereplicate_after_s,
    })
}

fn spec_of(n: &NodeEntry) -> NodeSpec {
    NodeSpec {
        id: n.id.clone(),
        zone: n.zone.clone(),
        weight: n.weight,
    }
}

/// Whether `id` is catching up on `pg` in the syncing table of a map being made.
fn catching_up(syncing: &BTreeMap<String, BTreeMap<u32, u64>>, id: &str, pg: u32) -> bool {
    syncing.get(id).is_some_and(|s| s.contains_key(&pg))
}

/// The nodes gone whose grace period is running (active ones: a draining node's replicas
/// are being moved anyway), with when they went and the PGs they held. A grace period is an
/// etcd lease of the map's `rereplicate_after_s` on `away/<node>`, taken by the manager that
/// first finds the node gone ([`newly_away`]): it runs out by etcd's clock, so a manager
/// elected meanwhile on a machine whose clock is off by hours neither cuts it short nor
/// stretches it (etcd may stretch it by up to its length when its own leader changes). A
/// node found gone for the first time is away from `now_ms`.
fn away_now(
    map: &ClusterMap,
    registered: &[NodeEntry],
    live: &BTreeSet<String>,
    graced: &BTreeSet<String>,
    now_ms: u64,
) -> BTreeMap<String, Away> {
    let mut away = BTreeMap::new();
    if map.rereplicate_after_s == 0 {
        return away;
    }
    for n in registered {
        if n.state != NodeState::Active || live.contains(&n.id) || !graced.contains(&n.id) {
            continue;
        }
        let kept = match map.away.get(&n.id) {
            Some(a) => a.clone(),
            None => Away {
                since_ms: now_ms,
                pgs: (0..map.pgs)
                    .filter(|pg| map.chain(*pg).contains(&n.id))
                    .collect(),
            },
        };
        if !kept.pgs.is_empty() {
            away.insert(n.id.clone(), kept);
        }
    }
    away
}

/// The active nodes found gone since the map was written (not live, not yet away, holding
/// places): the manager takes each a grace period before it computes the map.
fn newly_away<'r>(
    map: &ClusterMap,
    registered: &'r [NodeEntry],
    live: &BTreeSet<String>,
) -> Vec<&'r str> {
    registered
        .iter()
        .filter(|n| {
            n.state == NodeState::Active
                && !live.contains(&n.id)
                && !map.away.contains_key(&n.id)
                && map.chains.iter().any(|c| c.contains(&n.id))
        })
        .map(|n| n.id.as_str())
        .collect()
}

/// The chains when some nodes are or were away: placed as if they were still there (so
/// nothing moves on their account), then without those still away. A node that came back
/// takes the places kept for it (at the tails, where it catches up). A PG left with fewer
/// members than a write needs is filled from the live nodes at once; the away node keeps its
/// place there too, and when it returns the chain keeps the first R of its members.
fn keep_places(
    map: &ClusterMap,
    placed: &[Vec<String>],
    registered: &[NodeEntry],
    members: &[NodeSpec],
    away: BTreeMap<String, Away>,
) -> (Vec<Vec<String>>, BTreeMap<String, Away>) {
    let mut previous = placed.to_vec();
    let back = map
        .away
        .iter()
        .filter(|(id, _)| members.iter().any(|m| m.id == **id));
    for (id, a) in away.iter().chain(back) {
        for pg in &a.pgs {
            if let Some(chain) = previous.get_mut(*pg as usize)
                && !chain.contains(id)
            {
                chain.push(id.clone());
            }
        }
    }
    let mut all = members.to_vec();
    all.extend(
        registered
            .iter()
            .filter(|n| away.contains_key(&n.id))
            .map(spec_of),
    );
    let planned = assign(&previous, &all, map.pgs, map.replicas);
    let mut chains: Vec<Vec<String>> = planned
        .iter()
        .map(|c| {
            c.iter()
                .filter(|id| !away.contains_key(*id))
                .cloned()
                .collect()
        })
        .collect();
    let quorum = map.write_quorum().min(members.len());
    let short: Vec<usize> = (0..chains.len())
        .filter(|pg| chains[*pg].len() < quorum)
        .collect();
    if !short.is_empty() {
        let filled = assign(&chains, members, map.pgs, map.replicas);
        for pg in short {
            chains[pg] = filled[pg].clone();
        }
    }
    let away = away
        .into_iter()
        .map(|(id, a)| {
            let pgs = (0..map.pgs)
                .filter(|pg| planned[*pg as usize].contains(&id))
                .collect();
            (id, Away { pgs, ..a })
        })
        .collect();
    (chains, away)
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
    // A head catching up (a node that restarted within its lease catches up in place; a
    // chain of newcomers) hands the head to the first caught-up member: the head decides
    // conditional writes against its own copy.
    for (pg, chain) in chains.iter_mut().enumerate() {
        let behind = |id: &String| catching_up(syncing, id, pg as u32);
        if chain.first().is_some_and(behind)
            && let Some(i) = chain.iter().position(|id| !behind(id))
        {
            let head = chain.remove(i);
            chain.insert(0, head);
        }
    }
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
    let registered = etcd.registered_nodes().await?;
    let mut live: BTreeSet<String> = etcd
        .list("live/")
        .await?
        .into_iter()
        .map(|(k, _)| k.trim_start_matches("live/").to_string())
        .collect();
    // A node that stepped down (most of the others cannot reach it, see `node::reports`)
    // serves nothing: its chains go on without it, as if it were gone.
    for (k, _) in etcd.list("stepped-down/").await? {
        live.remove(k.trim_start_matches("stepped-down/"));
    }
    let mut synced = BTreeMap::new();
    for (k, v) in etcd.list("synced/").await? {
        let mut parts = k.trim_start_matches("synced/").splitn(2, '/');
        if let (Some(id), Some(pg)) = (parts.next(), parts.next())
            && let (Ok(pg), Ok(epoch)) = (pg.parse::<u32>(), String::from_utf8_lossy(&v).parse())
        {
            synced.insert((id.to_string(), pg), epoch);
        }
    }
    let mut graced: BTreeSet<String> = etcd
        .list("away/")
        .await?
        .into_iter()
        .map(|(k, _)| k.trim_start_matches("away/").to_string())
        .collect();
    if map.rereplicate_after_s > 0 {
        for id in newly_away(&map, &registered, &live) {
            // A new lease, whatever an earlier absence left: the period starts now.
            etcd.put_leased(
                &format!("away/{id}"),
                crate::now_ms().to_string(),
                map.rereplicate_after_s,
            )
            .await?;
            graced.insert(id.to_string());
        }
    }
    let next = next_map(&map, &registered, &live, &synced, &graced, crate::now_ms());
    // Grace periods of nodes no longer away (back, removed, or re-replicated) are dropped.
    let away = next.as_ref().map_or(&map.away, |n| &n.away);
    for id in graced.iter().filter(|id| !away.contains_key(*id)) {
        let _ = etcd.delete(&format!("away/{id}")).await;
    }
    let Some(next) = next else {
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

    /// Every resync report the members catching up in `map` would send.
    fn caught_up_on_all(map: &ClusterMap) -> BTreeMap<(String, u32), u64> {
        map.syncing
            .iter()
            .flat_map(|(id, pgs)| pgs.iter().map(move |(pg, e)| ((id.clone(), *pg), *e)))
            .collect()
    }

    /// Every node's grace period running (one found gone keeps its places).
    fn every() -> BTreeSet<String> {
        ('a'..='z').map(|c| c.to_string()).collect()
    }

    fn node(id: &str) -> NodeEntry {
        NodeEntry {
            id: id.into(),
            addr: format!("{id}:1"),
            zone: None,
            weight: 1.0,
            state: NodeState::Active,
            incarnation: 1,
            classes: Vec::new(),
            s3: None,
        }
    }

    #[test]
    fn a_dead_node_leaves_and_a_returning_one_catches_up_first() {
        let nodes = [node("a"), node("b"), node("c")];
        let all: BTreeSet<String> = ["a", "b", "c"].iter().map(|s| s.to_string()).collect();
        let first = next_map(
            &ClusterMap::new(8, 3),
            &nodes,
            &all,
            &BTreeMap::new(),
            &every(),
            0,
        )
        .unwrap();
        assert!(
            first.syncing.is_empty(),
            "a new cluster has nothing to catch up on"
        );
        assert!(first.chains.iter().all(|c| c.len() == 3));
        // Nodes that join one by one end up with equal shares of heads.
        let one = next_map(
            &ClusterMap::new(8, 3),
            &nodes[..1],
            &all,
            &BTreeMap::new(),
            &every(),
            0,
        )
        .unwrap();
        let two = next_map(&one, &nodes[..2], &all, &BTreeMap::new(), &every(), 0).unwrap();
        let three = next_map(&two, &nodes, &all, &BTreeMap::new(), &every(), 0).unwrap();
        let heads = |m: &ClusterMap, id: &str| m.chains.iter().filter(|c| c[0] == id).count();
        assert_eq!(
            heads(&three, "a"),
            8,
            "members still catching up never lead"
        );
        let reports = caught_up_on_all(&three);
        let four = next_map(&three, &nodes, &all, &reports, &every(), 0).unwrap();
        assert!(four.syncing.is_empty());
        assert!(
            ["a", "b", "c"]
                .iter()
                .all(|id| (2..=3).contains(&heads(&four, id)))
        );
        let without_b: BTreeSet<String> = ["a", "c"].iter().map(|s| s.to_string()).collect();
        let second = next_map(&first, &nodes, &without_b, &BTreeMap::new(), &every(), 0).unwrap();
        assert!(
            second
                .chains
                .iter()
                .all(|c| c.len() == 2 && !c.contains(&"b".to_string()))
        );
        assert_eq!(second.epoch, first.epoch + 1);
        let third = next_map(&second, &nodes, &all, &BTreeMap::new(), &every(), 0).unwrap();
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
        let fourth = next_map(&third, &nodes, &all, &synced, &every(), 0).unwrap();
        assert!(fourth.syncing.is_empty());
        assert!(
            next_map(&fourth, &nodes, &all, &synced, &every(), 0).is_none(),
            "nothing changes"
        );
        // c restarts before its lease ran out: it catches up on its PGs, in place.
        let mut again = nodes.clone();
        again[2].incarnation = 2;
        let fifth = next_map(&fourth, &again, &all, &synced, &every(), 0).unwrap();
        let sorted = |m: &ClusterMap| -> Vec<BTreeSet<String>> {
            m.chains
                .iter()
                .map(|c| c.iter().cloned().collect())
                .collect()
        };
        assert_eq!(sorted(&fifth), sorted(&fourth));
        assert_eq!(heads(&fifth, "c"), 0, "a member catching up does not lead");
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
        let sixth = next_map(&fifth, &four_nodes, &alive, &caught_up, &every(), 0).unwrap();
        for (pg, chain) in sixth.chains.iter().enumerate() {
            assert!(
                chain.contains(&"a".to_string()),
                "PG {pg}: a left before its replacement caught up"
            );
            assert_eq!(chain.len(), 4);
            assert_eq!(sixth.readers(pg as u32).count(), 3);
        }
        let done = caught_up_on_all(&sixth);
        let seventh = next_map(&sixth, &four_nodes, &alive, &done, &every(), 0).unwrap();
        assert!(
            seventh
                .chains
                .iter()
                .all(|c| c.len() == 3 && !c.contains(&"a".to_string()))
        );
        assert!(seventh.syncing.is_empty());
    }

    #[test]
    fn a_chain_whose_members_all_restarted_resumes_from_a_former_caught_up_member() {
        let ids = |v: &[&str]| -> BTreeSet<String> { v.iter().map(|s| s.to_string()).collect() };
        let restarted = |nodes: &[NodeEntry], incarnation: u64| -> Vec<NodeEntry> {
            nodes
                .iter()
                .map(|n| NodeEntry {
                    incarnation,
                    ..n.clone()
                })
                .collect()
        };
        let nodes = ["a", "b", "c"].map(node);
        let all = ids(&["a", "b", "c"]);
        let none = BTreeMap::new();
        let mut start = ClusterMap::new(8, 3);
        start.rereplicate_after_s = 600;
        let first = next_map(&start, &nodes, &all, &none, &every(), 0).unwrap();
        // Every node killed and started again within its lease: all three are back at once,
        // each with a new incarnation. One caught-up member of each chain is its source.
        let again = restarted(&nodes, 2);
        let back = next_map(&first, &again, &all, &none, &every(), 0).unwrap();
        for pg in 0..8 {
            let readers: Vec<&String> = back.readers(pg).collect();
            assert_eq!(readers.len(), 1, "PG {pg}: one source, {back:?}");
            assert_eq!(&back.chain(pg)[0], readers[0], "PG {pg}: the source leads");
            assert_eq!(back.chain(pg).len(), 3);
            // The tail of the chain before: reads were answered there, so it has every
            // version a client may have seen.
            assert_eq!(readers[0], first.chain(pg).last().unwrap(), "PG {pg}");
        }
        assert!(back.waiting.is_empty());
        // A member still catching up when every node restarted is never the source.
        let mut c_again = nodes.to_vec();
        c_again[2].incarnation = 3;
        let c_behind = next_map(&first, &c_again, &all, &none, &every(), 0).unwrap();
        assert_eq!(c_behind.syncing["c"].len(), 8);
        let all_back = next_map(&c_behind, &restarted(&nodes, 4), &all, &none, &every(), 0);
        let all_back = all_back.unwrap();
        for pg in 0..8 {
            let readers: Vec<&String> = all_back.readers(pg).collect();
            assert_eq!(readers.len(), 1, "PG {pg}");
            assert_ne!(readers[0], "c", "PG {pg}: c had not caught up");
        }
        // A power cut as the manager saw it: b and c went first (their places kept), then a,
        // the last caught-up member of every chain.
        let only_a = next_map(&first, &nodes, &ids(&["a"]), &none, &every(), 1_000).unwrap();
        assert!(only_a.chains.iter().all(|c| c == &["a"]));
        // b comes back first: its copies may lack what a took alone, so nothing is served
        // or written until a is back, and the map says whom each PG waits for.
        let b_back = next_map(&only_a, &again, &ids(&["b"]), &none, &every(), 2_000).unwrap();
        for pg in 0..8 {
            assert_eq!(b_back.readers(pg).count(), 0, "PG {pg}");
            assert_eq!(b_back.waiting[&pg], ["a"], "PG {pg}");
        }
        let report = crate::status_report(&b_back);
        assert_eq!(report["waited_for"]["a"], 8);
        assert_eq!(report["pgs_waiting"].as_array().map(Vec::len), Some(8));
        let bc_back = next_map(&b_back, &again, &ids(&["b", "c"]), &none, &every(), 3_000);
        let bc_back = bc_back.unwrap();
        assert!((0..8).all(|pg| bc_back.readers(pg).count() == 0));
        assert_eq!(bc_back.waiting.len(), 8, "still waiting for a");
        // a is back: it is every PG's source and leads; b and c catch up from it.
        let a_back = next_map(&bc_back, &again, &all, &none, &every(), 4_000).unwrap();
        assert!(a_back.waiting.is_empty());
        for pg in 0..8 {
            assert_eq!(a_back.readers(pg).collect::<Vec<_>>(), ["a"], "PG {pg}");
            assert_eq!(a_back.chain(pg)[0], "a");
            assert_eq!(a_back.chain(pg).len(), 3);
        }
        let done = caught_up_on_all(&a_back);
        let settled = next_map(&a_back, &again, &all, &done, &every(), 5_000).unwrap();
        assert!(settled.syncing.is_empty() && settled.waiting.is_empty());
        assert!((0..8).all(|pg| settled.readers(pg).count() == 3));
    }

    #[test]
    fn a_pg_whose_holders_are_placed_elsewhere_takes_one_back_as_its_source() {
        // Every member of a PG's last chain is gone past its grace period and the PG was
        // re-placed on newcomers, which have nothing to copy from; when a former member
        // returns, it rejoins that chain as its source even where placement puts it elsewhere.
        let ids = |v: &[&str]| -> BTreeSet<String> { v.iter().map(|s| s.to_string()).collect() };
        let nodes: Vec<NodeEntry> = ["a", "b", "c", "d", "e", "f"].map(node).to_vec();
        let none = BTreeMap::new();
        let mut start = ClusterMap::new(1, 3);
        start.rereplicate_after_s = 0;
        let first = next_map(
            &start,
            &nodes[..3],
            &ids(&["a", "b", "c"]),
            &none,
            &every(),
            0,
        );
        let first = first.unwrap();
        let def = ids(&["d", "e", "f"]);
        let replaced = next_map(&first, &nodes, &def, &none, &BTreeSet::new(), 0).unwrap();
        assert_eq!(replaced.readers(0).count(), 0);
        let mut waited = replaced.waiting[&0].clone();
        waited.sort();
        assert_eq!(waited, ["a", "b", "c"]);
        let mut back = def.clone();
        back.insert("b".into());
        let with_b = next_map(&replaced, &nodes, &back, &none, &BTreeSet::new(), 0).unwrap();
        assert_eq!(with_b.readers(0).collect::<Vec<_>>(), ["b"]);
        assert_eq!(with_b.chain(0)[0], "b", "the source leads");
        assert!(with_b.waiting.is_empty());
    }

    #[test]
    fn nodes_joining_one_that_holds_everything_leave_every_pg_a_caught_up_copy() {
        let nodes: Vec<NodeEntry> = ["a", "b", "c", "d"].map(node).to_vec();
        let all: BTreeSet<String> = ["a", "b", "c", "d"].iter().map(|s| s.to_string()).collect();
        let none = BTreeMap::new();
        let alone = next_map(
            &ClusterMap::new(16, 3),
            &nodes[..1],
            &all,
            &none,
            &every(),
            0,
        )
        .unwrap();
        // b, c and d at once: a holds 16 replicas of its share of 12, so 4 PGs get three
        // newcomers; a stays in them, leading, until they have caught up.
        let joined = next_map(&alone, &nodes, &all, &none, &every(), 0).unwrap();
        for pg in 0..16 {
            assert_eq!(joined.readers(pg).collect::<Vec<_>>(), ["a"], "PG {pg}");
        }
        let moved: Vec<&Vec<String>> = joined.chains.iter().filter(|c| c.len() == 4).collect();
        assert_eq!(moved.len(), 4);
        assert!(
            moved.iter().all(|c| c[0] == "a"),
            "a leads the chains of newcomers: {moved:?}"
        );
        assert_eq!(joined.leaving.len(), 4);
        assert!(
            next_map(&joined, &nodes, &all, &none, &every(), 0).is_none(),
            "nothing changes while they catch up"
        );
        let reports = caught_up_on_all(&joined);
        let settled = next_map(&joined, &nodes, &all, &reports, &every(), 0).unwrap();
        assert!(settled.syncing.is_empty() && settled.leaving.is_empty());
        assert!(settled.chains.iter().all(|c| c.len() == 3));
        let a = "a".to_string();
        assert_eq!(settled.chains.iter().filter(|c| c.contains(&a)).count(), 12);
    }

    #[test]
    fn a_node_back_within_the_grace_period_takes_its_places_back() {
        let nodes: Vec<NodeEntry> = ["a", "b", "c", "d"].map(node).to_vec();
        let ids = |v: &[&str]| -> BTreeSet<String> { v.iter().map(|s| s.to_string()).collect() };
        let (all, abc) = (ids(&["a", "b", "c", "d"]), ids(&["a", "b", "c"]));
        let none = BTreeMap::new();
        let mut start = ClusterMap::new(16, 3);
        start.rereplicate_after_s = 60;
        let first = next_map(&start, &nodes, &all, &none, &every(), 0).unwrap();
        let d = "d".to_string();
        let held: Vec<u32> = (0..16).filter(|pg| first.chain(*pg).contains(&d)).collect();
        assert_eq!(held.len(), 12, "a quarter of 48 replicas");
        // d goes: its chains run a member short; nothing is copied to a, b or c.
        let gone = next_map(&first, &nodes, &abc, &none, &every(), 1_000).unwrap();
        assert_eq!(
            gone.away["d"],
            Away {
                since_ms: 1_000,
                pgs: held.clone()
            }
        );
        for pg in 0..16 {
            let set = |c: &[String]| {
                c.iter()
                    .filter(|id| **id != d)
                    .cloned()
                    .collect::<BTreeSet<_>>()
            };
            assert_eq!(set(gone.chain(pg)), set(first.chain(pg)), "PG {pg}");
        }
        assert!(gone.syncing.is_empty());
        // While its lease runs, nothing changes, whatever this manager's clock says (a
        // manager elected on a machine whose clock is days ahead or behind).
        for clock in [0, 60_999, 86_400_000 * 3] {
            assert!(
                next_map(&gone, &nodes, &abc, &none, &ids(&["d"]), clock).is_none(),
                "nothing changes within the grace period (clock {clock})"
            );
        }
        // Back within it: d takes its places again, at the tails, and catches up there.
        let back = next_map(&gone, &nodes, &all, &none, &every(), 30_000).unwrap();
        assert!(back.away.is_empty());
        for pg in 0..16 {
            let chain = back.chain(pg);
            assert_eq!(chain.contains(&d), held.contains(&pg), "PG {pg}");
            if held.contains(&pg) {
                assert_eq!(chain.last(), Some(&d), "PG {pg}");
                assert!(back.is_syncing("d", pg));
            }
        }
        assert_eq!(back.syncing.len(), 1, "only d catches up");
        // Its lease ran out (etcd dropped `away/d`): its replicas are made on the others.
        let replaced = next_map(&gone, &nodes, &abc, &none, &BTreeSet::new(), 1_000).unwrap();
        assert!(replaced.away.is_empty());
        assert!(
            replaced
                .chains
                .iter()
                .all(|c| c.len() == 3 && !c.contains(&d))
        );
        assert_eq!(
            replaced.syncing.values().map(BTreeMap::len).sum::<usize>(),
            12
        );
        // With no grace period, at once.
        let mut eager = first.clone();
        eager.rereplicate_after_s = 0;
        let at_once = next_map(&eager, &nodes, &abc, &none, &every(), 1_000).unwrap();
        assert!(newly_away(&first, &nodes, &abc) == ["d"]);
        assert!(
            newly_away(&gone, &nodes, &abc).is_empty(),
            "d has its period already"
        );
        assert!(at_once.away.is_empty());
        assert_eq!(at_once.chains, replaced.chains);
        // Two nodes gone: a PG left with one member cannot take writes, so it is filled from
        // the live nodes at once; the places elsewhere are still kept.
        let two_gone = next_map(&first, &nodes, &ids(&["a", "b"]), &none, &every(), 1_000).unwrap();
        assert!(two_gone.chains.iter().all(|c| c.len() == 2));
        assert_eq!(two_gone.away.len(), 2);
        let both: Vec<u32> = (0..16)
            .filter(|pg| {
                ["c", "d"]
                    .iter()
                    .all(|n| first.chain(*pg).contains(&n.to_string()))
            })
            .collect();
        assert!(!both.is_empty());
        for pg in both {
            assert_eq!(two_gone.chain(pg).len(), 2, "PG {pg}");
            assert_eq!(
                two_gone
                    .syncing
                    .values()
                    .filter(|s| s.contains_key(&pg))
                    .count(),
                1
            );
        }
    }
}
