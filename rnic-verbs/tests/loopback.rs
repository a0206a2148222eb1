//! Two NICs in one process, on loopback addresses, over real UDP sockets.

use std::time::Duration;

use rnic_verbs::*;

struct Side {
    _dev: Device,
    _pd: ProtectionDomain,
    mr: MemoryRegion,
    cq: CompletionQueue,
    qp: QueuePair,
}

fn side() -> Side {
    let dev = Device::open_loopback().expect("a loopback address");
    let pd = dev.alloc_pd().unwrap();
    let mr = pd
        .register(
            65536,
            Access::LOCAL_WRITE
                | Access::REMOTE_WRITE
                | Access::REMOTE_READ
                | Access::REMOTE_ATOMIC,
        )
        .unwrap();
    let cq = dev.create_cq(256).unwrap();
    let qp = pd.create_rc_qp(&cq, &cq, QpCaps::default()).unwrap();
    Side {
        _dev: dev,
        _pd: pd,
        mr,
        cq,
        qp,
    }
}

fn pair() -> (Side, Side) {
    let (a, b) = (side(), side());
    let o = ConnectOptions::default();
    a.qp.connect(&b.qp.endpoint(), &o).unwrap();
    b.qp.connect(&a.qp.endpoint(), &o).unwrap();
    (a, b)
}

fn wr(wr_id: u64, op: SendOp, sg_list: Vec<Sge>) -> SendWr {
    SendWr::new(wr_id, op, sg_list.into())
}

const T: Duration = Duration::from_secs(10);

#[test]
fn every_operation_over_udp() {
    let (a, b) = pair();
    let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
    assert!(a.mr.write(0, &data));

    // WRITE 10 kB (ten packets), then READ it back into another place.
    let remote = b.mr.addr();
    a.qp.post_send(wr(
        1,
        SendOp::write(remote, b.mr.rkey()),
        vec![a.mr.sge(0, 10_000)],
    ))
    .unwrap();
    a.qp.post_send(wr(
        2,
        SendOp::read(remote, b.mr.rkey()),
        vec![a.mr.sge(20_000, 10_000)],
    ))
    .unwrap();
    for id in [1, 2] {
        let c = a.cq.wait(T).unwrap();
        assert_eq!((c.wr_id, c.status), (id, WcStatus::Success));
    }
    let mut back = vec![0u8; 10_000];
    assert!(a.mr.read(20_000, &mut back));
    assert_eq!(back, data);
    let mut at_b = vec![0u8; 10_000];
    assert!(b.mr.read(0, &mut at_b));
    assert_eq!(at_b, data);
    // The target's CPU did nothing and saw nothing.
    assert!(b.cq.poll().is_empty());

    // SEND with immediate into a posted receive.
    b.qp.post_recv(RecvWr {
        wr_id: 9,
        sg_list: sg_list![b.mr.sge(40_000, 4096)],
    })
    .unwrap();
    a.qp.post_send(wr(3, SendOp::send_imm(0x1234), vec![a.mr.sge(0, 3000)]))
        .unwrap();
    assert_eq!(a.cq.wait(T).unwrap().status, WcStatus::Success);
    let r = b.cq.wait(T).unwrap();
    assert_eq!(
        (r.wr_id, r.opcode, r.byte_len, r.imm_data),
        (9, WcOpcode::Recv, 3000, Some(0x1234))
    );

    // Atomics on B's first 8 bytes (they hold data[0..8] now).
    let before = u64::from_ne_bytes(data[..8].try_into().unwrap());
    a.qp.post_send(wr(
        4,
        SendOp::fetch_add(remote, b.mr.rkey(), 5),
        vec![a.mr.sge(50_000, 8)],
    ))
    .unwrap();
    a.qp.post_send(wr(
        5,
        SendOp::compare_swap(remote, b.mr.rkey(), before + 5, 42),
        vec![a.mr.sge(50_008, 8)],
    ))
    .unwrap();
    for id in [4, 5] {
        assert_eq!(a.cq.wait(T).unwrap().wr_id, id);
    }
    let mut v = [0u8; 8];
    b.mr.read(0, &mut v);
    assert_eq!(u64::from_ne_bytes(v), 42);
    a.mr.read(50_000, &mut v);
    assert_eq!(u64::from_ne_bytes(v), before);
    a.mr.read(50_008, &mut v);
    assert_eq!(u64::from_ne_bytes(v), before + 5);
}

