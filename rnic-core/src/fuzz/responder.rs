//! A responder under fire: the body of the `responder` fuzz target.
//!
//! One NIC with an RC, a UC and a UD QP in one protection domain, and five
//! regions laid end to end in I/O address space, each a window onto one
//! arena with guard bytes around it (`super::arena`):
//!
//! | region | domain | access                        | who may touch it               |
//! |--------|--------|-------------------------------|--------------------------------|
//! | W      | the QPs' | remote write, read, atomic  | requests naming W's R_Key      |
//! | RO     | the QPs' | remote read                 | READs naming RO's R_Key        |
//! | OTHER  | another  | remote write, read, atomic  | nobody                         |
//! | RECV   | the QPs' | local write                 | SENDs, inside posted receives  |
//! | MWR    | the QPs' | local write, MW bind        | requests naming the window's key, inside its 2 KiB |
//!
//! The input sends request packets, with a correct ICRC, at the QPs' expected
//! PSNs or near them, whose keys, addresses and lengths are drawn from the
//! values at and around every bound (a region's first and last byte, one
//! past its end, the window's edges, lengths that reach one byte too far or
//! wrap the address space); it also posts receives, advances time and drains
//! what the NIC sends.
//!
//! After every step, each byte the engine read or wrote through a region
//! must be one some request the input sent was allowed to touch: inside the
//! region, with the right to do it, inside the range a key-bearing header of
//! a request named (or a receive the input posted). The guard bytes never
//! change, every packet the NIC sends is well formed with a correct ICRC,
//! and every completion is for a receive the input posted, once.

use core::net::{IpAddr, Ipv4Addr};
use core::ops::Range;
use std::collections::HashSet;
use std::time::Duration;

use rnic_wire::opcode::{ExtHeader, Opcode, OPCODES};
use rnic_wire::psn::Psn;

use super::arena::{Arena, Kind, Named, Touch};
use super::{assert_well_formed, datagram, Input, MTUS};
use crate::cq::CqHandle;
use crate::mem::{Access, MwBind, MwType};
use crate::qp::{AddressVector, QpAttr, QpType};
use crate::time::Time;
use crate::wr::{sg_list, RecvWr, SendOp, SendWr, Sge, WcStatus};
use crate::{Nic, QpCaps};

const W: usize = 0;
const RO: usize = 1;
const OTHER: usize = 2;
const RECV: usize = 3;
const MWR: usize = 4;
const LENS: [usize; 5] = [4096, 4096, 4096, 8192, 4096];
/// Where the regions start in I/O address space, end to end: one byte past
/// W is RO's first.
const IOVA: u64 = 0x7000_0000;
/// The window on MWR.
const WINDOW: Range<usize> = 1024..3072;
const QKEY: u32 = 0x1111_1111;
const ME: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
const PEER: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
const STRANGER: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 9));
const STEPS: usize = 128;

fn iova(region: usize) -> u64 {
    IOVA + LENS[..region].iter().sum::<usize>() as u64
}

/// The NIC under test and what the harness knows of it.
struct Target {
    nic: Nic,
    arena: Arena,
    /// RC, UC and UD.
    qpns: [u32; 3],
    cq: CqHandle,
    mtu: usize,
    /// R_Keys of W, RO, OTHER, MWR; RECV's L_Key; the window's key.
    w: u32,
    ro: u32,
    other: u32,
    mwr: u32,
    recv: u32,
    mw: u32,
    /// Per region, the bytes some request or receive named.
    named: Named,
    posted: HashSet<u64>,
    completed: HashSet<u64>,
    next_id: u64,
    /// The window is bound: no SEND_WITH_INV has invalidated it.
    mw_bound: bool,
}

