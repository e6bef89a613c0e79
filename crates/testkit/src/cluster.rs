//! [`RedisCluster`]: a real multi-node Redis Cluster of throw-away `redis-server` processes.
//!
//! A one-node cluster ([`RedisServerBuilder::single_node_cluster`]) already makes scripts obey
//! the one-slot rule, but it never redirects a client: every slot is on the node it asked.
//! Redirections (`MOVED` after a slot moved, `ASK` while it moves), slot maps that change under
//! a running client and replicas promoted by a failover only happen with several nodes, so this
//! module builds one: by default 3 primaries with one replica each, slots split evenly.
//!
//! Every wait has a deadline and fails with [`TestkitError::Timeout`] naming what was awaited
//! and what was last seen, so a test that hangs on a cluster says why.
//!
//! [`RedisServerBuilder::single_node_cluster`]: crate::RedisServerBuilder::single_node_cluster

use std::collections::BTreeMap;
use std::thread;
use std::time::{Duration, Instant};

use crate::error::{Result, TestkitError};
use crate::resp::RespValue;
use crate::server::RedisServer;

/// Number of hash slots of Redis Cluster.
pub const CLUSTER_SLOTS: u16 = 16384;

/// `--cluster-node-timeout` of every node: short, so that a killed primary is failed over within
/// a few seconds, but well above scheduling hiccups of a loaded test machine.
const NODE_TIMEOUT_MS: u64 = 2000;
/// How long the cluster may take to form (meet, slots, replicas synced).
const FORM_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a failover or a slot migration may take to settle on every node.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(20);
/// How long one `CLUSTER FAILOVER` may take before it is asked again (Redis's own manual
/// failover timeout is 5 s), and how often.
const MANUAL_FAILOVER_WAIT: Duration = Duration::from_secs(7);
const FAILOVER_ATTEMPTS: usize = 3;
/// How often the kit tries a fresh port pair for a node before giving up.
const NODE_START_ATTEMPTS: usize = 20;
/// Keys moved per `MIGRATE` call.
const MIGRATE_BATCH: usize = 1000;
const POLL: Duration = Duration::from_millis(20);

/// Who serves which slots, as one node sees it: slot range (inclusive) to node id.
type SlotMap = BTreeMap<(u16, u16), String>;

/// One node's line of `CLUSTER NODES`, as seen by some node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterNodeInfo {
    /// The node id (40 hex characters).
    pub id: String,
    /// Its client port on 127.0.0.1.
    pub port: u16,
    /// Its flags: `myself`, `master`, `slave`, `fail?`, `fail`, `handshake`, ...
    pub flags: Vec<String>,
    /// For a replica, its primary's id.
    pub primary_id: Option<String>,
    /// Whether the cluster bus link to it is `connected`.
    pub connected: bool,
    /// Slot ranges it serves (inclusive); importing/migrating markers are left out.
    pub slots: Vec<(u16, u16)>,
}

impl ClusterNodeInfo {
    /// Whether the flags say `master`.
    pub fn is_primary(&self) -> bool {
        self.flags.iter().any(|f| f == "master")
    }

    /// Whether the flags say the node failed (`fail` or `fail?`).
    pub fn is_failing(&self) -> bool {
        self.flags.iter().any(|f| f == "fail" || f == "fail?")
    }

    /// Whether it serves `slot`.
    pub fn serves(&self, slot: u16) -> bool {
        self.slots.iter().any(|&(a, b)| a <= slot && slot <= b)
    }
}

/// Parses the text of `CLUSTER NODES`.
pub fn parse_cluster_nodes(text: &str) -> Result<Vec<ClusterNodeInfo>> {
    let mut nodes = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 8 {
            return Err(TestkitError::Protocol(format!(
                "short CLUSTER NODES line {line:?}"
            )));
        }
        // ip:port@cport[,hostname]
        let port = fields[1]
            .split('@')
            .next()
            .and_then(|a| a.rsplit(':').next())
            .and_then(|p| p.parse().ok())
            .ok_or_else(|| {
                TestkitError::Protocol(format!("bad address in CLUSTER NODES line {line:?}"))
            })?;
        let mut slots = Vec::new();
        for range in &fields[8..] {
            if range.starts_with('[') {
                continue; // [slot->-id] / [slot-<-id]: a migration in progress
            }
            let parse = |s: &str| {
                s.parse::<u16>().map_err(|_| {
                    TestkitError::Protocol(format!("bad slot range {range:?} in {line:?}"))
                })
            };
            match range.split_once('-') {
                Some((a, b)) => slots.push((parse(a)?, parse(b)?)),
                None => {
                    let s = parse(range)?;
                    slots.push((s, s));
                }
            }
        }
        nodes.push(ClusterNodeInfo {
            id: fields[0].to_string(),
            port,
            flags: fields[2].split(',').map(str::to_string).collect(),
            primary_id: (fields[3] != "-").then(|| fields[3].to_string()),
            connected: fields[7] == "connected",
            slots,
        });
    }
    Ok(nodes)
}

