//! The fenced store: an SQLite file shared by every client process.
//!
//! A write for resource `r` with token `T` is accepted only if `T` is higher than the last
//! accepted token for `r`, checked and applied in one transaction (the guide's fenced UPDATE).
//! Accepted and refused writes are logged in the same transaction, in serialization order, with
//! the time read under the store's write lock.

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use leasehold::{FencingToken, QuorumToken};
use rusqlite::{params, Connection, TransactionBehavior};

use crate::clock;

/// Longer than any pause the orchestrator injects: a client SIGSTOPped inside a write
/// transaction holds the store's lock until it is resumed.
const BUSY_TIMEOUT: Duration = Duration::from_secs(60);

/// One connection to the store (one per client task: rusqlite connections are not `Sync`).
#[derive(Debug)]
pub struct Store {
    conn: Connection,
}

/// One accepted write, as the store recorded it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Accepted {
    pub seq: i64,
    pub resource: u32,
    pub token: u64,
    pub client: u32,
    pub gen: u32,
    pub op: u64,
    pub t: i64,
}

/// One accepted RedLock write: its token by server number (`None`: that server did not grant).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuorumAccepted {
    pub seq: i64,
    pub resource: u32,
    pub tokens: Vec<Option<u64>>,
    pub client: u32,
    pub gen: u32,
    pub op: u64,
    pub t: i64,
}

/// A [`QuorumToken`] from tokens by server number.
pub fn quorum_token(tokens: &[Option<u64>]) -> QuorumToken {
    QuorumToken::from_tokens(tokens.iter().map(|t| t.map(FencingToken::new)))
}

/// One refused write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refused {
    pub resource: u32,
    pub token: u64,
    /// The store's last accepted token at the time.
    pub last_token: u64,
    pub client: u32,
    pub gen: u32,
    pub op: u64,
    pub t: i64,
}

impl Store {
    /// Creates the store with `resources` rows at token 0.
    pub fn create(path: &Path, resources: u32) -> anyhow::Result<()> {
        let conn = Store::connect(path)?;
        conn.execute_batch(
            "CREATE TABLE resource(id INTEGER PRIMARY KEY, last_token INTEGER NOT NULL, writes INTEGER NOT NULL);
             CREATE TABLE accepted(seq INTEGER PRIMARY KEY AUTOINCREMENT, resource INTEGER NOT NULL,
                 token INTEGER NOT NULL, client INTEGER NOT NULL, gen INTEGER NOT NULL,
                 op INTEGER NOT NULL, t INTEGER NOT NULL);
             CREATE TABLE refused(seq INTEGER PRIMARY KEY AUTOINCREMENT, resource INTEGER NOT NULL,
                 token INTEGER NOT NULL, last_token INTEGER NOT NULL, client INTEGER NOT NULL,
                 gen INTEGER NOT NULL, op INTEGER NOT NULL, t INTEGER NOT NULL);",
        )?;
        for id in 0..resources {
            conn.execute(
                "INSERT INTO resource(id, last_token, writes) VALUES (?1, 0, 0)",
                params![id],
            )?;
        }
        Ok(())
    }

    pub fn open(path: &Path) -> anyhow::Result<Store> {
        Ok(Store {
            conn: Store::connect(path)?,
        })
    }

    fn connect(path: &Path) -> anyhow::Result<Connection> {
        let conn = Connection::open(path).with_context(|| format!("opening {}", path.display()))?;
        conn.busy_timeout(BUSY_TIMEOUT)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        Ok(conn)
    }

    /// The fenced write. Returns whether it was accepted and the time read under the lock.
    pub fn write(
        &mut self,
        resource: u32,
        token: u64,
        client: u32,
        gen: u32,
        op: u64,
    ) -> anyhow::Result<(bool, i64)> {
        let token = i64::try_from(token).context("token over i64")?;
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        // Read under the write lock: no other write can happen between this and the commit,
        // so these times order writes exactly as the store applied them.
        let t = clock::now_us();
        let changed = tx.execute(
            "UPDATE resource SET last_token = ?1, writes = writes + 1 WHERE id = ?2 AND last_token < ?1",
            params![token, resource],
        )?;
        let accepted = changed == 1;
        if accepted {
            tx.execute(
                "INSERT INTO accepted(resource, token, client, gen, op, t) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![resource, token, client, gen, op as i64, t],
            )?;
        } else {
            let last: i64 = tx.query_row(
                "SELECT last_token FROM resource WHERE id = ?1",
                params![resource],
                |row| row.get(0),
            )?;
            tx.execute(
                "INSERT INTO refused(resource, token, last_token, client, gen, op, t) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                params![resource, token, last, client, gen, op as i64, t],
            )?;
        }
        tx.commit()?;
        Ok((accepted, t))
    }

