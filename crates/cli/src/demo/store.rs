//! The demo's inventory table, in SQLite (default) or PostgreSQL (`DATABASE_URL`).
//!
//! `inventory(product_id, stock, last_fence)`. Every pod opens its own connection, as pods of
//! a real service would. The writes the demo contrasts:
//!
//! * [`Store::sell`]: `stock = stock - 1`, what an unguarded service does after checking the
//!   stock: two pods that both saw the last unit both sell it.
//! * [`Store::fenced_sell`]: the same, only if no newer lock holder has written:
//!   `... WHERE product_id = ? AND last_fence < :fence`. 0 rows means a newer token already
//!   wrote, and the write is refused.
//!
//! SQLite runs in WAL mode with a busy timeout, so three processes can share the file: readers
//! never block, writers queue instead of failing with SQLITE_BUSY.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use anyhow::{bail, Context};
use leasehold::FencingToken;

/// Where the inventory lives, as passed to pods.
#[derive(Debug, Clone)]
pub enum StoreSpec {
    /// A SQLite database file.
    Sqlite(PathBuf),
    /// A PostgreSQL table; the server is `url` (from DATABASE_URL).
    Postgres {
        /// The connection URL.
        url: String,
        /// The table, unique per demo run.
        table: String,
    },
}

impl StoreSpec {
    /// The pod arguments that name this store (the PostgreSQL URL travels in DATABASE_URL).
    pub fn pod_args(&self) -> Vec<String> {
        match self {
            StoreSpec::Sqlite(path) => vec!["--sqlite".into(), path.display().to_string()],
            StoreSpec::Postgres { table, .. } => vec!["--pg-table".into(), table.clone()],
        }
    }

    /// A short description for the demo's header.
    pub fn describe(&self) -> String {
        match self {
            StoreSpec::Sqlite(_) => {
                "SQLite file in a temp dir (WAL; set DATABASE_URL to use PostgreSQL)".into()
            }
            StoreSpec::Postgres { table, .. } => {
                format!("PostgreSQL from DATABASE_URL, table {table} (dropped at the end)")
            }
        }
    }
}

/// An open connection to the inventory.
pub enum Store {
    /// SQLite; calls block briefly (busy waits included), so they run via `block_in_place`.
    Sqlite(Mutex<rusqlite::Connection>),
    /// PostgreSQL.
    Postgres {
        /// The client.
        client: tokio_postgres::Client,
        /// The table name (checked to be a plain identifier).
        table: String,
    },
}

const SQLITE_TABLE: &str = "inventory";

impl Store {
    /// Opens a connection.
    pub async fn open(spec: &StoreSpec) -> anyhow::Result<Store> {
        match spec {
            StoreSpec::Sqlite(path) => {
                let conn = rusqlite::Connection::open(path)
                    .with_context(|| format!("cannot open SQLite file {}", path.display()))?;
                conn.busy_timeout(Duration::from_secs(10))?;
                Ok(Store::Sqlite(Mutex::new(conn)))
            }
            StoreSpec::Postgres { url, table } => {
                check_identifier(table)?;
                let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
                    .await
                    .context("cannot connect to PostgreSQL at DATABASE_URL")?;
                tokio::spawn(async move {
                    // Ends when the client is dropped; an error then shows up on the next query.
                    let _ = connection.await;
                });
                Ok(Store::Postgres {
                    client,
                    table: table.clone(),
                })
            }
        }
    }

