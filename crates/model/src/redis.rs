//! A small in-memory Redis: the commands the shipped scripts call, over a logical clock.
//!
//! Only what the scripts need, with Redis's semantics where they matter to the protocol: keys
//! expire by PX deadlines on the model's clock (a key whose deadline is `t` still exists at `t`,
//! PTTL 0, and is gone after it, as in Redis), replies are typed as Redis hands them to Lua
//! (integers, bulk strings, nil, arrays, status and error replies), and a command on a key of
//! another type answers WRONGTYPE. [`COMMANDS`] is the registry a test checks every script
//! against: a command a script calls that is not listed here fails that test by name.

use std::collections::BTreeMap;
use std::fmt;

/// Every command this Redis implements. A script that calls another fails
/// `tests/commands.rs`, which names it.
pub const COMMANDS: &[&str] = &[
    "DEL",
    "EXISTS",
    "GET",
    "HDEL",
    "HEXISTS",
    "HGET",
    "HINCRBY",
    "HKEYS",
    "HMGET",
    "HSET",
    "INCR",
    "PEXPIRE",
    "PTTL",
    "PUBLISH",
    "SET",
    "SPUBLISH",
    "TIME",
    "TYPE",
    "ZADD",
    "ZCARD",
    "ZPOPMIN",
    "ZRANGE",
    "ZRANGEBYSCORE",
    "ZRANK",
    "ZREM",
    "ZSCORE",
];

/// A sorted-set score. Scripts only write integral scores (microseconds, milliseconds); the
/// bits make it hashable for the checker's state fingerprint.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Score(pub f64);

impl Eq for Score {}

impl std::hash::Hash for Score {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.to_bits().hash(state);
    }
}

impl Score {
    fn text(self) -> String {
        number_text(self.0)
    }
}

/// How Redis writes a number as text: integral values without a fraction.
pub fn number_text(n: f64) -> String {
    if n.fract() == 0.0 && n.abs() < 1e17 {
        format!("{}", n as i64)
    } else {
        format!("{n}")
    }
}

/// A value stored under a key.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Data {
    /// A string.
    Str(String),
    /// A hash: field -> value.
    Hash(BTreeMap<String, String>),
    /// A sorted set: member -> score.
    ZSet(BTreeMap<String, Score>),
}

impl Data {
    fn type_name(&self) -> &'static str {
        match self {
            Data::Str(_) => "string",
            Data::Hash(_) => "hash",
            Data::ZSet(_) => "zset",
        }
    }

    fn is_empty(&self) -> bool {
        match self {
            Data::Str(_) => false,
            Data::Hash(h) => h.is_empty(),
            Data::ZSet(z) => z.is_empty(),
        }
    }
}

/// A key's value and its PX deadline (model milliseconds), if any.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Entry {
    /// The value.
    pub data: Data,
    /// The key exists up to and including this instant.
    pub expires_at: Option<u64>,
}

/// A reply as Redis hands it to Lua.
#[derive(Clone, Debug, PartialEq)]
pub enum Reply {
    /// An integer.
    Int(i64),
    /// A bulk string.
    Bulk(String),
    /// Nil (Lua `false`).
    Nil,
    /// An array.
    Array(Vec<Reply>),
    /// A status reply (Lua `{ok = ...}`).
    Status(String),
    /// An error reply (Lua `{err = ...}`; raised by `redis.call`).
    Error(String),
}

impl fmt::Display for Reply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reply::Int(i) => write!(f, "{i}"),
            Reply::Bulk(s) => write!(f, "{s:?}"),
            Reply::Nil => f.write_str("nil"),
            Reply::Status(s) => write!(f, "+{s}"),
            Reply::Error(e) => write!(f, "-{e}"),
            Reply::Array(items) => {
                f.write_str("[")?;
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{item}")?;
                }
                f.write_str("]")
            }
        }
    }
}

const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";

/// The keyspace at one instant.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Redis {
    /// Key -> entry. Expired keys are removed when the clock moves ([`Redis::expire_until`]).
    pub keys: BTreeMap<String, Entry>,
}

/// What one script run needs besides the keyspace: the clock and where messages go.
pub struct Call<'a> {
    /// The model's time in milliseconds.
    pub now: u64,
    /// Messages published so far by this script: (channel, payload).
    pub published: &'a mut Vec<(String, String)>,
}

