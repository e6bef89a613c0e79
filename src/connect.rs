//! Connecting a fred client within a timeout, and closing it whatever happens.

use std::time::Duration;

use fred::interfaces::ClientLike;
use leasehold_core::{LockError, RedisError, Result};

/// Connects `client`, bounded by `timeout`, and turns a failure into one clear error: fred
/// fails fast when Redis is down, and says little. The caller owns the client and closes it
/// when this fails (see [`quit_in_background`]).
pub(crate) async fn connect<C: ClientLike>(client: &C, timeout: Duration) -> Result<()> {
    let server = client
        .client_config()
        .server
        .hosts()
        .first()
        .map(|s| s.to_string())
        .unwrap_or_default();
    let failed = |detail: String, tls: bool| {
        // The hint fits a refused or silent server, not a TLS handshake that failed.
        let hint = if tls {
            " (check the CA and the server certificate)"
        } else {
            " (is redis-server running? check the URL or REDIS_URL)"
        };
        LockError::Connection(RedisError::connection(format!(
            "cannot connect to Redis at {server}: {detail}{hint}"
        )))
    };
    match tokio::time::timeout(timeout, client.init()).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(error)) => {
            let tls = is_tls_error(&error);
            match LockError::from_redis(error) {
                LockError::PermissionDenied(error) => Err(LockError::PermissionDenied(error)),
                LockError::Connection(error) | LockError::Redis(error) => {
                    Err(failed(error.to_string(), tls))
                }
                other => Err(failed(other.to_string(), tls)),
            }
        }
        Err(_) => Err(failed(format!("no answer within {timeout:?}"), false)),
    }
}

#[cfg(feature = "tls")]
fn is_tls_error(error: &fred::error::Error) -> bool {
    matches!(error.kind(), fred::error::ErrorKind::Tls)
}

/// Without the `tls` feature there are no TLS connections, so no TLS errors.
#[cfg(not(feature = "tls"))]
fn is_tls_error(_: &fred::error::Error) -> bool {
    false
}

/// Closes `client` in the background (fred does not close a client on drop, and keeps
/// reconnecting forever under our policy). Without a runtime there is nothing to run it on; the
/// process is ending anyway.
pub(crate) fn quit_in_background<C: ClientLike + Clone + Send + Sync + 'static>(client: &C) {
    let client = client.clone();
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(async move {
            let _ = client.quit().await;
        });
    }
}
