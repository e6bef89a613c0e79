//! Security: TLS with a private CA, a least-privilege ACL user, passwords kept out of Debug,
//! Display and log output, and owner ids that cannot be guessed.

mod common;

use std::sync::{Mutex, Once};
use std::time::Duration;

use common::{cmd, exists, hget, set_user, ACL_RULE};
use leasehold::schedule::{run_once, RunOnce, RunOnceOptions};
use leasehold::{LockClient, LockError, Owner};
use leasehold_core::commands::{self, ReleaseKind};
use leasehold_core::ClientId;
use leasehold_testkit::{RedisServer, RespValue};

// ---------------------------------------------------------------------------------------------
// TLS
// ---------------------------------------------------------------------------------------------

/// Needs the `tls` feature (on by default).
#[cfg(feature = "tls")]
mod tls {
    use std::net::{Ipv4Addr, TcpListener};
    use std::path::Path;
    use std::sync::Arc;
    use std::time::Duration;

    use crate::common::{self, cmd};
    use fred::prelude::{Config, TlsConfig, TlsConnector};
    use fred::rustls::{ClientConfig, RootCertStore};
    use fred::types::config::TlsHostMapping;
    use leasehold::{LockClient, LockError};
    use leasehold_testkit::RedisServer;
    use rcgen::{
        BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair,
        KeyUsagePurpose,
    };

    /// A CA made for one test.
    struct Ca {
        issuer: CertifiedIssuer<'static, KeyPair>,
    }

    impl Ca {
        fn new(name: &str) -> Ca {
            let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
            params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            params.distinguished_name.push(DnType::CommonName, name);
            params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
            let issuer =
                CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
            Ca { issuer }
        }

        /// A server certificate for 127.0.0.1 and localhost: (certificate PEM, key PEM).
        fn server_cert(&self) -> (String, String) {
            let mut params =
                CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
                    .unwrap();
            params
                .distinguished_name
                .push(DnType::CommonName, "leasehold test redis");
            let key = KeyPair::generate().unwrap();
            let cert = params.signed_by(&key, &self.issuer).unwrap();
            (cert.pem(), key.serialize_pem())
        }