/// A Redis Cluster of `redis-server` processes on free loopback ports (each below 55535, with
/// its cluster bus port, port + 10000, free too).
///
/// * [`start`](Self::start): 3 primaries with one replica each; slots split evenly over the
///   primaries with `CLUSTER ADDSLOTS`, nodes introduced with `CLUSTER MEET`, replicas
///   attached with `CLUSTER REPLICATE`. Returns once every node says `cluster_state:ok`, knows
///   every other node, agrees on who serves every slot, and every replica's link to its
///   primary is up.
/// * Nodes keep their index in [`nodes`](Self::nodes) for the cluster's life; their roles may
///   change ([`failover`](Self::failover)), so [`primaries`](Self::primaries) and
///   [`replicas`](Self::replicas) ask the nodes each time.
/// * Fault controls per node: [`kill`](Self::kill), [`pause`](Self::pause),
///   [`resume`](Self::resume) (the [`RedisServer`] controls of [`node`](Self::node)); after
///   a primary's kill, [`wait_taken_over`](Self::wait_taken_over) waits for its replica's
///   promotion and [`rejoin`](Self::rejoin) starts it again as a replica.
/// * [`failover`](Self::failover) promotes a primary's replica (`CLUSTER FAILOVER`);
///   [`migrate_slot`](Self::migrate_slot) moves one slot and its keys to another primary while
///   clients keep running (they see `ASK`, then `MOVED`).
///
/// Every process is SIGKILLed on drop (see [`RedisServer`]). All methods block; call them
/// from `tokio::task::spawn_blocking` (or a multi-thread runtime) in async tests.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    ids: Vec<String>,
}

impl RedisCluster {
    /// Starts 3 primaries with one replica each and waits until the cluster is ok.
    pub fn start() -> Result<RedisCluster> {
        RedisCluster::start_with(3, 1)
    }

    /// Starts `primaries` primaries (at least 1) with `replicas_each` replicas each, slots
    /// split evenly over the primaries in node order. Node `i < primaries` is a primary; the
    /// replicas follow, replica `primaries + p * replicas_each + r` replicating primary `p`.
    pub fn start_with(primaries: usize, replicas_each: usize) -> Result<RedisCluster> {
        if primaries == 0 {
            return Err(TestkitError::Unsupported(
                "a cluster needs at least one primary".into(),
            ));
        }
        let count = primaries * (1 + replicas_each);
        let mut nodes = Vec::with_capacity(count);
        for _ in 0..count {
            nodes.push(start_node()?);
        }
        let mut ids = Vec::with_capacity(count);
        for node in &nodes {
            ids.push(text(node.command(&["CLUSTER", "MYID"])?)?);
        }
        let cluster = RedisCluster { nodes, ids };
        cluster.form(primaries, replicas_each)?;
        Ok(cluster)
    }

