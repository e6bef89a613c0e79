//! Connecting the operator commands to Redis.
//!
//! They go through [`LockClient`] rather than a bare fred client so that a bad URL, a bad
//! prefix and an unreachable server produce the library's own one-line messages (which name
//! the server and suggest checking `REDIS_URL`), and so that `unlock --force` runs the very
//! force-unlock script the library uses.

use std::time::Duration;

use anyhow::bail;
use leasehold::{LockClient, LockError};

/// How long an operator command waits for any Redis reply.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(5);

/// Connects to `url` with keys under `prefix`.
pub async fn connect(url: &str, prefix: &str) -> anyhow::Result<LockClient> {
    check_scheme(url)?;
    match LockClient::builder(url)
        .prefix(prefix)
        .command_timeout(COMMAND_TIMEOUT)
        .build()
        .await
    {
        Ok(client) => Ok(client),
        // Already names the server and suggests checking the URL.
        Err(error @ LockError::Connection(_)) => Err(error.into()),
        Err(error) => {
            Err(anyhow::Error::new(error).context(format!("cannot use Redis at {}", redact(url))))
        }
    }
}

/// Refuses URLs fred would misread: it takes any scheme (`http://host:1` is tried as Redis)
/// and reports a missing `redis://` as a bare `RelativeUrlWithoutBase`.
fn check_scheme(url: &str) -> anyhow::Result<()> {
    const EXPECTED: &str = "expected redis://[user:pass@]host:port[/db] (or rediss://, \
                            redis-cluster://, redis-sentinel://)";
    let Some((scheme, rest)) = url.split_once("://") else {
        bail!("bad Redis URL {:?}: {EXPECTED}", redact(url));
    };
    let base = scheme
        .strip_suffix("-cluster")
        .or_else(|| scheme.strip_suffix("-sentinel"))
        .unwrap_or(scheme);
    if !matches!(base, "redis" | "rediss" | "valkey" | "valkeys") {
        bail!(
            "bad Redis URL {:?}: unsupported scheme {scheme:?}; {EXPECTED}",
            redact(url)
        );
    }
    if rest.is_empty() {
        bail!("bad Redis URL {:?}: no host; {EXPECTED}", redact(url));
    }
    Ok(())
}

/// `url` with any password replaced by `***`, fit for an error message.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    match rest.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _password)) => format!("{scheme}://{user}:***@{host}"),
            None => url.to_string(),
        },
        None => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn schemes() {
        use super::check_scheme;
        for good in [
            "redis://127.0.0.1:6379",
            "rediss://h:1/0",
            "redis-cluster://h:1",
            "redis://h",
        ] {
            assert!(check_scheme(good).is_ok(), "{good}");
        }
        for bad in ["not a url", "http://x:1", "127.0.0.1:6379", "redis://", ""] {
            assert!(check_scheme(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn passwords_are_hidden() {
        assert_eq!(redact("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
        assert_eq!(redact("redis://u:secret@h:1/0"), "redis://u:***@h:1/0");
        assert_eq!(redact("redis://:secret@h:1"), "redis://:***@h:1");
        assert_eq!(redact("redis://u@h:1"), "redis://u@h:1");
        assert_eq!(redact("not a url"), "not a url");
    }
}