        /// A rustls client trusting only this CA.
        fn client_config(&self) -> ClientConfig {
            let mut roots = RootCertStore::empty();
            roots.add(self.issuer.der().clone()).unwrap();
            ClientConfig::builder_with_provider(Arc::new(
                fred::rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth()
        }
    }

    fn free_port() -> u16 {
        TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }

    /// A redis-server with a TLS port (server certificate from `ca`) next to the plain port the
    /// testkit uses for its own commands. Returns the server and its TLS port.
    fn tls_server(ca: &Ca, dir: &Path) -> (RedisServer, u16) {
        let (cert, key) = ca.server_cert();
        std::fs::write(dir.join("redis.crt"), cert).unwrap();
        std::fs::write(dir.join("redis.key"), key).unwrap();
        std::fs::write(dir.join("ca.crt"), ca.issuer.pem()).unwrap();
        let mut last = None;
        // The TLS port is picked free, then bound by redis-server: retry if someone took it.
        for _ in 0..5 {
            let port = free_port();
            let started = RedisServer::builder()
                .arg("--tls-port")
                .arg(port.to_string())
                .arg("--tls-cert-file")
                .arg(dir.join("redis.crt"))
                .arg("--tls-key-file")
                .arg(dir.join("redis.key"))
                .arg("--tls-ca-cert-file")
                .arg(dir.join("ca.crt"))
                .arg("--tls-auth-clients")
                .arg("no")
                .start();
            match started {
                Ok(server) => return (server, port),
                Err(error) => last = Some(error),
            }
        }
        panic!("cannot start a TLS redis-server: {last:?}");
    }

    /// `rediss://` config whose TLS trusts `ca` only. (fred fills in a connector with the system
    /// roots for `rediss://`; on a machine without a CA bundle that fails, so the plain URL with
    /// TLS set by hand, which is the same connection, is the fallback.)
    fn tls_config(port: u16, ca: &Ca) -> Config {
        let mut config = Config::from_url(&format!("rediss://127.0.0.1:{port}"))
            .or_else(|_| Config::from_url(&format!("redis://127.0.0.1:{port}")))
            .unwrap();
        config.tls = Some(TlsConfig {
            connector: TlsConnector::from(ca.client_config()),
            hostnames: TlsHostMapping::None,
        });
        config
    }

    /// A client over TLS, trusting the test's CA: locks, waits (the subscriber connection is TLS
    /// too) and renews.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn tls_with_a_private_ca_works_for_every_connection() {
        let dir = tempfile::tempdir().unwrap();
        let ca = Ca::new("leasehold test CA");
        let (redis, port) = tls_server(&ca, dir.path());
        let build = || {
            LockClient::builder_from_config(tls_config(port, &ca))
                .lease(Duration::from_secs(3))
                .build()
        };
        let holder = build().await.expect("TLS connect with the private CA");
        let waiter = build().await.unwrap();
        let guard_lock = holder.lock("tls").unwrap();
        let guard = guard_lock.lock().await.unwrap();
        let lock = waiter.lock("tls").unwrap();
        let waiting = tokio::spawn(async move {
            lock.try_lock_for(Duration::from_secs(10))
                .await
                .map(|g| g.map(|g| g.detach()))
        });
        assert!(common::eventually(Duration::from_secs(10), || waiter.waiters() == 1).await);
        // Renewed over TLS (every lease/3 = 1 s).
        assert!(
            common::eventually(Duration::from_secs(15), || holder.watchdog_stats().renewed
                >= 1)
            .await
        );
        assert!(guard.is_held());
        guard.unlock().await.unwrap();
        let handed = waiting
            .await
            .unwrap()
            .unwrap()
            .expect("woken over TLS pub/sub");
        handed.unlock().await.unwrap();
        // The clients' connections are on the TLS port (the testkit's own plain connection aside).
        let clients = cmd(&redis, &["CLIENT", "LIST"]).as_str().unwrap();
        assert!(
            clients
                .lines()
                .filter(|l| l.contains("laddr=127.0.0.1:"))
                .count()
                >= 3,
            "{clients}"
        );
        assert!(
            clients
                .lines()
                .filter(|l| l.contains(&format!("laddr=127.0.0.1:{port}")))
                .count()
                >= 3,
            "{clients}"
        );
    }