    fn form(&self, primaries: usize, replicas_each: usize) -> Result<()> {
        let per = CLUSTER_SLOTS as usize / primaries;
        for p in 0..primaries {
            let first = p * per;
            let last = if p + 1 == primaries {
                CLUSTER_SLOTS as usize - 1
            } else {
                first + per - 1
            };
            self.nodes[p].add_slots(first as u16, last as u16)?;
        }
        // Every node meets the first; gossip introduces the rest.
        let first_port = self.nodes[0].port().to_string();
        for node in &self.nodes[1..] {
            node.command(&["CLUSTER", "MEET", "127.0.0.1", &first_port])?;
        }
        // A replica can only REPLICATE a node it knows as a primary: wait for the gossip first.
        self.wait_until("every node knows every other node", FORM_TIMEOUT, || {
            for node in &self.nodes {
                let seen = self.view(node)?;
                if seen.len() != self.nodes.len() || seen.iter().any(|n| !n.connected) {
                    return Ok(Err(format!(
                        "node {} knows {} nodes ({} connected)",
                        node.port(),
                        seen.len(),
                        seen.iter().filter(|n| n.connected).count()
                    )));
                }
            }
            Ok(Ok(()))
        })?;
        for p in 0..primaries {
            for r in 0..replicas_each {
                let replica = &self.nodes[primaries + p * replicas_each + r];
                replica.command(&["CLUSTER", "REPLICATE", &self.ids[p]])?;
            }
        }
        // Every node must know the replicas as replicas before the cluster is used: a primary
        // that still takes a replica for a primary refuses it its vote ("it is a master node"),
        // and a CLUSTER FAILOVER right after forming then times out.
        self.wait_until("every node to see the replicas", FORM_TIMEOUT, || {
            for node in &self.nodes {
                let view = self.view(node)?;
                for p in 0..primaries {
                    for r in 0..replicas_each {
                        let id = &self.ids[primaries + p * replicas_each + r];
                        let seen = view.iter().find(|n| &n.id == id);
                        let ok = seen.is_some_and(|n| {
                            !n.is_primary() && n.primary_id.as_deref() == Some(self.ids[p].as_str())
                        });
                        if !ok {
                            return Ok(Err(format!(
                                "node {} does not see {id} as a replica of {}",
                                node.port(),
                                self.ids[p]
                            )));
                        }
                    }
                }
            }
            Ok(Ok(()))
        })?;
        self.wait_healthy("the cluster to form", FORM_TIMEOUT)
    }

    /// Every node, in start order (primaries first). Indices stay valid; roles may change.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// Node `index` (panics when out of range, like slice indexing).
    pub fn node(&self, index: usize) -> &RedisServer {
        &self.nodes[index]
    }

    /// Node `index`'s cluster node id.
    pub fn node_id(&self, index: usize) -> &str {
        &self.ids[index]
    }

    /// The index of the node with this port, if it is one of ours.
    pub fn index_of_port(&self, port: u16) -> Option<usize> {
        self.nodes.iter().position(|n| n.port() == port)
    }

    /// `("127.0.0.1", port)` of every node, for `fred`'s `ServerConfig::new_clustered`.
    pub fn seeds(&self) -> Vec<(String, u16)> {
        self.nodes
            .iter()
            .map(|n| ("127.0.0.1".to_string(), n.port()))
            .collect()
    }

    /// The cluster as a URL for `fred`'s `Config::from_url` (and `LockClient::connect`):
    /// `redis-cluster://127.0.0.1:PORT?node=127.0.0.1:PORT2&node=...`, every node a seed.
    pub fn url(&self) -> String {
        let mut seeds = self.seeds().into_iter();
        let mut url = match seeds.next() {
            Some((host, port)) => format!("redis-cluster://{host}:{port}"),
            None => return "redis-cluster://".to_string(),
        };
        for (i, (host, port)) in seeds.enumerate() {
            url.push(if i == 0 { '?' } else { '&' });
            url.push_str(&format!("node={host}:{port}"));
        }
        url
    }

    /// Indices of the nodes that are running, not paused and say `role:master` (`ROLE`).
    pub fn primaries(&self) -> Result<Vec<usize>> {
        self.with_role("master")
    }

    /// Indices of the nodes that are running, not paused and say `role:slave` (`ROLE`).
    pub fn replicas(&self) -> Result<Vec<usize>> {
        self.with_role("slave")
    }

    fn with_role(&self, role: &str) -> Result<Vec<usize>> {
        let mut out = Vec::new();
        for (i, node) in self.nodes.iter().enumerate() {
            if !self.reachable(i) {
                continue;
            }
            if role_of(node)? == role {
                out.push(i);
            }
        }
        Ok(out)
    }

    /// Indices of the replicas (running, not paused) whose primary is node `primary`, per
    /// their own `ROLE`.
    pub fn replicas_of(&self, primary: usize) -> Result<Vec<usize>> {
        let port = self.nodes[primary].port();
        let mut out = Vec::new();
        for i in self.replicas()? {
            let role = self.nodes[i].command(&["ROLE"])?;
            let primary_port = role
                .as_array()
                .and_then(|parts| parts.get(2))
                .and_then(RespValue::as_int);
            if primary_port == Some(i64::from(port)) {
                out.push(i);
            }
        }
        Ok(out)
    }

