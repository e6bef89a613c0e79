//! A tiny blocking RESP2 client: just enough to poke a Redis server from tests.
//!
//! Commands are written as arrays of bulk strings; replies are parsed into [`RespValue`].

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use crate::error::{Result, TestkitError};

/// Largest bulk string / array this parser accepts (Redis' own proto-max-bulk-len default).
const MAX_LEN: i64 = 512 * 1024 * 1024;

/// A parsed RESP2 reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RespValue {
    /// `+OK`
    Simple(String),
    /// `-ERR message` (only seen nested, e.g. inside an `EXEC` reply; a top-level error reply
    /// is returned as [`TestkitError::Redis`] by [`command`]).
    Error(String),
    /// `:42`
    Int(i64),
    /// `$3\r\nfoo`
    Bulk(Vec<u8>),
    /// `$-1` or `*-1`
    Nil,
    /// `*2\r\n...`
    Array(Vec<RespValue>),
}

impl RespValue {
    /// The value as an integer: `Int` directly, `Simple`/`Bulk` if they parse as one.
    pub fn as_int(&self) -> Option<i64> {
        match self {
            RespValue::Int(i) => Some(*i),
            RespValue::Simple(s) => s.trim().parse().ok(),
            RespValue::Bulk(b) => std::str::from_utf8(b).ok()?.trim().parse().ok(),
            _ => None,
        }
    }

    /// The value as text: `Simple`, or a UTF-8 `Bulk`.
    pub fn as_str(&self) -> Option<String> {
        match self {
            RespValue::Simple(s) => Some(s.clone()),
            RespValue::Bulk(b) => String::from_utf8(b.clone()).ok(),
            _ => None,
        }
    }

    /// The elements, if this is an `Array`.
    pub fn as_array(&self) -> Option<&[RespValue]> {
        match self {
            RespValue::Array(v) => Some(v),
            _ => None,
        }
    }

    /// `true` for `Nil`.
    pub fn is_nil(&self) -> bool {
        matches!(self, RespValue::Nil)
    }
}

/// Encodes a command as a RESP2 array of bulk strings.
pub fn encode_command<A: AsRef<[u8]>>(args: &[A]) -> Vec<u8> {
    let mut out =
        Vec::with_capacity(16 + args.iter().map(|a| a.as_ref().len() + 16).sum::<usize>());
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for a in args {
        let a = a.as_ref();
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// Reads one RESP2 value (recursively for arrays) from `r`.
///
/// An `-ERR` reply is returned as `Ok(RespValue::Error(..))`; a closed connection as an
/// `UnexpectedEof` I/O error.
pub fn read_value<R: BufRead>(r: &mut R) -> Result<RespValue> {
    let line = read_line(r)?;
    let (kind, rest) = line
        .split_first()
        .ok_or_else(|| TestkitError::Protocol("empty line".into()))?;
    let text = || String::from_utf8_lossy(rest).into_owned();
    match kind {
        b'+' => Ok(RespValue::Simple(text())),
        b'-' => Ok(RespValue::Error(text())),
        b':' => Ok(RespValue::Int(parse_int(rest)?)),
        b'$' => {
            let len = parse_int(rest)?;
            if len < 0 {
                return Ok(RespValue::Nil);
            }
            if len > MAX_LEN {
                return Err(TestkitError::Protocol(format!(
                    "bulk length {len} too large"
                )));
            }
            let mut buf = vec![0u8; len as usize + 2];
            r.read_exact(&mut buf)?;
            if !buf.ends_with(b"\r\n") {
                return Err(TestkitError::Protocol(
                    "bulk string not terminated by CRLF".into(),
                ));
            }
            buf.truncate(len as usize);
            Ok(RespValue::Bulk(buf))
        }
        b'*' => {
            let n = parse_int(rest)?;
            if n < 0 {
                return Ok(RespValue::Nil);
            }
            if n > MAX_LEN {
                return Err(TestkitError::Protocol(format!(
                    "array length {n} too large"
                )));
            }
            let mut items = Vec::with_capacity((n as usize).min(1024));
            for _ in 0..n {
                items.push(read_value(r)?);
            }
            Ok(RespValue::Array(items))
        }
        other => Err(TestkitError::Protocol(format!(
            "unexpected RESP type byte {:?} in line {:?}",
            *other as char,
            String::from_utf8_lossy(&line)
        ))),
    }
}

fn read_line<R: BufRead>(r: &mut R) -> Result<Vec<u8>> {
    let mut line = Vec::new();
    r.read_until(b'\n', &mut line)?;
    if line.is_empty() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "connection closed before a reply was read",
        )
        .into());
    }
    if !line.ends_with(b"\r\n") {
        return Err(TestkitError::Protocol(format!(
            "line not terminated by CRLF: {:?}",
            String::from_utf8_lossy(&line)
        )));
    }
    line.truncate(line.len() - 2);
    Ok(line)
}