impl Target {
    fn new(setup: u8) -> Option<Target> {
        let mut nic = Nic::new(ME, u64::from(setup));
        let (arena, windows) = Arena::new(&LENS);
        let pd = nic.alloc_pd();
        let pd_other = nic.alloc_pd();
        let remote = Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
        let rights = [
            (pd, Access::LOCAL_WRITE | remote | Access::FLUSH_GLOBAL),
            (pd, Access::REMOTE_READ),
            (pd_other, Access::LOCAL_WRITE | remote),
            (pd, Access::LOCAL_WRITE),
            (pd, Access::LOCAL_WRITE | Access::MW_BIND),
        ];
        let mut keys = Vec::new();
        for (region, (window, (pd, access))) in windows.into_iter().zip(rights).enumerate() {
            keys.push(
                nic.reg_mr(pd, iova(region), Box::new(window), access)
                    .ok()?,
            );
        }
        let cq = nic.create_cq(1 << 16);
        let mtu = MTUS[usize::from(setup % 3)];
        let mut qpns = [0; 3];
        for (i, qp_type) in [QpType::Rc, QpType::Uc, QpType::Ud].into_iter().enumerate() {
            qpns[i] = nic.create_qp(pd, qp_type, cq, cq, QpCaps::default()).ok()?;
            let attr = QpAttr {
                qp_access_flags: remote | Access::FLUSH_GLOBAL,
                ah_attr: Some(AddressVector {
                    dest: PEER,
                    src: None,
                    traffic_class: 0,
                    hop_limit: 64,
                    flow_label: 0,
                }),
                path_mtu: mtu,
                dest_qp_num: 0xAB_CD00 + i as u32,
                rq_psn: 0xFF_FFF0,
                sq_psn: 0x10_0000,
                max_dest_rd_atomic: 1 + (setup >> 4) % 4,
                max_rd_atomic: 1,
                timeout: 10,
                retry_cnt: 1,
                rnr_retry: 1,
                min_rnr_timer: 1,
                qkey: QKEY,
                ..QpAttr::default()
            };
            nic.to_rts(Time(0), qpns[i], &attr).ok()?;
        }
        // A type 2 window on the middle of MWR, bound by the RC QP.
        let old = nic.alloc_mw_of(pd, MwType::Two).ok()?;
        let mw = (old & !0xFF) | (old.wrapping_add(1) & 0xFF);
        let bind = SendWr::new(
            0,
            SendOp::BindMw(MwBind {
                mw_rkey: old,
                new_rkey: mw,
                mr_lkey: keys[MWR].lkey,
                addr: iova(MWR) + WINDOW.start as u64,
                length: WINDOW.len() as u64,
                access: remote,
            }),
            sg_list![],
        );
        nic.post_send(Time(0), qpns[0], bind).ok()?;
        while nic.poll_transmit().is_some() {}
        let done = nic.poll_cq(cq, 8).ok()?;
        assert!(
            done.len() == 1 && done[0].status == crate::wr::WcStatus::Success,
            "the window is bound: {done:?}"
        );
        Some(Target {
            nic,
            arena,
            qpns,
            cq,
            mtu: mtu.bytes(),
            w: keys[W].rkey,
            ro: keys[RO].rkey,
            other: keys[OTHER].rkey,
            mwr: keys[MWR].rkey,
            recv: keys[RECV].lkey,
            mw,
            named: Named::new(&LENS),
            posted: HashSet::new(),
            completed: HashSet::new(),
            next_id: 1,
            mw_bound: true,
        })
    }

    /// A key, and the region it grants remote access to through QP `qpn`,
    /// if any (the type 2 window opens MWR to the RC QP alone).
    fn key(&self, input: &mut Input<'_>, qpn: u32) -> (u32, Option<usize>) {
        let (key, region) = self.any_key(input);
        let through = |r| r != MWR || qpn == self.qpns[0];
        (key, region.filter(|&r| through(r)))
    }

    fn any_key(&self, input: &mut Input<'_>) -> (u32, Option<usize>) {
        match input.byte() % 10 {
            0 | 1 => (self.w, Some(W)),
            2 => (self.ro, Some(RO)),
            3 => (self.other, None),
            4 => (self.recv, None),
            5 | 6 => (self.mw, Some(MWR)),
            7 => (self.mwr, None),
            // The window's key before the bind; W's with another key byte.
            8 => (self.mw ^ 1, None),
            _ => (self.w ^ 0x80, None),
        }
    }