    /// The slot of `key` (`CLUSTER KEYSLOT`, asked of a reachable node).
    pub fn key_slot(&self, key: &str) -> Result<u16> {
        let node = self.any_reachable()?;
        let slot = node.command(&["CLUSTER", "KEYSLOT", key])?;
        slot.as_int()
            .and_then(|s| u16::try_from(s).ok())
            .ok_or_else(|| TestkitError::Protocol(format!("CLUSTER KEYSLOT replied {slot:?}")))
    }

    /// One lock name per primary, in the order of [`primaries`](Self::primaries): the first
    /// `PREFIX:N` whose slot that primary serves. A leasehold lock's keys carry its name as the
    /// hash tag (`P:{NAME}`), so the name's slot is the lock's.
    pub fn names_on_every_primary(&self, prefix: &str) -> Result<Vec<String>> {
        let primaries = self.primaries()?;
        let mut found: Vec<Option<String>> = vec![None; primaries.len()];
        for n in 0..10_000 {
            let name = format!("{prefix}:{n}");
            let owner = self.owner_of_slot(self.key_slot(&name)?)?;
            if let Some(at) = primaries.iter().position(|&p| p == owner) {
                found[at].get_or_insert(name);
            }
            if found.iter().all(Option::is_some) {
                return Ok(found.into_iter().flatten().collect());
            }
        }
        Err(TestkitError::Protocol(format!(
            "no {prefix}:N name for every primary among 10,000: {found:?}"
        )))
    }

    /// The index of the primary serving `slot`, per `CLUSTER NODES` of a reachable node.
    pub fn owner_of_slot(&self, slot: u16) -> Result<usize> {
        let view = self.view(self.any_reachable()?)?;
        view.iter()
            .find(|n| n.is_primary() && n.serves(slot))
            .and_then(|n| self.index_of_port(n.port))
            .ok_or_else(|| TestkitError::Protocol(format!("no node serves slot {slot}")))
    }

    /// `CLUSTER NODES` as seen by `node`.
    pub fn view(&self, node: &RedisServer) -> Result<Vec<ClusterNodeInfo>> {
        parse_cluster_nodes(&text(node.command(&["CLUSTER", "NODES"])?)?)
    }

    /// SIGKILLs node `index` ([`RedisServer::kill`]). The cluster notices after the node
    /// timeout (2 s) and, for a primary, its replica takes over shortly after.
    pub fn kill(&self, index: usize) -> Result<()> {
        self.nodes[index].kill()
    }

    /// SIGSTOPs node `index` ([`RedisServer::pause`]).
    pub fn pause(&self, index: usize) -> Result<()> {
        self.nodes[index].pause()
    }

    /// SIGCONTs node `index` ([`RedisServer::resume`]).
    pub fn resume(&self, index: usize) -> Result<()> {
        self.nodes[index].resume()
    }

    /// Starts node `index` again after a [`kill`](Self::kill), on its port and in its
    /// directory ([`RedisServer::restart`]): it keeps its node id and its view of the cluster
    /// (`nodes.conf`), and its data is lost. Once a replica has taken over its slots (see
    /// [`wait_taken_over`](Self::wait_taken_over)), the cluster's newer configuration makes it
    /// a replica of that new primary, which it then syncs from. Waits until it says
    /// `role:slave` and the cluster is healthy ([`wait_healthy`](Self::wait_healthy)).
    ///
    /// Restarting a killed primary *before* a replica took over brings it back as the primary
    /// of its slots with none of its data: call [`wait_taken_over`](Self::wait_taken_over)
    /// first.
    pub fn rejoin(&self, index: usize) -> Result<()> {
        self.nodes[index].restart()?;
        let port = self.nodes[index].port();
        self.wait_until(
            &format!("node {port} to rejoin as a replica"),
            SETTLE_TIMEOUT,
            || {
                Ok(if role_of(&self.nodes[index])? == "slave" {
                    Ok(())
                } else {
                    Err(format!("node {port} does not say role:slave yet"))
                })
            },
        )?;
        self.wait_healthy(
            &format!("the cluster after node {port} rejoined"),
            SETTLE_TIMEOUT,
        )
    }

