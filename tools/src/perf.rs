//! `rnic perf`: perftest-like bandwidth and latency of RDMA operations between
//! two rnic NICs, next to a raw UDP baseline measured in the same run.

use std::io::{self, Write};
use std::net::UdpSocket;
use std::time::{Duration, Instant};

use rnic_verbs::*;

/// What to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Op {
    /// RDMA WRITE.
    Write,
    /// RDMA READ.
    Read,
    /// SEND into posted receives.
    Send,
}

/// Options, as perftest spells them where it can.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// The operation.
    pub op: Op,
    /// Message size in bytes.
    pub size: u32,
    /// Messages.
    pub iterations: u64,
    /// Work requests outstanding at once (bandwidth mode).
    pub tx_depth: u32,
    /// Latency mode: one message at a time.
    pub latency: bool,
    /// Print JSON instead of a table.
    pub json: bool,
}

const T: Duration = Duration::from_secs(30);

struct Pair {
    a: (
        Device,
        ProtectionDomain,
        MemoryRegion,
        CompletionQueue,
        QueuePair,
    ),
    b: (
        Device,
        ProtectionDomain,
        MemoryRegion,
        CompletionQueue,
        QueuePair,
    ),
}

fn side(
    len: usize,
) -> Result<(
    Device,
    ProtectionDomain,
    MemoryRegion,
    CompletionQueue,
    QueuePair,
)> {
    let dev = Device::open_loopback()?;
    let pd = dev.alloc_pd()?;
    let mr = pd.register(
        len,
        Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
    )?;
    let cq = dev.create_cq(1 << 16)?;
    let caps = QpCaps {
        max_send_wr: 4096,
        max_recv_wr: 4096,
        ..QpCaps::default()
    };
    let qp = pd.create_rc_qp(&cq, &cq, caps)?;
    Ok((dev, pd, mr, cq, qp))
}

fn connect(len: usize) -> Result<Pair> {
    let a = side(len)?;
    let b = side(len)?;
    let o = ConnectOptions::default();
    a.4.connect(&b.4.endpoint(), &o)?;
    b.4.connect(&a.4.endpoint(), &o)?;
    Ok(Pair { a, b })
}

fn wr(p: &Pair, op: Op, id: u64, size: u32) -> SendWr {
    let (mr_a, mr_b) = (&p.a.2, &p.b.2);
    let op = match op {
        Op::Write => SendOp::Write {
            remote_addr: mr_b.addr(),
            rkey: mr_b.rkey(),
            imm: None,
        },
        Op::Read => SendOp::Read {
            remote_addr: mr_b.addr(),
            rkey: mr_b.rkey(),
        },
        Op::Send => SendOp::Send { imm: None },
    };
    SendWr {
        wr_id: id,
        op,
        sg_list: vec![mr_a.sge(0, size)],
        signaled: true,
        solicited: false,
        fence: false,
        inline: None,
    }
}

fn post_recv(p: &Pair, id: u64, size: u32) -> Result<()> {
    p.b.4.post_recv(RecvWr {
        wr_id: id,
        sg_list: vec![p.b.2.sge(0, size)],
    })
}

/// Raw UDP on the same loopback addresses: the same bytes as datagrams of one
/// PMTU's payload, sent and received by two threads. Bytes/s of payload.
fn udp_baseline(total: u64) -> io::Result<f64> {
    let rx = UdpSocket::bind("127.0.0.1:0")?;
    rx.set_read_timeout(Some(Duration::from_millis(200)))?;
    // The same socket buffers as rnic's engine asks for.
    let _ = rustix::net::sockopt::set_socket_recv_buffer_size(&rx, 4 << 20);
    let to = rx.local_addr()?;
    let chunk = 1024usize;
    let n = total.div_ceil(chunk as u64).max(1);
    let sender = std::thread::spawn(move || -> io::Result<()> {
        let tx = UdpSocket::bind("127.0.0.1:0")?;
        let buf = vec![0x5Au8; chunk];
        for _ in 0..n {
            // Loopback drops when the receiver lags; pace by yielding on error.
            while tx.send_to(&buf, to).is_err() {
                std::thread::yield_now();
            }
        }
        Ok(())
    });
    let mut buf = vec![0u8; 2048];
    let start = Instant::now();
    let mut got = 0u64;
    let mut last = start;
    while got < n {
        match rx.recv(&mut buf) {
            Ok(_) => {
                got += 1;
                last = Instant::now();
            }
            Err(_) => break, // the rest were dropped by the kernel
        }
    }
    // Up to the last datagram received, not the timeout after it.
    let elapsed = last - start;
    let _ = sender.join();
    Ok(got as f64 * chunk as f64 / elapsed.as_secs_f64())
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i]
}