#[test]
fn bad_rkey_is_a_remote_access_error() {
    let (a, b) = pair();
    a.qp.post_send(wr(
        1,
        SendOp::write(b.mr.addr(), b.mr.rkey() ^ 0xFF),
        vec![a.mr.sge(0, 8)],
    ))
    .unwrap();
    a.qp.post_send(wr(
        2,
        SendOp::write(b.mr.addr(), b.mr.rkey()),
        vec![a.mr.sge(0, 8)],
    ))
    .unwrap();
    assert_eq!(a.cq.wait(T).unwrap().status, WcStatus::RemAccessErr);
    assert_eq!(a.cq.wait(T).unwrap().status, WcStatus::WrFlushErr);
}

#[test]
fn no_receive_posted_exhausts_rnr_retries() {
    let (a, b) = (side(), side());
    let o = ConnectOptions {
        rnr_retry: 1,
        ..ConnectOptions::default()
    };
    a.qp.connect(&b.qp.endpoint(), &o).unwrap();
    b.qp.connect(&a.qp.endpoint(), &o).unwrap();
    a.qp.post_send(wr(1, SendOp::send(), vec![a.mr.sge(0, 8)]))
        .unwrap();
    assert_eq!(a.cq.wait(T).unwrap().status, WcStatus::RnrRetryExcErr);
}

#[test]
fn a_qp_in_error_flushes_its_work_requests() {
    let (a, b) = pair();
    // Receives waiting on B, then B's QP fails: a bad rkey from B to A.
    for i in 0..3 {
        b.qp.post_recv(RecvWr {
            wr_id: 10 + i,
            sg_list: sg_list![b.mr.sge(0, 64)],
        })
        .unwrap();
    }
    b.qp.post_send(wr(
        1,
        SendOp::read(a.mr.addr(), a.mr.rkey() ^ 0x80),
        vec![b.mr.sge(0, 8)],
    ))
    .unwrap();
    assert_eq!(b.cq.wait(T).unwrap().status, WcStatus::RemAccessErr);
    let flushed: Vec<_> = (0..3).map(|_| b.cq.wait(T).unwrap()).collect();
    assert!(
        flushed.iter().all(|c| c.status == WcStatus::WrFlushErr),
        "{flushed:?}"
    );
    assert_eq!(
        flushed.iter().map(|c| c.wr_id).collect::<Vec<_>>(),
        vec![10, 11, 12]
    );
    // Work posted to a QP in ERR completes at once, flushed.
    b.qp.post_send(wr(2, SendOp::send(), vec![b.mr.sge(0, 8)]))
        .unwrap();
    assert_eq!(b.cq.wait(T).unwrap().status, WcStatus::WrFlushErr);
}

#[test]
fn capacities_beyond_the_device_are_refused() {
    let dev = Device::open_loopback().unwrap();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(16).unwrap();
    let caps = QpCaps {
        max_send_sge: DEVICE_ATTR.max_sge + 1,
        ..QpCaps::default()
    };
    assert!(matches!(
        pd.create_rc_qp(&cq, &cq, caps),
        Err(Error::Verb(VerbError::CapsTooLarge))
    ));
}