    /// Creates the table (the demo does this once, before any pod opens it).
    pub async fn create(&self) -> anyhow::Result<()> {
        match self {
            Store::Sqlite(conn) => sqlite(conn, |c| {
                // WAL is a property of the file: set once here, every pod's connection uses it.
                let mode: String = c.query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))?;
                if !mode.eq_ignore_ascii_case("wal") {
                    bail!("SQLite refused WAL mode (journal_mode={mode})");
                }
                c.execute_batch(&format!(
                    "CREATE TABLE IF NOT EXISTS {SQLITE_TABLE} (
                         product_id INTEGER PRIMARY KEY,
                         stock      INTEGER NOT NULL,
                         last_fence INTEGER NOT NULL DEFAULT 0)"
                ))?;
                Ok(())
            }),
            Store::Postgres { client, table } => {
                client
                    .batch_execute(&format!(
                        "CREATE TABLE {table} (
                             product_id BIGINT PRIMARY KEY,
                             stock      BIGINT NOT NULL,
                             last_fence BIGINT NOT NULL DEFAULT 0)"
                    ))
                    .await
                    .with_context(|| format!("cannot create table {table}"))?;
                Ok(())
            }
        }
    }

    /// Puts `stock` units of `product` on the shelf, with no fencing token seen yet.
    pub async fn reset(&self, product: i64, stock: i64) -> anyhow::Result<()> {
        match self {
            Store::Sqlite(conn) => sqlite(conn, |c| {
                c.execute(
                    &format!(
                        "INSERT INTO {SQLITE_TABLE} (product_id, stock, last_fence) VALUES (?1, ?2, 0)
                         ON CONFLICT (product_id) DO UPDATE SET stock = excluded.stock, last_fence = 0"
                    ),
                    rusqlite::params![product, stock],
                )?;
                Ok(())
            }),
            Store::Postgres { client, table } => {
                client
                    .execute(
                        &format!(
                            "INSERT INTO {table} (product_id, stock, last_fence) VALUES ($1, $2, 0)
                             ON CONFLICT (product_id) DO UPDATE SET stock = EXCLUDED.stock, last_fence = 0"
                        ),
                        &[&product, &stock],
                    )
                    .await?;
                Ok(())
            }
        }
    }

    /// The stock of `product`.
    pub async fn stock(&self, product: i64) -> anyhow::Result<i64> {
        Ok(self.snapshot(product).await?.0)
    }

    /// `(stock, last_fence)` of `product`.
    pub async fn snapshot(&self, product: i64) -> anyhow::Result<(i64, i64)> {
        match self {
            Store::Sqlite(conn) => sqlite(conn, |c| {
                Ok(c.query_row(
                    &format!("SELECT stock, last_fence FROM {SQLITE_TABLE} WHERE product_id = ?1"),
                    [product],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )?)
            }),
            Store::Postgres { client, table } => {
                let row = client
                    .query_one(
                        &format!("SELECT stock, last_fence FROM {table} WHERE product_id = $1"),
                        &[&product],
                    )
                    .await?;
                Ok((row.try_get(0)?, row.try_get(1)?))
            }
        }
    }

    /// Sells one unit without any check: `stock = stock - 1`. Returns rows updated.
    pub async fn sell(&self, product: i64) -> anyhow::Result<u64> {
        match self {
            Store::Sqlite(conn) => sqlite(conn, |c| {
                let rows = c.execute(
                    &format!("UPDATE {SQLITE_TABLE} SET stock = stock - 1 WHERE product_id = ?1"),
                    [product],
                )?;
                Ok(rows as u64)
            }),
            Store::Postgres { client, table } => Ok(client
                .execute(
                    &format!("UPDATE {table} SET stock = stock - 1 WHERE product_id = $1"),
                    &[&product],
                )
                .await?),
        }
    }

    /// Sells one unit unless a holder with a newer token already wrote. Returns rows updated:
    /// 0 means this write came from a stale holder and was refused.
    pub async fn fenced_sell(&self, product: i64, fence: FencingToken) -> anyhow::Result<u64> {
        let fence = i64::from(fence);
        match self {
            Store::Sqlite(conn) => sqlite(conn, |c| {
                let rows = c.execute(
                    &format!(
                        "UPDATE {SQLITE_TABLE} SET stock = stock - 1, last_fence = ?2
                         WHERE product_id = ?1 AND last_fence < ?2"
                    ),
                    [product, fence],
                )?;
                Ok(rows as u64)
            }),
            Store::Postgres { client, table } => Ok(client
                .execute(
                    &format!(
                        "UPDATE {table} SET stock = stock - 1, last_fence = $2
                         WHERE product_id = $1 AND last_fence < $2"
                    ),
                    &[&product, &fence],
                )
                .await?),
        }
    }

    /// Drops the PostgreSQL table (SQLite's file goes with its temp dir).
    pub async fn drop_table(&self) -> anyhow::Result<()> {
        if let Store::Postgres { client, table } = self {
            client
                .batch_execute(&format!("DROP TABLE IF EXISTS {table}"))
                .await
                .with_context(|| format!("cannot drop table {table}"))?;
        }
        Ok(())
    }
}

/// Runs a SQLite call. It may block (a busy wait for another pod's write), so on a
/// multi-thread runtime it tells tokio to move other tasks off this thread first.
fn sqlite<T>(
    conn: &Mutex<rusqlite::Connection>,
    call: impl FnOnce(&rusqlite::Connection) -> anyhow::Result<T>,
) -> anyhow::Result<T> {
    let run = || {
        let conn = conn
            .lock()
            .map_err(|_| anyhow::anyhow!("SQLite connection poisoned"))?;
        call(&conn)
    };
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(run),
        _ => run(),
    }
}

/// Table names are put into SQL text, so only plain identifiers are accepted.
fn check_identifier(name: &str) -> anyhow::Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if !ok {
        bail!("bad table name {name:?}: use lowercase letters, digits and _");
    }
    Ok(())
}

/// A SQLite database path inside `dir`.
pub fn sqlite_path(dir: &Path) -> PathBuf {
    dir.join("shop.db")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_are_plain_identifiers() {
        assert!(check_identifier("leasehold_demo_0a1b2c3d").is_ok());
        for bad in ["", "Inventory", "x; DROP TABLE y", "1abc", "a-b"] {
            assert!(check_identifier(bad).is_err(), "{bad:?}");
        }
    }

    #[tokio::test]
    async fn fenced_sell_refuses_older_tokens() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&StoreSpec::Sqlite(sqlite_path(dir.path())))
            .await
            .unwrap();
        store.create().await.unwrap();
        store.reset(42, 2).await.unwrap();
        assert_eq!(
            store.fenced_sell(42, FencingToken::new(10)).await.unwrap(),
            1
        );
        assert_eq!(
            store.fenced_sell(42, FencingToken::new(9)).await.unwrap(),
            0
        );
        assert_eq!(
            store.fenced_sell(42, FencingToken::new(10)).await.unwrap(),
            0
        );
        assert_eq!(store.snapshot(42).await.unwrap(), (1, 10));
        assert_eq!(store.sell(42).await.unwrap(), 1);
        assert_eq!(store.stock(42).await.unwrap(), 0);
    }
}
