//! A requester whose peer is the input: the body of the `requester` fuzz
//! target.
//!
//! One NIC with an RC QP connected to a peer that does not exist: the input
//! plays it, answering with ACKs, NAKs of every syndrome, RNR NAKs, READ
//! responses and atomic ACKs at PSNs in and around the requester's window,
//! with MSNs and payload lengths of its choosing, interleaved with posts of
//! every operation and with time advanced through the ACK and RNR timers.
//! Three regions are windows onto one arena (`super::arena`): SRC, which
//! SENDs and WRITEs read; SINK, which READs and atomics land in; OTHER,
//! which no work request names.
//!
//! After every step: every byte the engine read was in the scatter/gather
//! list of a SEND or WRITE the input posted, and every byte it wrote in that
//! of a READ or atomic; every packet it sent is well formed and goes to the
//! peer; completions come for posted work requests only, once each, in the
//! order they were posted. And when the input ends, the peer falls silent:
//! within 20 s (simulated) the send queue must drain, every signaled work
//! request completed (successfully, or with an error and the rest flushed).
//! No sequence of responses may leave a QP stuck.

use core::net::{IpAddr, Ipv4Addr};
use std::collections::HashSet;
use std::time::Duration;

use rnic_wire::psn::Psn;

use super::arena::{Arena, Kind, Named, Touch};
use super::{assert_well_formed, datagram, Input, MTUS};
use crate::cq::CqHandle;
use crate::mem::Access;
use crate::qp::{AddressVector, QpAttr, QpType};
use crate::time::Time;
use crate::wr::{sg_list, SendOp, SendWr, Sge};
use crate::{Nic, QpCaps};

const SRC: usize = 0;
const SINK: usize = 1;
const LENS: [usize; 3] = [8192, 8192, 4096];
const IOVA: u64 = 0x4000_0000;
const ME: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
const PEER: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
const PEER_QPN: u32 = 0x00AB_CDEF;
const STEPS: usize = 192;
/// How long the silent peer is waited out, and in what steps.
const SILENCE: Duration = Duration::from_secs(20);
const TICK: Duration = Duration::from_millis(10);

fn iova(region: usize) -> u64 {
    IOVA + LENS[..region].iter().sum::<usize>() as u64
}

struct Target {
    nic: Nic,
    arena: Arena,
    qpn: u32,
    cq: CqHandle,
    mtu: usize,
    lkey: [u32; 3],
    /// Per region, the bytes posted work requests named (SRC: to read;
    /// SINK: to write).
    named: Named,
    /// Signaled work requests not yet completed.
    waiting: HashSet<u64>,
    posted: HashSet<u64>,
    last_completed: u64,
    next_id: u64,
}

impl Target {
    fn new(setup: u8) -> Option<Target> {
        let mut nic = Nic::new(ME, u64::from(setup));
        let (arena, windows) = Arena::new(&LENS);
        let pd = nic.alloc_pd();
        let mut lkey = [0; 3];
        for (region, window) in windows.into_iter().enumerate() {
            let keys = nic
                .reg_mr(pd, iova(region), Box::new(window), Access::LOCAL_WRITE)
                .ok()?;
            lkey[region] = keys.lkey;
        }
        let cq = nic.create_cq(1 << 16);
        let mtu = MTUS[usize::from(setup % 3)];
        let qpn = nic
            .create_qp(pd, QpType::Rc, cq, cq, QpCaps::default())
            .ok()?;
        let attr = QpAttr {
            ah_attr: Some(AddressVector {
                dest: PEER,
                src: None,
                traffic_class: 0,
                hop_limit: 64,
                flow_label: 0,
            }),
            path_mtu: mtu,
            dest_qp_num: PEER_QPN,
            rq_psn: 0x10_0000,
            sq_psn: 0xFF_FFF0 + u32::from(setup >> 4),
            max_dest_rd_atomic: 1,
            max_rd_atomic: 1 + (setup >> 2) % 4,
            timeout: 10,
            retry_cnt: (setup >> 6) % 3,
            rnr_retry: 2,
            min_rnr_timer: 1,
            ..QpAttr::default()
        };
        nic.to_rts(Time(0), qpn, &attr).ok()?;
        Some(Target {
            nic,
            arena,
            qpn,
            cq,
            mtu: mtu.bytes(),
            lkey,
            named: Named::new(&LENS),
            waiting: HashSet::new(),
            posted: HashSet::new(),
            last_completed: 0,
            next_id: 1,
        })
    }