#[test]
fn ud_over_udp() {
    let a = Device::open_loopback().unwrap();
    let b = Device::open_loopback().unwrap();
    let (pda, pdb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (mra, mrb) = (
        pda.register(8192, Access::LOCAL_WRITE).unwrap(),
        pdb.register(8192, Access::LOCAL_WRITE).unwrap(),
    );
    let (cqa, cqb) = (a.create_cq(16).unwrap(), b.create_cq(16).unwrap());
    let qa = pda
        .create_qp(QpType::Ud, &cqa, &cqa, QpCaps::default(), None)
        .unwrap();
    let qb = pdb
        .create_qp(QpType::Ud, &cqb, &cqb, QpCaps::default(), None)
        .unwrap();
    qa.ready_ud(0x1111_1111).unwrap();
    qb.ready_ud(0x1111_1111).unwrap();
    qb.post_recv(RecvWr {
        wr_id: 5,
        sg_list: sg_list![mrb.sge(0, 2048)],
    })
    .unwrap();
    mra.write(0, b"datagram");
    let ah = pda.create_ah(b.addr());
    qa.post_send_ud(
        wr(1, SendOp::send(), vec![mra.sge(0, 8)]),
        &ah,
        qb.qpn(),
        0x1111_1111,
    )
    .unwrap();
    assert_eq!(cqa.wait(T).unwrap().status, WcStatus::Success);
    let r = cqb.wait(T).unwrap();
    assert_eq!(
        (r.wr_id, r.byte_len, r.src_qp),
        (5, 8 + GRH_LEN as u32, Some(qa.qpn()))
    );
    let mut got = [0u8; 8];
    mrb.read(GRH_LEN, &mut got);
    assert_eq!(&got, b"datagram");
}

#[test]
fn uc_and_an_srq_shared_by_two_qps() {
    let a = Device::open_loopback().unwrap();
    let b = Device::open_loopback().unwrap();
    let (pda, pdb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let mra = pda.register(4096, Access::LOCAL_WRITE).unwrap();
    let mrb = pdb.register(4096, Access::LOCAL_WRITE).unwrap();
    let (cqa, cqb) = (a.create_cq(16).unwrap(), b.create_cq(16).unwrap());
    let events = b.async_events().unwrap();
    let srq = pdb.create_srq(8, 1).unwrap();
    for id in 0..3 {
        srq.post_recv(RecvWr {
            wr_id: id,
            sg_list: sg_list![mrb.sge(id as usize * 512, 512)],
        })
        .unwrap();
    }
    srq.arm(2).unwrap();
    let o = ConnectOptions::default();
    let mut pairs = Vec::new();
    for t in [QpType::Uc, QpType::Rc] {
        let qa = pda
            .create_qp(t, &cqa, &cqa, QpCaps::default(), None)
            .unwrap();
        let qb = pdb
            .create_qp(t, &cqb, &cqb, QpCaps::default(), Some(&srq))
            .unwrap();
        qa.connect(&qb.endpoint(), &o).unwrap();
        qb.connect(&qa.endpoint(), &o).unwrap();
        pairs.push((qa, qb));
    }
    for (i, (qa, _)) in pairs.iter().enumerate() {
        qa.post_send(wr(i as u64, SendOp::send(), vec![mra.sge(0, 100)]))
            .unwrap();
        assert_eq!(cqa.wait(T).unwrap().status, WcStatus::Success);
        let r = cqb.wait(T).unwrap();
        assert_eq!(
            (r.wr_id, r.qp_num, r.byte_len),
            (i as u64, pairs[i].1.qpn(), 100)
        );
    }
    assert!(matches!(
        events.recv_timeout(T).unwrap(),
        AsyncEvent::SrqLimitReached(_)
    ));
}

#[test]
fn windows_atomic_write_and_flush_on_page_backed_memory() {
    let rights = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let (da, db) = (
        Device::open_loopback().unwrap(),
        Device::open_loopback().unwrap(),
    );
    let (pa, pb) = (da.alloc_pd().unwrap(), db.alloc_pd().unwrap());
    let ma = pa.register(4096, rights).unwrap();
    let mb = pb
        .register_with(
            1 << 20,
            rights | Access::MW_BIND | Access::FLUSH_GLOBAL,
            Backing::HugePages,
        )
        .unwrap();
    assert_ne!(mb.placement(), Placement::Heap);
    let (ca, cb) = (da.create_cq(64).unwrap(), db.create_cq(64).unwrap());
    let qa = pa.create_rc_qp(&ca, &ca, QpCaps::default()).unwrap();
    let qb = pb.create_rc_qp(&cb, &cb, QpCaps::default()).unwrap();
    let o = ConnectOptions {
        access: Access::REMOTE_WRITE | Access::REMOTE_READ | Access::FLUSH_GLOBAL,
        ..ConnectOptions::default()
    };
    qa.connect(&qb.endpoint(), &o).unwrap();
    qb.connect(&qa.endpoint(), &o).unwrap();

    // B opens 64 bytes at offset 4096 of its region to A, and only those.
    let mw = pb.alloc_mw().unwrap();
    let win = qb
        .bind_mw(1, &mw, &mb, 4096, 64, Access::REMOTE_WRITE)
        .unwrap();
    let c = cb.wait(T).unwrap();
    assert_eq!((c.status, c.opcode), (WcStatus::Success, WcOpcode::BindMw));
    assert_eq!(mw.rkey(), win);

    let at = mb.addr() + 4096;
    qa.post_send(wr(
        2,
        SendOp::AtomicWrite {
            remote_addr: at + 8,
            rkey: win,
            data: *b"rnic-aw!",
        },
        vec![],
    ))
    .unwrap();
    qa.post_send(wr(
        3,
        SendOp::Flush {
            remote_addr: mb.addr(),
            rkey: mb.rkey(),
            len: 0,
            placement: 1,
            whole_region: true,
        },
        vec![],
    ))
    .unwrap();
    for (id, op) in [(2, WcOpcode::AtomicWrite), (3, WcOpcode::Flush)] {
        let c = ca.wait(T).unwrap();
        assert_eq!((c.wr_id, c.status, c.opcode), (id, WcStatus::Success, op));
    }
    let mut got = [0u8; 8];
    assert!(mb.read(4096 + 8, &mut got));
    assert_eq!(&got, b"rnic-aw!");

    // SEND_WITH_INV closes the window; a WRITE through it then fails.
    qb.post_recv(RecvWr {
        wr_id: 9,
        sg_list: sg_list![mb.sge(0, 64)],
    })
    .unwrap();
    qa.post_send(wr(
        4,
        SendOp::SendWithInv {
            invalidate_rkey: win,
        },
        vec![ma.sge(0, 8)],
    ))
    .unwrap();
    assert_eq!(ca.wait(T).unwrap().status, WcStatus::Success);
    let r = cb.wait(T).unwrap();
    assert_eq!((r.wr_id, r.invalidated_rkey), (9, Some(win)));
    qa.post_send(wr(5, SendOp::write(at, win), vec![ma.sge(0, 8)]))
        .unwrap();
    assert_eq!(ca.wait(T).unwrap().status, WcStatus::RemAccessErr);
}

#[test]
fn a_completion_channel_wakes_poll_once_per_arming() {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    let (da, db) = (
        Device::open_loopback().unwrap(),
        Device::open_loopback().unwrap(),
    );
    let (pa, pb) = (da.alloc_pd().unwrap(), db.alloc_pd().unwrap());
    let rights = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    let (ma, mb) = (
        pa.register(64, rights).unwrap(),
        pb.register(64, rights).unwrap(),
    );
    let channel = da.create_comp_channel().unwrap();
    let ca = da.create_cq_with_channel(16, &channel).unwrap();
    let cb = db.create_cq(16).unwrap();
    let qa = pa.create_rc_qp(&ca, &ca, QpCaps::default()).unwrap();
    let qb = pb.create_rc_qp(&cb, &cb, QpCaps::default()).unwrap();
    let o = ConnectOptions::default();
    qa.connect(&qb.endpoint(), &o).unwrap();
    qb.connect(&qa.endpoint(), &o).unwrap();
    let write = |id| {
        qa.post_send(wr(
            id,
            SendOp::write(mb.addr(), mb.rkey()),
            vec![ma.sge(0, 8)],
        ))
        .unwrap()
    };
    let readable = |ms: i64| {
        let ts = Timespec {
            tv_sec: ms / 1000,
            tv_nsec: (ms % 1000) * 1_000_000,
        };
        let mut fds = [PollFd::new(&channel, PollFlags::IN)];
        poll(&mut fds, Some(&ts)).unwrap() == 1
    };

    ca.req_notify();
    assert!(!readable(0), "nothing completed yet");
    assert!(matches!(
        channel.get_cq_event(Duration::ZERO),
        Err(Error::Timeout)
    ));
    write(1);
    assert!(
        readable(10_000),
        "the completion makes the descriptor readable"
    );
    assert_eq!(channel.get_cq_event(Duration::ZERO).unwrap(), ca.id());
    assert_eq!(ca.poll().len(), 1);
    assert!(!readable(0), "the event was taken");

    // Not armed again: the next completion raises no event.
    write(2);
    assert_eq!(ca.wait(T).unwrap().wr_id, 2);
    assert!(!readable(50));
    // Armed again: one more event.
    ca.req_notify();
    write(3);
    assert_eq!(channel.get_cq_event(T).unwrap(), ca.id());
    assert_eq!(ca.wait(T).unwrap().wr_id, 3);
}

#[test]
fn a_one_gib_write_arrives_intact() {
    const GIB: usize = 1 << 30;
    const CHUNK: usize = 1 << 20;
    let rights = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    let (da, db) = (
        Device::open_loopback().unwrap(),
        Device::open_loopback().unwrap(),
    );
    let (pa, pb) = (da.alloc_pd().unwrap(), db.alloc_pd().unwrap());
    let ma = pa.register_with(GIB, rights, Backing::Pages).unwrap();
    let mb = pb.register_with(GIB, rights, Backing::Pages).unwrap();
    let (ca, cb) = (da.create_cq(16).unwrap(), db.create_cq(16).unwrap());
    let qa = pa.create_rc_qp(&ca, &ca, QpCaps::default()).unwrap();
    let qb = pb.create_rc_qp(&cb, &cb, QpCaps::default()).unwrap();
    let o = ConnectOptions {
        mtu: Mtu::Mtu4096,
        ..ConnectOptions::default()
    };
    qa.connect(&qb.endpoint(), &o).unwrap();
    qb.connect(&qa.endpoint(), &o).unwrap();
    // Every MiB different, so a misplaced packet cannot go unnoticed.
    let chunk = |i: usize| -> Vec<u8> {
        (0..CHUNK)
            .map(|j| (j as u8).wrapping_mul(13) ^ (i as u8).wrapping_mul(101) ^ (j >> 12) as u8)
            .collect()
    };
    for i in 0..GIB / CHUNK {
        assert!(ma.write(i * CHUNK, &chunk(i)));
    }
    qa.post_send(wr(
        1,
        SendOp::write(mb.addr(), mb.rkey()),
        vec![ma.sge(0, GIB as u32)],
    ))
    .unwrap();
    let c = ca.wait(Duration::from_secs(300)).unwrap();
    assert_eq!((c.wr_id, c.status), (1, WcStatus::Success));
    let mut got = vec![0u8; CHUNK];
    for i in 0..GIB / CHUNK {
        assert!(mb.read(i * CHUNK, &mut got));
        assert!(got == chunk(i), "MiB {i} differs");
    }
}

#[test]
fn the_callers_own_buffer_is_written_in_place_and_given_back() {
    let (a, b) = pair();
    let pd_b = &b._pd;
    let mine: Vec<u8> = (0..1000u32).map(|i| (i % 7) as u8).collect();
    let mr = pd_b
        .register_vec(mine.clone(), Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    assert_eq!((mr.len(), mr.placement()), (1000, Placement::Caller));
    assert!(a.mr.write(0, b"placed by the NIC"));
    a.qp.post_send(wr(
        1,
        SendOp::write(mr.addr() + 100, mr.rkey()),
        vec![a.mr.sge(0, 17)],
    ))
    .unwrap();
    assert_eq!(a.cq.wait(T).unwrap().status, WcStatus::Success);
    let back = mr.into_vec().unwrap();
    let mut want = mine;
    want[100..117].copy_from_slice(b"placed by the NIC");
    assert_eq!(back, want);
    // Memory rnic allocated is not the caller's to take.
    assert!(matches!(a.mr.into_vec(), Err(Error::NotReturnable)));
}

/// The UDP source ports of what a's NIC sends for `n` 64-byte WRITEs from
/// a's QP to b's region, each completed successfully before the next.
fn source_ports_of_writes(a: &Side, b: &Side, n: u64) -> Vec<u16> {
    let tap = a._dev.tap().unwrap();
    for id in 0..n {
        a.qp.post_send(wr(
            id,
            SendOp::write(b.mr.addr(), b.mr.rkey()),
            vec![a.mr.sge(0, 64)],
        ))
        .unwrap();
        assert_eq!(a.cq.wait(T).unwrap().status, WcStatus::Success);
    }
    tap.try_iter()
        .filter(|e| e.sent)
        .map(|e| e.datagram.src_port)
        .collect()
}

#[test]
fn each_connection_sends_from_its_own_udp_source_port() {
    let (a, b) = pair();
    let sent = source_ports_of_writes(&a, &b, 2);
    assert_eq!(sent.len(), 2);
    // rdma_rxe's choice for this pair of QPs (each device has an address of
    // its own, so the port is free), and the receiver verified the ICRC over
    // it: the WRITEs completed.
    let want = rnic_wire::encap::udp::rxe_src_port(a.qp.qpn(), b.qp.qpn());
    assert_eq!(sent, [want, want]);
}

/// Take `qp` through INIT, RTR and RTS with `modify`, as ibv_rc_pingpong
/// does, to `remote`, with `flow_label` in the address vector.
fn modify_to_rts(qp: &QueuePair, remote: &Endpoint, flow_label: u32) {
    let init = QpAttr {
        qp_state: QpState::Init,
        qp_access_flags: Access::REMOTE_WRITE,
        ..QpAttr::default()
    };
    let m = AttrMask::STATE | AttrMask::ACCESS_FLAGS | AttrMask::PKEY_INDEX | AttrMask::PORT;
    qp.modify(&init, m).unwrap();
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        ah_attr: Some(AddressVector {
            dest: remote.addr,
            src: None,
            traffic_class: 0,
            hop_limit: 64,
            flow_label,
        }),
        path_mtu: Mtu::Mtu1024,
        dest_qp_num: remote.qpn,
        rq_psn: remote.psn,
        max_dest_rd_atomic: 1,
        min_rnr_timer: 12,
        ..QpAttr::default()
    };
    let m = AttrMask::STATE
        | AttrMask::AV
        | AttrMask::PATH_MTU
        | AttrMask::DEST_QPN
        | AttrMask::RQ_PSN
        | AttrMask::MAX_DEST_RD_ATOMIC
        | AttrMask::MIN_RNR_TIMER;
    qp.modify(&rtr, m).unwrap();
    let rts = QpAttr {
        qp_state: QpState::Rts,
        sq_psn: qp.endpoint().psn,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        max_rd_atomic: 1,
        ..QpAttr::default()
    };
    let m = AttrMask::STATE
        | AttrMask::SQ_PSN
        | AttrMask::TIMEOUT
        | AttrMask::RETRY_CNT
        | AttrMask::RNR_RETRY
        | AttrMask::MAX_QP_RD_ATOMIC;
    qp.modify(&rts, m).unwrap();
}

/// A connection made with `ibv_modify_qp` (the drop-in library's way)
/// sends from the UDP source port rdma_rxe would give it, as one made with
/// `connect` does: from both QP numbers, or from the flow label its
/// address vector carries.
#[test]
fn a_connection_made_by_modify_sends_from_rxe_s_udp_source_port() {
    for flow_label in [0, 0x1_2345] {
        let (a, b) = (side(), side());
        modify_to_rts(&a.qp, &b.qp.endpoint(), flow_label);
        modify_to_rts(&b.qp, &a.qp.endpoint(), 0);
        let sent = source_ports_of_writes(&a, &b, 1);
        let want = match flow_label {
            0 => rnic_wire::encap::udp::rxe_src_port(a.qp.qpn(), b.qp.qpn()),
            fl => rnic_wire::encap::udp::flow_label_src_port(fl),
        };
        assert_eq!(sent, [want], "flow label {flow_label:#x}");
    }
}

#[test]
fn builder_modify_and_query_as_ibv_modify_qp_does() {
    let dev = Device::open_loopback().unwrap();
    assert_eq!(dev.query_gid(0), Some(dev.gid()));
    assert_eq!(dev.query_gid(1), None);
    assert_eq!(dev.query_port().active_mtu, Mtu::Mtu4096);
    assert_eq!(dev.query_device().max_inline_data, 256);
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(16).unwrap();
    let qp = pd
        .qp_builder(&cq, &cq)
        .qp_type(QpType::Uc)
        .max_send_wr(8)
        .max_send_sge(2)
        .build()
        .unwrap();
    assert_eq!(qp.state().unwrap(), QpState::Reset);
    let init = QpAttr {
        qp_state: QpState::Init,
        qp_access_flags: Access::REMOTE_WRITE,
        ..QpAttr::default()
    };
    // RESET -> INIT needs the P_Key index and port too, as on Linux.
    let err = qp
        .modify(&init, AttrMask::STATE | AttrMask::ACCESS_FLAGS)
        .unwrap_err();
    assert!(err.to_string().contains("PKEY_INDEX"), "{err}");
    qp.modify(
        &init,
        AttrMask::STATE | AttrMask::ACCESS_FLAGS | AttrMask::PKEY_INDEX | AttrMask::PORT,
    )
    .unwrap();
    let q = qp.query().unwrap();
    assert_eq!(
        (q.qp_state, q.qp_access_flags),
        (QpState::Init, Access::REMOTE_WRITE)
    );
    // Two SGEs allowed, three refused at post time.
    let mr = pd.register(64, Access::LOCAL_WRITE).unwrap();
    let wr = SendWr::new(1, SendOp::send(), sg_list![mr.sge(0, 8); 3]);
    assert!(matches!(
        qp.post_send(wr),
        Err(Error::Verb(VerbError::TooManySge { given: 3, max: 2 }))
    ));
}

/// A QP reset takes its unpolled completions with it, those already handed
/// to the program included (receives flushed by an error): used again, it
/// shows nothing from before. Another QP's on the same CQ stay.
#[test]
fn reset_takes_the_qps_unpolled_completions() {
    let (a, b) = pair();
    let other = a._pd.create_rc_qp(&a.cq, &a.cq, QpCaps::default()).unwrap();
    other
        .connect(&b.qp.endpoint(), &ConnectOptions::default())
        .unwrap();
    for (qp, wr_id) in [(&a.qp, 1), (&a.qp, 2), (&other, 3)] {
        qp.post_recv(RecvWr {
            wr_id,
            sg_list: vec![a.mr.sge(0, 8)].into(),
        })
        .unwrap();
    }
    let to = |state| QpAttr {
        qp_state: state,
        ..QpAttr::default()
    };
    a.qp.modify(&to(QpState::Err), AttrMask::STATE).unwrap();
    other.modify(&to(QpState::Err), AttrMask::STATE).unwrap();
    // Handed over to the program, not polled.
    let deadline = std::time::Instant::now() + T;
    while a.cq.len() < 3 {
        assert!(std::time::Instant::now() < deadline, "three flushes");
        std::thread::sleep(Duration::from_millis(1));
    }
    a.qp.modify(&to(QpState::Reset), AttrMask::STATE).unwrap();
    assert_eq!(a.cq.len(), 1, "the other QP's completion stays");
    // Destroying a QP takes its unpolled completions too.
    other.destroy().unwrap();
    assert!(a.cq.poll().is_empty());
}

/// Both NICs' egress impaired (loss, duplication, reordering, corruption):
/// RC still delivers every message exactly once, in order, every byte
/// right, and each impairment did happen (the corrupted copies died at the
/// receiver's ICRC check).
#[test]
fn impaired_links_lose_nothing() {
    const SLOT: usize = 4096;
    const BATCH: u64 = 32;
    let open = |seed: u64| {
        let dev = Device::open_loopback().expect("a loopback address");
        let spec = format!("loss=5%,dup=3%,reorder=5%,corrupt=2%,seed={seed}");
        dev.set_impairment(spec.parse().unwrap()).unwrap();
        let pd = dev.alloc_pd().unwrap();
        let mr = pd
            .register(64 * SLOT, Access::LOCAL_WRITE | Access::REMOTE_READ)
            .unwrap();
        let cq = dev.create_cq(256).unwrap();
        let qp = pd.create_rc_qp(&cq, &cq, QpCaps::default()).unwrap();
        (dev, pd, mr, cq, qp)
    };
    let (da, _pa, ma, ca, qa) = open(1);
    let (db, _pb, mb, cb, qb) = open(2);
    let o = ConnectOptions::default();
    qa.connect(&qb.endpoint(), &o).unwrap();
    qb.connect(&qa.endpoint(), &o).unwrap();
    let size = |k: u64| 1 + (k * 997 % 4000) as usize;
    let byte = |k: u64, i: usize| (k as usize * 31 + i * 7) as u8;
    let mut k = 0u64;
    for _ in 0..8 {
        for j in 0..BATCH {
            let slot = (j as usize) * SLOT;
            qb.post_recv(RecvWr {
                wr_id: k + j,
                sg_list: vec![mb.sge(slot, SLOT as u32)].into(),
            })
            .unwrap();
            let msg: Vec<u8> = (0..size(k + j)).map(|i| byte(k + j, i)).collect();
            assert!(ma.write(slot, &msg));
        }
        for j in 0..BATCH {
            let slot = (j as usize) * SLOT;
            let sge = ma.sge(slot, size(k + j) as u32);
            qa.post_send(wr(k + j, SendOp::send(), vec![sge])).unwrap();
        }
        for j in 0..BATCH {
            let c = ca.wait(T).unwrap();
            assert_eq!((c.wr_id, c.status), (k + j, WcStatus::Success));
            let r = cb.wait(T).unwrap();
            assert_eq!((r.wr_id, r.status), (k + j, WcStatus::Success), "in order");
            assert_eq!(r.byte_len as usize, size(k + j));
            let mut got = vec![0u8; size(k + j)];
            assert!(mb.read(j as usize * SLOT, &mut got));
            assert!(
                got.iter().enumerate().all(|(i, &b)| b == byte(k + j, i)),
                "message {} intact",
                k + j
            );
        }
        k += BATCH;
    }
    // And nothing more: every message exactly once.
    std::thread::sleep(Duration::from_millis(300));
    assert!(ca.poll().is_empty() && cb.poll().is_empty());
    let (sa, sb) = (
        da.impairment_stats().unwrap(),
        db.impairment_stats().unwrap(),
    );
    for s in [sa, sb] {
        assert!(s.lost > 0 && s.duplicated > 0 && s.reordered > 0, "{s:?}");
    }
    assert!(sa.corrupted + sb.corrupted > 0, "{sa:?} {sb:?}");
    // A flipped bit fails the ICRC, or the parse before it (a length or an
    // opcode that no longer adds up): dropped either way.
    let dropped = |d: &Device| {
        let c = d.counters().unwrap();
        c.icrc_errors + c.malformed
    };
    assert_eq!(
        dropped(&da) + dropped(&db),
        sa.corrupted + sb.corrupted,
        "every corrupted copy was caught"
    );
}

#[test]
fn a_malformed_rnic_impair_is_an_error_naming_it() {
    // (A child process: the variable would reach this process's other tests.)
    if std::env::var_os("RNIC_IMPAIR_CHILD").is_some() {
        let e = Device::open_loopback().unwrap_err().to_string();
        assert!(e.contains("RNIC_IMPAIR") && e.contains("loss=7"), "{e}");
        return;
    }
    let me = std::env::current_exe().unwrap();
    let out = std::process::Command::new(me)
        .args(["--exact", "a_malformed_rnic_impair_is_an_error_naming_it"])
        .env("RNIC_IMPAIR_CHILD", "1")
        .env("RNIC_IMPAIR", "loss=7")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// A UDP socket on a free loopback address's port 4791: a peer whose
/// packets the test writes and reads itself.
fn raw_peer() -> std::net::UdpSocket {
    for last in 2..=254u8 {
        let addr = std::net::SocketAddr::from(([127, 0, 0, last], 4791));
        if let Ok(s) = std::net::UdpSocket::bind(addr) {
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            return s;
        }
    }
    panic!("no free loopback address for the peer");
}

/// A request from `peer` to a queue pair of `to`, its ICRC right.
fn request(peer: &std::net::UdpSocket, to: &Device, ib: &rnic_wire::IbRepr, data: &[u8]) {
    let from = peer.local_addr().unwrap();
    let mut buf = vec![0u8; ib.buffer_len()];
    ib.emit(&mut buf, data).unwrap();
    let n = buf.len();
    let crc = rnic_wire::icrc::for_udp(from.ip(), to.addr(), from.port(), &buf[..n - 4]).unwrap();
    buf[n - 4..].copy_from_slice(&crc.to_le_bytes());
    peer.send_to(&buf, (to.addr(), 4791)).unwrap();
}

/// A READ of 256 MiB is answered a burst at a time, between the packets
/// other connections wait for: a WRITE on another QP, sent after the first
/// response arrived, is acknowledged before the READ's last response
/// leaves. (Generating every response in one go, the NIC would take the
/// WRITE in only after all 262,144 of them.)
#[test]
fn a_huge_read_does_not_hold_up_other_connections() {
    use rnic_wire::{bth, reth, IbPacket, IbRepr, Opcode, Psn};
    const LEN: u32 = 256 << 20;
    let peer = raw_peer();
    let dev = Device::open_loopback().unwrap();
    let pd = dev.alloc_pd().unwrap();
    let big = pd
        .register_with(LEN as usize, Access::REMOTE_READ, Backing::Pages)
        .unwrap();
    let target = pd
        .register(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    let cq = dev.create_cq(16).unwrap();
    let (reader, writer) = (
        pd.create_rc_qp(&cq, &cq, QpCaps::default()).unwrap(),
        pd.create_rc_qp(&cq, &cq, QpCaps::default()).unwrap(),
    );
    let o = ConnectOptions {
        mtu: Mtu::Mtu1024,
        ..ConnectOptions::default()
    };
    let them = peer.local_addr().unwrap().ip();
    for (qp, qpn) in [(&reader, 0x100), (&writer, 0x101)] {
        let remote = Endpoint {
            addr: them,
            qpn,
            psn: 0,
        };
        qp.connect(&remote, &o).unwrap();
    }
    // A first request (PSN 0) with a RETH.
    let with_reth = |op, qpn, va, r_key, dma_length| {
        let mut ib = IbRepr::new(bth::Repr::new(op, qpn, Psn::new(0)));
        ib.reth = Some(reth::Repr {
            va,
            r_key,
            dma_length,
        });
        ib
    };
    let read = with_reth(
        Opcode::RC_RDMA_READ_REQUEST,
        reader.qpn(),
        big.addr(),
        big.rkey(),
        LEN,
    );
    request(&peer, &dev, &read, &[]);
    let mut buf = vec![0u8; 65536];
    let next = |buf: &mut Vec<u8>| -> IbRepr {
        let n = peer.recv(buf).unwrap();
        IbRepr::parse(&IbPacket::new_checked(&buf[..n]).unwrap()).unwrap()
    };
    let first = next(&mut buf);
    assert_eq!(first.bth.opcode, Opcode::RC_RDMA_READ_RESPONSE_FIRST);
    let mut write = with_reth(
        Opcode::RC_RDMA_WRITE_ONLY,
        writer.qpn(),
        target.addr(),
        target.rkey(),
        8,
    );
    write.bth.ack_req = true;
    write.payload_len = 8;
    request(&peer, &dev, &write, &[7; 8]);
    // The peer's socket drops what it has no room for; the PSNs say how far
    // the READ had gone.
    let last = LEN / 1024 - 1;
    let mut furthest = 0;
    loop {
        let p = next(&mut buf);
        if p.bth.dest_qp == 0x101 {
            assert_eq!(p.bth.opcode, Opcode::RC_ACKNOWLEDGE);
            break;
        }
        furthest = furthest.max(p.bth.psn.value());
        assert!(
            furthest < last,
            "the WRITE was acknowledged only after the READ's last response"
        );
    }
    println!("the WRITE's ACK came after READ response {furthest} of {last}");
    let mut got = [0u8; 8];
    assert!(target.read(0, &mut got));
    assert_eq!(got, [7; 8]);
}
