//! Every operation between two processes over loopback: this test starts a
//! copy of its own binary as the target (the `peer_process` entry point,
//! which does nothing unless `RNIC_PEER_PORT` is set), meets it over TCP with
//! the rendezvous helper, and posts each opcode at it.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rnic_verbs::rendezvous::{self, EndpointRecord, RemoteBuffer};
use rnic_verbs::*;

const T: Duration = Duration::from_secs(20);
const LEN: usize = 65536;

fn wr(wr_id: u64, op: SendOp, sg_list: Vec<Sge>) -> SendWr {
    SendWr::new(wr_id, op, sg_list.into())
}

/// The target: a QP, a region and a memory window; it checks the receives
/// the SENDs and WRITE_WITH_IMM consume and prints what it saw.
#[test]
fn peer_process() {
    let Ok(port) = std::env::var("RNIC_PEER_PORT") else {
        return; // run by the test below, as a process of its own
    };
    let port: u16 = port.parse().unwrap();
    let dev = Device::open_loopback().unwrap();
    let pd = dev.alloc_pd().unwrap();
    let rights = Access::LOCAL_WRITE
        | Access::REMOTE_WRITE
        | Access::REMOTE_READ
        | Access::REMOTE_ATOMIC
        | Access::MW_BIND
        | Access::FLUSH_GLOBAL;
    let mr = pd.register(LEN, rights).unwrap();
    let cq = dev.create_cq(64).unwrap();
    let qp = pd.create_rc_qp(&cq, &cq, QpCaps::default()).unwrap();
    let mine = EndpointRecord {
        endpoint: qp.endpoint(),
        buffer: Some(RemoteBuffer {
            va: mr.addr(),
            rkey: mr.rkey(),
            len: LEN as u64,
        }),
    };
    let theirs = rendezvous::serve(port, &mine).unwrap();
    let o = ConnectOptions {
        access: Access::REMOTE_WRITE
            | Access::REMOTE_READ
            | Access::REMOTE_ATOMIC
            | Access::FLUSH_GLOBAL,
        ..ConnectOptions::default()
    };
    qp.connect(&theirs.endpoint, &o).unwrap();
    // Receives can be posted from INIT on; a SEND that comes first meets an
    // RNR NAK and is retried.
    for i in 0..4 {
        qp.post_recv(RecvWr {
            wr_id: 100 + i,
            sg_list: sg_list![mr.sge(32768 + 1024 * i as usize, 1024)],
        })
        .unwrap();
    }
    // A window over 256 bytes at 16 KiB, for this QP's peer only.
    let mw = pd.alloc_mw().unwrap();
    let win = qp
        .bind_mw(1, &mw, &mr, 16384, 256, Access::REMOTE_WRITE)
        .unwrap();
    let c = cq.wait(T).unwrap();
    assert_eq!((c.opcode, c.status), (WcOpcode::BindMw, WcStatus::Success));
    let window = EndpointRecord {
        endpoint: qp.endpoint(),
        buffer: Some(RemoteBuffer {
            va: mr.addr() + 16384,
            rkey: win,
            len: 256,
        }),
    };
    rendezvous::serve(port + 1, &window).unwrap();
    // Four receives: SEND, SEND_WITH_IMM, WRITE_WITH_IMM, SEND_WITH_INV.
    let mut out = std::io::stdout().lock();
    for _ in 0..4 {
        let c = cq.wait(T).unwrap();
        // A WRITE_WITH_IMM's data went where its RETH said, not here.
        let mut data = vec![0u8; c.byte_len as usize];
        if c.opcode == WcOpcode::Recv {
            mr.read(32768 + 1024 * (c.wr_id - 100) as usize, &mut data);
        } else {
            data.clear();
        }
        writeln!(
            out,
            "recv {} {} {} len={} imm={:?} inv={:?} data={}",
            c.wr_id,
            c.opcode,
            c.status,
            c.byte_len,
            c.imm_data,
            c.invalidated_rkey.map(|k| k == win),
            String::from_utf8_lossy(&data)
        )
        .unwrap();
    }
    out.flush().unwrap();
    // Stay until the other side has finished with this memory.
    let _ = rendezvous::serve(port + 2, &mine);
}