    /// The addresses a key to `region` opens: the region, or for MWR the
    /// window.
    fn extent(region: usize) -> Range<u64> {
        match region {
            MWR => iova(MWR) + WINDOW.start as u64..iova(MWR) + WINDOW.end as u64,
            r => iova(r)..iova(r) + LENS[r] as u64,
        }
    }

    /// An address at or around a bound of what a key to `region` opens, or
    /// of the region itself.
    fn va(input: &mut Input<'_>, region: usize) -> u64 {
        let Range { start, end } = Self::extent(region);
        match input.byte() % 16 {
            0 => start,
            1 => start + 1,
            2 => start + 8,
            3 => end - 8,
            4 => end - 1,
            5 => end,
            6 => end + 1,
            7 => start - 1,
            8 => iova(region),
            9 => iova(region) + LENS[region] as u64 - 8,
            10 => iova(region) + LENS[region] as u64,
            11 => 0u64.wrapping_sub(u64::from(input.byte()) + 1),
            12 => 0,
            _ => start + u64::from(input.u16()) % (end - start + 64),
        }
    }

    /// A DMA length at or around a bound, for an address `va` in what a
    /// key to `region` opens.
    fn dma_len(&self, input: &mut Input<'_>, va: u64, region: usize) -> u32 {
        let to_end = Self::extent(region).end.wrapping_sub(va) as u32;
        match input.byte() % 12 {
            0 => 0,
            1 => 1,
            2 => 8,
            3 => self.mtu as u32,
            4 => 2 * self.mtu as u32,
            5 => to_end,
            6 => to_end.wrapping_add(1),
            7 => to_end.wrapping_sub(1),
            8 => 1 << 31,
            9 => u32::MAX,
            _ => u32::from(input.u16()),
        }
    }

    /// Mark the `len` bytes at `va` as named by a request with a key that
    /// grants access to `region`.
    fn name(&mut self, region: Option<usize>, va: u64, len: u64) {
        let Some(r) = region else { return };
        if let Some(off) = va.checked_sub(iova(r)) {
            self.named.mark(r, off, len);
        }
    }

    fn qpn(&self, input: &mut Input<'_>, sel: u8) -> (u32, u8) {
        match sel & 3 {
            0 => (self.qpns[0], 0x00),
            1 => (self.qpns[1], 0x20),
            2 => (self.qpns[2], 0x60),
            _ => (input.u32() & 0xFF_FFFF, input.byte() & 0xE0),
        }
    }

