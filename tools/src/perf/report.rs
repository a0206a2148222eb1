//! The UDP baseline measured in the same run over the same addresses, and
//! what is printed: a table as perftest prints it, or JSON lines.

use std::io::{self, Write};
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use super::{percentile, Mode, Op, Options, Row};

/// Raw UDP between the same two addresses: `n` datagrams of `chunk` bytes,
/// sent by one thread and received by another.
pub(super) fn udp_baseline_local(
    from: IpAddr,
    to: IpAddr,
    n: u64,
    chunk: usize,
) -> io::Result<f64> {
    let rx = UdpSocket::bind(SocketAddr::new(to, 0))?;
    let dest = rx.local_addr()?;
    let _ = rustix::net::sockopt::set_socket_recv_buffer_size(&rx, 4 << 20);
    let sender = std::thread::spawn(move || udp_send(from, dest, n, chunk));
    let got = udp_receive(&rx, n, chunk)?;
    let _ = sender.join();
    Ok(got)
}

pub(super) fn udp_send(from: IpAddr, to: SocketAddr, n: u64, chunk: usize) -> io::Result<()> {
    let tx = UdpSocket::bind(SocketAddr::new(from, 0))?;
    let buf = vec![0x5Au8; chunk];
    for _ in 0..n {
        // Loopback drops when the receiver lags; pace by yielding on error.
        while tx.send_to(&buf, to).is_err() {
            std::thread::yield_now();
        }
    }
    Ok(())
}

/// Receive up to `n` datagrams; payload bytes per second from the first to the last.
pub(super) fn udp_receive(rx: &UdpSocket, n: u64, chunk: usize) -> io::Result<f64> {
    rx.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut buf = vec![0u8; 65536];
    rx.recv(&mut buf)?;
    rx.set_read_timeout(Some(Duration::from_millis(200)))?;
    let start = Instant::now();
    let (mut got, mut last) = (1u64, start);
    while got < n {
        match rx.recv(&mut buf) {
            Ok(_) => {
                got += 1;
                last = Instant::now();
            }
            Err(_) => break, // the rest were dropped by the kernel
        }
    }
    let secs = (last - start).as_secs_f64().max(1e-9);
    Ok((got - 1) as f64 * chunk as f64 / secs)
}

/// The raw UDP transfer to compare with: datagrams of one message (at most
/// one PMTU) each, as many as the largest size's run moved (at least 1000).
pub(super) fn baseline_plan(o: &Options, rows: &[Row]) -> (u64, usize) {
    let size = rows.iter().map(|r| r.size).max().unwrap_or(8) as usize;
    let chunk = size.clamp(1, o.mtu.bytes());
    let bytes = rows
        .iter()
        .filter(|r| r.size as usize == size)
        .filter_map(|r| r.bw.map(|b| b.bytes))
        .max()
        .unwrap_or(0);
    (bytes.div_ceil(chunk as u64).max(1000), chunk)
}

pub(crate) fn gbit(bytes_per_sec: f64) -> f64 {
    bytes_per_sec * 8.0 / 1e9
}

/// `outstanding`: READs and atomics outstanding per QP, as the first QP
/// has it (see `Local::outstanding`).
pub(super) fn print_header(o: &Options, outstanding: u8, out: &mut impl Write) -> io::Result<()> {
    if o.json {
        return Ok(());
    }
    let mut how = match &o.mode {
        Mode::Loopback => "two rnic NICs in this process".to_string(),
        Mode::Server => "server side".to_string(),
        Mode::Client(h) => format!("client of {h}"),
    };
    if o.cm {
        how.push_str(", connected through the CM");
    }
    let outs = match o.op {
        Op::Read => format!(", {outstanding} READs outstanding per QP"),
        Op::Atomic => format!(", {outstanding} atomics outstanding per QP"),
        Op::Write | Op::Send => String::new(),
    };
    writeln!(
        out,
        " RDMA {} {}{}, {} QP(s), PMTU {}{}, {}",
        o.op.name().to_uppercase(),
        match (o.latency, o.op.ping_pong()) {
            (false, _) => "bandwidth",
            (true, true) => "latency (half a ping-pong's round trip, as perftest)",
            (true, false) => "latency (post to completion, as perftest)",
        },
        match (o.bidir, &o.mode) {
            (false, _) => "",
            (true, Mode::Loopback) => " (both directions, summed)",
            (true, _) => " (both directions; this side's requests)",
        },
        o.qps.max(1),
        o.mtu.bytes(),
        outs,
        how
    )?;
    if o.latency {
        writeln!(
            out,
            " #bytes     #iterations    t_min[usec]    t_p50[usec]    t_p99[usec]    t_max[usec]"
        )
    } else {
        writeln!(
            out,
            " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]"
        )
    }
}