/// Run; false if any operation failed.
pub fn run(o: &Options) -> std::result::Result<bool, Box<dyn std::error::Error>> {
    let p = connect((o.size as usize).max(4096))?;
    let stdout = io::stdout();
    let mut out = stdout.lock();
    let mut ok = true;
    if o.latency {
        let mut lat = Vec::with_capacity(o.iterations as usize);
        for i in 0..o.iterations {
            if o.op == Op::Send {
                post_recv(&p, i, o.size)?;
            }
            let t = Instant::now();
            p.a.4.post_send(wr(&p, o.op, i, o.size))?;
            let c = p.a.3.wait(T)?;
            lat.push(t.elapsed());
            ok &= c.status == WcStatus::Success;
            if o.op == Op::Send {
                ok &= p.b.3.wait(T)?.status == WcStatus::Success;
            }
        }
        lat.sort();
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        if o.json {
            writeln!(
                out,
                "{{\"op\":\"{:?}\",\"bytes\":{},\"iterations\":{},\"lat_min_us\":{:.2},\"lat_p50_us\":{:.2},\"lat_p99_us\":{:.2},\"lat_max_us\":{:.2}}}",
                o.op, o.size, o.iterations, us(lat[0]), us(percentile(&lat, 0.5)), us(percentile(&lat, 0.99)), us(lat[lat.len() - 1])
            )?;
        } else {
            writeln!(
                out,
                " {:?} latency, completion to completion, two rnic NICs on loopback",
                o.op
            )?;
            writeln!(
                out,
                " #bytes  #iterations  t_min[usec]  t_p50[usec]  t_p99[usec]  t_max[usec]"
            )?;
            writeln!(
                out,
                " {:<7} {:<12} {:<12.2} {:<12.2} {:<12.2} {:.2}",
                o.size,
                o.iterations,
                us(lat[0]),
                us(percentile(&lat, 0.5)),
                us(percentile(&lat, 0.99)),
                us(lat[lat.len() - 1])
            )?;
        }
        return Ok(ok);
    }

    // Bandwidth: keep tx_depth requests outstanding.
    let depth = u64::from(o.tx_depth.max(1));
    if o.op == Op::Send {
        for i in 0..depth.min(o.iterations) {
            post_recv(&p, i, o.size)?;
        }
    }
    let start = Instant::now();
    let (mut posted, mut done, mut recvs_posted) = (0u64, 0u64, depth.min(o.iterations));
    let window = (o.iterations / 10).max(1);
    let mut peak = 0.0f64;
    let mut window_start = (Instant::now(), 0u64);
    while done < o.iterations {
        while posted < o.iterations && posted - done < depth {
            p.a.4.post_send(wr(&p, o.op, posted, o.size))?;
            posted += 1;
        }
        let c = p.a.3.wait(T)?;
        ok &= c.status == WcStatus::Success;
        done += 1;
        for c in p.a.3.poll() {
            ok &= c.status == WcStatus::Success;
            done += 1;
        }
        if o.op == Op::Send {
            for c in p.b.3.poll() {
                ok &= c.status == WcStatus::Success;
                if recvs_posted < o.iterations {
                    post_recv(&p, recvs_posted, o.size)?;
                    recvs_posted += 1;
                }
            }
        }
        if done - window_start.1 >= window {
            let bytes = (done - window_start.1) as f64 * f64::from(o.size);
            peak = peak.max(bytes / window_start.0.elapsed().as_secs_f64());
            window_start = (Instant::now(), done);
        }
        if !ok {
            break;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let bytes = o.iterations as f64 * f64::from(o.size);
    let avg = bytes / secs;
    let peak = peak.max(avg);
    let base = udp_baseline(bytes as u64)?;
    let retries = p.a.0.counters()?.completer_retry_err;
    let gbit = |b: f64| b * 8.0 / 1e9;
    let mpps = o.iterations as f64 / secs / 1e6;
    if o.json {
        writeln!(
            out,
            "{{\"op\":\"{:?}\",\"bytes\":{},\"iterations\":{},\"bw_peak_gbps\":{:.3},\"bw_avg_gbps\":{:.3},\"msg_rate_mpps\":{:.4},\"udp_baseline_gbps\":{:.3},\"ratio_to_udp\":{:.3},\"retransmissions\":{},\"ok\":{}}}",
            o.op, o.size, o.iterations, gbit(peak), gbit(avg), mpps, gbit(base), avg / base, retries, ok
        )?;
    } else {
        writeln!(
            out,
            " {:?} bandwidth, two rnic NICs on loopback, {} outstanding",
            o.op, depth
        )?;
        writeln!(
            out,
            " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]"
        )?;
        writeln!(
            out,
            " {:<10} {:<14} {:<18.3} {:<20.3} {:.4}",
            o.size,
            o.iterations,
            gbit(peak),
            gbit(avg),
            mpps
        )?;
        writeln!(
            out,
            " baseline: raw UDP on loopback, 1024-byte datagrams, same bytes: {:.3} Gb/s; rnic / raw UDP = {:.3}",
            gbit(base),
            avg / base
        )?;
        writeln!(out, " retransmissions (timeouts, sequence NAKs): {retries}")?;
    }
    Ok(ok)
}