    /// Adds the RedLock tables: `resources` rows whose stored token is the merged latest
    /// [`QuorumToken`] (JSON, one entry per server, `null` where none was seen yet).
    pub fn create_quorum(path: &Path, resources: u32) -> anyhow::Result<()> {
        let conn = Store::connect(path)?;
        conn.execute_batch(
            "CREATE TABLE qresource(id INTEGER PRIMARY KEY, tokens TEXT NOT NULL, writes INTEGER NOT NULL);
             CREATE TABLE qaccepted(seq INTEGER PRIMARY KEY AUTOINCREMENT, resource INTEGER NOT NULL,
                 tokens TEXT NOT NULL, client INTEGER NOT NULL, gen INTEGER NOT NULL,
                 op INTEGER NOT NULL, t INTEGER NOT NULL);
             CREATE TABLE qrefused(seq INTEGER PRIMARY KEY AUTOINCREMENT, resource INTEGER NOT NULL,
                 tokens TEXT NOT NULL, stored TEXT NOT NULL, client INTEGER NOT NULL,
                 gen INTEGER NOT NULL, op INTEGER NOT NULL, t INTEGER NOT NULL);",
        )?;
        for id in 0..resources {
            conn.execute(
                "INSERT INTO qresource(id, tokens, writes) VALUES (?1, '[]', 0)",
                params![id],
            )?;
        }
        Ok(())
    }

    /// The RedLock fenced write (docs/red-lock.md's check): accepted unless `tokens` is older
    /// ([`QuorumToken::is_older_than`]) than the merged token stored for `resource`, which then
    /// becomes the merge of the two ([`QuorumToken::merged`]); checked and applied in one
    /// transaction, with the time read under the store's write lock. `tokens` is by server
    /// number (the orchestrator's, the same in every client).
    pub fn write_quorum(
        &mut self,
        resource: u32,
        tokens: &[Option<u64>],
        client: u32,
        gen: u32,
        op: u64,
    ) -> anyhow::Result<(bool, i64)> {
        let mine = quorum_token(tokens);
        let text = serde_json::to_string(tokens)?;
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let t = clock::now_us();
        let stored_text: String = tx.query_row(
            "SELECT tokens FROM qresource WHERE id = ?1",
            params![resource],
            |row| row.get(0),
        )?;
        let stored_tokens: Vec<Option<u64>> = serde_json::from_str(&stored_text)?;
        let stored = quorum_token(&stored_tokens);
        let accepted = !mine.is_older_than(&stored);
        if accepted {
            let merged: Vec<Option<u64>> = stored
                .merged(&mine)
                .tokens()
                .iter()
                .map(|t| t.map(|t| t.get()))
                .collect();
            tx.execute(
                "UPDATE qresource SET tokens = ?1, writes = writes + 1 WHERE id = ?2",
                params![serde_json::to_string(&merged)?, resource],
            )?;
            tx.execute(
                "INSERT INTO qaccepted(resource, tokens, client, gen, op, t) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![resource, text, client, gen, op as i64, t],
            )?;
        } else {
            tx.execute(
                "INSERT INTO qrefused(resource, tokens, stored, client, gen, op, t) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                params![resource, text, stored_text, client, gen, op as i64, t],
            )?;
        }
        tx.commit()?;
        Ok((accepted, t))
    }

