//! `rnic pingpong`, like rdma-core's `ibv_rc_pingpong`: a server and a client
//! exchange queue pair numbers, PSNs and GIDs over TCP, in ibv_rc_pingpong's own
//! format, then bounce messages back and forth over RC SENDs.

use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv6Addr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use rnic_verbs::*;

/// Options, named as ibv_rc_pingpong names them.
#[derive(Debug, Clone)]
pub struct Options {
    /// The server to connect to; `None` to be the server.
    pub server: Option<String>,
    /// TCP port of the exchange.
    pub port: u16,
    /// Message size.
    pub size: u32,
    /// Round trips.
    pub iters: u64,
    /// Path MTU.
    pub mtu: Mtu,
}

const T: Duration = Duration::from_secs(30);
/// "LID:QPN:PSN:GID" and the terminating NUL: 52 bytes, as ibv_rc_pingpong sends.
const MSG_LEN: usize = 52;

/// An endpoint in ibv_rc_pingpong's wire format.
pub fn encode(e: &Endpoint) -> [u8; MSG_LEN] {
    let gid = match e.addr {
        IpAddr::V4(a) => a.to_ipv6_mapped(),
        IpAddr::V6(a) => a,
    };
    let hex: String = gid.octets().iter().map(|b| format!("{b:02x}")).collect();
    let text = format!("{:04x}:{:06x}:{:06x}:{}", 0, e.qpn, e.psn, hex);
    let mut msg = [0u8; MSG_LEN];
    msg[..text.len()].copy_from_slice(text.as_bytes());
    msg
}

/// Parse ibv_rc_pingpong's "LID:QPN:PSN:GID".
pub fn decode(msg: &[u8]) -> Option<Endpoint> {
    let text = std::str::from_utf8(msg).ok()?.trim_end_matches('\0');
    let mut parts = text.split(':');
    let _lid = u32::from_str_radix(parts.next()?, 16).ok()?;
    let qpn = u32::from_str_radix(parts.next()?, 16).ok()?;
    let psn = u32::from_str_radix(parts.next()?, 16).ok()?;
    let gid = parts.next()?;
    if gid.len() != 32 || parts.next().is_some() {
        return None;
    }
    let mut raw = [0u8; 16];
    for (i, b) in raw.iter_mut().enumerate() {
        *b = u8::from_str_radix(&gid[2 * i..2 * i + 2], 16).ok()?;
    }
    let v6 = Ipv6Addr::from(raw);
    let addr = match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    };
    Some(Endpoint { addr, qpn, psn })
}

fn exchange(o: &Options, mine: &Endpoint) -> io::Result<Endpoint> {
    let bad = || {
        io::Error::new(
            io::ErrorKind::InvalidData,
            "malformed endpoint from the peer",
        )
    };
    let mut msg = [0u8; MSG_LEN];
    match &o.server {
        Some(host) => {
            // The server may not be listening yet: retry for a while.
            let deadline = Instant::now() + Duration::from_secs(10);
            let mut s = loop {
                match TcpStream::connect((host.as_str(), o.port)) {
                    Ok(s) => break s,
                    Err(e) if Instant::now() > deadline => return Err(e),
                    Err(_) => std::thread::sleep(Duration::from_millis(50)),
                }
            };
            s.write_all(&encode(mine))?;
            s.read_exact(&mut msg)?;
            s.write_all(b"done\0")?;
            decode(&msg).ok_or_else(bad)
        }
        None => {
            let l = TcpListener::bind(("0.0.0.0", o.port))?;
            let (mut s, _) = l.accept()?;
            s.read_exact(&mut msg)?;
            let remote = decode(&msg).ok_or_else(bad)?;
            s.write_all(&encode(mine))?;
            let mut done = [0u8; 5];
            s.read_exact(&mut done)?;
            Ok(remote)
        }
    }
}

/// Run as server or client; prints ibv_rc_pingpong's two result lines.
pub fn run(o: &Options) -> std::result::Result<(), Box<dyn std::error::Error>> {
    let dev = Device::open_loopback()?;
    let pd = dev.alloc_pd()?;
    let size = o.size.max(1);
    let mr = pd.register(2 * size as usize, Access::LOCAL_WRITE)?;
    let cq = dev.create_cq(4096)?;
    let qp = pd.create_rc_qp(&cq, &cq, QpCaps::default())?;
    let mine = qp.endpoint();
    println!(
        "  local address:  LID 0x0000, QPN 0x{:06x}, PSN 0x{:06x}, GID {}",
        mine.qpn,
        mine.psn,
        dev.gid()
    );
    let remote = exchange(o, &mine)?;
    println!(
        "  remote address: LID 0x0000, QPN 0x{:06x}, PSN 0x{:06x}, GID {}",
        remote.qpn,
        remote.psn,
        match remote.addr {
            IpAddr::V4(a) => a.to_ipv6_mapped(),
            IpAddr::V6(a) => a,
        }
    );
    let opts = ConnectOptions {
        mtu: o.mtu,
        access: Access::NONE,
        ..ConnectOptions::default()
    };
    qp.connect(&remote, &opts)?;

    let recv = |id: u64| {
        qp.post_recv(RecvWr {
            wr_id: id,
            sg_list: vec![mr.sge(size as usize, size)],
        })
    };
    // Enough receives posted that the peer never waits for one.
    for i in 0..o.iters.min(1000) {
        recv(i)?;
    }
    let mut posted_recvs = o.iters.min(1000);
    let send = |id: u64| {
        qp.post_send(SendWr {
            wr_id: id,
            op: SendOp::Send { imm: None },
            sg_list: vec![mr.sge(0, size)],
            signaled: true,
            solicited: false,
            fence: false,
        })
    };
    let start = Instant::now();
    let (mut sent, mut received) = (0u64, 0u64);
    if o.server.is_some() {
        send(sent)?;
        sent += 1;
    }
    while sent < o.iters || received < o.iters {
        let c = cq.wait(T)?;
        if c.status != WcStatus::Success {
            return Err(format!("completion {} failed: {}", c.wr_id, c.status).into());
        }
        if c.opcode == WcOpcode::Recv {
            received += 1;
            if posted_recvs < o.iters {
                recv(posted_recvs)?;
                posted_recvs += 1;
            }
            if sent < o.iters {
                send(sent)?;
                sent += 1;
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let bytes = 2 * o.iters * u64::from(size);
    println!(
        "{bytes} bytes in {secs:.2} seconds = {:.2} Mbit/sec",
        bytes as f64 * 8.0 / secs / 1e6
    );
    println!(
        "{} iters in {secs:.2} seconds = {:.2} usec/iter",
        o.iters,
        secs * 1e6 / o.iters as f64
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    #[test]
    fn ibv_rc_pingpong_wire_format() {
        let e = Endpoint {
            addr: IpAddr::V4(Ipv4Addr::new(10, 77, 0, 1)),
            qpn: 0x11,
            psn: 0x74e070,
        };
        let msg = encode(&e);
        assert_eq!(
            &msg[..51],
            b"0000:000011:74e070:00000000000000000000ffff0a4d0001"
        );
        assert_eq!(msg[51], 0);
        assert_eq!(decode(&msg), Some(e));
        assert_eq!(decode(b"0000:000011:74e070:00"), None);
    }
}