fn int(arg: &str) -> Result<i64, Reply> {
    arg.parse::<i64>()
        .map_err(|_| Reply::Error("ERR value is not an integer or out of range".into()))
}

fn float(arg: &str) -> Result<f64, Reply> {
    match arg {
        "-inf" => Ok(f64::NEG_INFINITY),
        "+inf" | "inf" => Ok(f64::INFINITY),
        _ => arg
            .parse::<f64>()
            .map_err(|_| Reply::Error("ERR value is not a valid float".into())),
    }
}

fn syntax() -> Reply {
    Reply::Error("ERR syntax error".into())
}

/// A ZRANGEBYSCORE bound: the value and whether it is exclusive (`(` prefix).
fn bound(arg: &str) -> Result<(f64, bool), Reply> {
    match arg.strip_prefix('(') {
        Some(rest) => Ok((float(rest)?, true)),
        None => Ok((float(arg)?, false)),
    }
}

impl Redis {
    /// Removes every key whose deadline is before `now` (Redis: gone once its time has passed).
    /// Returns the removed keys.
    pub fn expire_until(&mut self, now: u64) -> Vec<String> {
        let gone: Vec<String> = self
            .keys
            .iter()
            .filter(|(_, e)| e.expires_at.is_some_and(|at| at < now))
            .map(|(k, _)| k.clone())
            .collect();
        for key in &gone {
            self.keys.remove(key);
        }
        gone
    }

    fn live(&self, key: &str, now: u64) -> Option<&Entry> {
        self.keys
            .get(key)
            .filter(|e| e.expires_at.is_none_or(|at| at >= now))
    }

    fn hash(&self, key: &str, now: u64) -> Result<Option<&BTreeMap<String, String>>, Reply> {
        match self.live(key, now).map(|e| &e.data) {
            None => Ok(None),
            Some(Data::Hash(h)) => Ok(Some(h)),
            Some(_) => Err(Reply::Error(WRONGTYPE.into())),
        }
    }

    fn zset(&self, key: &str, now: u64) -> Result<Option<&BTreeMap<String, Score>>, Reply> {
        match self.live(key, now).map(|e| &e.data) {
            None => Ok(None),
            Some(Data::ZSet(z)) => Ok(Some(z)),
            Some(_) => Err(Reply::Error(WRONGTYPE.into())),
        }
    }

    /// The entry of `key` for writing, created with `empty` when absent (or expired).
    fn entry_mut(&mut self, key: &str, now: u64, empty: Data) -> Result<&mut Entry, Reply> {
        if self.live(key, now).is_none() {
            self.keys.insert(
                key.to_string(),
                Entry {
                    data: empty.clone(),
                    expires_at: None,
                },
            );
        }
        let entry = self.keys.get_mut(key).expect("just made");
        if std::mem::discriminant(&entry.data) != std::mem::discriminant(&empty) {
            return Err(Reply::Error(WRONGTYPE.into()));
        }
        Ok(entry)
    }

    /// Deletes `key` when its collection became empty (Redis never keeps an empty hash or zset).
    fn drop_if_empty(&mut self, key: &str) {
        if self.keys.get(key).is_some_and(|e| e.data.is_empty()) {
            self.keys.remove(key);
        }
    }

    fn sorted(z: &BTreeMap<String, Score>) -> Vec<(&String, Score)> {
        let mut members: Vec<(&String, Score)> = z.iter().map(|(m, s)| (m, *s)).collect();
        members.sort_by(|a, b| a.1 .0.total_cmp(&b.1 .0).then_with(|| a.0.cmp(b.0)));
        members
    }

    /// Whether `key` exists (and has not expired) at `now`.
    pub fn exists(&self, key: &str, now: u64) -> bool {
        self.live(key, now).is_some()
    }

    /// The keys a command names: every argument of `DEL` and `EXISTS`, none of `TIME` and the
    /// publishes, the first of every other command in [`COMMANDS`].
    pub fn command_keys(args: &[String]) -> &[String] {
        let name = args.first().map(|n| n.to_ascii_uppercase());
        match name.as_deref() {
            None | Some("TIME" | "PUBLISH" | "SPUBLISH") => &[],
            Some("DEL" | "EXISTS") => &args[1..],
            Some(_) => &args[1..args.len().min(2)],
        }
    }

