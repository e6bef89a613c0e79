//! A client's own look at a fair lock's line: one plain connection straight to Redis, beside
//! the library's (which go through the client's fault proxy, so the faults on the client leave
//! this one alone), served by a thread of its own, one command at a time. Every answer says
//! when its command was sent and when the reply came back (the run's clock): the command ran
//! in Redis at some instant in between.
//!
//! On a Redis Cluster (`run --cluster`) it starts from the nodes' addresses and follows the
//! cluster: a node that does not serve a key's slot answers `MOVED` with the node that does,
//! which it asks again at once; a node it cannot reach (killed) sends the next command to the
//! next node it knows. A command that meets anything else (`ASK` or `TRYAGAIN` during a slot
//! migration, `CLUSTERDOWN` during a failover) goes unanswered, as when Redis is paused.
//!
//! What it reads (see `checker::fair_order_check` for how it is used):
//! - [`Observer::floor`], just before a fair acquire: whether the owner already had a place in
//!   the line or held the lock;
//! - [`Observer::watch`], polled while a fair or read/write acquire waits: the owner's entry's
//!   score (its arrival, server microseconds) or nothing, and the token of a grant it holds in
//!   Redis (granted there, though its call has not returned);
//! - [`Observer::pttl`], right after a foreign-kind attempt on a semaphore's or latch's name:
//!   whether its hash got a TTL.

use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::mpsc;
use std::time::Duration;

use leasehold_core::{protocol, LockKeys};
use leasehold_testkit::resp::{encode_command, read_value};
use leasehold_testkit::RespValue;
use tokio::sync::oneshot;

use crate::clock::now_us;

/// Connect, write and read timeout: an observation that cannot be made quickly (Redis paused
/// or restarting) is simply not made.
const TIMEOUT: Duration = Duration::from_millis(250);
/// How long an acquire waits for its floor at most (the thread may be busy with other
/// commands timing out).
const FLOOR_WAIT: Duration = Duration::from_millis(300);

/// The owner's state at a fair or read/write lock, read atomically (one script): an entry in
/// the line, a hold (a fair lock's or writer's `<owner>` field, a reader's `~r:<owner>`: a
/// grant the line made is a hold too). `ARGV[2]` is the reader field's prefix
/// ([`leasehold_core::protocol`]: the scripts' `@READ@` is filled in when the library loads
/// them, so the text here must be the real one).
const FLOOR_SCRIPT: &str = "\
local entry = redis.call('ZSCORE', KEYS[1], ARGV[1]) and 1 or 0
local held = math.max(redis.call('HEXISTS', KEYS[2], ARGV[1]),
  redis.call('HEXISTS', KEYS[2], ARGV[2] .. ARGV[1]))
return {entry, held}";

/// A waiter's place in line and its hold, read atomically: its entry's score (or false) and,
/// when it holds the lock in Redis, that grant's token: `~fence` for a fair lock's or a
/// writer's hold (`<owner>` field), `~rf:<owner>` for a reader's (`~r:<owner>`). `ARGV[2..4]`:
/// the fence field and the read and read-fence prefixes.
const WATCH_SCRIPT: &str = "\
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
local token = false
if redis.call('HEXISTS', KEYS[2], ARGV[1]) == 1 then
  token = redis.call('HGET', KEYS[2], ARGV[2])
elseif redis.call('HEXISTS', KEYS[2], ARGV[3] .. ARGV[1]) == 1 then
  token = redis.call('HGET', KEYS[2], ARGV[4] .. ARGV[1])
end
return {score or false, token or false}";

/// The checker's self-test (`--cut-in-line`): puts the owner at the head of a non-empty line,
/// with an entry as a waiter's try makes it (arrival, deadline a lease away).
const CUT_IN_LINE_SCRIPT: &str = "\
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')[2]
if not first then
  return 0
end
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local life = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], tonumber(first) - 1, ARGV[1])
redis.call('ZADD', KEYS[2], now_ms + life, ARGV[1])
redis.call('PEXPIRE', KEYS[1], life + 1000)
redis.call('PEXPIRE', KEYS[2], life + 1000)
return 1";

