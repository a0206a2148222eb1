//! What two sides exchange before they can talk, and a small TCP rendezvous
//! to exchange it.
//!
//! Two formats: rdma-core's `ibv_rc_pingpong` message (`LID:QPN:PSN:GID`, 52
//! bytes with its NUL, then "done" from the client), so rnic can meet that
//! program; and rnic's own line, which also carries a buffer for one-sided
//! operations: `rnic1 gid=<GID> qpn=<hex> psn=<hex> [va=<hex> rkey=<hex> len=<dec>]`.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{IpAddr, Ipv6Addr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use crate::Endpoint;

/// A remote buffer for RDMA WRITE, READ and atomics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteBuffer {
    /// Its address.
    pub va: u64,
    /// Its remote key.
    pub rkey: u32,
    /// Its length.
    pub len: u64,
}

/// Everything a peer needs: the queue pair, and optionally a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EndpointRecord {
    /// The queue pair.
    pub endpoint: Endpoint,
    /// A buffer the peer may access.
    pub buffer: Option<RemoteBuffer>,
}

fn gid_of(addr: IpAddr) -> Ipv6Addr {
    match addr {
        IpAddr::V4(a) => a.to_ipv6_mapped(),
        IpAddr::V6(a) => a,
    }
}

fn addr_of(gid: Ipv6Addr) -> IpAddr {
    match gid.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(gid),
    }
}

/// Bytes of ibv_rc_pingpong's message, its NUL included.
pub const PINGPONG_MSG_LEN: usize = 52;

/// An endpoint in ibv_rc_pingpong's format (LID 0: RoCE has none).
pub fn to_pingpong(e: &Endpoint) -> [u8; PINGPONG_MSG_LEN] {
    let hex: String = gid_of(e.addr)
        .octets()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let text = format!("{:04x}:{:06x}:{:06x}:{}", 0, e.qpn, e.psn, hex);
    let mut msg = [0u8; PINGPONG_MSG_LEN];
    msg[..text.len()].copy_from_slice(text.as_bytes());
    msg
}