    /// A server certificate from another CA is refused at connect, with an error that says so.
    #[tokio::test]
    async fn tls_with_the_wrong_ca_is_refused_clearly() {
        let dir = tempfile::tempdir().unwrap();
        let ca = Ca::new("the server's CA");
        let (_redis, port) = tls_server(&ca, dir.path());
        let stranger = Ca::new("some other CA");
        let error = LockClient::builder_from_config(tls_config(port, &stranger))
            .command_timeout(Duration::from_secs(2))
            .build()
            .await
            .expect_err("a certificate from an unknown CA must be refused");
        let text = error.to_string();
        assert!(matches!(error, LockError::Connection(_)), "{error:?}");
        assert!(
            text.contains("InvalidCertificate(UnknownIssuer)"),
            "not a clear TLS error: {text}"
        );
        // A plain rediss:// URL trusts the system roots only, which do not know the test CA
        // (or, without a CA bundle on the machine, the URL is refused before connecting).
        let error = LockClient::connect(&format!("rediss://127.0.0.1:{port}"))
            .await
            .expect_err("system roots do not trust the test CA");
        assert!(
            error.to_string().contains("InvalidCertificate")
                || matches!(error, LockError::InvalidArgument(_)),
            "{error}"
        );
    }
}

/// Without the `tls` feature a `rediss://` URL is refused: fred would only warn and connect in
/// the clear, credentials included.
#[cfg(not(feature = "tls"))]
#[tokio::test]
async fn without_the_tls_feature_rediss_is_refused() {
    for url in ["rediss://127.0.0.1:1", "valkeys://127.0.0.1:1"] {
        match LockClient::connect(url).await {
            Err(LockError::InvalidArgument(message)) => {
                assert!(message.contains("tls"), "{message}")
            }
            other => panic!("{url}: {other:?}"),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// ACL
// ---------------------------------------------------------------------------------------------

/// `ACL LOG` entries as `reason=... object=...` lines.
fn acl_log(redis: &RedisServer) -> Vec<String> {
    let reply = cmd(redis, &["ACL", "LOG"]);
    let entries = reply.as_array().unwrap_or_default();
    entries
        .iter()
        .map(|entry| {
            let fields = entry.as_array().unwrap_or_default();
            fields
                .chunks(2)
                .filter_map(|kv| {
                    let key = kv[0].as_str()?;
                    matches!(key.as_str(), "reason" | "context" | "object" | "username")
                        .then(|| format!("{key}={}", kv[1].as_str().unwrap_or_default()))
                })
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect()
}

async fn connect_as(
    redis: &RedisServer,
    user: &str,
    password: &str,
) -> leasehold::Result<LockClient> {
    LockClient::builder(&format!(
        "redis://{user}:{password}@127.0.0.1:{}",
        redis.port()
    ))
    .lease(Duration::from_secs(3))
    .build()
    .await
}

/// The plain lock's paths under the rule (see the test below).
async fn plain_lock_paths(a: &LockClient, b: &LockClient) {
    // lock(), re-entry, watchdog renewal.
    let lock = a.lock("acl").unwrap();
    let guard = lock.lock().await.unwrap();
    let again = lock.lock().await.unwrap();
    assert_eq!(again.hold_count(), 2);
    assert!(lock.is_locked().await.unwrap());
    assert_eq!(lock.hold_count().await.unwrap(), 2);
    assert!(common::eventually(Duration::from_secs(15), || a.watchdog_stats().renewed >= 1).await);
    // A waiter on another client subscribes and queues; one gives up (leaves the queue).
    assert!(b
        .lock("acl")
        .unwrap()
        .try_lock_for(Duration::from_millis(200))
        .await
        .unwrap()
        .is_none());
    let other = b.lock("acl").unwrap();
    let waiting = tokio::spawn(async move { other.lock().await.map(|g| g.detach()) });
    assert!(common::eventually(Duration::from_secs(10), || b.waiters() == 1).await);
    again.unlock().await.unwrap();
    drop(guard); // background release; the turn goes to b
    let handed = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiter got its turn")
        .unwrap()
        .unwrap();
    handed.unlock().await.unwrap();

    // Explicit leases: try_lock_with_lease, lock_with_lease, try_lock_for_with_lease.
    let fixed = a.lock("acl-fixed").unwrap();
    let g = fixed
        .try_lock_with_lease(Duration::from_secs(5))
        .await
        .unwrap()
        .unwrap();
    g.unlock().await.unwrap();
    fixed
        .lock_with_lease(Duration::from_secs(5))
        .await
        .unwrap()
        .unlock()
        .await
        .unwrap();
    fixed
        .try_lock_for_with_lease(Duration::from_secs(1), Duration::from_secs(5))
        .await
        .unwrap()
        .unwrap()
        .unlock()
        .await
        .unwrap();
    // run_once with hold_at_least (release_after), then force_unlock.
    let job = a.lock("acl-job").unwrap();
    let options = RunOnceOptions::at_most(Duration::from_secs(5)).at_least(Duration::from_secs(2));
    assert_eq!(
        run_once(&job, options, async { 1 }).await.unwrap(),
        RunOnce::Ran(1)
    );
    assert!(job.is_locked().await.unwrap());
    assert!(job.force_unlock().await.unwrap());
    // Lock::unlock without a guard, and an unanswered acquire's rollback (dropped mid-flight).
    let owner = a.new_owner();
    let by_owner_lock = a.lock("acl-owner").unwrap();
    let by_owner = by_owner_lock.with_owner(owner.clone());
    std::mem::forget(
        by_owner
            .try_lock_with_lease(Duration::from_secs(5))
            .await
            .unwrap(),
    );
    by_owner.unlock().await.unwrap();
    assert_ne!(
        common::release_as(
            a.redis(),
            by_owner.keys(),
            &owner,
            ReleaseKind::Now,
            Some(1)
        )
        .await
        .unwrap(),
        commands::Release::Released
    );
}

/// The fair and read/write locks' paths under the rule (see the test below).
async fn fair_and_read_write_paths(a: &LockClient, b: &LockClient) {
    // The fair lock: a waiter queued on its own channel, one that gives up, the hand-on, the
    // watchdog's entry renewals, force_unlock with a waiter queued.
    let fair = a.fair_lock("acl-fair").unwrap();
    let held = fair.lock().await.unwrap();
    assert!(b
        .fair_lock("acl-fair")
        .unwrap()
        .try_lock_for(Duration::from_millis(200))
        .await
        .unwrap()
        .is_none());
    let other = b.fair_lock("acl-fair").unwrap();
    let waiting = tokio::spawn(async move { other.lock().await.map(|g| g.detach()) });
    assert!(common::eventually(Duration::from_secs(10), || b.waiters() == 1).await);
    held.unlock().await.unwrap();
    let handed = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the fair waiter got its turn")
        .unwrap()
        .unwrap();
    let queued = {
        let lock = a.fair_lock("acl-fair").unwrap();
        tokio::spawn(async move { lock.lock().await.map(|g| g.detach()) })
    };
    assert!(common::eventually(Duration::from_secs(10), || a.waiters() == 1).await);
    assert!(fair.force_unlock().await.unwrap());
    let next = tokio::time::timeout(Duration::from_secs(10), queued)
        .await
        .expect("force_unlock handed the fair lock on")
        .unwrap()
        .unwrap();
    next.unlock().await.unwrap();
    drop(handed);

    // The read/write lock: readers, a waiting writer, downgrade, release, renewal.
    let rw = a.rw_lock("acl-rw").unwrap();
    let r = rw.read().lock().await.unwrap();
    let writer = b.rw_lock("acl-rw").unwrap();
    let writing = tokio::spawn(async move { writer.write().lock().await.map(|g| g.detach()) });
    assert!(common::eventually(Duration::from_secs(10), || b.waiters() == 1).await);
    r.unlock().await.unwrap();
    let w = tokio::time::timeout(Duration::from_secs(10), writing)
        .await
        .expect("the writer got its turn")
        .unwrap()
        .unwrap();
    w.unlock().await.unwrap();
    let w = rw.write().lock().await.unwrap();
    let down = rw.read().lock().await.unwrap();
    w.unlock().await.unwrap();
    down.unlock().await.unwrap();
}

/// The semaphore's and the latch's paths under the rule (see the test below).
async fn semaphore_and_latch_paths(a: &LockClient, b: &LockClient) {
    // The semaphore (set, acquire, wait in line, release by id, delete) and the latch.
    let semaphore = a.semaphore("acl-sem").unwrap();
    assert!(semaphore.try_set_permits(1).await.unwrap());
    let permit = semaphore.acquire(1).await.unwrap();
    let other = b.semaphore("acl-sem").unwrap();
    let waiting = tokio::spawn(async move { other.acquire(1).await.map(|p| p.id().to_string()) });
    assert!(common::eventually(Duration::from_secs(10), || b.waiters() == 1).await);
    assert_eq!(semaphore.available_permits().await.unwrap(), 0);
    permit.release().await.unwrap();
    let id = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the permit was handed on")
        .unwrap()
        .unwrap();
    // (The waiter's permit was dropped with its task: released in the background.)
    let _ = semaphore.release_permit(&id).await;
    assert!(semaphore.delete().await.unwrap());
    let latch = a.latch("acl-latch").unwrap();
    assert!(latch.try_set_count(1).await.unwrap());
    let waiting = {
        let latch = b.latch("acl-latch").unwrap();
        tokio::spawn(async move { latch.wait().await })
    };
    assert!(common::eventually(Duration::from_secs(10), || b.waiters() == 1).await);
    assert_eq!(latch.count().await.unwrap(), 1);
    assert_eq!(latch.count_down().await.unwrap(), 0);
    waiting.await.unwrap().unwrap();
}

/// Under the rule, every lock kind and every path a client takes (waiting, the turn queue,
/// renewal, re-entry, background release, release after, rollback, giving up a wait) works,
/// and Redis logs no refusal at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_acl_rule_allows_every_lock_kind_and_nothing_is_refused() {
    let redis = common::server();
    set_user(&redis, "leasehold", ACL_RULE);
    cmd(&redis, &["ACL", "LOG", "RESET"]);
    let a = connect_as(&redis, "leasehold", "s3cr3t-Pa55")
        .await
        .unwrap();
    let b = connect_as(&redis, "leasehold", "s3cr3t-Pa55")
        .await
        .unwrap();

    Box::pin(plain_lock_paths(&a, &b)).await;
    // Each kind's section runs boxed: one async fn holding them all overflowed a debug
    // build's test thread (2 MB).
    Box::pin(fair_and_read_write_paths(&a, &b)).await;
    Box::pin(semaphore_and_latch_paths(&a, &b)).await;

    let log = acl_log(&redis);
    assert!(log.is_empty(), "Redis refused something: {log:#?}");
}

fn denied<T>(result: &leasehold::Result<T>, what: &str) {
    match result {
        Err(LockError::PermissionDenied(message)) => {
            assert!(!message.to_string().is_empty(), "{what}");
            println!("{what}: {message}");
        }
        Err(error) => panic!("{what}: expected PermissionDenied, got {error:?}"),
        Ok(_) => panic!("{what}: expected PermissionDenied, got Ok"),
    }
}

/// Users without the rights get `PermissionDenied`, whatever was refused: a key, a command
/// at the top level or inside a script, a channel, or the password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_rights_are_permission_denied() {
    let redis = common::server();
    let full = ACL_RULE.replace(">s3cr3t-Pa55", ">pw");
    set_user(
        &redis,
        "otherkeys",
        &full.replace("~leasehold:*", "~other:*"),
    );
    set_user(&redis, "nozadd", &full.replace("+zadd", ""));
    set_user(
        &redis,
        "nopublish",
        &full.replace("&leasehold:*", "&other:*"),
    );
    set_user(&redis, "noevalsha", &full.replace("+evalsha", ""));
    set_user(&redis, "noload", &full.replace("+script|load", ""));

    let wrong = connect_as(&redis, "otherkeys", "not-the-password").await;
    denied(&wrong, "wrong password");
    let db_url = format!("redis://otherkeys:pw@127.0.0.1:{}/1", redis.port());
    denied(
        &LockClient::connect(&db_url).await,
        "SELECT without +select",
    );

    let noload = connect_as(&redis, "noload", "pw").await;
    denied(&noload, "no SCRIPT LOAD (scripts are loaded at connect)");

    let client = connect_as(&redis, "otherkeys", "pw").await.unwrap();
    denied(
        &client.lock("k").unwrap().try_lock().await,
        "no access to the lock's keys",
    );
    let client = connect_as(&redis, "noevalsha", "pw").await.unwrap();
    denied(&client.lock("k").unwrap().try_lock().await, "no EVALSHA");

    // A command refused inside a script: ZADD, used only when a waiter queues.
    let holder = connect_as(&redis, "nozadd", "pw").await.unwrap();
    let guard_lock = holder.lock("q").unwrap();
    let guard = guard_lock.try_lock().await.unwrap().unwrap();
    let waiter = connect_as(&redis, "nozadd", "pw").await.unwrap();
    denied(
        &waiter
            .lock("q")
            .unwrap()
            .try_lock_for(Duration::from_secs(2))
            .await,
        "no ZADD inside the acquire script",
    );
    guard.unlock().await.unwrap();

    // A channel refused, with waking by messages only (`Waking::PubSub`; the default wakes
    // by timer there, see tests/timer_waking.rs): the waiter cannot subscribe, and the release
    // cannot publish.
    let strict = || async {
        LockClient::builder(&format!("redis://nopublish:pw@127.0.0.1:{}", redis.port()))
            .lease(Duration::from_secs(3))
            .waking(leasehold::Waking::PubSub)
            .build()
            .await
            .unwrap()
    };
    let holder = strict().await;
    let waiter = strict().await;
    let guard_lock = holder.lock("c").unwrap();
    let guard = guard_lock.try_lock().await.unwrap().unwrap();
    // A refused SUBSCRIBE: fred's `subscribe()` returns as soon as it is written, so the PING
    // that confirms every subscription carries Redis's NOPERM reply back.
    let waited_lock = waiter.lock("c").unwrap();
    denied(
        &waited_lock.try_lock_for(Duration::from_secs(2)).await,
        "no SUBSCRIBE on the release channel",
    );
    assert!(
        acl_log(&redis).iter().any(|e| e.contains("channel")),
        "{:?}",
        acl_log(&redis)
    );
    denied(&guard.unlock().await, "no PUBLISH on the release channel");
    assert!(
        exists(&redis, "leasehold:{c}"),
        "a release refused at its publish released nothing"
    );

    // Last (the testkit's own commands use the default user): without a password fred pings.
    set_user(
        &redis,
        "default",
        &full.replace(">pw", "nopass").replace("+ping", ""),
    );
    denied(
        &LockClient::connect(&redis.url()).await,
        "no password and no +ping",
    );
}

// ---------------------------------------------------------------------------------------------
// Passwords
// ---------------------------------------------------------------------------------------------

/// Everything logged through `tracing` and `log` in this test binary.
static CAPTURED: Mutex<String> = Mutex::new(String::new());

struct Capture;

impl tracing::field::Visit for Capture {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        let mut captured = CAPTURED.lock().unwrap();
        captured.push_str(&format!(" {}={value:?}", field.name()));
    }
}

struct CaptureSubscriber;

impl tracing::Subscriber for CaptureSubscriber {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, span: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        span.record(&mut Capture);
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, values: &tracing::span::Record<'_>) {
        values.record(&mut Capture);
    }
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        event.record(&mut Capture);
        CAPTURED.lock().unwrap().push('\n');
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

struct CaptureLogger;

impl log::Log for CaptureLogger {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }
    fn log(&self, record: &log::Record<'_>) {
        let mut captured = CAPTURED.lock().unwrap();
        captured.push_str(&format!("{} {}\n", record.target(), record.args()));
    }
    fn flush(&self) {}
}

fn capture_logs() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        tracing::subscriber::set_global_default(CaptureSubscriber).unwrap();
        log::set_logger(&CaptureLogger).unwrap();
        log::set_max_level(log::LevelFilter::Debug);
    });
}