    /// After primary `killed` was [`kill`](Self::kill)ed (or paused): waits until another
    /// node serves every slot it served, as every reachable node sees it, and the reachable
    /// part of the cluster is healthy. Takes the node timeout (2 s) plus an election.
    pub fn wait_taken_over(&self, killed: usize) -> Result<()> {
        let killed_id = self.ids[killed].clone();
        self.wait_until(
            &format!(
                "a replica to take over from node {}",
                self.nodes[killed].port()
            ),
            SETTLE_TIMEOUT,
            || {
                for (i, node) in self.nodes.iter().enumerate() {
                    if i == killed || !self.reachable(i) {
                        continue;
                    }
                    let view = self.view(node)?;
                    if let Some(n) = view
                        .iter()
                        .find(|n| n.id == killed_id && n.is_primary() && !n.slots.is_empty())
                    {
                        return Ok(Err(format!(
                            "node {} still sees {} serving {:?}",
                            node.port(),
                            n.port,
                            n.slots.first()
                        )));
                    }
                }
                Ok(Ok(()))
            },
        )?;
        self.wait_healthy("the cluster after the takeover", SETTLE_TIMEOUT)
    }

    /// Fails over primary `primary`: `CLUSTER FAILOVER` (a coordinated, lossless failover: the
    /// replica first catches up with the primary's replication offset) on its first replica,
    /// then waits until that replica says `role:master` (asking again, up to 3 times, when a
    /// manual failover times out), the old primary says `role:slave`, every reachable node
    /// agrees, and the cluster is ok. Returns the new primary's index.
    pub fn failover(&self, primary: usize) -> Result<usize> {
        let replica = *self.replicas_of(primary)?.first().ok_or_else(|| {
            TestkitError::Unsupported(format!(
                "node {} has no reachable replica to fail over to",
                self.nodes[primary].port()
            ))
        })?;
        // Redis gives a manual failover 5 s; should one time out (a primary refusing its vote),
        // it is asked again.
        let mut attempt = 1;
        loop {
            self.nodes[replica].command(&["CLUSTER", "FAILOVER"])?;
            let promoted = self.wait_until(
                &format!("node {} to say role:master", self.nodes[replica].port()),
                MANUAL_FAILOVER_WAIT,
                || {
                    Ok(if role_of(&self.nodes[replica])? == "master" {
                        Ok(())
                    } else {
                        Err("not yet".into())
                    })
                },
            );
            match promoted {
                Ok(()) => break,
                Err(e) if attempt >= FAILOVER_ATTEMPTS => return Err(e),
                Err(_) => {
                    tracing::debug!(attempt, "CLUSTER FAILOVER did not complete, asking again");
                    attempt += 1;
                }
            }
        }
        let (new_id, old_id) = (&self.ids[replica], &self.ids[primary]);
        self.wait_until(
            &format!(
                "node {} to take over from {}",
                self.nodes[replica].port(),
                self.nodes[primary].port()
            ),
            SETTLE_TIMEOUT,
            || {
                if role_of(&self.nodes[replica])? != "master" {
                    return Ok(Err("the replica does not say role:master yet".into()));
                }
                if self.reachable(primary) && role_of(&self.nodes[primary])? != "slave" {
                    return Ok(Err("the old primary does not say role:slave yet".into()));
                }
                for (i, node) in self.nodes.iter().enumerate() {
                    if !self.reachable(i) {
                        continue;
                    }
                    let view = self.view(node)?;
                    let promoted = view.iter().any(|n| &n.id == new_id && n.is_primary());
                    let demoted = view.iter().all(|n| &n.id != old_id || !n.is_primary());
                    if !promoted || !demoted {
                        return Ok(Err(format!("node {} has the old roles", node.port())));
                    }
                }
                Ok(Ok(()))
            },
        )?;
        self.wait_healthy("the cluster after the failover", SETTLE_TIMEOUT)?;
        Ok(replica)
    }