    /// A request packet (see the module's notes), sent to the NIC.
    fn request(&mut self, now: Time, input: &mut Input<'_>) {
        let sel = input.byte();
        let (qpn, transport) = self.qpn(input, sel);
        let opcode = if sel & 0x1C == 0x1C {
            input.byte()
        } else {
            let requests: Vec<u8> = OPCODES
                .iter()
                .filter(|i| i.is_request() && i.opcode.0 & 0xE0 == transport)
                .map(|i| i.opcode.0)
                .collect();
            let i = input.byte();
            match requests.len() {
                0 => i,
                n => requests[usize::from(i) % n],
            }
        };
        let flags = input.byte();
        let expected = self.nic.recv_psn(qpn).unwrap_or(Psn::new(0));
        let d = input.byte();
        let psn = match d {
            0..=199 => expected.add(u32::from(d % 8)).sub(2),
            _ => Psn::new(input.u32()),
        };
        let mut p = vec![opcode, flags & 0xF0, 0xFF, 0xFF, 0];
        p.extend_from_slice(&qpn.to_be_bytes()[1..]);
        p.push(input.byte() & 0x80);
        p.extend_from_slice(&psn.value().to_be_bytes()[1..]);
        let headers = Opcode(opcode).info().map_or(&[][..], |i| i.headers);
        for &h in headers {
            match h {
                ExtHeader::Reth => {
                    let (key, region) = self.key(input, qpn);
                    let va = Self::va(input, region.unwrap_or(usize::from(sel >> 5) % 5));
                    let len = self.dma_len(input, va, region.unwrap_or(W));
                    self.name(region, va, u64::from(len));
                    p.extend_from_slice(&va.to_be_bytes());
                    p.extend_from_slice(&key.to_be_bytes());
                    p.extend_from_slice(&len.to_be_bytes());
                }
                ExtHeader::AtomicEth => {
                    let (key, region) = self.key(input, qpn);
                    let va = Self::va(input, region.unwrap_or(usize::from(sel >> 5) % 5));
                    self.name(region, va, 8);
                    p.extend_from_slice(&va.to_be_bytes());
                    p.extend_from_slice(&key.to_be_bytes());
                    p.extend_from_slice(&input.u64().to_be_bytes());
                    p.extend_from_slice(&input.u64().to_be_bytes());
                }
                ExtHeader::Deth => {
                    let qkey = if input.byte() & 1 == 0 {
                        QKEY
                    } else {
                        input.u32()
                    };
                    p.extend_from_slice(&qkey.to_be_bytes());
                    p.extend_from_slice(&input.u32().to_be_bytes()[..1]);
                    p.extend_from_slice(&input.u32().to_be_bytes()[1..]);
                }
                ExtHeader::Ieth => {
                    let (key, _) = self.key(input, qpn);
                    p.extend_from_slice(&key.to_be_bytes());
                }
                other => p.extend(input.bytes(other.wire_len())),
            }
        }
        // A payload where the opcode has one (and, now and then, where it
        // has not), of a length at or around the path MTU; padded to four
        // bytes, or with a pad count from the input.
        let info = Opcode(opcode).info();
        let n = match input.byte() % 8 {
            _ if info.is_some_and(|i| !i.has_payload) && flags & 0x0E != 0 => 0,
            0 => 0,
            1 | 2 => self.mtu,
            3 => self.mtu + 1,
            4 => 8,
            _ => usize::from(input.u16()) % (self.mtu + 64),
        };
        let pad = if flags & 0x07 == 0x07 {
            (flags >> 4) & 3
        } else {
            ((4 - n % 4) % 4) as u8
        };
        p[1] = (p[1] & 0xC0) | (pad << 4);
        let fill = input.byte();
        p.extend(core::iter::repeat_n(fill, n + usize::from(pad)));
        let from = if sel & 0xC0 == 0xC0 { STRANGER } else { PEER };
        let port = 0xC000 | u16::from(sel);
        self.send(now, from, port, p, flags & 0x0F == 0x0F);
    }

    /// `p` (BTH onwards, no ICRC) with its ICRC appended (flipped if `bad`),
    /// to the NIC.
    fn send(&mut self, now: Time, from: IpAddr, port: u16, p: Vec<u8>, bad: bool) {
        self.nic
            .handle_datagram(now, &datagram(from, ME, port, p, bad));
        // A SEND_WITH_INV that took the window away completes its receive
        // here, before any READ response is generated: from now on
        // nothing may reach MWR through it.
        self.completions();
    }

    /// A packet of input bytes, aimed at one of the QPs (the seeds cut from
    /// captures come in this way): `sel` picks the QP (as for requests),
    /// whether the PSN becomes the expected one (bit 2), the length's size
    /// (bit 3: 16 bits, else 8), and whether a RETH or AtomicETH is pointed
    /// at W (bit 4).
    fn raw(&mut self, now: Time, input: &mut Input<'_>) {
        let sel = input.byte();
        let n = if sel & 8 != 0 {
            usize::from(input.u16() % 4200)
        } else {
            usize::from(input.byte())
        };
        let n = n.max(12);
        let mut p = input.bytes(n);
        let (qpn, _) = self.qpn(input, sel);
        p[5..8].copy_from_slice(&qpn.to_be_bytes()[1..]);
        if sel & 4 != 0 {
            let psn = self.nic.recv_psn(qpn).unwrap_or(Psn::new(0));
            p[9..12].copy_from_slice(&psn.value().to_be_bytes()[1..]);
        }
        if sel & 0x10 != 0 {
            self.aim_at_w(&mut p);
        }
        self.send(now, PEER, 0xC000, p, false);
    }