/// A client built from a URL with a password never shows it: not in Debug output of the
/// client, not in any error's Display or Debug, not in what leasehold (tracing) or fred (log)
/// logs while connecting, failing, locking, renewing and losing a lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passwords_never_show_in_debug_errors_or_logs() {
    capture_logs();
    let redis = common::server();
    const GOOD: &str = "Gd-pw-7f3a9c";
    const BAD: &str = "Bd-pw-51e0d2";
    set_user(
        &redis,
        "app",
        &ACL_RULE.replace(">s3cr3t-Pa55", &format!(">{GOOD}")),
    );
    let url = |pw: &str| format!("redis://app:{pw}@127.0.0.1:{}", redis.port());

    let client = LockClient::builder(&url(GOOD))
        .lease(Duration::from_millis(300))
        .command_timeout(Duration::from_millis(500))
        .build()
        .await
        .unwrap();
    let mut shown = vec![format!("{client:?}"), format!("{:?}", client.redis())];
    let guard_lock = client.lock("pw").unwrap();
    let guard = guard_lock.lock().await.unwrap();
    shown.push(format!("{guard:?}"));
    tokio::time::sleep(Duration::from_millis(400)).await; // a renewal or two
    redis.pause().unwrap(); // renewals fail, the lease is lost (warnings logged)
    tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .unwrap();
    redis.resume().unwrap();
    drop(guard);

    let failures = [
        LockClient::connect(&url(BAD)).await.map(|_| ()),
        LockClient::connect(&format!("redis://app:{BAD}@127.0.0.1:1"))
            .await
            .map(|_| ()),
        LockClient::connect(&format!("redis://app:{BAD}@127.0.0.1:notaport"))
            .await
            .map(|_| ()),
        LockClient::builder(&url(BAD))
            .lease(Duration::ZERO)
            .build()
            .await
            .map(|_| ()),
    ];
    for failure in &failures {
        let error = failure.as_ref().expect_err("each of these fails");
        shown.push(format!("{error}"));
        shown.push(format!("{error:?}"));
    }
    let logged_lock = CAPTURED.lock().unwrap();
    let logged = logged_lock.clone();
    assert!(!logged.is_empty(), "the capture works");
    for text in shown.iter().chain([&logged]) {
        for secret in [GOOD, BAD] {
            assert!(!text.contains(secret), "password shown in: {text}");
        }
    }
}