    /// Moves `slot` and its keys to primary `to`, the way `redis-cli --cluster reshard` does:
    /// `SETSLOT IMPORTING` on the target, `SETSLOT MIGRATING` on the source, `MIGRATE` of the
    /// keys listed by `CLUSTER GETKEYSINSLOT` (in batches; an existing key at the target is an
    /// error, not replaced), then `SETSLOT NODE` on the target, the source and every other
    /// primary. Waits until every reachable node says `to` serves the slot. Returns how many
    /// keys were moved.
    ///
    /// While it runs, a client asking the source for a key that has already moved gets `ASK`;
    /// a script over several keys of the slot, some moved and some not, gets `TRYAGAIN`.
    /// Afterwards the source answers `MOVED`.
    pub fn migrate_slot(&self, slot: u16, to: usize) -> Result<usize> {
        self.migrate_slot_with(slot, to, Duration::ZERO)
    }

    /// [`migrate_slot`](Self::migrate_slot) with a pause of `dwell` while the slot is half
    /// moved (after the `SETSLOT IMPORTING/MIGRATING` pair, before any key moves), so clients
    /// can be caught in the middle.
    pub fn migrate_slot_with(&self, slot: u16, to: usize, dwell: Duration) -> Result<usize> {
        if self.owner_of_slot(slot)? == to {
            return Ok(0);
        }
        let migration = self.begin_slot_migration(slot, to)?;
        thread::sleep(dwell);
        let moved = migration.move_keys()?;
        migration.finish()?;
        Ok(moved)
    }

    /// The first step of [`migrate_slot`](Self::migrate_slot), for tests that act between
    /// the steps: `SETSLOT IMPORTING` on `to` and `SETSLOT MIGRATING` on the slot's owner.
    /// Then [`SlotMigration::move_keys`] (after which a client asking the source for a moved
    /// key gets `ASK`) and [`SlotMigration::finish`] (after which it gets `MOVED`).
    pub fn begin_slot_migration(&self, slot: u16, to: usize) -> Result<SlotMigration<'_>> {
        let from = self.owner_of_slot(slot)?;
        if from == to {
            return Err(TestkitError::Unsupported(format!(
                "slot {slot} is on node {} already",
                self.nodes[to].port()
            )));
        }
        let slot_arg = slot.to_string();
        self.nodes[to].command(&[
            "CLUSTER",
            "SETSLOT",
            &slot_arg,
            "IMPORTING",
            &self.ids[from],
        ])?;
        self.nodes[from].command(&["CLUSTER", "SETSLOT", &slot_arg, "MIGRATING", &self.ids[to]])?;
        Ok(SlotMigration {
            cluster: self,
            slot,
            from,
            to,
        })
    }

    /// Waits until every reachable node says `cluster_state:ok`, sees every slot served by a
    /// primary that is not failing, agrees with the others on who serves which slot, and every
    /// reachable replica's link to its primary is up.
    pub fn wait_healthy(&self, what: &str, within: Duration) -> Result<()> {
        self.wait_until(what, within, || {
            let mut maps: Vec<(u16, SlotMap)> = Vec::new();
            for (i, node) in self.nodes.iter().enumerate() {
                if !self.reachable(i) {
                    continue;
                }
                let info = text(node.command(&["CLUSTER", "INFO"])?)?;
                if !info.contains("cluster_state:ok") {
                    return Ok(Err(format!("node {} is not ok", node.port())));
                }
                let view = self.view(node)?;
                let mut map = BTreeMap::new();
                for n in view
                    .iter()
                    .filter(|n| n.is_primary() && !n.slots.is_empty())
                {
                    if n.is_failing() {
                        return Ok(Err(format!(
                            "node {} sees slots on failing {}",
                            node.port(),
                            n.port
                        )));
                    }
                    for &range in &n.slots {
                        map.insert(range, n.id.clone());
                    }
                }
                let covered: usize = map.keys().map(|&(a, b)| (b - a) as usize + 1).sum();
                if covered != CLUSTER_SLOTS as usize {
                    return Ok(Err(format!(
                        "node {} sees {covered} slots served",
                        node.port()
                    )));
                }
                maps.push((node.port(), map));
                if role_of(node)? == "slave" {
                    let repl = node.info("replication")?;
                    if !repl.contains("master_link_status:up") {
                        return Ok(Err(format!(
                            "replica {} has its primary link down",
                            node.port()
                        )));
                    }
                }
            }
            if let Some((port, first)) = maps.first() {
                if let Some((other, _)) = maps.iter().find(|(_, m)| m != first) {
                    return Ok(Err(format!(
                        "nodes {port} and {other} disagree on the slot map"
                    )));
                }
            }
            Ok(Ok(()))
        })
    }

    /// Whether node `index` runs and is not paused (so it answers commands).
    fn reachable(&self, index: usize) -> bool {
        let node = &self.nodes[index];
        node.is_running() && !node.is_paused()
    }

    fn any_reachable(&self) -> Result<&RedisServer> {
        (0..self.nodes.len())
            .find(|&i| self.reachable(i))
            .map(|i| &self.nodes[i])
            .ok_or_else(|| TestkitError::Process("no cluster node is reachable".into()))
    }

    /// Polls `check` until it says `Ok(Ok(()))`. `Ok(Err(why))` is "not yet" (the last `why`
    /// goes into the timeout error); a command error is retried too, since nodes answer
    /// `CLUSTERDOWN` and the like while they settle.
    fn wait_until(
        &self,
        what: &str,
        within: Duration,
        mut check: impl FnMut() -> Result<std::result::Result<(), String>>,
    ) -> Result<()> {
        let deadline = Instant::now() + within;
        loop {
            let last = match check() {
                Ok(Ok(())) => return Ok(()),
                Ok(Err(why)) => why,
                Err(e) => e.to_string(),
            };
            if Instant::now() >= deadline {
                let tails: Vec<String> = self
                    .nodes
                    .iter()
                    .map(|n| format!("--- node {} ---\n{}", n.port(), n.log_tail(600)))
                    .collect();
                return Err(TestkitError::Timeout(format!(
                    "waiting {within:?} for {what}; last seen: {last}\n{}",
                    tails.join("\n")
                )));
            }
            thread::sleep(POLL);
        }
    }
}