    /// Point a raw packet's RETH or AtomicETH, if it has one, at the start
    /// of W with W's R_Key (a captured request names its own peer's memory).
    fn aim_at_w(&mut self, p: &mut [u8]) {
        let Some(info) = Opcode(p[0]).info() else {
            return;
        };
        for (h, len_at) in [(ExtHeader::Reth, Some(12)), (ExtHeader::AtomicEth, None)] {
            let Some(at) = info.offset_of(h).filter(|&at| at + 16 <= p.len()) else {
                continue;
            };
            p[at..at + 8].copy_from_slice(&iova(W).to_be_bytes());
            p[at + 8..at + 12].copy_from_slice(&self.w.to_be_bytes());
            let len = len_at.map_or(8, |l| {
                u32::from_be_bytes([p[at + l], p[at + l + 1], p[at + l + 2], p[at + l + 3]])
            });
            self.name(Some(W), iova(W), u64::from(len));
        }
    }

    fn post_recv(&mut self, now: Time, input: &mut Input<'_>) {
        let qpn = self.qpns[usize::from(input.byte() % 3)];
        let off = usize::from(input.byte()) * 32;
        let len = u32::from(input.u16()) % 4200;
        let id = self.next_id;
        self.next_id += 1;
        let wr = RecvWr {
            wr_id: id,
            sg_list: sg_list![Sge {
                addr: iova(RECV) + off as u64,
                length: len,
                lkey: self.recv,
            }],
        };
        if self.nic.post_recv(now, qpn, wr).is_ok() {
            self.posted.insert(id);
            self.named.mark(RECV, off as u64, u64::from(len));
        }
    }

    /// Take what the NIC sends (READ responses are made here) and its
    /// completions.
    fn drain(&mut self) {
        while let Some(d) = self.nic.poll_transmit() {
            assert_well_formed(&d);
        }
        self.completions();
    }

    /// Take the completions: each for a posted receive, once; one that
    /// invalidated the window closes it.
    fn completions(&mut self) {
        for c in self.nic.poll_cq(self.cq, usize::MAX).unwrap_or_default() {
            assert!(
                self.posted.contains(&c.wr_id),
                "a completion for nothing: {c:?}"
            );
            assert!(self.completed.insert(c.wr_id), "completed twice: {c:?}");
            if c.status == WcStatus::Success && c.invalidated_rkey == Some(self.mw) {
                self.mw_bound = false;
            }
        }
    }

    /// Whether the engine was allowed to make this access.
    fn allowed(&self, t: &Touch) -> bool {
        let right = match (t.region, t.kind) {
            (W, _) | (RO, Kind::Read) | (RECV, Kind::Write) => true,
            (MWR, _) => self.mw_bound && WINDOW.start <= t.offset && t.range().end <= WINDOW.end,
            _ => false,
        };
        right && self.named.covers(t)
    }

    fn check(&self) {
        for t in self.arena.take_log() {
            assert!(self.allowed(&t), "an access no request allowed: {t:?}");
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
        match input.byte() % 10 {
            0..=5 => t.request(now, &mut input),
            6 => t.post_recv(now, &mut input),
            7 => {
                let b = input.byte();
                now = now + Duration::from_micros(u64::from(b) * u64::from(b));
                t.nic.handle_timeout(now);
            }
            8 => t.drain(),
            _ => t.raw(now, &mut input),
        }
        t.check();
    }
    t.drain();
    t.check();
    assert!(t.arena.guards_intact(&LENS), "a guard byte changed");
}