    /// A work request of every operation: `kind % 8` picks it (bit 3:
    /// unsignaled, bit 4: fenced, bit 5: a wrong L_Key), then the local
    /// offset and the length.
    fn post(&mut self, now: Time, input: &mut Input<'_>) {
        let kind = input.byte();
        let remote_addr = input.u64();
        let rkey = input.u32();
        let op = match kind % 8 {
            0 => SendOp::send(),
            1 => SendOp::send_imm(input.u32()),
            2 => SendOp::write(remote_addr, rkey),
            3 => SendOp::write_imm(remote_addr, rkey, input.u32()),
            4 | 5 => SendOp::read(remote_addr, rkey),
            6 => SendOp::compare_swap(remote_addr, rkey, input.u64(), input.u64()),
            _ => SendOp::fetch_add(remote_addr, rkey, input.u64()),
        };
        let into = matches!(
            op,
            SendOp::Read { .. } | SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. }
        );
        let region = if into { SINK } else { SRC };
        let off = usize::from(input.byte()) * 32;
        let len = match op {
            SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. } => 8,
            _ => match input.byte() {
                0 => 0,
                1 => self.mtu,
                2 => self.mtu + 1,
                b => usize::from(b) * 13,
            },
        };
        let id = self.next_id;
        self.next_id += 1;
        let signaled = kind & 0x08 == 0;
        let wr = SendWr::new(
            id,
            op,
            sg_list![Sge {
                addr: iova(region) + off as u64,
                length: len as u32,
                lkey: self.lkey[region] ^ u32::from(kind & 0x20 != 0),
            }],
        )
        .signaled(signaled)
        .fence(kind & 0x10 != 0);
        if self.nic.post_send(now, self.qpn, wr).is_ok() {
            self.posted.insert(id);
            if signaled {
                self.waiting.insert(id);
            }
            self.named.mark(region, off as u64, len as u64);
        }
    }

    /// A response from the peer: a READ response, ACK or atomic ACK (or any
    /// opcode), at a PSN in or around the window, with an AETH syndrome of
    /// every kind.
    fn respond(&mut self, now: Time, input: &mut Input<'_>) {
        let sel = input.byte();
        let opcode = if sel & 0x80 != 0 {
            input.byte()
        } else {
            0x0D + sel % 6
        };
        let (una, outstanding) = self.nic.send_window(self.qpn).unwrap_or((Psn::new(0), 0));
        let k = input.byte();
        let psn = match k {
            0..=239 => una.add(u32::from(k) % (outstanding + 3)).sub(1),
            _ => Psn::new(input.u32()),
        };
        let flags = input.byte() & 0x30;
        let mut p = vec![opcode, flags, 0xFF, 0xFF, 0];
        p.extend_from_slice(&self.qpn.to_be_bytes()[1..]);
        p.push(0);
        p.extend_from_slice(&psn.value().to_be_bytes()[1..]);
        let has_aeth = matches!(opcode, 0x0D | 0x0F | 0x10 | 0x11 | 0x12);
        if has_aeth {
            let syndrome = match input.byte() % 8 {
                // ACK with a credit count.
                0..=2 => input.byte() & 0x1F,
                // RNR NAK with a timer.
                3 => 0x20 | (input.byte() & 0x1F),
                // NAK: sequence error, invalid request, remote access
                // error, remote operational error, invalid RD request.
                4 | 5 => 0x60 | (input.byte() % 5),
                _ => input.byte(),
            };
            p.push(syndrome);
            p.extend(input.bytes(3));
        }
        if opcode == 0x12 {
            p.extend(input.bytes(8));
        }
        if matches!(opcode, 0x0D..=0x10) {
            let n = match input.byte() {
                0 => 0,
                1 => self.mtu,
                2 => self.mtu - 1,
                3 => self.mtu + 1,
                b => usize::from(b) * 11 % (self.mtu + 8),
            };
            let fill = input.byte();
            p.extend(core::iter::repeat_n(fill, n));
        }
        p.extend(core::iter::repeat_n(0, usize::from(flags >> 4)));
        let port = 0xC000 | u16::from(sel);
        let d = datagram(PEER, ME, port, p, false);
        self.nic.handle_datagram(now, &d);
    }

    /// Take what the NIC sends (dropped: the peer only ever says what the
    /// input says) and its completions.
    fn drain(&mut self) {
        while let Some(d) = self.nic.poll_transmit() {
            assert_well_formed(&d);
            assert_eq!(d.dst, PEER, "a packet to someone else: {d:?}");
            assert_eq!(
                &d.payload[5..8],
                &PEER_QPN.to_be_bytes()[1..],
                "a packet to another QP: {d:?}"
            );
        }
        for c in self.nic.poll_cq(self.cq, usize::MAX).unwrap_or_default() {
            assert!(
                self.posted.contains(&c.wr_id),
                "a completion for nothing: {c:?}"
            );
            assert!(
                c.wr_id > self.last_completed,
                "completed twice or out of order (after {}): {c:?}",
                self.last_completed
            );
            self.last_completed = c.wr_id;
            self.waiting.remove(&c.wr_id);
        }
    }

    fn allowed(&self, t: &Touch) -> bool {
        let wanted = match t.region {
            SRC => Kind::Read,
            SINK => Kind::Write,
            _ => return false,
        };
        t.kind == wanted && self.named.covers(t)
    }

    fn check(&self) {
        for t in self.arena.take_log() {
            assert!(self.allowed(&t), "an access no work request allowed: {t:?}");
        }
    }
}

/// Run one session from `data`. Panics if an invariant breaks (or the engine does).
pub fn run(data: &[u8]) {
    let mut input = Input(data);
    let mut t = Target::new(input.byte()).expect("the harness sets up");
    let mut now = Time(1_000_000);
    for _ in 0..STEPS {
        if input.done() {
            break;
        }
        match input.byte() % 8 {
            0..=2 => t.respond(now, &mut input),
            3 | 4 => t.post(now, &mut input),
            5 => {
                let b = input.byte();
                now = now
                    + if b & 0x80 != 0 {
                        Duration::from_millis(u64::from(b & 0x7F))
                    } else {
                        Duration::from_micros(u64::from(b) * 40)
                    };
                t.nic.handle_timeout(now);
            }
            _ => t.drain(),
        }
        t.check();
    }
    let end = now + SILENCE;
    loop {
        t.drain();
        t.check();
        if t.nic.send_queue_len(t.qpn) == Some(0) || now >= end {
            break;
        }
        now = now + TICK;
        t.nic.handle_timeout(now);
    }
    assert_eq!(
        t.nic.send_queue_len(t.qpn),
        Some(0),
        "the send queue is stuck after {SILENCE:?} of silence"
    );
    assert!(
        t.waiting.is_empty(),
        "signaled work requests never completed: {:?}",
        t.waiting
    );
    assert!(t.arena.guards_intact(&LENS), "a guard byte changed");
}