/// One command's answer.
#[derive(Debug)]
pub struct Answer<T> {
    /// Taken before the command was written.
    pub sent: i64,
    pub value: T,
    /// Taken after the reply was read.
    pub received: i64,
}

/// What [`Observer::watch`] read: the owner's entry's score (its arrival), and the token of
/// the grant it holds in Redis, if any.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Watched {
    pub arrival: Option<i64>,
    pub token: Option<u64>,
}

/// What [`Observer::floor`] read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Floor {
    pub entry: bool,
    pub held: bool,
}

struct Ask {
    args: Vec<String>,
    answer: oneshot::Sender<Answer<RespValue>>,
}

/// The handle on the observing thread (cheap to clone).
#[derive(Clone, Debug)]
pub struct Observer {
    asks: mpsc::Sender<Ask>,
}

impl std::fmt::Debug for Ask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ask").field("args", &self.args).finish()
    }
}

impl Observer {
    /// Starts the thread; it connects to `addr` at its first command (and again after any
    /// failure).
    /// Observes the server at `addrs[0]`, or the cluster whose nodes are `addrs`.
    pub fn start(addrs: Vec<SocketAddr>) -> anyhow::Result<Observer> {
        anyhow::ensure!(!addrs.is_empty(), "nothing to observe");
        let (asks, requests) = mpsc::channel();
        std::thread::Builder::new()
            .name("observer".into())
            .spawn(move || serve(addrs, requests))?;
        Ok(Observer { asks })
    }

    /// Runs `args`; `None` when it failed (no connection, a timeout, an error reply).
    async fn ask(&self, args: Vec<String>) -> Option<Answer<RespValue>> {
        let (answer, reply) = oneshot::channel();
        self.asks.send(Ask { args, answer }).ok()?;
        reply.await.ok()
    }

    /// `owner`'s entry and hold at the fair lock `keys`, read in one script; `None` also
    /// when no answer came within [`FLOOR_WAIT`] (the acquire then goes on without).
    pub async fn floor(&self, keys: &LockKeys, owner: &str) -> Option<Answer<Floor>> {
        let args = [
            "EVAL",
            FLOOR_SCRIPT,
            "2",
            &keys.waiters(),
            keys.hash(),
            owner,
            protocol::READ_FIELD_PREFIX,
        ];
        let ask = self.ask(args.map(str::to_string).to_vec());
        let answer = tokio::time::timeout(FLOOR_WAIT, ask).await.ok()??;
        let flags: Vec<bool> = answer
            .value
            .as_array()?
            .iter()
            .map(|v| v.as_int().map(|n| n == 1))
            .collect::<Option<_>>()?;
        let [entry, held] = flags[..] else {
            return None;
        };
        Some(Answer {
            sent: answer.sent,
            value: Floor { entry, held },
            received: answer.received,
        })
    }

    /// Puts `owner` at the head of the fair lock's line if anyone waits (the checker's
    /// self-test: a lock that lets callers jump the line).
    pub async fn cut_in_line(&self, keys: &LockKeys, owner: &str, life: Duration) {
        let life = life.as_millis().to_string();
        let args = [
            "EVAL",
            CUT_IN_LINE_SCRIPT,
            "2",
            &keys.waiters(),
            &keys.waiters_until(),
            owner,
            &life,
        ];
        let _ = self.ask(args.map(str::to_string).to_vec()).await;
    }

    /// `owner`'s place in the line of the fair or read/write lock `keys` and its hold there,
    /// read in one script ([`Watched`]).
    pub async fn watch(&self, keys: &LockKeys, owner: &str) -> Option<Answer<Watched>> {
        let args = [
            "EVAL",
            WATCH_SCRIPT,
            "2",
            &keys.waiters(),
            keys.hash(),
            owner,
            protocol::FENCE_FIELD,
            protocol::READ_FIELD_PREFIX,
            protocol::READ_FENCE_FIELD_PREFIX,
        ];
        let answer = self.ask(args.map(str::to_string).to_vec()).await?;
        let items = answer.value.as_array()?;
        let number = |value: &RespValue| match value {
            RespValue::Nil => Some(None),
            // Scores are whole microseconds (a read/write lock's: twice that, + 1 for a
            // writer), below 2^53: exact as a double.
            value => Some(Some(value.as_str()?.parse::<f64>().ok()? as i64)),
        };
        let arrival = number(items.first()?)?;
        let token = number(items.get(1)?)?.map(|t| t as u64);
        Some(Answer {
            sent: answer.sent,
            value: Watched { arrival, token },
            received: answer.received,
        })
    }