#[test]
fn every_operation_between_two_processes() {
    let port = 40_000 + (std::process::id() % 5_000) as u16 * 3;
    let mut peer = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "peer_process", "--nocapture", "--test-threads=1"])
        .env("RNIC_PEER_PORT", port.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();

    let dev = Device::open_loopback().unwrap();
    let pd = dev.alloc_pd().unwrap();
    let mr = pd
        .register(LEN, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    let cq = dev.create_cq(64).unwrap();
    let qp = pd.create_rc_qp(&cq, &cq, QpCaps::default()).unwrap();
    let mine = EndpointRecord {
        endpoint: qp.endpoint(),
        buffer: None,
    };
    let theirs = match rendezvous::connect("127.0.0.1", port, &mine, T) {
        Ok(t) => t,
        Err(e) => {
            let _ = peer.kill();
            let out = peer.wait_with_output().unwrap();
            panic!(
                "no peer on port {port}: {e}\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    };
    qp.connect(&theirs.endpoint, &ConnectOptions::default())
        .unwrap();
    let b = theirs.buffer.unwrap();
    let win = rendezvous::connect("127.0.0.1", port + 1, &mine, T)
        .unwrap()
        .buffer
        .unwrap();

    mr.write(0, b"0123456789abcdef");
    mr.write(64, &7u64.to_ne_bytes());
    let (va, rkey) = (b.va, b.rkey);
    let ops: Vec<(SendOp, Vec<Sge>, WcOpcode)> = vec![
        (SendOp::send(), vec![mr.sge(0, 4)], WcOpcode::Send),
        (SendOp::send_imm(0xAB), vec![mr.sge(4, 4)], WcOpcode::Send),
        (
            SendOp::write(va, rkey),
            vec![mr.sge(0, 16)],
            WcOpcode::RdmaWrite,
        ),
        (
            SendOp::write_imm(va + 16, rkey, 0xCD),
            vec![mr.sge(8, 8)],
            WcOpcode::RdmaWrite,
        ),
        (
            SendOp::read(va, rkey),
            vec![mr.sge(1024, 24)],
            WcOpcode::RdmaRead,
        ),
        (
            SendOp::compare_swap(va + 4096, rkey, 0, 41),
            vec![mr.sge(2048, 8)],
            WcOpcode::CompSwap,
        ),
        (
            SendOp::fetch_add(va + 4096, rkey, 1),
            vec![mr.sge(2056, 8)],
            WcOpcode::FetchAdd,
        ),
        (
            SendOp::AtomicWrite {
                remote_addr: va + 4104,
                rkey,
                data: *b"ATOMIC-W",
            },
            vec![],
            WcOpcode::AtomicWrite,
        ),
        (
            SendOp::Flush {
                remote_addr: va,
                rkey,
                len: 8192,
                placement: 1,
                whole_region: false,
            },
            vec![],
            WcOpcode::Flush,
        ),
        (
            SendOp::read(va + 4096, rkey),
            vec![mr.sge(3072, 16)],
            WcOpcode::RdmaRead,
        ),
        (
            SendOp::write(win.va, win.rkey),
            vec![mr.sge(0, 8)],
            WcOpcode::RdmaWrite,
        ),
        (
            SendOp::SendWithInv {
                invalidate_rkey: win.rkey,
            },
            vec![mr.sge(8, 4)],
            WcOpcode::Send,
        ),
    ];
    for (i, (op, sges, opcode)) in ops.into_iter().enumerate() {
        qp.post_send(wr(i as u64, op, sges)).unwrap();
        let c = cq.wait(T).unwrap();
        assert_eq!(
            (c.wr_id, c.status, c.opcode),
            (i as u64, WcStatus::Success, opcode),
            "request {i}"
        );
    }
    let mut got = [0u8; 24];
    mr.read(1024, &mut got);
    assert_eq!(
        &got, b"0123456789abcdef89abcdef",
        "WRITE, WRITE_WITH_IMM, READ"
    );
    let word = |at: usize| {
        let mut w = [0u8; 8];
        mr.read(at, &mut w);
        u64::from_ne_bytes(w)
    };
    assert_eq!((word(2048), word(2056)), (0, 41), "CAS then FETCH_ADD saw");
    let mut atomics = [0u8; 16];
    mr.read(3072, &mut atomics);
    assert_eq!(atomics[..8], 42u64.to_ne_bytes());
    assert_eq!(&atomics[8..], b"ATOMIC-W");
    // The window is closed now.
    qp.post_send(wr(99, SendOp::write(win.va, win.rkey), vec![mr.sge(0, 8)]))
        .unwrap();
    assert_eq!(cq.wait(T).unwrap().status, WcStatus::RemAccessErr);
    let _ = rendezvous::connect("127.0.0.1", port + 2, &mine, T);

    let deadline = Instant::now() + T;
    while peer.try_wait().unwrap().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = peer.kill();
    let out = peer.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "peer: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // (The test harness may print its own words before the first line.)
    let recvs: Vec<&str> = text
        .lines()
        .filter_map(|l| l.find("recv ").map(|i| &l[i..]))
        .collect();
    assert_eq!(
        recvs,
        [
            "recv 100 IBV_WC_RECV IBV_WC_SUCCESS len=4 imm=None inv=None data=0123",
            "recv 101 IBV_WC_RECV IBV_WC_SUCCESS len=4 imm=Some(171) inv=None data=4567",
            "recv 102 IBV_WC_RECV_RDMA_WITH_IMM IBV_WC_SUCCESS len=8 imm=Some(205) inv=None data=",
            "recv 103 IBV_WC_RECV IBV_WC_SUCCESS len=4 imm=None inv=Some(true) data=89ab",
        ],
        "{text}"
    );
}
