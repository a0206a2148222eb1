//! `rnic demo`: two software NICs in this process, on loopback, and one of each
//! RDMA operation, told step by step: what was posted, the packets on the wire,
//! what each side's CPU saw.

use std::io::{self, Write};
use std::path::Path;
use std::time::Duration;

use rnic_verbs::*;
use rnic_wire::aeth::Syndrome;
use rnic_wire::IbPacket;

const T: Duration = Duration::from_secs(5);
const LEN: usize = 64 * 1024;

struct Nic {
    dev: Device,
    _pd: ProtectionDomain,
    mr: MemoryRegion,
    cq: CompletionQueue,
    qp: QueuePair,
}

fn nic() -> Result<Nic> {
    let dev = Device::open_loopback()?;
    let pd = dev.alloc_pd()?;
    let mr = pd.register(
        LEN,
        Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC,
    )?;
    let cq = dev.create_cq(64)?;
    let qp = pd.create_rc_qp(&cq, &cq, QpCaps::default())?;
    Ok(Nic {
        dev,
        _pd: pd,
        mr,
        cq,
        qp,
    })
}

/// Prints what a tap saw.
struct Wire {
    tap: TapReceiver,
    a: std::net::IpAddr,
    packets: usize,
}

impl Wire {
    fn show(&mut self, out: &mut impl Write) -> io::Result<()> {
        // Everything of a step was tapped before its completion was delivered
        // (the engine taps a packet as it sends or receives it); the pause
        // only lets a step's trailing ACK be printed with its step.
        std::thread::sleep(Duration::from_millis(5));
        while let Ok(ev) = self.tap.try_recv() {
            self.packets += 1;
            let d = &ev.datagram;
            let dir = if d.src == self.a { "A > B" } else { "B > A" };
            let Ok(p) = IbPacket::new_checked(&d.payload[..]) else {
                writeln!(out, "     wire  {dir}  (unparsable)")?;
                continue;
            };
            let bth = p.bth();
            let mut line = format!(
                "     wire  {dir}  {:<33} psn {:#08x}",
                p.info().name,
                bth.psn().value()
            );
            if bth.ack_req() {
                line.push_str("  AckReq");
            }
            if let Some(r) = p.reth() {
                line.push_str(&format!(
                    "  RETH va={:#x} rkey={:#x} len={}",
                    r.va(),
                    r.r_key(),
                    r.dma_length()
                ));
            }
            if let Some(a) = p.atomic_eth() {
                line.push_str(&format!(
                    "  AtomicETH swap/add={:#x} compare={:#x}",
                    a.swap_or_add_data(),
                    a.compare_data()
                ));
            }
            if let Some(a) = p.aeth() {
                line.push_str(&format!(
                    "  AETH {} msn={}",
                    Syndrome::from_byte(a.syndrome()),
                    a.msn()
                ));
            }
            if let Some(a) = p.atomic_ack_eth() {
                line.push_str(&format!("  orig={:#x}", a.orig_rem_dt()));
            }
            if let Some(i) = p.immdt() {
                line.push_str(&format!("  imm={:#x}", i.immediate()));
            }
            if p.info().has_payload {
                line.push_str(&format!("  {} bytes", p.payload().len()));
            }
            writeln!(out, "{line}")?;
        }
        Ok(())
    }
}

fn completion(out: &mut impl Write, who: &str, c: &Completion) -> io::Result<()> {
    writeln!(
        out,
        "     {who}: completion wr_id {} {} {}{}",
        c.wr_id,
        c.opcode,
        c.status,
        if c.byte_len > 0 {
            format!(", {} bytes", c.byte_len)
        } else {
            String::new()
        }
    )
}

fn wr(wr_id: u64, op: SendOp, sg: Sge) -> SendWr {
    SendWr::new(wr_id, op, sg_list![sg])
}

fn expect(ok: bool, what: &str, failures: &mut Vec<String>) {
    if !ok {
        failures.push(what.to_string());
    }
}

