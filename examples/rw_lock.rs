//! The read/write lock: a price list that pods read all the time and a pricing job republishes
//! now and then. Readers on two pods hold the read lock together; the pricing job asks for the
//! write lock and waits for them; a reader that comes after it waits for it in turn (a waiting
//! writer stops later readers), and gets the new version. A reader's late cache fill, derived
//! from the old version, is refused by its fencing token. Then a downgrade (publish, keep
//! reading, let other readers in) and an upgrade, refused at once.
//!
//! Run: `cargo run --example rw_lock` (uses $REDIS_URL, or starts its own redis-server).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use fred::interfaces::SortedSetsInterface;
use leasehold::{FencingToken, LockClient, LockError, RwLock};
use tokio::sync::Barrier;
use tokio::task::JoinHandle;
use tokio::time::Instant;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// The lock's name: `leasehold:{prices:eu}`.
const NAME: &str = "prices:eu";

/// The store the price list lives in. It keeps the highest write token it applied, so it can
/// refuse a stale writer, and anything derived from a read older than that write.
#[derive(Default)]
struct Store {
    version: u32,
    /// The highest write token applied.
    applied: Option<FencingToken>,
    /// A summary derived from the price list: (version it was derived from, read token).
    cache: Option<(u32, FencingToken)>,
}

impl Store {
    /// A new version, fenced: refused unless `token` is above every write token applied.
    fn publish(&mut self, version: u32, token: FencingToken) -> bool {
        if self.applied.is_some_and(|applied| applied >= token) {
            return false;
        }
        self.version = version;
        self.applied = Some(token);
        true
    }

    /// A cache entry derived from version `version`, read under `read_token`: refused when a
    /// write with a larger token has been applied since (what was read may be stale).
    fn fill_cache(&mut self, version: u32, read_token: FencingToken) -> bool {
        if self.applied.is_some_and(|applied| applied > read_token) {
            return false;
        }
        self.cache = Some((version, read_token));
        true
    }
}

/// What happened when, for the printout and the assertions.
#[derive(Clone)]
struct Log {
    started: Instant,
    events: Arc<Mutex<Vec<(String, Instant)>>>,
}

impl Log {
    fn new() -> Log {
        Log {
            started: Instant::now(),
            events: Arc::default(),
        }
    }

    /// Prints `what` for `who` and records `event` at this moment.
    fn say(&self, who: &str, event: &str, what: &str) {
        let now = Instant::now();
        println!(
            "  {:>4} ms  {who:<16} {what}",
            now.duration_since(self.started).as_millis()
        );
        self.events.lock().unwrap().push((event.to_string(), now));
    }

    fn at(&self, event: &str) -> Instant {
        self.events
            .lock()
            .unwrap()
            .iter()
            .find(|(e, _)| e == event)
            .unwrap_or_else(|| panic!("no event {event:?}"))
            .1
    }
}

/// A reader: takes the read lock, reads the version, holds it for `hold` (after meeting the
/// others at `inside`, if given), releases. Returns its read token and the version it read.
fn reader(
    rw: RwLock,
    who: &'static str,
    hold: Duration,
    inside: Option<Arc<Barrier>>,
    store: Arc<Mutex<Store>>,
    log: Log,
) -> JoinHandle<leasehold::Result<(FencingToken, u32)>> {
    tokio::spawn(async move {
        log.say(who, &format!("{who} asks"), "asks for the read lock");
        let guard = rw.read().lock().await?;
        let token = guard.fencing_token();
        let version = store.lock().unwrap().version;
        log.say(
            who,
            &format!("{who} in"),
            &format!("read lock, token {token}: reads version {version}"),
        );
        if let Some(inside) = inside {
            // Every reader of the group is inside before any leaves: they hold it together.
            tokio::time::timeout(Duration::from_secs(5), inside.wait())
                .await
                .expect("the readers share the lock");
        }
        tokio::time::sleep(hold).await;
        log.say(who, &format!("{who} out"), "releases the read lock");
        guard.unlock().await?;
        Ok((token, version))
    })
}

/// The pricing job: takes the write lock, publishes `version` (fenced), holds it for `hold`.
fn writer(
    rw: RwLock,
    who: &'static str,
    version: u32,
    hold: Duration,
    store: Arc<Mutex<Store>>,
    log: Log,
) -> JoinHandle<leasehold::Result<FencingToken>> {
    tokio::spawn(async move {
        log.say(who, "writer asks", "asks for the write lock");
        let guard = rw.write().lock().await?;
        let token = guard.fencing_token();
        log.say(
            who,
            "writer in",
            &format!("write lock, token {token}: publishes version {version}"),
        );
        assert!(store.lock().unwrap().publish(version, token));
        tokio::time::sleep(hold).await;
        log.say(who, "writer out", "releases the write lock");
        guard.unlock().await?;
        Ok(token)
    })
}