    /// Runs one command. `args[0]` is the command name (any case).
    pub fn execute(&mut self, args: &[String], call: &mut Call<'_>) -> Reply {
        match self.run(args, call) {
            Ok(reply) | Err(reply) => reply,
        }
    }

    fn run(&mut self, args: &[String], call: &mut Call<'_>) -> Result<Reply, Reply> {
        let now = call.now;
        let name = args
            .first()
            .map(|a| a.to_ascii_uppercase())
            .unwrap_or_default();
        let a = &args[1..];
        let need = |n: usize| {
            if a.len() < n {
                Err(Reply::Error(format!(
                    "ERR wrong number of arguments for '{}' command",
                    name.to_lowercase()
                )))
            } else {
                Ok(())
            }
        };
        match name.as_str() {
            // The server clock starts at 1 s, so tokens (microseconds) have no leading zero.
            "TIME" => Ok(Reply::Array(vec![
                Reply::Bulk((1 + now / 1000).to_string()),
                Reply::Bulk(((now % 1000) * 1000).to_string()),
            ])),
            "DEL" => {
                need(1)?;
                let mut n = 0;
                for key in a {
                    if self.live(key, now).is_some() {
                        n += 1;
                    }
                    self.keys.remove(key);
                }
                Ok(Reply::Int(n))
            }
            "EXISTS" => {
                need(1)?;
                Ok(Reply::Int(
                    a.iter().filter(|k| self.live(k, now).is_some()).count() as i64,
                ))
            }
            "TYPE" => {
                need(1)?;
                Ok(Reply::Status(
                    self.live(&a[0], now)
                        .map_or("none", |e| e.data.type_name())
                        .to_string(),
                ))
            }
            "PTTL" => {
                need(1)?;
                Ok(Reply::Int(match self.live(&a[0], now) {
                    None => -2,
                    Some(Entry {
                        expires_at: None, ..
                    }) => -1,
                    Some(Entry {
                        expires_at: Some(at),
                        ..
                    }) => (*at - now) as i64,
                }))
            }
            "PEXPIRE" => {
                need(2)?;
                let ms = int(&a[1])?;
                if a.len() > 2 {
                    return Err(syntax());
                }
                if self.live(&a[0], now).is_none() {
                    return Ok(Reply::Int(0));
                }
                if ms <= 0 {
                    self.keys.remove(&a[0]);
                } else if let Some(e) = self.keys.get_mut(&a[0]) {
                    e.expires_at = Some(now + ms as u64);
                }
                Ok(Reply::Int(1))
            }
            "SET" => {
                need(2)?;
                let (mut get, mut px, mut nx, mut xx) = (false, None, false, false);
                let mut i = 2;
                while i < a.len() {
                    match a[i].to_ascii_uppercase().as_str() {
                        "GET" => get = true,
                        "NX" => nx = true,
                        "XX" => xx = true,
                        "PX" if i + 1 < a.len() => {
                            px = Some(int(&a[i + 1])?);
                            i += 1;
                        }
                        _ => return Err(syntax()),
                    }
                    i += 1;
                }
                let old = match self.live(&a[0], now).map(|e| &e.data) {
                    None => None,
                    Some(Data::Str(s)) => Some(s.clone()),
                    Some(_) if get => return Err(Reply::Error(WRONGTYPE.into())),
                    Some(_) => None,
                };
                let exists = self.live(&a[0], now).is_some();
                if (nx && exists) || (xx && !exists) {
                    return Ok(if get {
                        old.map_or(Reply::Nil, Reply::Bulk)
                    } else {
                        Reply::Nil
                    });
                }
                self.keys.insert(
                    a[0].clone(),
                    Entry {
                        data: Data::Str(a[1].clone()),
                        expires_at: px.map(|ms| now + ms.max(0) as u64),
                    },
                );
                Ok(if get {
                    old.map_or(Reply::Nil, Reply::Bulk)
                } else {
                    Reply::Status("OK".into())
                })
            }
            "GET" => {
                need(1)?;
                match self.live(&a[0], now).map(|e| &e.data) {
                    None => Ok(Reply::Nil),
                    Some(Data::Str(s)) => Ok(Reply::Bulk(s.clone())),
                    Some(_) => Err(Reply::Error(WRONGTYPE.into())),
                }
            }
            "INCR" => {
                need(1)?;
                let entry = self.entry_mut(&a[0], now, Data::Str("0".into()))?;
                let Data::Str(s) = &mut entry.data else {
                    unreachable!()
                };
                let n = int(s)?.checked_add(1).ok_or_else(|| {
                    Reply::Error("ERR increment or decrement would overflow".into())
                })?;
                *s = n.to_string();
                Ok(Reply::Int(n))
            }
            "HGET" => {
                need(2)?;
                Ok(self
                    .hash(&a[0], now)?
                    .and_then(|h| h.get(&a[1]))
                    .map_or(Reply::Nil, |v| Reply::Bulk(v.clone())))
            }
            "HMGET" => {
                need(2)?;
                let h = self.hash(&a[0], now)?;
                Ok(Reply::Array(
                    a[1..]
                        .iter()
                        .map(|f| {
                            h.and_then(|h| h.get(f))
                                .map_or(Reply::Nil, |v| Reply::Bulk(v.clone()))
                        })
                        .collect(),
                ))
            }
            // A grant that takes a grant of the line or replaces an orphan, and a hand-on to the
            // line's head, replace a hash's fields in place (HKEYS, then HSET and HDEL).
            "HKEYS" => {
                need(1)?;
                Ok(Reply::Array(
                    self.hash(&a[0], now)?
                        .map(|h| h.keys().map(|k| Reply::Bulk(k.clone())).collect())
                        .unwrap_or_default(),
                ))
            }
            "HEXISTS" => {
                need(2)?;
                Ok(Reply::Int(
                    self.hash(&a[0], now)?
                        .is_some_and(|h| h.contains_key(&a[1])) as i64,
                ))
            }
            "HSET" => {
                need(3)?;
                if a.len().is_multiple_of(2) {
                    return Err(Reply::Error(
                        "ERR wrong number of arguments for 'hset' command".into(),
                    ));
                }
                let entry = self.entry_mut(&a[0], now, Data::Hash(BTreeMap::new()))?;
                let Data::Hash(h) = &mut entry.data else {
                    unreachable!()
                };
                let mut added = 0;
                for pair in a[1..].chunks(2) {
                    if h.insert(pair[0].clone(), pair[1].clone()).is_none() {
                        added += 1;
                    }
                }
                Ok(Reply::Int(added))
            }
            "HDEL" => {
                need(2)?;
                if self.hash(&a[0], now)?.is_none() {
                    return Ok(Reply::Int(0));
                }
                let Some(Entry {
                    data: Data::Hash(h),
                    ..
                }) = self.keys.get_mut(&a[0])
                else {
                    unreachable!()
                };
                let n = a[1..].iter().filter(|f| h.remove(*f).is_some()).count();
                self.drop_if_empty(&a[0]);
                Ok(Reply::Int(n as i64))
            }
            "HINCRBY" => {
                need(3)?;
                let by = int(&a[2])?;
                let entry = self.entry_mut(&a[0], now, Data::Hash(BTreeMap::new()))?;
                let Data::Hash(h) = &mut entry.data else {
                    unreachable!()
                };
                let old = match h.get(&a[1]) {
                    None => 0,
                    Some(v) => v
                        .parse::<i64>()
                        .map_err(|_| Reply::Error("ERR hash value is not an integer".into()))?,
                };
                let n = old + by;
                h.insert(a[1].clone(), n.to_string());
                Ok(Reply::Int(n))
            }
            "ZADD" => {
                need(3)?;
                let (mut nx, mut xx, mut gt, mut lt) = (false, false, false, false);
                let mut i = 1;
                while i < a.len() {
                    match a[i].to_ascii_uppercase().as_str() {
                        "NX" => nx = true,
                        "XX" => xx = true,
                        "GT" => gt = true,
                        "LT" => lt = true,
                        "CH" | "INCR" => return Err(syntax()),
                        _ => break,
                    }
                    i += 1;
                }
                let pairs = &a[i..];
                if pairs.is_empty() || !pairs.len().is_multiple_of(2) {
                    return Err(syntax());
                }
                let mut scored = Vec::new();
                for pair in pairs.chunks(2) {
                    scored.push((float(&pair[0])?, pair[1].clone()));
                }
                let entry = self.entry_mut(&a[0], now, Data::ZSet(BTreeMap::new()))?;
                let Data::ZSet(z) = &mut entry.data else {
                    unreachable!()
                };
                let mut added = 0;
                for (score, member) in scored {
                    match z.get(&member) {
                        Some(_) if nx => {}
                        None if xx => {}
                        Some(old) if (gt && score <= old.0) || (lt && score >= old.0) => {}
                        Some(_) => {
                            z.insert(member, Score(score));
                        }
                        None => {
                            z.insert(member, Score(score));
                            added += 1;
                        }
                    }
                }
                self.drop_if_empty(&a[0]);
                Ok(Reply::Int(added))
            }
            "ZREM" => {
                need(2)?;
                if self.zset(&a[0], now)?.is_none() {
                    return Ok(Reply::Int(0));
                }
                let Some(Entry {
                    data: Data::ZSet(z),
                    ..
                }) = self.keys.get_mut(&a[0])
                else {
                    unreachable!()
                };
                let n = a[1..].iter().filter(|m| z.remove(*m).is_some()).count();
                self.drop_if_empty(&a[0]);
                Ok(Reply::Int(n as i64))
            }
            "ZSCORE" => {
                need(2)?;
                Ok(self
                    .zset(&a[0], now)?
                    .and_then(|z| z.get(&a[1]))
                    .map_or(Reply::Nil, |s| Reply::Bulk(s.text())))
            }
            "ZCARD" => {
                need(1)?;
                Ok(Reply::Int(
                    self.zset(&a[0], now)?.map_or(0, |z| z.len()) as i64
                ))
            }
            "ZRANK" => {
                need(2)?;
                if a.len() > 2 {
                    return Err(syntax());
                }
                Ok(self
                    .zset(&a[0], now)?
                    .and_then(|z| Self::sorted(z).iter().position(|(m, _)| **m == a[1]))
                    .map_or(Reply::Nil, |i| Reply::Int(i as i64)))
            }
            "ZRANGE" => {
                need(3)?;
                let with_scores = match a.get(3).map(|s| s.to_ascii_uppercase()) {
                    None => false,
                    Some(w) if w == "WITHSCORES" && a.len() == 4 => true,
                    // BYSCORE, BYLEX, REV, LIMIT: no script uses them.
                    Some(_) => return Err(syntax()),
                };
                let (start, stop) = (int(&a[1])?, int(&a[2])?);
                let members = self.zset(&a[0], now)?.map(Self::sorted).unwrap_or_default();
                let len = members.len() as i64;
                let start = if start < 0 {
                    (len + start).max(0)
                } else {
                    start
                };
                let stop = if stop < 0 {
                    len + stop
                } else {
                    stop.min(len - 1)
                };
                let mut out = Vec::new();
                if start <= stop {
                    for (m, s) in &members[start as usize..=stop as usize] {
                        out.push(Reply::Bulk((*m).clone()));
                        if with_scores {
                            out.push(Reply::Bulk(s.text()));
                        }
                    }
                }
                Ok(Reply::Array(out))
            }
            "ZRANGEBYSCORE" => {
                need(3)?;
                let (min, min_open) = bound(&a[1])?;
                let (max, max_open) = bound(&a[2])?;
                let (mut with_scores, mut limit) = (false, None);
                let mut i = 3;
                while i < a.len() {
                    match a[i].to_ascii_uppercase().as_str() {
                        "WITHSCORES" => with_scores = true,
                        "LIMIT" if i + 2 < a.len() => {
                            limit = Some((int(&a[i + 1])?, int(&a[i + 2])?));
                            i += 2;
                        }
                        _ => return Err(syntax()),
                    }
                    i += 1;
                }
                let members = self.zset(&a[0], now)?.map(Self::sorted).unwrap_or_default();
                let inside = members.into_iter().filter(|(_, s)| {
                    (if min_open { s.0 > min } else { s.0 >= min })
                        && (if max_open { s.0 < max } else { s.0 <= max })
                });
                let (offset, count) = limit.unwrap_or((0, -1));
                let picked: Vec<_> = inside
                    .skip(offset.max(0) as usize)
                    .take(if count < 0 {
                        usize::MAX
                    } else {
                        count as usize
                    })
                    .collect();
                let mut out = Vec::new();
                for (m, s) in picked {
                    out.push(Reply::Bulk(m.clone()));
                    if with_scores {
                        out.push(Reply::Bulk(s.text()));
                    }
                }
                Ok(Reply::Array(out))
            }
            "ZPOPMIN" => {
                need(1)?;
                if a.len() > 1 {
                    // A count: no script uses it.
                    return Err(syntax());
                }
                let Some(z) = self.zset(&a[0], now)? else {
                    return Ok(Reply::Array(Vec::new()));
                };
                let Some((member, score)) =
                    Self::sorted(z).first().map(|(m, s)| ((*m).clone(), *s))
                else {
                    return Ok(Reply::Array(Vec::new()));
                };
                if let Some(Entry {
                    data: Data::ZSet(z),
                    ..
                }) = self.keys.get_mut(&a[0])
                {
                    z.remove(&member);
                }
                self.drop_if_empty(&a[0]);
                Ok(Reply::Array(vec![
                    Reply::Bulk(member),
                    Reply::Bulk(score.text()),
                ]))
            }
            // (SPUBLISH: the same message, sent to the lock's shard only on a cluster.)
            "PUBLISH" | "SPUBLISH" => {
                need(2)?;
                call.published.push((a[0].clone(), a[1].clone()));
                // The receivers are counted by the model when it delivers; no script reads this.
                Ok(Reply::Int(0))
            }
            _ => Err(Reply::Error(format!(
                "ERR unknown command '{}' (not implemented by the model's Redis)",
                name
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(redis: &mut Redis, now: u64, args: &[&str]) -> Reply {
        let mut published = Vec::new();
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        redis.execute(
            &args,
            &mut Call {
                now,
                published: &mut published,
            },
        )
    }

    #[test]
    fn keys_expire_after_their_deadline() {
        let mut r = Redis::default();
        run(&mut r, 0, &["HSET", "k", "a", "1"]);
        run(&mut r, 0, &["PEXPIRE", "k", "5"]);
        assert_eq!(run(&mut r, 5, &["PTTL", "k"]), Reply::Int(0));
        assert_eq!(run(&mut r, 6, &["PTTL", "k"]), Reply::Int(-2));
        assert!(r.expire_until(6).contains(&"k".to_string()));
    }

    #[test]
    fn zsets_pop_and_range_in_score_order() {
        let mut r = Redis::default();
        run(&mut r, 0, &["ZADD", "z", "NX", "5", "b"]);
        run(&mut r, 0, &["ZADD", "z", "NX", "3", "a"]);
        run(&mut r, 0, &["ZADD", "z", "NX", "1", "b"]);
        assert_eq!(
            run(&mut r, 0, &["ZRANGE", "z", "0", "-1", "WITHSCORES"]),
            Reply::Array(vec![
                Reply::Bulk("a".into()),
                Reply::Bulk("3".into()),
                Reply::Bulk("b".into()),
                Reply::Bulk("5".into())
            ])
        );
        assert_eq!(
            run(&mut r, 0, &["ZPOPMIN", "z"]),
            Reply::Array(vec![Reply::Bulk("a".into()), Reply::Bulk("3".into())])
        );
        run(&mut r, 0, &["ZREM", "z", "b"]);
        assert_eq!(run(&mut r, 0, &["EXISTS", "z"]), Reply::Int(0));
    }

    #[test]
    fn wrong_types_answer_wrongtype() {
        let mut r = Redis::default();
        run(&mut r, 0, &["SET", "s", "1"]);
        assert!(
            matches!(run(&mut r, 0, &["HGET", "s", "f"]), Reply::Error(e) if e.starts_with("WRONGTYPE"))
        );
        assert_eq!(
            run(&mut r, 0, &["SET", "s", "2", "GET"]),
            Reply::Bulk("1".into())
        );
        assert_eq!(run(&mut r, 0, &["INCR", "s"]), Reply::Int(3));
    }
}