/// A slot half-way between two primaries, from [`RedisCluster::begin_slot_migration`].
///
/// Dropping it without [`finish`](Self::finish) leaves the slot importing/migrating.
#[derive(Debug)]
pub struct SlotMigration<'a> {
    cluster: &'a RedisCluster,
    slot: u16,
    from: usize,
    to: usize,
}

impl SlotMigration<'_> {
    /// The slot being moved.
    pub fn slot(&self) -> u16 {
        self.slot
    }

    /// The index of the primary the slot leaves.
    pub fn source(&self) -> usize {
        self.from
    }

    /// The index of the primary the slot goes to.
    pub fn target(&self) -> usize {
        self.to
    }

    /// `MIGRATE`s every key of the slot still on the source (listed by `CLUSTER
    /// GETKEYSINSLOT`, in batches) to the target; an existing key at the target is an error,
    /// not replaced. Returns how many keys moved. Can be called again for keys created since.
    pub fn move_keys(&self) -> Result<usize> {
        let (source, target) = (&self.cluster.nodes[self.from], &self.cluster.nodes[self.to]);
        let slot_arg = self.slot.to_string();
        let target_port = target.port().to_string();
        let mut moved = 0;
        loop {
            let keys = source.command(&[
                "CLUSTER",
                "GETKEYSINSLOT",
                &slot_arg,
                &MIGRATE_BATCH.to_string(),
            ])?;
            let keys: Vec<String> = keys
                .as_array()
                .ok_or_else(|| TestkitError::Protocol(format!("GETKEYSINSLOT replied {keys:?}")))?
                .iter()
                .filter_map(RespValue::as_str)
                .collect();
            if keys.is_empty() {
                return Ok(moved);
            }
            let mut args: Vec<&str> = vec!["MIGRATE", "127.0.0.1", &target_port, "", "0", "5000"];
            args.push("KEYS");
            args.extend(keys.iter().map(String::as_str));
            source.command(&args).map_err(|e| {
                TestkitError::Redis(format!(
                    "MIGRATE of {} keys of slot {} from {} to {}: {e}",
                    keys.len(),
                    self.slot,
                    source.port(),
                    target.port()
                ))
            })?;
            moved += keys.len();
        }
    }

    /// Moves any keys left, then `SETSLOT NODE` on the target, the source and every other
    /// primary, and waits until every reachable node says the target serves the slot.
    pub fn finish(self) -> Result<()> {
        self.move_keys()?;
        let cluster = self.cluster;
        let (slot, from, to) = (self.slot, self.from, self.to);
        let to_id = &cluster.ids[to];
        let slot_arg = slot.to_string();
        cluster.nodes[to].command(&["CLUSTER", "SETSLOT", &slot_arg, "NODE", to_id])?;
        cluster.nodes[from].command(&["CLUSTER", "SETSLOT", &slot_arg, "NODE", to_id])?;
        for p in cluster.primaries()? {
            if p != from && p != to {
                cluster.nodes[p].command(&["CLUSTER", "SETSLOT", &slot_arg, "NODE", to_id])?;
            }
        }
        cluster.wait_until(
            &format!(
                "slot {slot} to be served by {} everywhere",
                cluster.nodes[to].port()
            ),
            SETTLE_TIMEOUT,
            || {
                for (i, node) in cluster.nodes.iter().enumerate() {
                    if !cluster.reachable(i) {
                        continue;
                    }
                    let view = cluster.view(node)?;
                    let owner = view.iter().find(|n| n.is_primary() && n.serves(slot));
                    if owner.map(|n| n.id.as_str()) != Some(to_id.as_str()) {
                        return Ok(Err(format!(
                            "node {} says slot {slot} is on {:?}",
                            node.port(),
                            owner.map(|n| n.port)
                        )));
                    }
                }
                Ok(Ok(()))
            },
        )
    }
}

