//! `rnic pingpong`, like rdma-core's `ibv_rc_pingpong`: a server and a client
//! exchange queue pair numbers, PSNs and GIDs over TCP, in ibv_rc_pingpong's own
//! format (or, with `--cm`, connect through the communication manager on
//! QP1, by address and rdma_cm port, as rdma_cm programs do), then bounce
//! messages back and forth over RC SENDs.

use std::net::ToSocketAddrs;
use std::time::{Duration, Instant};

use rnic_verbs::rendezvous;
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
    /// The network interface of the frame transport, if not loopback.
    pub iface: Option<String>,
    /// The local GID, by index in the port's table, if not the device's
    /// own address.
    pub gid_index: Option<usize>,
    /// The first PSN this side sends, if not a random one.
    pub psn: Option<rnic_wire::Psn>,
    /// Connect through the CM (`port` is the rdma_cm port) rather than
    /// exchange endpoints over TCP.
    pub cm: bool,
}

const T: Duration = Duration::from_secs(30);

fn exchange(o: &Options, mine: &Endpoint) -> std::io::Result<Endpoint> {
    match &o.server {
        Some(host) => rendezvous::connect_pingpong(host, o.port, mine, Duration::from_secs(10)),
        None => rendezvous::serve_pingpong(o.port, mine),
    }
}

/// Run as server or client; prints ibv_rc_pingpong's two result lines.
pub fn run(o: &Options) -> std::result::Result<(), Box<dyn std::error::Error>> {
    let dev = match &o.iface {
        Some(name) => Device::open_on_interface(name)?,
        None => Device::open_loopback()?,
    };
    let pd = dev.alloc_pd()?;
    let size = o.size.max(1);
    let mr = pd.register(2 * size as usize, Access::LOCAL_WRITE)?;
    let cq = dev.create_cq(4096)?;
    let mut qp = pd.create_rc_qp(&cq, &cq, QpCaps::default())?;
    if let Some(psn) = o.psn {
        qp.set_psn(psn);
    }
    if let Some(i) = o.gid_index {
        qp.use_gid(i)?;
    }
    let post_recvs = |qp: &QueuePair, n: u64| -> Result<()> {
        for i in 0..n {
            qp.post_recv(RecvWr {
                wr_id: i,
                sg_list: sg_list![mr.sge(size as usize, size)],
            })?;
        }
        Ok(())
    };
    // Through the CM: receives posted before the connection is made (the
    // QP in INIT), as an rdma_cm program posts them after rdma_create_qp,
    // so the peer's first SEND finds one.
    let _conn = if o.cm {
        qp.init(Access::NONE)?;
        post_recvs(&qp, o.iters.min(1000))?;
        Some(connect_cm(o, &dev, &qp)?)
    } else {
        None
    };
    if !o.cm {
        exchange_and_connect(o, &qp)?;
        post_recvs(&qp, o.iters.min(1000))?;
    }
    let recv = |id: u64| {
        qp.post_recv(RecvWr {
            wr_id: id,
            sg_list: sg_list![mr.sge(size as usize, size)],
        })
    };
    let mut posted_recvs = o.iters.min(1000);
    let send = |id: u64| qp.post_send(SendWr::new(id, SendOp::send(), sg_list![mr.sge(0, size)]));
    let start = Instant::now();
    // Sends posted and completed, and messages received. Like
    // ibv_rc_pingpong, a side is done when its last SEND has completed
    // (the peer acknowledged it) as well as its last receive: leaving
    // before would leave the peer retransmitting to a closed NIC.
    let (mut sent, mut acked, mut received) = (0u64, 0u64, 0u64);
    if o.server.is_some() {
        send(sent)?;
        sent += 1;
    }
    while acked < o.iters || received < o.iters {
        let c = cq.wait(T)?;
        if c.status != WcStatus::Success {
            return Err(format!("completion {} failed: {}", c.wr_id, c.status).into());
        }
        if c.opcode == WcOpcode::Send {
            acked += 1;
        } else if c.opcode == WcOpcode::Recv {
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

/// Connect through the CM: the server listens on rdma_cm port `o.port` and
/// accepts the first request; the client connects to it.
fn connect_cm(
    o: &Options,
    dev: &Device,
    qp: &QueuePair,
) -> std::result::Result<cm::Connection, Box<dyn std::error::Error>> {
    let conn = match &o.server {
        Some(host) => {
            let to = (host.as_str(), o.port)
                .to_socket_addrs()?
                .next()
                .ok_or_else(|| format!("{host}: no address"))?;
            dev.connect(qp, to, &[], T)?
        }
        None => {
            let listener = dev.listen(o.port)?;
            println!(
                "  listening on {}:{} (rdma_cm)",
                dev.addr(),
                listener.port()
            );
            let request = listener.next(Duration::from_secs(600))?;
            println!("  request from {}", request.peer());
            request.accept(qp, &[], T)?
        }
    };
    let q = qp.query()?;
    println!(
        "  connected through the CM: QPN 0x{:06x} <-> 0x{:06x}, PSN 0x{:06x}, MTU {}",
        qp.qpn(),
        q.dest_qp_num,
        q.sq_psn,
        q.path_mtu.bytes()
    );
    Ok(conn)
}

/// Exchange endpoints over TCP as ibv_rc_pingpong does, and connect.
fn exchange_and_connect(
    o: &Options,
    qp: &QueuePair,
) -> std::result::Result<(), Box<dyn std::error::Error>> {
    let mine = qp.endpoint();
    println!(
        "  local address:  LID 0x0000, QPN 0x{:06x}, PSN 0x{:06x}, GID {}",
        mine.qpn,
        mine.psn,
        gid_of(mine.addr)
    );
    let remote = exchange(o, &mine)?;
    println!(
        "  remote address: LID 0x0000, QPN 0x{:06x}, PSN 0x{:06x}, GID {}",
        remote.qpn,
        remote.psn,
        gid_of(remote.addr)
    );
    let opts = ConnectOptions {
        mtu: o.mtu,
        access: Access::NONE,
        ..ConnectOptions::default()
    };
    qp.connect(&remote, &opts)?;
    Ok(())
}