    /// `PTTL key`.
    pub async fn pttl(&self, key: &str) -> Option<Answer<i64>> {
        let answer = self.ask(vec!["PTTL".to_string(), key.to_string()]).await?;
        let value = answer.value.as_int()?;
        Some(Answer {
            sent: answer.sent,
            value,
            received: answer.received,
        })
    }
}

type Connection = (TcpStream, BufReader<TcpStream>);

fn serve(mut addrs: Vec<SocketAddr>, requests: mpsc::Receiver<Ask>) {
    // The node asked: the one that served the last command.
    let mut at = 0;
    let mut conn: Option<Connection> = None;
    for ask in requests {
        if ask.answer.is_closed() {
            continue; // its caller is gone (the acquire it watched ended)
        }
        // A connection kept from an earlier command may have been cut since (CLIENT KILL, a
        // Redis restart): then once more on a new one (the commands only read, but for the
        // self-test's, which may then run twice).
        let reused = conn.is_some();
        let mut answer = run(addrs[at], &mut conn, &ask.args);
        if answer.is_err() && reused {
            conn = None;
            answer = run(addrs[at], &mut conn, &ask.args);
        }
        // Cluster: the key's slot is served elsewhere (the command did not run here).
        let moved = match &answer {
            Ok(Answer {
                value: RespValue::Error(error),
                ..
            }) => moved_to(error),
            _ => None,
        };
        if let Some(node) = moved {
            at = addrs.iter().position(|a| *a == node).unwrap_or_else(|| {
                addrs.push(node);
                addrs.len() - 1
            });
            conn = None;
            answer = run(addrs[at], &mut conn, &ask.args);
        }
        match answer {
            Ok(answer) if !matches!(answer.value, RespValue::Error(_)) => {
                let _ = ask.answer.send(answer);
            }
            // An error reply: the connection is still in step.
            Ok(_) => {}
            // Anything else may leave a reply unread: start over on a new connection, to the
            // next node of a cluster (this one may be down).
            Err(_) => {
                conn = None;
                at = (at + 1) % addrs.len();
            }
        }
    }
}

/// The node named by a `MOVED <slot> <host>:<port>` error.
fn moved_to(error: &str) -> Option<SocketAddr> {
    let mut words = error.split_whitespace();
    if words.next()? != "MOVED" {
        return None;
    }
    words.nth(1)?.parse().ok()
}

fn run(
    addr: SocketAddr,
    conn: &mut Option<Connection>,
    args: &[String],
) -> anyhow::Result<Answer<RespValue>> {
    let (stream, reader) = match conn {
        Some(conn) => conn,
        None => {
            let stream = TcpStream::connect_timeout(&addr, TIMEOUT)?;
            stream.set_read_timeout(Some(TIMEOUT))?;
            stream.set_write_timeout(Some(TIMEOUT))?;
            let _ = stream.set_nodelay(true);
            let reader = BufReader::new(stream.try_clone()?);
            conn.insert((stream, reader))
        }
    };
    let sent = now_us();
    stream.write_all(&encode_command(args))?;
    let value = read_value(reader)?;
    let received = now_us();
    Ok(Answer {
        sent,
        value,
        received,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scripts_name_the_real_fields() {
        // Sent as they are: a placeholder of the library's scripts (`@READ@`) would never
        // match.
        for script in [FLOOR_SCRIPT, WATCH_SCRIPT, CUT_IN_LINE_SCRIPT] {
            assert!(!script.contains('@'), "{script}");
        }
    }

    #[test]
    fn moved_names_the_node_serving_the_slot() {
        assert_eq!(
            moved_to("MOVED 3999 127.0.0.1:6381"),
            Some("127.0.0.1:6381".parse().unwrap())
        );
        assert_eq!(moved_to("ASK 3999 127.0.0.1:6381"), None);
        assert_eq!(moved_to("ERR unknown command"), None);
    }
}