/// Waits until `n` owners wait in the lock's line in Redis (`P:{N}:waiters`).
async fn until_queued(client: &LockClient, rw: &RwLock, n: usize) -> Result<()> {
    let waiters = rw.read().keys().waiters();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let queued: usize = client.redis().zcard(waiters.as_str()).await?;
        if queued == n {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("expected {n} in line, found {queued}").into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    // `$REDIS_URL` if set, otherwise a throwaway redis-server (stopped when `redis` drops).
    let redis = leasehold_testkit::redis_for_tests()?;
    // One client per pod.
    let pod_a = LockClient::connect(&redis.url()).await?;
    let pod_b = LockClient::connect(&redis.url()).await?;
    let (rw_a, rw_b) = (pod_a.rw_lock(NAME)?, pod_b.rw_lock(NAME)?);
    let store = Arc::new(Mutex::new(Store::default()));
    store.lock().unwrap().version = 1;

    println!(
        "read/write lock {} (pods a and b)",
        rw_a.read().keys().hash()
    );
    let log = Log::new();
    // Two readers, one per pod, inside together.
    let inside = Arc::new(Barrier::new(3));
    let hold = Duration::from_millis(300);
    let reader_1 = reader(
        rw_a.clone(),
        "reader-1 (pod a)",
        hold,
        Some(inside.clone()),
        store.clone(),
        log.clone(),
    );
    let reader_2 = reader(
        rw_b.clone(),
        "reader-2 (pod b)",
        hold,
        Some(inside.clone()),
        store.clone(),
        log.clone(),
    );
    tokio::time::timeout(Duration::from_secs(5), inside.wait()).await?;
    // The pricing job on pod b: the readers hold the lock, so it waits in line.
    let job = writer(
        rw_b.clone(),
        "pricing (pod b)",
        2,
        Duration::from_millis(150),
        store.clone(),
        log.clone(),
    );
    until_queued(&pod_a, &rw_a, 1).await?;
    // A reader arriving now does not pass the waiting writer: a try is refused at once...
    let late_try = rw_a.read().try_lock().await?;
    let refused = late_try.is_none();
    log.say(
        "main (pod a)",
        "late try",
        &format!("read try_lock -> {:?}", late_try.map(|g| g.fencing_token())),
    );
    assert!(refused, "a reader passed a waiting writer");
    // ... and a waiting reader lines up behind the writer.
    let reader_3 = reader(
        rw_a.clone(),
        "reader-3 (pod a)",
        Duration::from_millis(50),
        None,
        store.clone(),
        log.clone(),
    );
    until_queued(&pod_a, &rw_a, 2).await?;
    let (token_1, version_1) = reader_1.await??;
    let (token_2, _) = reader_2.await??;
    let write_token = job.await??;
    let (token_3, version_3) = reader_3.await??;

    // The writer entered only after both readers released; reader-3 only after the writer.
    let last_reader_out = log
        .at("reader-1 (pod a) out")
        .max(log.at("reader-2 (pod b) out"));
    assert!(log.at("writer in") > last_reader_out);
    assert!(log.at("reader-3 (pod a) in") > log.at("writer out"));
    assert_eq!((version_1, version_3), (1, 2));
    // Tokens rise over every grant, read and write.
    assert!(write_token > token_1.max(token_2) && token_3 > write_token);

    // Reader-1 derived a summary from version 1 and writes it to the cache only now, after the
    // new version went out: its read token is below the write token the store applied.
    let stale = store.lock().unwrap().fill_cache(version_1, token_1);
    println!(
        "cache fill from reader-1 (version {version_1}, read token {token_1}): {} \
         (the store applied write token {write_token})",
        if stale { "accepted" } else { "refused" }
    );
    assert!(!stale, "a summary of the old version is refused");
    let fresh = store.lock().unwrap().fill_cache(version_3, token_3);
    println!(
        "cache fill from reader-3 (version {version_3}, read token {token_3}): {}",
        if fresh { "accepted" } else { "refused" }
    );
    assert!(fresh);

    // Downgrade: publish under the write lock, take the read lock under it, release the write
    // lock and keep reading; readers waiting for the writer come in meanwhile.
    println!("downgrade on pod a");
    let log = Log::new();
    let write = rw_a.write().lock().await?;
    assert!(store.lock().unwrap().publish(3, write.fencing_token()));
    log.say(
        "main (pod a)",
        "write",
        &format!(
            "write lock, token {}: publishes version 3",
            write.fencing_token()
        ),
    );
    let read = rw_a
        .read()
        .try_lock()
        .await?
        .expect("the writer may always read");
    log.say(
        "main (pod a)",
        "read",
        &format!("read lock under it at once, token {}", read.fencing_token()),
    );
    assert!(read.fencing_token() > write.fencing_token());
    let reader_4 = reader(
        rw_b.clone(),
        "reader-4 (pod b)",
        Duration::ZERO,
        None,
        store.clone(),
        log.clone(),
    );
    until_queued(&pod_a, &rw_a, 1).await?;
    write.unlock().await?;
    log.say("main (pod a)", "write out", "releases the write lock");
    // Reader-4 is let in and done while pod a still reads.
    let (_, version_4) = tokio::time::timeout(Duration::from_secs(5), reader_4).await???;
    assert_eq!(version_4, 3);
    assert!(read.is_held());
    log.say(
        "main (pod a)",
        "still reading",
        &format!(
            "still holds its read lock (is_held: {}), reads version {}",
            read.is_held(),
            store.lock().unwrap().version
        ),
    );
    read.unlock().await?;

    // Upgrade: refused at once. Two readers waiting for the write lock would each wait for
    // the other's read lock forever.
    println!("upgrade on pod a");
    let read = rw_a.read().lock().await?;
    let started = Instant::now();
    match rw_a.write().lock().await {
        Err(error @ LockError::UpgradeRefused { .. }) => {
            println!(
                "  write lock while holding the read lock -> Err(UpgradeRefused) after {} ms:\n    {error}",
                started.elapsed().as_millis()
            );
        }
        other => panic!("expected UpgradeRefused, got {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(1));
    assert!(read.is_held(), "nothing changed");
    read.unlock().await?;
    let write = rw_a
        .write()
        .try_lock()
        .await?
        .expect("free once the read lock is released");
    println!(
        "  after releasing the read lock: write lock, token {}",
        write.fencing_token()
    );
    write.unlock().await?;

    assert!(!rw_a.read().is_locked().await?);
    let left: usize = pod_a.redis().zcard(rw_a.read().keys().waiters()).await?;
    assert_eq!(left, 0, "no entry left behind");
    Ok(())
}