/// The builder's Debug output must not show the password either: `LockClientBuilder` derives
/// `Debug` over fred's `Config`, whose derived `Debug` prints `password: Some("...")`.
#[test]
fn the_builder_debug_output_hides_the_password() {
    let builder = LockClient::builder("redis://app:Bldr-pw-0c1d@127.0.0.1:6390");
    let shown = format!("{builder:?}");
    assert!(!shown.contains("Bldr-pw-0c1d"), "{shown}");
}

// ---------------------------------------------------------------------------------------------
// Owner ids
// ---------------------------------------------------------------------------------------------

/// Client ids are random v4 uuids (122 random bits from the OS's cryptographic RNG via
/// `getrandom`): all distinct, version and variant bits in place.
#[test]
fn client_ids_are_random_v4_uuids() {
    let mut seen = std::collections::HashSet::new();
    for _ in 0..10_000 {
        let id = ClientId::random();
        let text = id.as_str().to_string();
        assert_eq!(text.len(), 32, "{text}");
        assert!(text
            .chars()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
        assert_eq!(&text[12..13], "4", "version nibble: {text}");
        assert!("89ab".contains(&text[16..17]), "variant bits: {text}");
        assert!(seen.insert(text), "a client id repeated");
    }
    let id = ClientId::random();
    assert!(id
        .new_owner()
        .id()
        .starts_with(&format!("{}:", id.as_str())));
}

/// Another client guessing the holder's owner id cannot release, renew, roll back or hand off
/// the hold on any path. Only `force_unlock`, the operator's escape hatch, removes it (by design:
/// restrict it to operators with a separate ACL user).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guessed_owner_ids_are_refused_by_every_release_path() {
    let redis = common::server();
    let victim = LockClient::builder(&redis.url())
        .lease(Duration::from_secs(3))
        .build()
        .await
        .unwrap();
    let attacker = common::client(&redis.url()).await;
    let guard_lock = victim.lock("victim").unwrap();
    let guard = guard_lock.lock().await.unwrap();
    let key = "leasehold:{victim}";
    let real = guard.owner().id().to_string();

    // The attacker knows the id format but not the victim's uuid: its own uuid, fresh ones, and
    // every small local id (tasks t0.., explicit o1.., threads), plus the victim's local id.
    let local = real.split(':').nth(1).unwrap().to_string();
    let mut guesses = vec![attacker.new_owner(), attacker.current_owner()];
    for _ in 0..20 {
        let uuid = ClientId::random();
        guesses.push(Owner::from_id(format!("{}:{local}", uuid.as_str())));
        for n in 0..5 {
            guesses.push(Owner::from_id(format!("{}:t{n}", uuid.as_str())));
            guesses.push(Owner::from_id(format!("{}:o{n}", uuid.as_str())));
        }
    }
    guesses.push(Owner::from_id(""));
    guesses.push(Owner::from_id(real.split(':').next().unwrap()));
    guesses.push(Owner::from_id(format!("{real}x")));
    let lock = attacker.lock("victim").unwrap();
    for guess in &guesses {
        assert_ne!(guess.id(), real);
        let as_guess = lock.clone().with_owner(guess.clone());
        assert!(matches!(
            as_guess.unlock().await,
            Err(LockError::NotHeld { .. })
        ));
        assert_eq!(as_guess.hold_count().await.unwrap(), 0);
        let redis_client = attacker.redis();
        assert_eq!(
            common::release_as(redis_client, lock.keys(), guess, ReleaseKind::Now, None)
                .await
                .unwrap(),
            commands::Release::NotHeld
        );
        assert_eq!(
            common::release_as(
                redis_client,
                lock.keys(),
                guess,
                ReleaseKind::After(1),
                None
            )
            .await
            .unwrap(),
            commands::Release::NotHeld
        );
        assert_eq!(
            common::release_as(redis_client, lock.keys(), guess, ReleaseKind::Now, Some(1))
                .await
                .unwrap(),
            commands::Release::NotHeld
        );
        assert_eq!(
            common::renew_as(redis_client, lock.keys(), guess, 1).await,
            [false]
        );
    }
    assert_eq!(hget(&redis, key, &real), Some(1), "the hold is untouched");
    // The owner and the grant's `~fence`, nothing else.
    let fields = cmd(&redis, &["HKEYS", key]);
    assert_eq!(
        fields.as_array().map(<[RespValue]>::len),
        Some(2),
        "no other owner was added: {fields:?}"
    );
    assert!(guard.is_held());

    // The operator's path works, by design, and the holder learns of it at its next renewal.
    assert!(lock.force_unlock().await.unwrap());
    tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("the holder notices the force unlock");
}