/// Starts one cluster-enabled node (not yet part of any cluster) on a port below 55535.
///
/// [`RedisServer`] picks an arbitrary free port unless asked for a one-node cluster (which
/// would assign it every slot), so the kit retries until the port leaves room for the bus port
/// (port + 10000); a bus port that is taken makes the server exit at startup, which is retried
/// too.
fn start_node() -> Result<RedisServer> {
    let mut last_err = None;
    for _ in 0..NODE_START_ATTEMPTS {
        let started = RedisServer::builder()
            .args([
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                &NODE_TIMEOUT_MS.to_string(),
                // Announce the address clients can reach: CLUSTER SLOTS answers with it.
                "--cluster-announce-ip",
                "127.0.0.1",
                // A replica whose primary was down for long may still be promoted: tests kill
                // primaries on purpose.
                "--cluster-replica-validity-factor",
                "0",
                // Replicas sync at once instead of after the default 5 s wait for more
                // replicas to share one diskless transfer.
                "--repl-diskless-sync-delay",
                "0",
            ])
            .start();
        match started {
            Ok(node) if node.port() < 55535 => return Ok(node),
            Ok(node) => {
                tracing::debug!(
                    port = node.port(),
                    "cluster node port leaves no bus port, retrying"
                );
                drop(node);
            }
            Err(e @ TestkitError::StartFailed { .. }) => last_err = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last_err.unwrap_or_else(|| {
        TestkitError::Timeout(format!(
            "no cluster node port below 55535 in {NODE_START_ATTEMPTS} attempts"
        ))
    }))
}

/// The first element of `ROLE`: `master`, `slave` or `sentinel`.
pub(crate) fn role_of(node: &RedisServer) -> Result<String> {
    let role = node.command(&["ROLE"])?;
    role.as_array()
        .and_then(|parts| parts.first())
        .and_then(RespValue::as_str)
        .ok_or_else(|| TestkitError::Protocol(format!("ROLE replied {role:?}")))
}

fn text(v: RespValue) -> Result<String> {
    v.as_str()
        .ok_or_else(|| TestkitError::Protocol(format!("expected text, got {v:?}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cluster_nodes() {
        let text = "\
07c37dfeb235213a872192d90877d0cd55635b91 127.0.0.1:30004@40004 slave e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 0 1426238317239 4 connected
e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 127.0.0.1:30001@40001,host myself,master - 0 0 1 connected 0-5460 [5461->-292f8b365bb7edb5e285caf0b7e6ddc7265d2f4f]
292f8b365bb7edb5e285caf0b7e6ddc7265d2f4f 127.0.0.1:30003@40003 master,fail? - 0 1426238316232 3 disconnected 5461 5462-10922
";
        let nodes = parse_cluster_nodes(text).unwrap();
        assert_eq!(nodes.len(), 3);
        assert_eq!(nodes[0].port, 30004);
        assert!(!nodes[0].is_primary());
        assert_eq!(
            nodes[0].primary_id.as_deref(),
            Some("e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca")
        );
        assert!(nodes[1].is_primary() && nodes[1].serves(0) && !nodes[1].serves(5461));
        assert!(nodes[2].is_failing() && !nodes[2].connected);
        assert_eq!(nodes[2].slots, vec![(5461, 5461), (5462, 10922)]);
    }
}