/// Parse ibv_rc_pingpong's `LID:QPN:PSN:GID`.
pub fn from_pingpong(msg: &[u8]) -> Option<Endpoint> {
    let text = std::str::from_utf8(msg).ok()?.trim_end_matches('\0');
    let mut parts = text.split(':');
    let _lid = u32::from_str_radix(parts.next()?, 16).ok()?;
    let qpn = u32::from_str_radix(parts.next()?, 16).ok()?;
    let psn = u32::from_str_radix(parts.next()?, 16).ok()?;
    let gid = parts.next()?;
    if gid.len() != 32 || parts.next().is_some() || qpn > 0xFF_FFFF || psn > 0xFF_FFFF {
        return None;
    }
    let mut raw = [0u8; 16];
    for (i, b) in raw.iter_mut().enumerate() {
        *b = u8::from_str_radix(gid.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(Endpoint {
        addr: addr_of(Ipv6Addr::from(raw)),
        qpn,
        psn,
    })
}

impl EndpointRecord {
    /// rnic's one-line format.
    pub fn to_line(&self) -> String {
        let e = &self.endpoint;
        let mut s = format!(
            "rnic1 gid={} qpn={:x} psn={:x}",
            gid_of(e.addr),
            e.qpn,
            e.psn
        );
        if let Some(b) = self.buffer {
            s.push_str(&format!(" va={:x} rkey={:x} len={}", b.va, b.rkey, b.len));
        }
        s
    }

    /// Parse rnic's one-line format.
    pub fn from_line(line: &str) -> Option<EndpointRecord> {
        let mut words = line.split_whitespace();
        if words.next()? != "rnic1" {
            return None;
        }
        let (mut gid, mut qpn, mut psn, mut va, mut rkey, mut len) =
            (None, None, None, None, None, None);
        for w in words {
            let (k, v) = w.split_once('=')?;
            match k {
                "gid" => gid = v.parse::<Ipv6Addr>().ok(),
                "qpn" => qpn = u32::from_str_radix(v, 16).ok(),
                "psn" => psn = u32::from_str_radix(v, 16).ok(),
                "va" => va = u64::from_str_radix(v, 16).ok(),
                "rkey" => rkey = u32::from_str_radix(v, 16).ok(),
                "len" => len = v.parse::<u64>().ok(),
                _ => return None,
            }
        }
        let (qpn, psn) = (qpn?, psn?);
        if qpn > 0xFF_FFFF || psn > 0xFF_FFFF {
            return None;
        }
        let buffer = match (va, rkey, len) {
            (Some(va), Some(rkey), Some(len)) => Some(RemoteBuffer { va, rkey, len }),
            (None, None, None) => None,
            _ => return None,
        };
        Some(EndpointRecord {
            endpoint: Endpoint {
                addr: addr_of(gid?),
                qpn,
                psn,
            },
            buffer,
        })
    }
}

fn bad(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("malformed {what} from the peer"),
    )
}

/// Wait on TCP `port` for one client and swap records: read its line, send ours.
pub fn serve(port: u16, mine: &EndpointRecord) -> io::Result<EndpointRecord> {
    let (s, _) = TcpListener::bind(("0.0.0.0", port))?.accept()?;
    let mut r = BufReader::new(s.try_clone()?);
    let mut line = String::new();
    r.read_line(&mut line)?;
    let theirs = EndpointRecord::from_line(line.trim()).ok_or_else(|| bad("endpoint record"))?;
    (&s).write_all(format!("{}\n", mine.to_line()).as_bytes())?;
    Ok(theirs)
}

fn connect_retrying(host: &str, port: u16, wait: Duration) -> io::Result<TcpStream> {
    let deadline = Instant::now() + wait;
    loop {
        match TcpStream::connect((host, port)) {
            Ok(s) => return Ok(s),
            Err(e) if Instant::now() > deadline => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// Connect to a server (retrying for up to `wait` while it starts) and swap records.
pub fn connect(
    host: &str,
    port: u16,
    mine: &EndpointRecord,
    wait: Duration,
) -> io::Result<EndpointRecord> {
    let s = connect_retrying(host, port, wait)?;
    (&s).write_all(format!("{}\n", mine.to_line()).as_bytes())?;
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line)?;
    EndpointRecord::from_line(line.trim()).ok_or_else(|| bad("endpoint record"))
}

/// ibv_rc_pingpong's server side of the exchange.
pub fn serve_pingpong(port: u16, mine: &Endpoint) -> io::Result<Endpoint> {
    let (mut s, _) = TcpListener::bind(("0.0.0.0", port))?.accept()?;
    let mut msg = [0u8; PINGPONG_MSG_LEN];
    s.read_exact(&mut msg)?;
    let theirs = from_pingpong(&msg).ok_or_else(|| bad("ibv_rc_pingpong address"))?;
    s.write_all(&to_pingpong(mine))?;
    let mut done = [0u8; 5];
    s.read_exact(&mut done)?;
    Ok(theirs)
}

/// ibv_rc_pingpong's client side of the exchange.
pub fn connect_pingpong(
    host: &str,
    port: u16,
    mine: &Endpoint,
    wait: Duration,
) -> io::Result<Endpoint> {
    let mut s = connect_retrying(host, port, wait)?;
    s.write_all(&to_pingpong(mine))?;
    let mut msg = [0u8; PINGPONG_MSG_LEN];
    s.read_exact(&mut msg)?;
    s.write_all(b"done\0")?;
    from_pingpong(&msg).ok_or_else(|| bad("ibv_rc_pingpong address"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn e() -> Endpoint {
        Endpoint {
            addr: IpAddr::V4(Ipv4Addr::new(10, 77, 0, 1)),
            qpn: 0x11,
            psn: 0x74e070,
        }
    }

    #[test]
    fn ibv_rc_pingpong_format() {
        let msg = to_pingpong(&e());
        assert_eq!(
            &msg[..51],
            b"0000:000011:74e070:00000000000000000000ffff0a4d0001"
        );
        assert_eq!(msg[51], 0);
        assert_eq!(from_pingpong(&msg), Some(e()));
        assert_eq!(from_pingpong(b"0000:000011:74e070:00"), None);
        assert_eq!(
            from_pingpong(b"0000:1000000:000000:00000000000000000000ffff0a4d0001"),
            None
        );
    }

    #[test]
    fn rnic_line_format() {
        let r = EndpointRecord {
            endpoint: e(),
            buffer: Some(RemoteBuffer {
                va: 0x7f00_1234_5000,
                rkey: 0x1a2b,
                len: 65536,
            }),
        };
        let line = r.to_line();
        assert_eq!(
            line,
            "rnic1 gid=::ffff:10.77.0.1 qpn=11 psn=74e070 va=7f0012345000 rkey=1a2b len=65536"
        );
        assert_eq!(EndpointRecord::from_line(&line), Some(r));
        let bare = EndpointRecord {
            endpoint: e(),
            buffer: None,
        };
        assert_eq!(EndpointRecord::from_line(&bare.to_line()), Some(bare));
        assert_eq!(EndpointRecord::from_line("rnic1 gid=::1 qpn=11"), None);
        assert_eq!(
            EndpointRecord::from_line("rnic1 gid=::1 qpn=11 psn=1 va=5"),
            None
        );
        assert_eq!(
            EndpointRecord::from_line("other gid=::1 qpn=11 psn=1"),
            None
        );
    }

    #[test]
    fn rendezvous_over_tcp() {
        let port = 30_000 + (std::process::id() % 20_000) as u16;
        let server = EndpointRecord {
            endpoint: e(),
            buffer: None,
        };
        let client = EndpointRecord {
            endpoint: Endpoint { qpn: 0x12, ..e() },
            buffer: Some(RemoteBuffer {
                va: 1,
                rkey: 2,
                len: 3,
            }),
        };
        let t = std::thread::spawn(move || serve(port, &server));
        let got = connect("127.0.0.1", port, &client, Duration::from_secs(5)).unwrap();
        assert_eq!(got, server);
        assert_eq!(t.join().unwrap().unwrap(), client);
    }
}
