//! The fenced store: an SQLite file shared by every client process.
//!
//! A write for resource `r` with token `T` is accepted only if `T` is higher than the last
//! accepted token for `r`, checked and applied in one transaction (the guide's fenced UPDATE).
//! Accepted and refused writes are logged in the same transaction, in serialization order, with
//! the time read under the store's write lock.

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
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
}
