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
/// and reports a missing `redis://` as a bare `RelativeUrlWithoutBase`. A cluster's or a
/// Sentinel set's other nodes go in `?node=host:port` parameters (fred's form); a list of
/// nodes with commas would be reported as a bad port.
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
    let hosts = rest.rsplit_once('@').map_or(rest, |(_, hosts)| hosts);
    let hosts = hosts.split(['/', '?']).next().unwrap_or(hosts);
    if hosts.contains(',') {
        bail!(
            "bad Redis URL {:?}: name one node, and the others as ?node=host:port \
             (redis-cluster://h1:7000?node=h2:7001&node=h3:7002)",
            redact(url)
        );
    }
    Ok(())
}

/// `url` with any password replaced by `***`, fit for an error message: the one in the user
/// info (`user:***@host`) and a Sentinel password (`sentinelPassword=***`).
///
/// When in doubt it hides more: a password may hold `@`, `?` or `/` without percent-encoding,
/// so everything up to the last `@` is taken as user info.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    // First the query's secrets: their values may hold an `@` too.
    let rest = redact_query_secrets(rest);
    match rest.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _password)) => format!("{scheme}://{user}:***@{host}"),
            None => format!("{scheme}://{rest}"),
        },
        None => format!("{scheme}://{rest}"),
    }
}

/// Query parameters whose value is a secret (fred's `sentinel-auth` parameter).
const SECRET_PARAMETERS: [&str; 1] = ["sentinelPassword="];

/// `rest` with the value of every [`SECRET_PARAMETERS`] replaced by `***` (up to the next `&`,
/// or the end).
fn redact_query_secrets(rest: &str) -> String {
    let mut out = String::with_capacity(rest.len());
    let mut left = rest;
    'outer: while !left.is_empty() {
        for parameter in SECRET_PARAMETERS {
            // A parameter starts after `?` or `&`.
            let found = left.char_indices().find(|&(i, _)| {
                left[i..].starts_with(parameter)
                    && i > 0
                    && matches!(left.as_bytes()[i - 1], b'?' | b'&')
            });
            if let Some((i, _)) = found {
                let value_start = i + parameter.len();
                out.push_str(&left[..value_start]);
                out.push_str("***");
                left = match left[value_start..].find('&') {
                    Some(end) => &left[value_start + end..],
                    None => "",
                };
                continue 'outer;
            }
        }
        out.push_str(left);
        break;
    }
    out
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
            "redis-cluster://u:p@h:1?node=h:2&node=h:3",
            "redis-sentinel://h:26379/0?sentinelServiceName=m&node=h:26380",
            "redis://h",
        ] {
            assert!(check_scheme(good).is_ok(), "{good}");
        }
        for bad in [
            "not a url",
            "http://x:1",
            "127.0.0.1:6379",
            "redis://",
            "",
            "redis-cluster://h:1,h:2",
            "redis-cluster://u:p@h:1,h:2/0",
        ] {
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
        assert_eq!(redact("redis://u:p@ss@h:1"), "redis://u:***@h:1");
    }

    #[test]
    fn cluster_and_sentinel_passwords_are_hidden() {
        assert_eq!(
            redact("redis-cluster://u:secret@h1:7000?node=h2:7001&node=h3:7002"),
            "redis-cluster://u:***@h1:7000?node=h2:7001&node=h3:7002"
        );
        assert_eq!(
            redact("rediss-cluster://:secret@h1:7000?node=h2:7001"),
            "rediss-cluster://:***@h1:7000?node=h2:7001"
        );
        assert_eq!(
            redact(
                "redis-sentinel://u:secret@s1:26379/0?sentinelServiceName=mymaster\
                 &sentinelUsername=su&sentinelPassword=s3cret&node=s2:26380"
            ),
            "redis-sentinel://u:***@s1:26379/0?sentinelServiceName=mymaster\
             &sentinelUsername=su&sentinelPassword=***&node=s2:26380"
        );
        // A Sentinel password with an `@` in it, and no data-node password.
        assert_eq!(
            redact("redis-sentinel://s1:26379?sentinelServiceName=m&sentinelPassword=a@b"),
            "redis-sentinel://s1:26379?sentinelServiceName=m&sentinelPassword=***"
        );
        // The comma form is refused by check_scheme, but its message is redacted too.
        assert_eq!(
            redact("redis-cluster://u:secret@h1:1,h2:2"),
            "redis-cluster://u:***@h1:1,h2:2"
        );
        for url in [
            "redis-cluster://u:pa?ss@h1:7000?node=h2:7001",
            "redis-cluster://u:pa/ss@h1:7000",
            "redis-sentinel://u:secret@s1:26379?sentinelPassword=secret&sentinelServiceName=m",
        ] {
            assert!(!redact(url).contains("ss@"), "{url}: {}", redact(url));
            assert!(!redact(url).contains("secret"), "{url}: {}", redact(url));
        }
    }
}