    /// Every accepted RedLock write, in the order the store applied them.
    pub fn quorum_accepted(&self) -> anyhow::Result<Vec<QuorumAccepted>> {
        let mut stmt = self.conn.prepare(
            "SELECT seq, resource, tokens, client, gen, op, t FROM qaccepted ORDER BY seq",
        )?;
        let rows = stmt.query_map([], |row| {
            Ok((
                row.get::<_, i64>(0)?,
                row.get::<_, u32>(1)?,
                row.get::<_, String>(2)?,
                row.get::<_, u32>(3)?,
                row.get::<_, u32>(4)?,
                row.get::<_, i64>(5)?,
                row.get::<_, i64>(6)?,
            ))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (seq, resource, tokens, client, gen, op, t) = row?;
            out.push(QuorumAccepted {
                seq,
                resource,
                tokens: serde_json::from_str(&tokens)?,
                client,
                gen,
                op: op as u64,
                t,
            });
        }
        Ok(out)
    }

    /// How many RedLock writes the store refused.
    pub fn quorum_refused(&self) -> anyhow::Result<usize> {
        let n: i64 = self
            .conn
            .query_row("SELECT COUNT(*) FROM qrefused", [], |row| row.get(0))?;
        Ok(n as usize)
    }

    /// Every accepted write, in the order the store applied them.
    pub fn accepted(&self) -> anyhow::Result<Vec<Accepted>> {
        let mut stmt = self.conn.prepare(
            "SELECT seq, resource, token, client, gen, op, t FROM accepted ORDER BY seq",
        )?;
        let rows = stmt.query_map([], |row| {
            Ok(Accepted {
                seq: row.get(0)?,
                resource: row.get(1)?,
                token: row.get::<_, i64>(2)? as u64,
                client: row.get(3)?,
                gen: row.get(4)?,
                op: row.get::<_, i64>(5)? as u64,
                t: row.get(6)?,
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Every refused write, in store order.
    pub fn refused(&self) -> anyhow::Result<Vec<Refused>> {
        let mut stmt = self.conn.prepare(
            "SELECT resource, token, last_token, client, gen, op, t FROM refused ORDER BY seq",
        )?;
        let rows = stmt.query_map([], |row| {
            Ok(Refused {
                resource: row.get(0)?,
                token: row.get::<_, i64>(1)? as u64,
                last_token: row.get::<_, i64>(2)? as u64,
                client: row.get(3)?,
                gen: row.get(4)?,
                op: row.get::<_, i64>(5)? as u64,
                t: row.get(6)?,
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_only_rising_tokens() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.db");
        Store::create(&path, 2).unwrap();
        let mut store = Store::open(&path).unwrap();
        assert!(store.write(0, 10, 1, 0, 1).unwrap().0);
        assert!(
            !store.write(0, 10, 1, 0, 2).unwrap().0,
            "equal token refused"
        );
        assert!(
            !store.write(0, 9, 2, 0, 1).unwrap().0,
            "lower token refused"
        );
        assert!(store.write(1, 5, 2, 0, 2).unwrap().0, "per resource");
        assert!(store.write(0, 11, 2, 0, 3).unwrap().0);
        let accepted = store.accepted().unwrap();
        assert_eq!(
            accepted.iter().map(|a| a.token).collect::<Vec<_>>(),
            [10, 5, 11]
        );
        assert!(accepted.windows(2).all(|w| w[0].t <= w[1].t));
        let refused = store.refused().unwrap();
        assert_eq!(refused.len(), 2);
        assert_eq!(refused[1].last_token, 10);
    }

    #[test]
    fn quorum_writes_refused_when_older_on_a_shared_server() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.db");
        Store::create(&path, 1).unwrap();
        Store::create_quorum(&path, 1).unwrap();
        let mut store = Store::open(&path).unwrap();
        let earlier = [Some(7), Some(900), Some(3), None, None];
        let later = [Some(8), None, None, Some(40), Some(5)];
        assert!(store.write_quorum(0, &later, 1, 0, 1).unwrap().0);
        // Lower on server 0, which both name: refused, however high on server 1.
        assert!(!store.write_quorum(0, &earlier, 2, 0, 1).unwrap().0);
        // Names no server the stored token names with a higher value: accepted.
        assert!(
            store
                .write_quorum(0, &[None, Some(1), Some(1), None, Some(6)], 2, 0, 2)
                .unwrap()
                .0
        );
        // The stored token is the merge: server 4 is now 6.
        assert!(
            !store
                .write_quorum(0, &[None, None, None, None, Some(5)], 3, 0, 1)
                .unwrap()
                .0
        );
        let accepted = store.quorum_accepted().unwrap();
        assert_eq!(accepted.len(), 2);
        assert_eq!(accepted[0].tokens, later.to_vec());
        assert_eq!(store.quorum_refused().unwrap(), 2);
    }
}
