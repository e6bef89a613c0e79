//! [`with_redis`]: run an async example against a throwaway Redis (doc tests, examples).

use std::fmt::Debug;
use std::future::Future;

use crate::target::redis_for_tests;

/// Runs `example(url)` on a fresh multi-thread tokio runtime against `$REDIS_URL` or a spawned
/// redis-server (stopped afterwards), and panics with the error if it fails. Doc examples use it
/// so that they really run.
///
/// ```
/// leasehold_testkit::with_redis(|url| async move {
///     assert!(url.starts_with("redis://"));
///     Ok::<(), std::io::Error>(())
/// });
/// ```
pub fn with_redis<F, Fut, E>(example: F)
where
    F: FnOnce(String) -> Fut,
    Fut: Future<Output = Result<(), E>>,
    E: Debug,
{
    let redis = redis_for_tests().unwrap_or_else(|e| panic!("no Redis for the example: {e}"));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    if let Err(error) = runtime.block_on(example(redis.url())) {
        panic!("example failed: {error:?}");
    }
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
}