pub(super) fn print_row(o: &Options, r: &Row, out: &mut impl Write) -> io::Result<()> {
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    if let Some(lat) = &r.lat {
        if lat.is_empty() {
            return Ok(());
        }
        let (min, p50, p99, max) = (
            us(lat[0]),
            us(percentile(lat, 0.5)),
            us(percentile(lat, 0.99)),
            us(lat[lat.len() - 1]),
        );
        if o.json {
            writeln!(
                out,
                "{{\"op\":\"{}\",\"bytes\":{},\"iterations\":{},\"lat_min_us\":{min:.2},\"lat_p50_us\":{p50:.2},\"lat_p99_us\":{p99:.2},\"lat_max_us\":{max:.2},\"ok\":{}}}",
                o.op.name(), r.size, lat.len(), r.failures == 0
            )
        } else {
            writeln!(
                out,
                " {:<10} {:<14} {min:<14.2} {p50:<14.2} {p99:<14.2} {max:.2}",
                r.size,
                lat.len()
            )
        }
    } else if let Some(b) = r.bw {
        let avg = b.bytes_per_sec();
        let mpps = b.messages_per_sec() / 1e6;
        if o.json {
            writeln!(
                out,
                "{{\"op\":\"{}\",\"bytes\":{},\"iterations\":{},\"qps\":{},\"bidir\":{},\"bw_peak_gbps\":{:.3},\"bw_avg_gbps\":{:.3},\"msg_rate_mpps\":{mpps:.4},\"ok\":{}}}",
                o.op.name(), r.size, b.messages, o.qps.max(1), o.bidir, gbit(b.peak), gbit(avg), r.failures == 0
            )
        } else {
            writeln!(
                out,
                " {:<10} {:<14} {:<18.3} {:<20.3} {mpps:.4}",
                r.size,
                b.messages,
                gbit(b.peak),
                gbit(avg)
            )
        }
    } else {
        Ok(())
    }
}

pub(super) fn print_baseline(
    o: &Options,
    rows: &[Row],
    base: f64,
    chunk: usize,
    out: &mut impl Write,
) -> io::Result<()> {
    // The largest size's bandwidth, against datagrams of its size.
    let size = rows.iter().map(|r| r.size).max().unwrap_or(0);
    let best = rows
        .iter()
        .filter(|r| r.size == size)
        .filter_map(|r| r.bw.map(|b| b.bytes_per_sec()))
        .fold(0.0f64, f64::max);
    let ratio = if base > 0.0 { best / base } else { 0.0 };
    if o.json {
        writeln!(
            out,
            "{{\"udp_baseline_gbps\":{:.3},\"udp_datagram_bytes\":{chunk},\"bytes\":{size},\"bw_avg_gbps\":{:.3},\"ratio_to_udp\":{ratio:.3}}}",
            gbit(base),
            gbit(best)
        )
    } else {
        writeln!(
            out,
            " baseline: raw UDP between the same addresses, {chunk}-byte datagrams: {:.3} Gb/s; rnic {size} B / raw UDP = {ratio:.3}",
            gbit(base)
        )
    }
}
