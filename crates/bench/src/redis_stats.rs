//! Server-side counters: round trips are the top-level commands clients sent, read from
//! `INFO commandstats` after `CONFIG RESETSTAT`.
//!
//! Redis 7 also counts commands run inside scripts there (the SET, HSET, PUBLISH... of our
//! acquire and release scripts), so each scenario names the commands its clients send at the
//! top level and only those are summed.

use fred::prelude::*;
use fred::types::InfoKind;

/// A separate connection for flushing and reading stats.
pub(crate) struct Admin {
    client: Client,
}

/// Commands the leasehold client sends at the top level in these scenarios (connect-time
/// PING included). EXISTS, HGET, ZREM... also run inside our scripts, so they are not listed:
/// the scenarios never send them directly.
pub(crate) const LEASEHOLD_COMMANDS: &[&str] = &[
    "evalsha",
    "eval",
    "script|load",
    "subscribe",
    "unsubscribe",
    "ping",
];

/// Commands the polling baselines send at the top level (their release is one EVALSHA).
pub(crate) const POLLING_COMMANDS: &[&str] = &["set", "evalsha", "eval", "script|load"];

impl Admin {
    pub(crate) async fn connect(url: &str) -> anyhow::Result<Admin> {
        let client = Builder::from_config(Config::from_url(url)?).build()?;
        client.init().await?;
        Ok(Admin { client })
    }

    /// Empties the database (the benchmark's own server, or the one REDIS_URL names: the
    /// harness says so in its help and README) and the command counters.
    pub(crate) async fn flush(&self) -> anyhow::Result<()> {
        let _: () = self.client.flushall(false).await?;
        self.reset_stats().await
    }

    pub(crate) async fn reset_stats(&self) -> anyhow::Result<()> {
        let _: () = self
            .client
            .custom(fred::cmd!("CONFIG"), vec!["RESETSTAT"])
            .await?;
        Ok(())
    }

    /// Calls of `commands` since the last reset, minus the stats reads themselves.
    pub(crate) async fn calls(&self, commands: &[&str]) -> anyhow::Result<u64> {
        let info: String = self.client.info(Some(InfoKind::CommandStats)).await?;
        Ok(sum_calls(&info, commands))
    }

    /// Redis CPU per call of `command` since the last reset (`usec_per_call`).
    pub(crate) async fn usec_per_call(&self, command: &str) -> anyhow::Result<f64> {
        let info = self.commandstats().await?;
        Ok(info
            .lines()
            .filter_map(|line| line.strip_prefix("cmdstat_"))
            .filter_map(|line| line.split_once(':'))
            .find(|(name, _)| *name == command)
            .and_then(|(_, stats)| {
                stats
                    .split(',')
                    .find_map(|kv| kv.strip_prefix("usec_per_call="))
                    .and_then(|v| v.trim().parse().ok())
            })
            .unwrap_or(0.0))
    }

    /// The raw `INFO commandstats` text (for `LEASEHOLD_BENCH_DEBUG`).
    pub(crate) async fn commandstats(&self) -> anyhow::Result<String> {
        Ok(self.client.info(Some(InfoKind::CommandStats)).await?)
    }

    pub(crate) async fn pttl(&self, key: &str) -> anyhow::Result<i64> {
        Ok(self.client.pttl(key).await?)
    }
}

fn sum_calls(info: &str, commands: &[&str]) -> u64 {
    info.lines()
        .filter_map(|line| line.strip_prefix("cmdstat_"))
        .filter_map(|line| line.split_once(':'))
        .filter(|(name, _)| commands.contains(name))
        .filter_map(|(_, stats)| {
            stats
                .split(',')
                .find_map(|kv| kv.strip_prefix("calls="))
                .and_then(|n| n.parse::<u64>().ok())
        })
        .sum()
}

#[cfg(test)]
mod tests {
    #[test]
    fn parses_commandstats() {
        let info = "# Commandstats\r\ncmdstat_evalsha:calls=12,usec=5\r\ncmdstat_set:calls=3,usec=1\r\ncmdstat_script|load:calls=2,usec=1\r\n";
        assert_eq!(super::sum_calls(info, &["evalsha", "script|load"]), 14);
        assert_eq!(super::sum_calls(info, &["get"]), 0);
    }
}