fn parse_int(s: &[u8]) -> Result<i64> {
    std::str::from_utf8(s)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| {
            TestkitError::Protocol(format!("bad integer {:?}", String::from_utf8_lossy(s)))
        })
}

/// Opens a short-lived connection to `addr`, optionally runs `setup` commands (e.g. `AUTH`,
/// `SELECT`), sends `args`, and returns the reply.
///
/// `timeout` bounds the connect and every read/write. A top-level error reply becomes
/// [`TestkitError::Redis`].
pub fn command<A: AsRef<[u8]>>(
    addr: SocketAddr,
    args: &[A],
    timeout: Duration,
) -> Result<RespValue> {
    command_with_setup::<A, &[u8]>(addr, &[], args, timeout)
}

pub(crate) fn command_with_setup<A: AsRef<[u8]>, S: AsRef<[u8]>>(
    addr: SocketAddr,
    setup: &[Vec<S>],
    args: &[A],
    timeout: Duration,
) -> Result<RespValue> {
    let stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    let _ = stream.set_nodelay(true);
    let mut writer = &stream;
    let mut reader = BufReader::new(&stream);
    for s in setup {
        writer.write_all(&encode_command(s))?;
        into_result(read_value(&mut reader)?)?;
    }
    writer.write_all(&encode_command(args))?;
    writer.flush()?;
    into_result(read_value(&mut reader)?)
}

fn into_result(v: RespValue) -> Result<RespValue> {
    match v {
        RespValue::Error(e) => Err(TestkitError::Redis(e)),
        v => Ok(v),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(bytes: &[u8]) -> RespValue {
        read_value(&mut &bytes[..]).unwrap()
    }

    #[test]
    fn parses_all_types() {
        assert_eq!(parse(b"+OK\r\n"), RespValue::Simple("OK".into()));
        assert_eq!(parse(b"-ERR bad\r\n"), RespValue::Error("ERR bad".into()));
        assert_eq!(parse(b":-12\r\n"), RespValue::Int(-12));
        assert_eq!(parse(b"$3\r\nf\ro\r\n"), RespValue::Bulk(b"f\ro".to_vec()));
        assert_eq!(parse(b"$0\r\n\r\n"), RespValue::Bulk(vec![]));
        assert_eq!(parse(b"$-1\r\n"), RespValue::Nil);
        assert_eq!(parse(b"*-1\r\n"), RespValue::Nil);
        assert_eq!(
            parse(b"*3\r\n:1\r\n*1\r\n$1\r\nx\r\n$-1\r\n"),
            RespValue::Array(vec![
                RespValue::Int(1),
                RespValue::Array(vec![RespValue::Bulk(b"x".to_vec())]),
                RespValue::Nil
            ])
        );
    }

    #[test]
    fn rejects_garbage_and_eof() {
        assert!(matches!(
            read_value(&mut &b"?x\r\n"[..]),
            Err(TestkitError::Protocol(_))
        ));
        assert!(matches!(
            read_value(&mut &b"+OK\n"[..]),
            Err(TestkitError::Protocol(_))
        ));
        assert!(matches!(
            read_value(&mut &b""[..]),
            Err(TestkitError::Io(_))
        ));
        assert!(matches!(
            read_value(&mut &b"$5\r\nab\r\n"[..]),
            Err(TestkitError::Io(_))
        ));
    }

    #[test]
    fn helpers() {
        assert_eq!(RespValue::Bulk(b"1000".to_vec()).as_int(), Some(1000));
        assert_eq!(RespValue::Int(7).as_int(), Some(7));
        assert_eq!(RespValue::Nil.as_int(), None);
        assert_eq!(
            RespValue::Simple("PONG".into()).as_str().as_deref(),
            Some("PONG")
        );
        assert_eq!(RespValue::Bulk(vec![0xff]).as_str(), None);
        assert!(RespValue::Nil.is_nil());
    }

    #[test]
    fn encodes() {
        assert_eq!(
            encode_command(&["SET", "k", ""]),
            b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$0\r\n\r\n".to_vec()
        );
    }
}
