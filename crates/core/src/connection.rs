//! The command connection as leasehold uses it: a fred client whose every command carries the
//! options a lock command needs, whoever built and configured the client.

use std::time::Duration;

use fred::clients::{Client, WithOptions};
use fred::interfaces::ClientLike;
use fred::types::config::Options;

/// A fred [`Client`] whose commands go out with [`lock_command_options`]. Every call of the
/// library goes through one, so the options hold on an application's own client too (one
/// built by [`LockClient::builder_from_client`](https://docs.rs/leasehold), whose connection
/// settings leasehold does not choose).
pub type Redis = WithOptions<Client>;

/// What every command of a lock needs from fred, set on each command:
///
/// - **one write attempt** (`max_attempts: 1`): fred resends a command in flight after a
///   reconnect unless told otherwise, and a state change must never go out twice (an acquire
///   sent twice would count a hold twice, a release would release twice). An unanswered
///   change is settled above fred, by a compare-and-set that knows what it sent;
/// - **no redirection followed** (`max_redirections: 0`): fred counts a `MOVED`/`ASK`
///   redirection as a write attempt, so under the line above it would fail the command anyway
///   (and an `ASK` followed that way stops a clustered client for good). With none allowed, it
///   reports the redirection (after resyncing its slot map on `MOVED`), and
///   [`resend_not_run`](crate::scripts::resend_not_run) sends the command again, knowing
///   nothing ran;
/// - **the command timeout**: fred times the command out by itself, so the hot path arms no
///   timer of its own when its budget is the whole timeout.
pub fn lock_command_options(timeout: Duration) -> Options {
    Options {
        max_attempts: Some(1),
        max_redirections: Some(0),
        timeout: Some(timeout),
        ..Options::default()
    }
}

/// `client` as leasehold sends through it ([`lock_command_options`] with `timeout`). It shares
/// `client`'s connections.
pub fn for_locks(client: &Client, timeout: Duration) -> Redis {
    client.with_options(&lock_command_options(timeout))
}