/// Run the demo, its packets captured in `pcap` (named in the output if
/// `announce`); returns whether every check passed.
pub fn run(
    pcap: Option<&Path>,
    announce: bool,
) -> std::result::Result<bool, Box<dyn std::error::Error>> {
    let stdout = io::stdout();
    let mut out = stdout.lock();
    let a = nic()?;
    let b = nic()?;
    let opts = ConnectOptions::default();
    a.qp.connect(&b.qp.endpoint(), &opts)?;
    b.qp.connect(&a.qp.endpoint(), &opts)?;
    if let Some(p) = pcap {
        a.dev.capture(p)?;
        b.dev.capture(p)?;
    }
    let mut wire = Wire {
        tap: a.dev.tap()?,
        a: a.dev.addr(),
        packets: 0,
    };
    let mut failures = Vec::new();

    writeln!(out, "rnic demo: two software RoCE v2 NICs in this process, talking over UDP port 4791 on loopback")?;
    for (name, n) in [("A", &a), ("B", &b)] {
        writeln!(
            out,
            "  NIC {name}: {}  GID {}  RC QP {:#x}  64 KiB registered at {:#x}, rkey {:#x}",
            n.dev.addr(),
            n.dev.gid(),
            n.qp.qpn(),
            n.mr.addr(),
            n.mr.rkey()
        )?;
    }
    writeln!(
        out,
        "  connected: path MTU 1024, so messages over 1 KiB travel as several packets\n"
    )?;

    // 1. SEND: two-sided.
    let msg: Vec<u8> = b"Hello over RoCE v2! "
        .iter()
        .copied()
        .cycle()
        .take(3000)
        .collect();
    a.mr.write(0, &msg);
    writeln!(out, "1. SEND 3000 bytes from A to B")?;
    writeln!(
        out,
        "   B posts a receive buffer first: a SEND lands only in memory the target offered."
    )?;
    b.qp.post_recv(RecvWr {
        wr_id: 100,
        sg_list: sg_list![b.mr.sge(8192, 4096)],
    })?;
    a.qp.post_send(wr(1, SendOp::send(), a.mr.sge(0, 3000)))?;
    let ca = a.cq.wait(T)?;
    let cb = b.cq.wait(T)?;
    wire.show(&mut out)?;
    completion(&mut out, "A", &ca)?;
    completion(&mut out, "B", &cb)?;
    let mut got = vec![0u8; 3000];
    b.mr.read(8192, &mut got);
    expect(
        got == msg && ca.status == WcStatus::Success && cb.byte_len == 3000,
        "SEND",
        &mut failures,
    );
    writeln!(
        out,
        "   B's CPU is told (a receive completion): SEND is two-sided.\n"
    )?;

    // 2. RDMA WRITE: one-sided.
    let pattern: Vec<u8> = (0..2048u32).map(|i| (i * 7) as u8).collect();
    a.mr.write(4096, &pattern);
    writeln!(
        out,
        "2. RDMA WRITE 2048 bytes from A into B's memory at {:#x}",
        b.mr.addr()
    )?;
    a.qp.post_send(wr(
        2,
        SendOp::write(b.mr.addr(), b.mr.rkey()),
        a.mr.sge(4096, 2048),
    ))?;
    let ca = a.cq.wait(T)?;
    wire.show(&mut out)?;
    completion(&mut out, "A", &ca)?;
    let mut got = vec![0u8; 2048];
    b.mr.read(0, &mut got);
    expect(
        got == pattern && b.cq.poll().is_empty(),
        "WRITE",
        &mut failures,
    );
    writeln!(
        out,
        "   B's CPU did nothing and was told nothing: the NIC wrote B's memory (one-sided).\n"
    )?;

    // 3. WRITE with immediate: one-sided data, plus a notification.
    writeln!(
        out,
        "3. RDMA WRITE WITH IMMEDIATE: 16 bytes, and 0xcafe for B's CPU"
    )?;
    b.qp.post_recv(RecvWr {
        wr_id: 101,
        sg_list: sg_list![],
    })?;
    a.qp.post_send(wr(
        3,
        SendOp::write_imm(b.mr.addr() + 2048, b.mr.rkey(), 0xcafe),
        a.mr.sge(4096, 16),
    ))?;
    let ca = a.cq.wait(T)?;
    let cb = b.cq.wait(T)?;
    wire.show(&mut out)?;
    completion(&mut out, "A", &ca)?;
    completion(&mut out, "B", &cb)?;
    expect(
        cb.imm_data == Some(0xcafe) && cb.opcode == WcOpcode::RecvRdmaWithImm,
        "WRITE_WITH_IMM",
        &mut failures,
    );
    writeln!(
        out,
        "   The data went straight to memory; the immediate consumed one receive to notify B.\n"
    )?;

    // 4. READ.
    writeln!(
        out,
        "4. RDMA READ: A fetches the 2048 bytes it wrote, into its own memory at offset 16384"
    )?;
    a.qp.post_send(wr(
        4,
        SendOp::read(b.mr.addr(), b.mr.rkey()),
        a.mr.sge(16384, 2048),
    ))?;
    let ca = a.cq.wait(T)?;
    wire.show(&mut out)?;
    completion(&mut out, "A", &ca)?;
    let mut got = vec![0u8; 2048];
    a.mr.read(16384, &mut got);
    expect(
        got == pattern && b.cq.poll().is_empty(),
        "READ",
        &mut failures,
    );
    writeln!(
        out,
        "   B's NIC answered from B's memory; B's CPU did nothing.\n"
    )?;

    // 5-6. Atomics on B's counter at offset 4096.
    b.mr.write(4096, &7u64.to_ne_bytes());
    writeln!(
        out,
        "5. CMP_AND_SWP on B's 8-byte counter (7): if it is 7, make it 100"
    )?;
    a.qp.post_send(wr(
        5,
        SendOp::compare_swap(b.mr.addr() + 4096, b.mr.rkey(), 7, 100),
        a.mr.sge(32768, 8),
    ))?;
    let ca = a.cq.wait(T)?;
    wire.show(&mut out)?;
    completion(&mut out, "A", &ca)?;
    let mut v = [0u8; 8];
    a.mr.read(32768, &mut v);
    let orig = u64::from_ne_bytes(v);
    writeln!(
        out,
        "   A got the value it found: {orig}; B's counter is now 100.\n"
    )?;
    expect(orig == 7, "CMP_AND_SWP", &mut failures);

    writeln!(out, "6. FETCH_AND_ADD 5 to B's counter")?;
    a.qp.post_send(wr(
        6,
        SendOp::fetch_add(b.mr.addr() + 4096, b.mr.rkey(), 5),
        a.mr.sge(32776, 8),
    ))?;
    let ca = a.cq.wait(T)?;
    wire.show(&mut out)?;
    completion(&mut out, "A", &ca)?;
    a.mr.read(32776, &mut v);
    let fetched = u64::from_ne_bytes(v);
    b.mr.read(4096, &mut v);
    let now = u64::from_ne_bytes(v);
    writeln!(
        out,
        "   A got {fetched}; B's counter is now {now}. Atomic at B's NIC, no B CPU involved.\n"
    )?;
    expect(
        fetched == 100 && now == 105 && b.cq.poll().is_empty(),
        "FETCH_AND_ADD",
        &mut failures,
    );

    let counters = (a.dev.counters()?, b.dev.counters()?);
    writeln!(out, "Summary")?;
    writeln!(
        out,
        "  6 operations, {} packets on the wire, every ICRC verified by the receiver",
        wire.packets
    )?;
    writeln!(
        out,
        "  A sent {} and received {}; B sent {} and received {}; ICRC errors {}",
        counters.0.sent_pkts,
        counters.0.rcvd_pkts,
        counters.1.sent_pkts,
        counters.1.rcvd_pkts,
        counters.0.icrc_errors + counters.1.icrc_errors
    )?;
    if let (Some(p), true) = (pcap, announce) {
        writeln!(
            out,
            "  capture written to {} (open it in Wireshark, or: rnic dump {})",
            p.display(),
            p.display()
        )?;
    }
    if failures.is_empty() {
        writeln!(out, "  memory verified: every operation did what it should")?;
    } else {
        writeln!(out, "  FAILED: {}", failures.join(", "))?;
    }
    Ok(failures.is_empty())
}
