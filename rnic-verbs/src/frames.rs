//! The frame transport's receiving side: an AF_PACKET socket on one network
//! interface, through which the NIC sees every IP header field the ICRC
//! covers. rdma_rxe sets a new IPv4 identification in every packet, and a
//! UDP socket never shows it, so only a frame can be verified in full
//! ([`rnic_core::Nic::handle_frame`]).
//!
//! Sending stays on the UDP sockets: the kernel puts identification 0 and
//! DF in what they send (`IP_PMTUDISC_DO`), the convention rnic computes
//! its ICRCs for, from any source port (rdma_rxe's formula), and resolves
//! next-hop addresses through its neighbour table. The socket on port 4791
//! stays bound, so the kernel answers no RoCE packet with an ICMP port
//! unreachable, but with a filter that drops everything: each packet is
//! taken in once, from the frame socket.
//!
//! The frame socket takes in IPv4 and IPv6 alike (ETH_P_ALL, as the
//! packet arrives, never as it leaves) and its filter, in the kernel,
//! passes only UDP to port 4791 at one of the NIC's addresses,
//! unfragmented (IPv4) or with no extension header (IPv6; RoCE v2 sends
//! none). It sees the packet from its IP header (SOCK_DGRAM); the
//! interface's MTU bounds what arrives.
//!
//! What this host sends to one of the NIC's own addresses (a QP to
//! another QP of the NIC, or a process to another sharing the address)
//! never crosses the interface: the kernel routes it through `lo`. A
//! second frame socket, on `lo` with the same filter, takes it in there,
//! as rdma_rxe loops such a packet back inside itself.

use std::ffi::CString;
use std::io;
use std::mem::size_of;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, UdpSocket};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// One classic BPF instruction.
fn op(code: u16, jt: u8, jf: u8, k: u32) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

// Classic BPF opcodes (linux/filter.h).
const LD_B_ABS: u16 = 0x30;
const LD_H_ABS: u16 = 0x28;
const LD_W_ABS: u16 = 0x20;
const LD_H_IND: u16 = 0x48;
const LD_W_IND: u16 = 0x40;
const LDX_B_MSH: u16 = 0xb1;
const ALU_AND_K: u16 = 0x54;
const JEQ_K: u16 = 0x15;
const JSET_K: u16 = 0x45;
const RET_K: u16 = 0x06;
/// Where the ancillary loads begin (SKF_AD_OFF, -0x1000): the packet's
/// metadata rather than its bytes.
const AD: u32 = 0xFFFF_F000;
/// `skb->protocol`, the EtherType (SKF_AD_PROTOCOL).
const AD_PROTOCOL: u32 = AD;
/// `skb->pkt_type` (SKF_AD_PKTTYPE): PACKET_OUTGOING (4) is what this host sends.
const AD_PKTTYPE: u32 = AD + 4;
const PACKET_OUTGOING: u32 = 4;
const ACCEPT: u32 = 0xFFFF;

/// A filter program with forward jumps to labels, resolved when it is
/// finished (classic BPF jumps are 8-bit forward offsets).
#[derive(Default)]
struct Program {
    code: Vec<libc::sock_filter>,
    /// (instruction, label if true, label if false).
    jumps: Vec<(usize, Option<Label>, Option<Label>)>,
    labels: Vec<Option<usize>>,
}

#[derive(Clone, Copy)]
struct Label(usize);

impl Program {
    fn label(&mut self) -> Label {
        self.labels.push(None);
        Label(self.labels.len() - 1)
    }
    fn here(&mut self, l: Label) {
        self.labels[l.0] = Some(self.code.len());
    }
    fn put(&mut self, code: u16, k: u32) {
        self.code.push(op(code, 0, 0, k));
    }
    /// A conditional jump: on to the next instruction unless a label is given.
    fn jump(&mut self, code: u16, k: u32, yes: Option<Label>, no: Option<Label>) {
        self.jumps.push((self.code.len(), yes, no));
        self.put(code, k);
    }
    /// The program, or an error if a jump is longer than classic BPF
    /// allows (more addresses than [`MAX_GIDS`] would need), goes back, or
    /// goes to a label never placed.
    fn finish(mut self) -> io::Result<Vec<libc::sock_filter>> {
        let too_long = || io::Error::new(io::ErrorKind::InvalidInput, "a filter jump too long");
        for &(at, yes, no) in &self.jumps {
            let off = |l: Option<Label>| match l {
                None => Ok(0),
                Some(l) => self.labels[l.0]
                    .and_then(|to| to.checked_sub(at + 1))
                    .and_then(|off| u8::try_from(off).ok())
                    .ok_or_else(too_long),
            };
            self.code[at].jt = off(yes)?;
            self.code[at].jf = off(no)?;
        }
        Ok(self.code)
    }
}

/// Which packets of an address are this NIC's when several share it: those
/// whose BTH destination QP has `slot` in its top `bits` bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpnSlot {
    /// The value of the top bits.
    pub slot: u32,
    /// How many bits.
    pub bits: u32,
}

impl QpnSlot {
    /// (mask, value) of the 32-bit word that holds the BTH's reserved byte
    /// and its destination QP.
    fn word(self) -> (u32, u32) {
        let shift = 24 - self.bits;
        (((1 << self.bits) - 1) << shift, self.slot << shift)
    }
}

/// The filter for an IP-level packet socket: IPv4 or IPv6, arriving (not
/// leaving), UDP, to one of `addrs`, destination port `port` (4791, but
/// for a ring being shown a GSO send, see [`open_probed`]), not a
/// fragment, and to a QP of `slot` if given; everything else is dropped in
/// the kernel.
fn port_filter(
    addrs: &[IpAddr],
    slot: Option<QpnSlot>,
    port: u16,
) -> io::Result<Vec<libc::sock_filter>> {
    let mut p = Program::default();
    let (drop, accept, v6, port4) = (p.label(), p.label(), p.label(), p.label());
    let (qpn4, qpn6) = (p.label(), p.label());
    p.put(LD_W_ABS, AD_PKTTYPE);
    p.jump(JEQ_K, PACKET_OUTGOING, Some(drop), None);
    p.put(LD_H_ABS, AD_PROTOCOL);
    p.jump(JEQ_K, u32::from(libc::ETH_P_IPV6 as u16), Some(v6), None);
    p.jump(JEQ_K, u32::from(libc::ETH_P_IP as u16), None, Some(drop));
    // IPv4: version 4, UDP, no fragment, to one of ours.
    p.put(LD_B_ABS, 0);
    p.put(ALU_AND_K, 0xF0);
    p.jump(JEQ_K, 0x40, None, Some(drop));
    p.put(LD_B_ABS, 9);
    p.jump(JEQ_K, u32::from(libc::IPPROTO_UDP as u8), None, Some(drop));
    p.put(LD_H_ABS, 6); // flags and fragment offset
    p.jump(JSET_K, 0x3FFF, Some(drop), None); // MF or an offset
    p.put(LD_W_ABS, 16); // destination address
    for a in addrs {
        if let IpAddr::V4(a) = a {
            p.jump(JEQ_K, u32::from(*a), Some(port4), None);
        }
    }
    p.jump(JEQ_K, 0, Some(drop), Some(drop));
    p.here(port4);
    p.put(LDX_B_MSH, 0); // X = header length
    p.put(LD_H_IND, 2); // UDP destination port
    p.jump(JEQ_K, u32::from(port), Some(qpn4), Some(drop));
    // IPv6: version 6, next header UDP, to one of ours, port 4791.
    p.here(v6);
    p.put(LD_B_ABS, 0);
    p.put(ALU_AND_K, 0xF0);
    p.jump(JEQ_K, 0x60, None, Some(drop));
    p.put(LD_B_ABS, 6);
    p.jump(JEQ_K, u32::from(libc::IPPROTO_UDP as u8), None, Some(drop));
    p.put(LD_H_ABS, 40 + 2);
    p.jump(JEQ_K, u32::from(port), None, Some(drop));
    for a in addrs {
        if let IpAddr::V6(a) = a {
            let next = p.label();
            for (i, w) in a.octets().chunks(4).enumerate() {
                let w = u32::from_be_bytes([w[0], w[1], w[2], w[3]]);
                p.put(LD_W_ABS, 24 + 4 * i as u32);
                let last = i == 3;
                p.jump(JEQ_K, w, last.then_some(qpn6), Some(next));
            }
            p.here(next);
        }
    }
    p.jump(JEQ_K, 0, Some(drop), Some(drop));
    // The destination QP, in the BTH's second word (past the UDP header).
    p.here(qpn4);
    if let Some(s) = slot {
        p.put(LD_W_IND, 8 + 4);
        let (mask, value) = s.word();
        p.put(ALU_AND_K, mask);
        p.jump(JEQ_K, value, Some(accept), Some(drop));
    }
    p.here(qpn6);
    if let Some(s) = slot {
        p.put(LD_W_ABS, 40 + 8 + 4);
        let (mask, value) = s.word();
        p.put(ALU_AND_K, mask);
        p.jump(JEQ_K, value, Some(accept), Some(drop));
    }
    p.here(accept);
    p.put(RET_K, ACCEPT);
    p.here(drop);
    p.put(RET_K, 0);
    p.finish()
}

/// `filter`, made for packets that begin with their IP header, for packets
/// that begin with a link-layer header of `link` bytes (a raw packet
/// socket's): every load of the packet's bytes moves on by `link`, loads of
/// what the kernel knows beside them stay.
fn past_link_header(mut filter: Vec<libc::sock_filter>, link: u32) -> Vec<libc::sock_filter> {
    for i in &mut filter {
        let of_bytes = match i.code {
            LD_B_ABS | LD_H_ABS | LD_W_ABS => i.k < AD,
            LD_H_IND | LD_W_IND | LDX_B_MSH => true,
            _ => false,
        };
        if of_bytes {
            i.k += link;
        }
    }
    filter
}

fn attach(fd: BorrowedFd<'_>, filter: &[libc::sock_filter]) -> io::Result<()> {
    let prog = libc::sock_fprog {
        len: filter.len() as u16,
        filter: filter.as_ptr().cast_mut(),
    };
    // `prog` points at `filter`, live for the call; the kernel copies and
    // checks the program.
    crate::udp::set_option(fd, libc::SOL_SOCKET, libc::SO_ATTACH_FILTER, &prog)
}

/// Keep `socket` bound but receiving nothing (its packets come in through
/// the frame socket).
pub(crate) fn receive_nothing(socket: &UdpSocket) -> io::Result<()> {
    attach(socket.as_fd(), &[op(RET_K, 0, 0, 0)])
}

/// The most addresses a NIC on an interface takes from it (the GID table's
/// length): its filter compares a packet's destination with each.
pub const MAX_GIDS: usize = 16;

/// An interface, by name: its index, addresses and MTU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interface {
    /// Its name.
    pub name: String,
    /// Its index.
    pub index: u32,
    /// Its addresses in the order a RoCE port's GID table lists them (as
    /// rdma_rxe and ConnectX do on an interface configured the usual way):
    /// the IPv6 link-local address first (the default GID), then the IPv4
    /// addresses, then the other IPv6 addresses; at most [`MAX_GIDS`].
    pub gids: Vec<IpAddr>,
    /// Its MTU: the largest IP packet it carries.
    pub mtu: u32,
}

impl Interface {
    /// Look `name` up.
    pub fn find(name: &str) -> io::Result<Interface> {
        let c = CString::new(name)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL in the name"))?;
        // SAFETY: a valid C string.
        let index = unsafe { libc::if_nametoindex(c.as_ptr()) };
        if index == 0 {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("no network interface {name}"),
            ));
        }
        let gids = gid_order(addrs_of(name)?);
        if gids.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("network interface {name} has no IP address"),
            ));
        }
        let mtu = std::fs::read_to_string(format!("/sys/class/net/{name}/mtu"))?;
        let mtu = mtu.trim().parse().map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("network interface {name}: MTU {mtu:?}"),
            )
        })?;
        Ok(Interface {
            name: name.into(),
            index,
            gids,
            mtu,
        })
    }

    /// The NIC's own address, what it answers with where nothing names a
    /// GID: the first IPv4 address, or else the first IPv6 one that is not
    /// link-local, or else the link-local one.
    pub fn addr(&self) -> IpAddr {
        let v4 = self.gids.iter().find(|a| a.is_ipv4());
        let global = self.gids.iter().find(|a| !link_local(**a));
        *v4.or(global).unwrap_or(&self.gids[0])
    }

    /// The scope to give a link-local IPv6 address of this interface in a
    /// socket address (0 for any other address).
    pub fn scope_of(&self, addr: IpAddr) -> u32 {
        if link_local(addr) {
            self.index
        } else {
            0
        }
    }
}

/// An IPv6 link-local address (fe80::/10).
pub(crate) fn link_local(a: IpAddr) -> bool {
    matches!(a, IpAddr::V6(v) if v.segments()[0] & 0xFFC0 == 0xFE80)
}

/// `addrs` in GID table order (see [`Interface::gids`]), IPv4-mapped IPv6
/// addresses taken as the IPv4 addresses they are, each once, at most
/// [`MAX_GIDS`].
fn gid_order(addrs: Vec<IpAddr>) -> Vec<IpAddr> {
    let addrs: Vec<IpAddr> = addrs.into_iter().map(|a| a.to_canonical()).collect();
    let rank = |a: &IpAddr| match a {
        _ if link_local(*a) => 0,
        IpAddr::V4(_) => 1,
        IpAddr::V6(_) => 2,
    };
    let mut out: Vec<IpAddr> = Vec::new();
    for r in 0..3 {
        for a in addrs.iter().filter(|a| rank(a) == r) {
            if !out.contains(a) && out.len() < MAX_GIDS {
                out.push(*a);
            }
        }
    }
    out
}

/// The IPv4 and IPv6 addresses of interface `name`, as the kernel lists them.
fn addrs_of(name: &str) -> io::Result<Vec<IpAddr>> {
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `list`, freed below.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut found = Vec::new();
    let mut p = list;
    while !p.is_null() {
        // SAFETY: a node of the list getifaddrs returned, not yet freed.
        let a = unsafe { &*p };
        // SAFETY: ifa_name is a C string.
        let this = unsafe { std::ffi::CStr::from_ptr(a.ifa_name) };
        if this.to_bytes() == name.as_bytes() && !a.ifa_addr.is_null() {
            // SAFETY: a non-null sockaddr, whose family is read first.
            let family = unsafe { (*a.ifa_addr).sa_family };
            if i32::from(family) == libc::AF_INET {
                // SAFETY: an AF_INET address is a sockaddr_in.
                let sin = unsafe { &*(a.ifa_addr as *const libc::sockaddr_in) };
                found.push(IpAddr::V4(Ipv4Addr::from(u32::from_be(
                    sin.sin_addr.s_addr,
                ))));
            } else if i32::from(family) == libc::AF_INET6 {
                // SAFETY: an AF_INET6 address is a sockaddr_in6.
                let sin6 = unsafe { &*(a.ifa_addr as *const libc::sockaddr_in6) };
                found.push(IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr)));
            }
        }
        p = a.ifa_next;
    }
    // SAFETY: the list from getifaddrs, freed once.
    unsafe { libc::freeifaddrs(list) };
    Ok(found)
}

/// How many top bits of a QP number say which NIC on an interface (or an
/// address: see `engine::relay`) it is on: up to 16 NICs (processes)
/// share one, and each QP number keeps 20 random bits.
pub const SLOT_BITS: u32 = 4;

/// The packet socket on an interface, filtered to the RoCE v2 packets
/// for `addrs` (the NIC's).
pub(crate) fn open(iface: &Interface, addrs: &[IpAddr], slot: Option<QpnSlot>) -> io::Result<Ring> {
    open_on(iface.index, addrs, slot, false, rnic_wire::ROCE_V2_PORT)
}

/// The same on `lo`, unless `iface` is `lo` itself: what this host sends
/// to the NIC's own addresses (one QP of the NIC to another, or a process
/// sharing the address to another) goes through the loopback interface,
/// never through `iface`, as the kernel routes it.
pub(crate) fn open_loopback(
    iface: &Interface,
    addrs: &[IpAddr],
    slot: Option<QpnSlot>,
) -> io::Result<Option<Ring>> {
    let lo = lo_index();
    if lo == 0 || lo == iface.index {
        return Ok(None);
    }
    open_on(lo, addrs, slot, false, rnic_wire::ROCE_V2_PORT).map(Some)
}

/// The UDP transport's ring on loopback: the packets to `addrs` (loopback
/// addresses) port 4791, taken from `lo` as they arrive, each a UDP
/// datagram (or a GSO send's, which loopback carries whole) read as a UDP
/// socket would give it, with no system call ([`Ring::datagram`]). The
/// NIC's UDP socket stays bound but receives nothing.
///
/// A kernel that cannot describe a GSO send in a virtio-net header (UDP
/// segmentation there came with Linux 6.2) drops such a send rather than
/// put it in the ring: the ring is first shown one, and is an error if it
/// does not hand it over.
pub(crate) fn open_loopback_udp(addr: IpAddr) -> io::Result<Ring> {
    let lo = lo_index();
    if lo == 0 {
        return Err(io::Error::last_os_error());
    }
    open_probed(lo, addr, true)
}

/// The index of `lo` (0 if there is none).
pub(crate) fn lo_index() -> u32 {
    // SAFETY: a valid C string.
    unsafe { libc::if_nametoindex(c"lo".as_ptr()) }
}

/// A ring on `lo` (the UDP transport's if `udp`) for port 4791 of `addr`,
/// shown a GSO send first ([`Ring::takes_gso_sends`]). The send goes to a
/// port of `addr` a socket here holds, which the ring's filter passes
/// until it is shown it: never to port 4791, where a capture would show a
/// packet that is not RoCE.
fn open_probed(lo: u32, addr: IpAddr, udp: bool) -> io::Result<Ring> {
    let target = UdpSocket::bind((addr, 0))?;
    let to = target.local_addr()?;
    let ring = open_on(lo, &[addr], None, udp, to.port())?;
    ring.takes_gso_sends(to)?;
    attach(
        ring.fd(),
        &ring_filter(&[addr], None, udp, rnic_wire::ROCE_V2_PORT)?,
    )?;
    Ok(ring)
}

/// The filter of a ring for UDP port `port` of `addrs` (see
/// [`port_filter`]), for the UDP transport's raw socket if `udp`.
fn ring_filter(
    addrs: &[IpAddr],
    slot: Option<QpnSlot>,
    udp: bool,
    port: u16,
) -> io::Result<Vec<libc::sock_filter>> {
    let filter = port_filter(addrs, slot, port)?;
    Ok(if udp {
        past_link_header(filter, LO_LINK_HEADER)
    } else {
        filter
    })
}

fn open_on(
    index: u32,
    addrs: &[IpAddr],
    slot: Option<QpnSlot>,
    udp: bool,
    port: u16,
) -> io::Result<Ring> {
    let proto = (libc::ETH_P_ALL as u16).to_be();
    // SAFETY: plain socket(2); the descriptor is owned below.
    let raw = unsafe {
        libc::socket(
            libc::AF_PACKET,
            // The virtio-net header the UDP transport's ring needs comes
            // only with a raw socket's packets (link-layer header and all).
            if udp {
                libc::SOCK_RAW
            } else {
                libc::SOCK_DGRAM
            } | libc::SOCK_NONBLOCK
                | libc::SOCK_CLOEXEC,
            i32::from(proto),
        )
    };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new descriptor, owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // The filter and the ring go on before the bind: no packet is queued
    // unfiltered, or anywhere but in the ring.
    attach(fd.as_fd(), &ring_filter(addrs, slot, udp, port)?)?;
    // What this host sends is not this ring's (the filter drops it too):
    // not even copied for it to look at (Linux 4.20).
    let on: libc::c_int = 1;
    let _ = crate::udp::set_option(
        fd.as_fd(),
        libc::SOL_PACKET,
        libc::PACKET_IGNORE_OUTGOING,
        &on,
    );
    let ring = Ring::new(fd, udp)?;
    // SAFETY: sockaddr_ll is plain data; all zeroes is valid.
    let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sll.sll_family = libc::AF_PACKET as u16;
    sll.sll_protocol = proto;
    sll.sll_ifindex = index as i32;
    // SAFETY: binds the descriptor to a valid sockaddr_ll of the right size.
    let r = unsafe {
        libc::bind(
            ring.fd.as_raw_fd(),
            (&sll as *const libc::sockaddr_ll).cast(),
            size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(ring)
}

/// Bytes per frame of an interface's [`Ring`]: the ring header and the
/// address the kernel writes before the packet (80 bytes), and a packet of
/// up to 8,112 bytes, more than a RoCE packet of the largest path MTU
/// (4,096) with every header. A longer packet is cut there and counted as
/// malformed, as a UDP receive slot cuts one.
const FRAME_SIZE: usize = 8192;

/// Bytes per frame of the UDP transport's ring on loopback: the ring
/// header, the address and the virtio-net header before the packet (76
/// bytes), and one packet of the largest path MTU (4,096) with every
/// header, the link-layer header and IPv6 included (4,194 bytes at most). Such a packet that did not
/// fit would be cut in the ring and also queued whole on the socket, the
/// kernel copying it twice and the NIC taking it with a system call: every
/// packet of a stream at a 2,048- or 4,096-byte MTU. What is longer still
/// (a GSO send, which loopback carries whole) goes that way.
const UDP_FRAME_SIZE: usize = 4352;

/// Bytes per block of the UDP transport's ring: fifteen frames and 256
/// bytes to spare (frames never straddle a block).
const UDP_BLOCK_SIZE: usize = 64 << 10;

/// Bytes of the UDP transport's ring: 1,920 frames, as many packets as a
/// UDP socket's receive buffer holds of small ones.
const UDP_RING_SIZE: usize = 8 << 20;

/// A frame socket's receive ring (`PACKET_RX_RING`, `TPACKET_V2`): frames
/// in memory the socket and this process share, each handed over by a
/// status word. The kernel copies a packet that passed the filter into the
/// next frame it owns and marks it the user's; the NIC reads it where it
/// lies and hands the frame back. A receive is no system call, and a
/// receive that finds nothing, most of a spinning poller's, is one load:
/// where a packet socket's `recvmmsg` costs as much as a UDP socket's.
/// Waiting stays poll(2) on the socket, which reports a frame the user
/// owns.
///
/// Frames are taken in order, one at a time, by whoever holds the engine's
/// state lock: [`Ring::next`] and the [`Filled`] it returns must not be
/// used from two threads at once, which the lock sees to.
pub(crate) struct Ring {
    fd: OwnedFd,
    map: std::ptr::NonNull<u8>,
    frames: usize,
    frame_size: usize,
    /// Frames per block: a block's frames lie one after another from its
    /// start, and what is left of it after them is not used.
    frames_per_block: usize,
    block_size: usize,
    /// The next frame to look at: the kernel fills them in order, wrapping.
    next: std::sync::atomic::AtomicUsize,
    /// The ring of the UDP transport on loopback ([`open_loopback_udp`]):
    /// each packet comes with a virtio-net header (its GSO segment size),
    /// and one longer than a frame is queued whole on the socket as well,
    /// to be received into this.
    udp: Option<parking_lot::Mutex<Vec<u8>>>,
}

// SAFETY: the mapping is owned by the ring and unmapped on drop; the frames
// in it are read and handed back only through `next` and `Filled`, whose
// callers hold the engine's lock (see the type), and each frame's status
// word, the only word the kernel and this process both write, is accessed
// atomically.
unsafe impl Send for Ring {}
unsafe impl Sync for Ring {}

impl Ring {
    /// Set `fd` (a packet socket, not yet bound) up with a ring (the UDP
    /// transport's if `udp`) and map it.
    fn new(fd: OwnedFd, udp: bool) -> io::Result<Ring> {
        // A block is whole pages, and frames never straddle one: a frame
        // a block, or a page's worth of frames, for an interface's ring.
        let (frame_size, block, bytes) = if udp {
            (UDP_FRAME_SIZE, UDP_BLOCK_SIZE, UDP_RING_SIZE)
        } else {
            let block = FRAME_SIZE.max(rustix::param::page_size());
            (FRAME_SIZE, block, crate::udp::SOCKET_BUFFER)
        };
        let version = libc::tpacket_versions::TPACKET_V2 as libc::c_int;
        crate::udp::set_option(fd.as_fd(), libc::SOL_PACKET, libc::PACKET_VERSION, &version)?;
        if udp {
            // A virtio-net header before each packet says how long the
            // datagrams of a GSO send are (loopback carries the send
            // whole); a packet longer than a frame (a GSO send of up to 64
            // KiB) is cut in the ring and queued whole on the socket too.
            let on: libc::c_int = 1;
            crate::udp::set_option(fd.as_fd(), libc::SOL_PACKET, libc::PACKET_VNET_HDR, &on)?;
            crate::udp::set_option(fd.as_fd(), libc::SOL_PACKET, libc::PACKET_COPY_THRESH, &on)?;
            crate::udp::ask_recv_buffer(fd.as_fd());
        }
        let blocks = (bytes / block).max(1);
        let frames_per_block = block / frame_size;
        let frames = blocks * frames_per_block;
        let req = libc::tpacket_req {
            tp_block_size: block as libc::c_uint,
            tp_block_nr: blocks as libc::c_uint,
            tp_frame_size: frame_size as libc::c_uint,
            tp_frame_nr: frames as libc::c_uint,
        };
        crate::udp::set_option(fd.as_fd(), libc::SOL_PACKET, libc::PACKET_RX_RING, &req)?;
        // SAFETY: maps the ring the kernel just made for this socket, at an
        // address it picks; the mapping is the ring's alone.
        let map = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                blocks * block,
                rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                rustix::mm::MapFlags::SHARED,
                &fd,
                0,
            )?
        };
        let map = std::ptr::NonNull::new(map.cast::<u8>())
            .ok_or_else(|| io::Error::other("mmap returned a null mapping"))?;
        Ok(Ring {
            fd,
            map,
            frames,
            frame_size,
            frames_per_block,
            block_size: block,
            next: std::sync::atomic::AtomicUsize::new(0),
            udp: udp.then(|| parking_lot::Mutex::new(vec![0; COPY_SLOT])),
        })
    }

    /// Send a GSO send of two datagrams to `to` (a port the ring's filter
    /// passes, see [`open_probed`]) and see it come through the ring
    /// whole, its datagrams' length told; an error if it does not within
    /// 200 ms.
    fn takes_gso_sends(&self, to: std::net::SocketAddr) -> io::Result<()> {
        const SEG: usize = 16;
        let probe = UdpSocket::bind((to.ip(), 0))?;
        let seg = SEG as libc::c_int;
        crate::udp::set_option(probe.as_fd(), libc::SOL_UDP, libc::UDP_SEGMENT, &seg)?;
        probe.send_to(&[0x5A; 2 * SEG], to)?;
        let from = probe.local_addr()?;
        let deadline = std::time::Instant::now() + std::time::Duration::from_millis(200);
        loop {
            while let Some(frame) = self.next() {
                let seen = self.datagram(&frame, |d| {
                    d.is_some_and(|(src, p, seg)| src == from && p.len() == 2 * SEG && seg == SEG)
                });
                if seen {
                    return Ok(());
                }
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Err(io::Error::other(
                    "the kernel hands no GSO send to a packet ring (it describes none in a virtio-net header)",
                ));
            }
            let mut fds = [rustix::event::PollFd::new(
                &self.fd,
                rustix::event::PollFlags::IN,
            )];
            let t = rustix::event::Timespec::try_from(left).unwrap_or_default();
            let _ = rustix::event::poll(&mut fds, Some(&t));
        }
    }

    /// Whether this is the UDP transport's ring on loopback, whose frames
    /// are read with [`Ring::datagram`].
    pub(crate) fn carries_udp(&self) -> bool {
        self.udp.is_some()
    }

    /// The datagram in `frame` of the UDP transport's ring, as a UDP
    /// socket with GRO gives it: its sender, its payload (the payloads of
    /// a GSO send's datagrams one after another), and how long each of
    /// them is (the last may be shorter); handed to `f`, with None if the
    /// frame holds no UDP datagram (it passed the filter, so something
    /// was wrong with it) or its whole copy could not be had.
    pub(crate) fn datagram<R>(
        &self,
        frame: &Filled<'_>,
        f: impl FnOnce(Option<(std::net::SocketAddr, &[u8], usize)>) -> R,
    ) -> R {
        let Some(big) = &self.udp else {
            return f(None);
        };
        if frame.copied {
            // Queued whole as the frame was filled, so the next on the
            // socket: a virtio-net header, then the IP packet.
            let mut buf = big.lock();
            // SAFETY: receives into `buf`, live and `buf.len()` long.
            let n = unsafe {
                libc::recv(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            let got = usize::try_from(n).ok().and_then(|n| buf.get(..n));
            let ip = VNET_HDR + LO_LINK_HEADER as usize;
            return f(got.and_then(|b| udp_datagram(b.get(ip..)?, gso_size(b))));
        }
        f(frame.bytes.and_then(|b| udp_datagram(b, frame.gso_size)))
    }

    /// The socket: poll(2) it to wait for a frame.
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Where frame `i` begins in the mapping.
    fn frame_at(&self, i: usize) -> usize {
        (i / self.frames_per_block) * self.block_size
            + (i % self.frames_per_block) * self.frame_size
    }

    /// The mapping's length: every block, whole.
    fn map_len(&self) -> usize {
        self.frames / self.frames_per_block * self.block_size
    }

    /// The status word of frame `i`.
    fn status(&self, i: usize) -> &std::sync::atomic::AtomicU32 {
        // SAFETY: frame `i` (< `frames`) lies within the mapping and begins
        // with a `tpacket2_hdr`, whose first field is the u32 status, at
        // whole blocks and frames from the page-aligned mapping (both
        // multiples of 16, so aligned); the kernel writes it with ordered stores, this process
        // only atomically.
        unsafe { &*self.map.as_ptr().add(self.frame_at(i)).cast() }
    }

    /// The next frame the kernel has filled, if it has: the caller reads
    /// it and the frame goes back to the kernel when the [`Filled`] drops.
    pub(crate) fn next(&self) -> Option<Filled<'_>> {
        use std::sync::atomic::Ordering;
        let i = self.next.load(Ordering::Relaxed);
        // Acquire: the packet's bytes, written before the status, are seen.
        if self.status(i).load(Ordering::Acquire) & libc::TP_STATUS_USER == 0 {
            return None;
        }
        let base = self.map.as_ptr().wrapping_add(self.frame_at(i));
        // SAFETY: the frame is the user's (status above) until `Filled`
        // hands it back: the kernel writes none of it meanwhile. Its
        // header is a `tpacket2_hdr` the kernel wrote, at a frame's start
        // (see `status`: aligned to 16 bytes), its u32 and u16 fields at
        // their natural alignment.
        let hdr = unsafe { std::ptr::read(base.cast::<libc::tpacket2_hdr>()) };
        // The packet the kernel copied begins at `tp_mac` (its link-layer
        // header, on a raw socket) and is `tp_snaplen` long; its IP header
        // at `tp_net`. A packet longer than the frame is cut to fit
        // (`tp_snaplen` less than `tp_len`): its IP header's length then
        // exceeds the bytes, and the NIC counts it as malformed.
        let at = usize::from(hdr.tp_net);
        let len = (hdr.tp_snaplen as usize).saturating_sub(at.saturating_sub(hdr.tp_mac.into()));
        let bytes = at
            .checked_add(len)
            .is_some_and(|end| end <= self.frame_size)
            .then(|| {
                // SAFETY: within the frame (checked), the user's until `Filled`
                // drops, which the slice's lifetime is tied to.
                unsafe { std::slice::from_raw_parts(base.add(at), len) }
            });
        // The virtio-net header, where there is one, lies just before the
        // link-layer header.
        let gso_size = match usize::from(hdr.tp_mac).checked_sub(VNET_HDR) {
            Some(v) if self.udp.is_some() && v >= TPACKET2_HDRLEN => {
                // SAFETY: within the frame, after its header, the user's
                // until `Filled` drops.
                gso_size(unsafe { std::slice::from_raw_parts(base.add(v), VNET_HDR) })
            }
            _ => 0,
        };
        Some(Filled {
            ring: self,
            frame: i,
            bytes,
            copied: hdr.tp_status & libc::TP_STATUS_COPY != 0,
            gso_size,
        })
    }
}

impl std::fmt::Debug for Ring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ring")
            .field("fd", &self.fd)
            .field("frames", &self.frames)
            .field("next", &self.next)
            .finish()
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: the mapping `new` made, of this length; no `Filled`
        // outlives the ring (it borrows it).
        unsafe {
            let _ = rustix::mm::munmap(self.map.as_ptr().cast(), self.map_len());
        }
    }
}

/// A frame of a [`Ring`] the kernel filled: the user's until this drops,
/// which hands it back and moves the ring on.
pub(crate) struct Filled<'a> {
    ring: &'a Ring,
    frame: usize,
    bytes: Option<&'a [u8]>,
    /// The packet was longer than the frame and is queued whole on the
    /// socket (the UDP transport's ring).
    copied: bool,
    /// The length of the datagrams of the GSO send in the frame (0: one
    /// datagram), from the virtio-net header.
    gso_size: usize,
}

impl Filled<'_> {
    /// The IP packet (cut short if it was longer than a frame), or None if
    /// the kernel placed it outside the frame.
    pub(crate) fn bytes(&self) -> Option<&[u8]> {
        self.bytes
    }
}

impl Drop for Filled<'_> {
    fn drop(&mut self) {
        use std::sync::atomic::Ordering;
        // Release: this process's reads of the frame are done before the
        // kernel may write it again.
        self.ring
            .status(self.frame)
            .store(libc::TP_STATUS_KERNEL, Ordering::Release);
        self.ring
            .next
            .store((self.frame + 1) % self.ring.frames, Ordering::Relaxed);
    }
}

/// A `tpacket2_hdr` and the link-layer address after it: where a frame's
/// own data may begin.
const TPACKET2_HDRLEN: usize = 32 + size_of::<libc::sockaddr_ll>();

/// The link-layer header `lo` gives its packets (an Ethernet header's
/// length), before the IP header.
const LO_LINK_HEADER: u32 = 14;

/// A virtio-net header's length (`struct virtio_net_hdr`).
const VNET_HDR: usize = 10;

/// Sends past the kernel's IP and UDP layers: a raw packet socket on the
/// NIC's link takes each message with the link-layer, IPv4 and UDP headers
/// the NIC writes itself, and hands it to the device. A UDP socket's send
/// finds a route, a socket and a neighbour first, and goes through the
/// netfilter hooks: on this machine class about a microsecond of a 64-byte
/// ping-pong's three on loopback, and of three and a half over a veth (a
/// datagram each way, both ends polling a ring). The receiver sees what it
/// would see of a UDP socket's send: IPv4 with DF, TTL 64, identification
/// 0, the UDP checksum 0.
///
/// On loopback ([`FrameSender::loopback`]) a message of several datagrams
/// is a GSO send, as from a UDP socket: one packet whose virtio-net header
/// gives the datagrams' length, which loopback carries whole (its datagram
/// `k` carries the ICRC for identification `k`, as the kernel would number
/// it if it cut the send), its UDP checksum left to the device; and the
/// packet goes to the device at once (`PACKET_QDISC_BYPASS`). Only to
/// addresses whose packets a ring takes in: the kernel's IP layer drops
/// such a packet to a loopback address as a martian (it comes without a
/// route), so a UDP socket never sees it.
///
/// On an interface ([`FrameSender::on`]) each datagram goes alone, to the
/// link-layer address the kernel's neighbour table has for its destination
/// (one the UDP socket's sends made it resolve), through the device's
/// queue, where a capture on the interface sees it.
///
/// Only for IPv4: an IPv6 receiver's UDP socket needs a UDP checksum. Needs
/// CAP_NET_RAW, as a ring does, and on loopback a kernel that takes a GSO
/// send in a virtio-net header (6.2), which the ring's probe has shown.
pub(crate) struct FrameSender {
    fd: OwnedFd,
    /// The link, as every send's destination.
    to: libc::sockaddr_ll,
    /// The link's own address, each frame's source (loopback's: zeroes).
    mac: [u8; 6],
    /// The link is `lo`.
    loopback: bool,
}

/// A message's headers: virtio-net, Ethernet, IPv4 and UDP.
const FRAME_HEADERS: usize = VNET_HDR + LO_LINK_HEADER as usize + 28;

/// A datagram as [`FrameSender::send`] takes it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Outgoing<'a> {
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    pub src_port: u16,
    /// The link-layer address it goes to.
    pub mac: [u8; 6],
    /// The IB packet, BTH through ICRC.
    pub ib: &'a [u8],
}

impl FrameSender {
    /// A sender on `lo`.
    pub(crate) fn loopback() -> io::Result<FrameSender> {
        let lo = lo_index();
        if lo == 0 {
            return Err(io::Error::new(io::ErrorKind::NotFound, "no lo"));
        }
        FrameSender::open(lo, [0; 6], true)
    }

    /// A sender on `iface`.
    pub(crate) fn on(iface: &Interface) -> io::Result<FrameSender> {
        let mac = link_address(&iface.name)?;
        FrameSender::open(iface.index, mac, false)
    }

    /// A raw packet socket on the link of index `index` whose own address
    /// is `mac`, that receives nothing (protocol 0) and takes a virtio-net
    /// header before each packet; handing packets to the device at once
    /// if `bypass`.
    fn open(index: u32, mac: [u8; 6], bypass: bool) -> io::Result<FrameSender> {
        // SAFETY: plain socket(2); the descriptor is owned below.
        let raw = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                0,
            )
        };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a new descriptor, owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let on: libc::c_int = 1;
        crate::udp::set_option(fd.as_fd(), libc::SOL_PACKET, libc::PACKET_VNET_HDR, &on)?;
        if bypass {
            // Straight to the device: loopback has no queue anyway.
            let _ = crate::udp::set_option(
                fd.as_fd(),
                libc::SOL_PACKET,
                libc::PACKET_QDISC_BYPASS,
                &on,
            );
        }
        crate::udp::ask_send_buffer(fd.as_fd());
        // SAFETY: sockaddr_ll is plain data; all zeroes is valid.
        let mut to: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        to.sll_family = libc::AF_PACKET as u16;
        to.sll_protocol = (libc::ETH_P_IP as u16).to_be();
        to.sll_ifindex = index as i32;
        Ok(FrameSender {
            fd,
            to,
            mac,
            loopback: bypass,
        })
    }

    /// Whether [`FrameSender::send`] takes `n` datagrams from `src` to
    /// `dst` as one message: IPv4; on loopback between loopback addresses
    /// (a ring must take `dst`'s packets in as well), elsewhere one
    /// datagram to an address not loopback's (whose link-layer address the
    /// kernel must have resolved as well).
    pub(crate) fn takes(&self, n: usize, src: IpAddr, dst: IpAddr) -> bool {
        match (src, dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) if self.loopback => s.is_loopback() && d.is_loopback(),
            (IpAddr::V4(_), IpAddr::V4(d)) => n == 1 && !d.is_loopback(),
            _ => false,
        }
    }

    /// Send `groups.len()` messages, message `g` being the `groups[g]`
    /// datagrams that follow the previous messages' (`datagram(i)` gives
    /// the `i`th; each one the sender [takes](FrameSender::takes), and a
    /// message of several on loopback only). A message of more than one
    /// datagram is a GSO send, and must be what [`crate::udp::gso_run`]
    /// would make of them. As few system calls as the device takes them
    /// in. Returns how many datagrams went, or were lost as on a full link
    /// (the transport retransmits them); an error if the first message
    /// could not be sent for another reason.
    pub(crate) fn send<'a>(
        &self,
        groups: &[usize],
        datagram: impl Fn(usize) -> Outgoing<'a>,
    ) -> io::Result<usize> {
        use std::mem::MaybeUninit;
        const BATCH: usize = crate::udp::BATCH;
        const IOVS: usize = 256;
        let mut headers = [[0u8; FRAME_HEADERS]; BATCH];
        let mut iovs = [const { MaybeUninit::<libc::iovec>::uninit() }; IOVS];
        let mut msgs = [const { MaybeUninit::<libc::mmsghdr>::uninit() }; BATCH];
        let mut sent = 0; // datagrams
        let mut g = 0; // the next message
        while g < groups.len() {
            // Messages for this call: up to BATCH of them, and IOVS iovecs.
            let (mut m, mut iov_at, mut at) = (0, 0, sent);
            while g + m < groups.len() && m < BATCH && iov_at + 1 + groups[g + m] <= IOVS {
                let n = groups[g + m];
                let first = datagram(at);
                let bytes: usize = (at..at + n).map(|i| datagram(i).ib.len()).sum();
                let gso = (n > 1).then_some(first.ib.len());
                frame_headers(&mut headers[m], &first, self.mac, bytes, gso)?;
                iovs[iov_at].write(libc::iovec {
                    iov_base: headers[m].as_mut_ptr().cast(),
                    iov_len: FRAME_HEADERS,
                });
                for k in 0..n {
                    let ib = datagram(at + k).ib;
                    iovs[iov_at + 1 + k].write(libc::iovec {
                        iov_base: ib.as_ptr() as *mut libc::c_void,
                        iov_len: ib.len(),
                    });
                }
                // SAFETY: mmsghdr is plain data; all zeroes is a valid empty one.
                let mut h: libc::mmsghdr = unsafe { std::mem::zeroed() };
                h.msg_hdr.msg_name = (&self.to as *const libc::sockaddr_ll).cast_mut().cast();
                h.msg_hdr.msg_namelen = size_of::<libc::sockaddr_ll>() as libc::socklen_t;
                h.msg_hdr.msg_iov = iovs.as_mut_ptr().wrapping_add(iov_at).cast();
                h.msg_hdr.msg_iovlen = 1 + n;
                msgs[m].write(h);
                iov_at += 1 + n;
                at += n;
                m += 1;
            }
            // SAFETY: the first `m` headers are filled in, each pointing at
            // the destination (read only) and at live iovecs over bytes
            // borrowed for the duration of the call: the headers above and
            // the datagrams; the kernel reads them and writes each sent
            // message's length.
            let r = unsafe {
                libc::sendmmsg(
                    self.fd.as_raw_fd(),
                    msgs.as_mut_ptr().cast::<libc::mmsghdr>(),
                    m as libc::c_uint,
                    libc::MSG_DONTWAIT,
                )
            };
            let went = if r < 0 {
                let e = io::Error::last_os_error();
                match e.raw_os_error() {
                    Some(libc::EAGAIN) => return Ok(sent),
                    Some(libc::EINTR) => continue,
                    // Dropped at the device (its backlog or queue full):
                    // lost, as on a full link.
                    Some(libc::ENOBUFS) => 1,
                    _ if sent == 0 => return Err(e),
                    _ => return Ok(sent),
                }
            } else if r == 0 {
                break;
            } else {
                r as usize
            };
            sent += groups[g..g + went].iter().sum::<usize>();
            g += went;
        }
        Ok(sent)
    }
}

/// Write a message's headers into `buf`, for `bytes` of UDP payload from
/// `d`'s source and port to its destination's port 4791, from link-layer
/// address `own` to `d.mac`: a virtio-net header (a GSO send of datagrams
/// of `gso` bytes, if given, with its UDP checksum left to the device), the
/// Ethernet header, and the IPv4 and UDP headers.
fn frame_headers(
    buf: &mut [u8; FRAME_HEADERS],
    d: &Outgoing<'_>,
    own: [u8; 6],
    bytes: usize,
    gso: Option<usize>,
) -> io::Result<()> {
    let (vnet, rest) = buf.split_at_mut(VNET_HDR);
    let (eth, ip_udp) = rest.split_at_mut(LO_LINK_HEADER as usize);
    vnet.fill(0);
    eth[..6].copy_from_slice(&d.mac);
    eth[6..12].copy_from_slice(&own);
    eth[12..14].copy_from_slice(&(libc::ETH_P_IP as u16).to_be_bytes());
    let ip = rnic_wire::encap::IpRepr::V4(rnic_wire::encap::ipv4::Repr::new(d.src, d.dst));
    rnic_wire::encap::emit_ip_udp(&ip, d.src_port, bytes, ip_udp)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
    if let Some(seg) = gso {
        let seg = u16::try_from(seg).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        let l4 = LO_LINK_HEADER as u16 + 20;
        // flags (NEEDS_CSUM), gso_type (UDP_L4), hdr_len, gso_size,
        // csum_start, csum_offset: little-endian, as a modern virtio-net
        // header is.
        vnet[0] = 1;
        vnet[1] = 5;
        vnet[2..4].copy_from_slice(&(l4 + 8).to_le_bytes());
        vnet[4..6].copy_from_slice(&seg.to_le_bytes());
        vnet[6..8].copy_from_slice(&l4.to_le_bytes());
        vnet[8..10].copy_from_slice(&6u16.to_le_bytes());
        // The device adds the payload to the pseudo-header's sum (its
        // folded sum: the checksum's complement).
        let mut pseudo = [0u8; 12];
        pseudo[..4].copy_from_slice(&d.src.octets());
        pseudo[4..8].copy_from_slice(&d.dst.octets());
        pseudo[9] = 17;
        pseudo[10..].copy_from_slice(&((8 + bytes) as u16).to_be_bytes());
        let sum = !rnic_wire::encap::ipv4::checksum(&pseudo);
        ip_udp[26..28].copy_from_slice(&sum.to_be_bytes());
    }
    Ok(())
}

/// The link-layer address of interface `name`, an Ethernet link (from
/// sysfs): the frames a [`FrameSender`] writes begin with an Ethernet
/// header, which another kind of link would carry as garbage.
fn link_address(name: &str) -> io::Result<[u8; 6]> {
    let kind = std::fs::read_to_string(format!("/sys/class/net/{name}/type"))?;
    if kind.trim() != "1" {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("{name} is not an Ethernet link (ARPHRD {})", kind.trim()),
        ));
    }
    let text = std::fs::read_to_string(format!("/sys/class/net/{name}/address"))?;
    parse_mac(text.trim()).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{name} has no Ethernet address ({})", text.trim()),
        )
    })
}

/// `aa:bb:cc:dd:ee:ff` as six bytes.
fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = s.split(':');
    for b in &mut mac {
        *b = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}

/// The link-layer address the kernel's neighbour table holds for `addr`
/// on interface `iface`, if it has resolved one (from `/proc/net/arp`:
/// IPv4 only).
pub(crate) fn neighbour(addr: Ipv4Addr, iface: &str) -> Option<[u8; 6]> {
    let table = std::fs::read_to_string("/proc/net/arp").ok()?;
    neighbour_in(&table, addr, iface)
}

/// [`neighbour`] in `table`, the text of `/proc/net/arp`: a complete entry
/// (flag ATF_COM, 0x2) for `addr` on `iface`.
fn neighbour_in(table: &str, addr: Ipv4Addr, iface: &str) -> Option<[u8; 6]> {
    table.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        let [ip, _hw_type, flags, mac, _mask, dev] = f.as_slice() else {
            return None;
        };
        let flags = u32::from_str_radix(flags.trim_start_matches("0x"), 16).ok()?;
        (ip.parse() == Ok(addr) && *dev == iface && flags & 0x2 != 0)
            .then(|| parse_mac(mac))
            .flatten()
    })
}

impl std::fmt::Debug for FrameSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrameSender").field("fd", &self.fd).finish()
    }
}

/// Room for a packet queued whole on the UDP transport's ring socket: a
/// virtio-net header and the largest IP packet.
const COPY_SLOT: usize = VNET_HDR + 65_536;

/// The GSO segment size a virtio-net header gives (little-endian, as a
/// modern virtio-net header is), 0 if it describes no GSO packet.
fn gso_size(vnet: &[u8]) -> usize {
    match vnet.get(..6) {
        // gso_type VIRTIO_NET_HDR_GSO_NONE (0): one datagram.
        Some(h) if h[1] != 0 => usize::from(u16::from_le_bytes([h[4], h[5]])),
        _ => 0,
    }
}

/// The sender, the UDP payload and the datagram length (`gso_size`, or
/// the whole payload's) of an IP packet holding a UDP datagram; None if it
/// holds none, or its length does not match its bytes.
fn udp_datagram(ip: &[u8], gso_size: usize) -> Option<(std::net::SocketAddr, &[u8], usize)> {
    let (src, ip_len, total): (IpAddr, usize, usize) = match ip.first()? >> 4 {
        4 => {
            let src: [u8; 4] = ip.get(12..16)?.try_into().ok()?;
            let total = usize::from(u16::from_be_bytes([*ip.get(2)?, *ip.get(3)?]));
            (
                Ipv4Addr::from(src).into(),
                usize::from(ip[0] & 0x0F) * 4,
                total,
            )
        }
        6 => {
            let src: [u8; 16] = ip.get(8..24)?.try_into().ok()?;
            let payload = usize::from(u16::from_be_bytes([*ip.get(4)?, *ip.get(5)?]));
            (Ipv6Addr::from(src).into(), 40, 40 + payload)
        }
        _ => return None,
    };
    if total != ip.len() || ip_len < 20 {
        return None;
    }
    let udp = ip.get(ip_len..)?;
    let port = u16::from_be_bytes([*udp.first()?, *udp.get(1)?]);
    let payload = udp.get(8..)?;
    let seg = if gso_size > 0 {
        gso_size
    } else {
        payload.len().max(1)
    };
    Some((std::net::SocketAddr::new(src, port), payload, seg))
}

/// The IB packet (BTH through ICRC) of an IP packet the frame socket took
/// in: past the IP header (an IPv4 header's IHL words, or IPv6's 40 bytes)
/// and the UDP header; empty if the packet is shorter than that. Enough to
/// look at the opcode and the QP before the NIC parses and verifies the
/// whole packet.
pub(crate) fn ib_packet(ip_packet: &[u8]) -> &[u8] {
    let ip_len = match ip_packet.first() {
        Some(b) if b >> 4 == 6 => 40,
        Some(b) => usize::from(b & 0x0F) * 4,
        None => 0,
    };
    ip_packet.get(ip_len + 8..).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The filter for port 4791.
    fn roce_filter(addrs: &[IpAddr], slot: Option<QpnSlot>) -> io::Result<Vec<libc::sock_filter>> {
        port_filter(addrs, slot, rnic_wire::ROCE_V2_PORT)
    }

    /// What the kernel knows of a packet beside its bytes.
    struct Meta {
        protocol: u16,
        pkttype: u32,
    }

    const IN4: Meta = Meta {
        protocol: libc::ETH_P_IP as u16,
        pkttype: 0,
    };
    const IN6: Meta = Meta {
        protocol: libc::ETH_P_IPV6 as u16,
        pkttype: 0,
    };

    /// Run a classic BPF program over `pkt` as the kernel would (only the
    /// instructions the filters here use): what it returns.
    fn run(prog: &[libc::sock_filter], pkt: &[u8], meta: &Meta) -> u32 {
        let (mut a, mut x, mut pc) = (0u32, 0u32, 0usize);
        let byte = |i: usize| pkt.get(i).copied();
        loop {
            let i = prog[pc];
            let k = i.k as usize;
            pc += 1;
            let load = match i.code {
                LD_H_ABS if i.k == AD_PROTOCOL => Some(u32::from(meta.protocol)),
                LD_W_ABS if i.k == AD_PKTTYPE => Some(meta.pkttype),
                LD_B_ABS => byte(k).map(u32::from),
                LD_H_ABS => byte(k)
                    .zip(byte(k + 1))
                    .map(|(h, l)| u32::from(h) << 8 | u32::from(l)),
                LD_W_ABS => pkt
                    .get(k..k + 4)
                    .map(|w| u32::from_be_bytes(w.try_into().unwrap())),
                LD_H_IND => {
                    let at = x as usize + k;
                    byte(at)
                        .zip(byte(at + 1))
                        .map(|(h, l)| u32::from(h) << 8 | u32::from(l))
                }
                LD_W_IND => {
                    let at = x as usize + k;
                    pkt.get(at..at + 4)
                        .map(|w| u32::from_be_bytes(w.try_into().unwrap()))
                }
                LDX_B_MSH => {
                    x = u32::from(byte(k).unwrap_or(0) & 0x0F) * 4;
                    continue;
                }
                ALU_AND_K => {
                    a &= i.k;
                    continue;
                }
                JEQ_K | JSET_K => {
                    let taken = if i.code == JEQ_K {
                        a == i.k
                    } else {
                        a & i.k != 0
                    };
                    pc += usize::from(if taken { i.jt } else { i.jf });
                    continue;
                }
                RET_K => return i.k,
                c => panic!("opcode {c:#x}"),
            };
            // A load past the end drops the packet, as in the kernel.
            match load {
                Some(v) => a = v,
                None => return 0,
            }
        }
    }

    /// An IPv4 UDP packet from 10.0.0.2 to `dst`:`port`, 64 bytes of payload.
    fn udp4(dst: Ipv4Addr, port: u16) -> Vec<u8> {
        let mut p = vec![0u8; 20 + 8 + 64];
        p[0] = 0x45;
        let len = p.len() as u16;
        p[2..4].copy_from_slice(&len.to_be_bytes());
        p[6] = 0x40; // DF
        p[8] = 64;
        p[9] = 17;
        p[12..16].copy_from_slice(&[10, 0, 0, 2]);
        p[16..20].copy_from_slice(&dst.octets());
        p[20..22].copy_from_slice(&0xC123u16.to_be_bytes());
        p[22..24].copy_from_slice(&port.to_be_bytes());
        p
    }

    /// An IPv6 UDP packet from fd00::2 to `dst`:`port`, 64 bytes of payload.
    fn udp6(dst: Ipv6Addr, port: u16) -> Vec<u8> {
        let mut p = vec![0u8; 40 + 8 + 64];
        p[0] = 0x60;
        p[4..6].copy_from_slice(&(8u16 + 64).to_be_bytes());
        p[6] = 17;
        p[7] = 64;
        p[8..24].copy_from_slice(&"fd00::2".parse::<Ipv6Addr>().unwrap().octets());
        p[24..40].copy_from_slice(&dst.octets());
        p[40..42].copy_from_slice(&0xC123u16.to_be_bytes());
        p[42..44].copy_from_slice(&port.to_be_bytes());
        p
    }

    /// The filter moved past a link-layer header passes what it passed,
    /// with the header before it, and only that: every load of the
    /// packet's bytes moved, the loads of its metadata did not.
    #[test]
    fn past_a_link_header_the_filter_reads_the_same_fields() {
        let (me4, me6) = (v4("10.0.0.1"), v6("fd00::1"));
        let addrs = [IpAddr::V4(me4), IpAddr::V6(me6)];
        let slot = QpnSlot { slot: 3, bits: 4 };
        let raw = past_link_header(roce_filter(&addrs, Some(slot)).unwrap(), LO_LINK_HEADER);
        let linked = |p: &[u8]| [&[0xAB; LO_LINK_HEADER as usize][..], p].concat();
        let with_qp = |mut p: Vec<u8>, at: usize, qpn: u32| {
            p[at + 5..at + 8].copy_from_slice(&qpn.to_be_bytes()[1..]);
            p
        };
        for (p, meta, at) in [(udp4(me4, 4791), &IN4, 28), (udp6(me6, 4791), &IN6, 48)] {
            let ours = with_qp(p.clone(), at, 0x3A_BCDE);
            let theirs = with_qp(p.clone(), at, 0x4A_BCDE);
            assert_ne!(run(&raw, &linked(&ours), meta), 0, "ours, after the header");
            assert_eq!(run(&raw, &linked(&theirs), meta), 0, "another slot's");
            assert_eq!(
                run(&raw, &ours, meta),
                0,
                "no header: the fields are elsewhere"
            );
            let leaving = Meta {
                pkttype: PACKET_OUTGOING,
                ..*meta
            };
            assert_eq!(run(&raw, &linked(&ours), &leaving), 0, "leaving");
        }
    }

    #[test]
    fn a_udp_datagram_is_read_from_its_ip_packet() {
        let from4 = "10.0.0.2:49443".parse().unwrap();
        let p = udp4(v4("10.0.0.1"), 4791);
        assert_eq!(udp_datagram(&p, 0), Some((from4, &p[28..], 64)));
        // A GSO send's: its datagrams' length from the virtio-net header.
        assert_eq!(udp_datagram(&p, 20), Some((from4, &p[28..], 20)));
        let from6 = "[fd00::2]:49443".parse().unwrap();
        let p = udp6(v6("fd00::1"), 4791);
        assert_eq!(udp_datagram(&p, 0), Some((from6, &p[48..], 64)));
        // The IP header's length and the bytes disagree: not taken.
        let p = udp4(v4("10.0.0.1"), 4791);
        assert_eq!(udp_datagram(&p[..p.len() - 1], 0), None);
        let mut long = p.clone();
        long.push(0);
        assert_eq!(udp_datagram(&long, 0), None);
        let p = udp6(v6("fd00::1"), 4791);
        assert_eq!(udp_datagram(&p[..p.len() - 1], 0), None);
        assert_eq!(udp_datagram(&p[..30], 0), None);
        assert_eq!(udp_datagram(&[0x45], 0), None);
        assert_eq!(udp_datagram(&[], 0), None);
        // Neither IPv4 nor IPv6.
        let mut v5 = udp4(v4("10.0.0.1"), 4791);
        v5[0] = 0x55;
        assert_eq!(udp_datagram(&v5, 0), None);
    }

    /// The UDP transport's ring is shown a GSO send before it is used,
    /// and is refused where it does not hand one over whole with its
    /// datagrams' length: a ring without virtio-net headers, here, as a
    /// kernel that cannot describe one would drop it. Needs CAP_NET_RAW.
    #[test]
    fn a_ring_that_does_not_hand_over_a_gso_send_is_refused() {
        let addr = crate::reserve_loopback().unwrap();
        let lo = lo_index();
        if open_on(lo, &[addr], None, true, 4791).is_err() {
            eprintln!("SKIPPED: no packet socket (CAP_NET_RAW is needed)");
            assert!(std::env::var_os("RNIC_REQUIRE_TOOLS").is_none());
            return;
        }
        open_probed(lo, addr, true).unwrap();
        assert!(open_probed(lo, addr, false).is_err());
    }

    /// What the frame sender writes on loopback reaches a ring as a UDP
    /// socket's send would: a valid IPv4 header (DF, TTL 64, identification 0), the
    /// UDP ports and length, and a GSO send's segment size.
    #[test]
    fn the_frame_sender_writes_what_a_udp_socket_would_send() {
        let IpAddr::V4(to) = crate::reserve_loopback().unwrap() else {
            panic!("an IPv4 loopback address")
        };
        let Ok(ring) = open_on(lo_index(), &[to.into()], None, true, 4791) else {
            eprintln!("SKIPPED: no packet socket (CAP_NET_RAW is needed)");
            assert!(std::env::var_os("RNIC_REQUIRE_TOOLS").is_none());
            return;
        };
        let tx = FrameSender::loopback().unwrap();
        let from = Ipv4Addr::LOCALHOST;
        let datagrams: [&[u8]; 3] = [&[0x11; 40], &[0x22; 48], &[0x33; 20]];
        // One datagram alone, then two as a GSO send.
        let sent = tx.send(&[1, 2], |i| Outgoing {
            src: from,
            dst: to,
            src_port: 50_000,
            mac: [0; 6],
            ib: datagrams[i],
        });
        assert_eq!(sent.unwrap(), 3);
        for (payload, seg) in [
            (datagrams[0].to_vec(), 40),
            ([datagrams[1], datagrams[2]].concat(), 48),
        ] {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
            let frame = loop {
                if let Some(f) = ring.next() {
                    break f;
                }
                assert!(std::time::Instant::now() < deadline, "nothing in the ring");
                std::thread::sleep(std::time::Duration::from_millis(1));
            };
            let ip = rnic_wire::encap::ipv4::Packet::new_checked(frame.bytes().unwrap()).unwrap();
            assert!(ip.verify_checksum(), "the IPv4 header checksum");
            assert_eq!(
                (
                    ip.ident(),
                    ip.dont_frag(),
                    ip.ttl(),
                    ip.src_addr(),
                    ip.dst_addr()
                ),
                (0, true, 64, from, to)
            );
            let udp = &frame.bytes().unwrap()[20..28];
            assert_eq!(udp[2..4], 4791u16.to_be_bytes());
            assert_eq!(
                usize::from(u16::from_be_bytes([udp[4], udp[5]])),
                8 + payload.len()
            );
            let got = ring.datagram(&frame, |d| d.map(|(src, p, seg)| (src, p.to_vec(), seg)));
            assert_eq!(got, Some(((from, 50_000).into(), payload, seg)));
        }
    }

    /// A frame sender writes Ethernet headers: on a link of another kind
    /// (here `lo`, ARPHRD_LOOPBACK, whose address reads as six zeroes) it
    /// is not opened; loopback's own is `FrameSender::loopback`.
    #[test]
    fn a_frame_sender_is_for_ethernet_links() {
        let err = link_address("lo").unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::Unsupported, "{err}");
    }

    /// A neighbour's link-layer address is a complete entry of the
    /// kernel's table, for the address on the interface.
    #[test]
    fn a_neighbour_is_a_complete_entry_of_the_table_on_the_interface() {
        let table = "IP address       HW type     Flags       HW address            Mask     Device
10.79.2.2        0x1         0x2         3a:9c:00:11:ab:fe     *        rva
10.79.2.3        0x1         0x0         00:00:00:00:00:00     *        rva
10.79.2.4        0x1         0x2         3a:9c:00:11:ab:01     *        eth0
";
        let a = |s: &str| s.parse::<Ipv4Addr>().unwrap();
        assert_eq!(
            neighbour_in(table, a("10.79.2.2"), "rva"),
            Some([0x3a, 0x9c, 0x00, 0x11, 0xab, 0xfe])
        );
        assert_eq!(
            neighbour_in(table, a("10.79.2.3"), "rva"),
            None,
            "incomplete"
        );
        assert_eq!(
            neighbour_in(table, a("10.79.2.4"), "rva"),
            None,
            "another interface"
        );
        assert_eq!(neighbour_in(table, a("10.79.2.5"), "rva"), None, "no entry");
        assert_eq!(parse_mac("3a:9c:00:11:ab"), None);
        assert_eq!(parse_mac("3a:9c:00:11:ab:fe:01"), None);
    }

    #[test]
    fn a_packet_of_the_largest_path_mtu_lies_whole_in_a_frame_of_the_udp_ring() {
        // BTH, RETH, immediate data, 4,096 bytes and the ICRC: the longest
        // RoCE packet, over IPv6 the longest IP header too.
        const LONGEST: usize = 12 + 16 + 4 + 4096 + 4;
        let lo = lo_index();
        let v4 = crate::reserve_loopback().unwrap();
        for addr in [v4, IpAddr::V6(Ipv6Addr::LOCALHOST)] {
            // A port a socket here holds, as the GSO probe's (see
            // `open_probed`): never 4791, where NICs of other tests listen.
            let Ok(target) = UdpSocket::bind((addr, 0)) else {
                assert!(addr.is_ipv6(), "{addr}");
                eprintln!("SKIPPED: no IPv6 loopback address");
                continue;
            };
            let to = target.local_addr().unwrap();
            let Ok(ring) = open_on(lo, &[addr], None, true, to.port()) else {
                eprintln!("SKIPPED: no packet socket (CAP_NET_RAW is needed)");
                assert!(std::env::var_os("RNIC_REQUIRE_TOOLS").is_none());
                return;
            };
            let sender = UdpSocket::bind((addr, 0)).unwrap();
            sender.send_to(&[0xA5; LONGEST], to).unwrap();
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
            let frame = loop {
                if let Some(f) = ring.next() {
                    break f;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "{addr}: nothing in the ring"
                );
                std::thread::sleep(std::time::Duration::from_millis(1));
            };
            // Not cut and queued whole on the socket as well: the kernel
            // would copy it twice and the NIC receive it with a system call.
            assert!(!frame.copied, "{addr}: cut in the ring");
            let got = ring.datagram(&frame, |d| d.map(|(src, p, seg)| (src, p.len(), seg)));
            assert_eq!(
                got,
                Some((sender.local_addr().unwrap(), LONGEST, LONGEST)),
                "{addr}"
            );
        }
    }

    #[test]
    fn the_virtio_net_header_gives_a_gso_sends_segment_size() {
        // flags, gso_type, hdr_len, gso_size (little-endian), csum_start,
        // csum_offset.
        let udp_l4 = [0, 5, 42, 0, 0xE8, 0x03, 0, 0, 0, 0];
        assert_eq!(gso_size(&udp_l4), 1000);
        let none = [0, 0, 0, 0, 0xE8, 0x03, 0, 0, 0, 0];
        assert_eq!(gso_size(&none), 0, "no GSO: one datagram");
        assert_eq!(gso_size(&udp_l4[..5]), 0, "cut short");
    }

    fn v4(s: &str) -> Ipv4Addr {
        s.parse().unwrap()
    }

    fn v6(s: &str) -> Ipv6Addr {
        s.parse().unwrap()
    }

    #[test]
    fn the_filter_passes_roce_to_this_address_only() {
        let me = v4("10.0.0.1");
        let f = roce_filter(&[IpAddr::V4(me)], None).unwrap();
        let pass = |p: &[u8]| run(&f, p, &IN4) != 0;
        assert!(pass(&udp4(me, 4791)));
        // IP options: the UDP header moves, and the port is found there.
        let mut opts = udp4(me, 4791);
        opts[0] = 0x46;
        opts.splice(20..20, [1, 1, 1, 1]);
        assert!(pass(&opts));
        assert!(!pass(&udp4(me, 4790)), "another port");
        assert!(!pass(&udp4(v4("10.0.0.3"), 4791)), "another address");
        let mut tcp = udp4(me, 4791);
        tcp[9] = 6;
        assert!(!pass(&tcp), "TCP");
        // A fragment whose flags and offset read 4791: dropped as a
        // fragment, never compared with the port.
        let mut frag = udp4(me, 4791);
        frag[6..8].copy_from_slice(&4791u16.to_be_bytes());
        assert!(!pass(&frag), "a fragment");
        let mut more = udp4(me, 4791);
        more[6] = 0x20; // MF
        assert!(!pass(&more), "a first fragment");
        let mut v6 = udp4(me, 4791);
        v6[0] = 0x60;
        assert!(!pass(&v6), "an IPv6 version in an IPv4 packet");
        assert!(!pass(&udp4(me, 4791)[..22]), "cut short before the port");
        let leaving = Meta {
            pkttype: PACKET_OUTGOING,
            ..IN4
        };
        assert_eq!(
            run(&f, &udp4(me, 4791), &leaving),
            0,
            "what this host sends"
        );
        let arp = Meta {
            protocol: 0x0806,
            pkttype: 0,
        };
        assert_eq!(run(&f, &udp4(me, 4791), &arp), 0, "not IP");
    }

    #[test]
    fn the_filter_passes_roce_to_each_of_the_nics_addresses() {
        let addrs = [
            IpAddr::V6(v6("fe80::1")),
            IpAddr::V4(v4("10.0.0.1")),
            IpAddr::V4(v4("10.0.1.1")),
            IpAddr::V6(v6("fd00::1")),
        ];
        let f = roce_filter(&addrs, None).unwrap();
        let pass4 = |p: &[u8]| run(&f, p, &IN4) != 0;
        let pass6 = |p: &[u8]| run(&f, p, &IN6) != 0;
        assert!(pass4(&udp4(v4("10.0.0.1"), 4791)));
        assert!(pass4(&udp4(v4("10.0.1.1"), 4791)));
        assert!(!pass4(&udp4(v4("10.0.2.1"), 4791)));
        assert!(pass6(&udp6(v6("fe80::1"), 4791)));
        assert!(pass6(&udp6(v6("fd00::1"), 4791)));
        assert!(!pass6(&udp6(v6("fd00::1"), 4790)), "another port");
        // Every one of the four words counts: an address one bit off in
        // each is not ours.
        for word in 0..4 {
            let mut o = v6("fd00::1").octets();
            o[4 * word + 3] ^= 0x10;
            assert!(!pass6(&udp6(Ipv6Addr::from(o), 4791)), "word {word}");
        }
        let mut ext = udp6(v6("fd00::1"), 4791);
        ext[6] = 0; // a hop-by-hop header first
        assert!(!pass6(&ext), "an extension header");
        let mut tcp = udp6(v6("fd00::1"), 4791);
        tcp[6] = 6;
        assert!(!pass6(&tcp), "TCP");
        assert!(!pass6(&udp6(v6("fd00::1"), 4791)[..43]), "cut short");
        // A packet whose EtherType says IPv6 must be IPv6 inside.
        assert!(!pass6(&udp4(v4("10.0.0.1"), 4791)));
        assert!(!pass4(&udp6(v6("fd00::1"), 4791)));
        // No IPv6 address: no IPv6 packet.
        let only4 = roce_filter(&[IpAddr::V4(v4("10.0.0.1"))], None).unwrap();
        assert_eq!(run(&only4, &udp6(v6("fd00::1"), 4791), &IN6), 0);
    }

    #[test]
    fn with_a_slot_the_filter_passes_only_the_slots_qps() {
        let me4 = v4("10.0.0.1");
        let me6 = v6("fd00::1");
        let slot = QpnSlot { slot: 0x5, bits: 4 };
        let f = roce_filter(&[IpAddr::V4(me4), IpAddr::V6(me6)], Some(slot)).unwrap();
        // The BTH's destination QP: bytes 5-7 of the UDP payload.
        let to_qp = |mut p: Vec<u8>, udp_at: usize, qpn: u32| {
            p[udp_at + 8 + 4] = 0; // reserved
            p[udp_at + 8 + 5..udp_at + 8 + 8].copy_from_slice(&qpn.to_be_bytes()[1..]);
            p
        };
        for (qpn, ours) in [
            (0x50_0000, true),
            (0x5F_FFFF, true),
            (0x51_2345, true),
            (0x4F_FFFF, false),
            (0x60_0000, false),
            (0xD5_0000, false),
        ] {
            let p4 = to_qp(udp4(me4, 4791), 20, qpn);
            assert_eq!(run(&f, &p4, &IN4) != 0, ours, "IPv4, QP {qpn:#x}");
            let p6 = to_qp(udp6(me6, 4791), 40, qpn);
            assert_eq!(run(&f, &p6, &IN6) != 0, ours, "IPv6, QP {qpn:#x}");
        }
        // With IP options the BTH moves, and the QP is found there.
        let mut opts = to_qp(udp4(me4, 4791), 20, 0x4F_0000);
        opts[0] = 0x46;
        opts.splice(20..20, [0x50, 0x50, 0x50, 0x50]);
        assert_eq!(run(&f, &opts, &IN4), 0);
        let mut opts = to_qp(udp4(me4, 4791), 20, 0x52_0000);
        opts[0] = 0x46;
        opts.splice(20..20, [0, 0, 0, 0]);
        assert_ne!(run(&f, &opts, &IN4), 0);
        // The rest of the checks still hold.
        assert_eq!(run(&f, &to_qp(udp4(me4, 4790), 20, 0x50_0000), &IN4), 0);
        assert_eq!(
            run(&f, &to_qp(udp6(v6("fd00::9"), 4791), 40, 0x50_0000), &IN6),
            0
        );
    }

    #[test]
    fn a_jump_back_or_nowhere_is_an_error() {
        let mut p = Program::default();
        let back = p.label();
        p.here(back);
        p.put(RET_K, 0);
        p.jump(JEQ_K, 0, Some(back), None);
        assert!(p.finish().is_err());
        let mut p = Program::default();
        let nowhere = p.label();
        p.jump(JEQ_K, 0, None, Some(nowhere));
        assert!(p.finish().is_err());
    }

    #[test]
    fn sixteen_addresses_fit_the_filter() {
        let many: Vec<IpAddr> = (0..MAX_GIDS as u16)
            .map(|i| IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, i + 1)))
            .chain([IpAddr::V4(v4("10.0.0.1"))])
            .collect();
        let f = roce_filter(&many, None).unwrap();
        assert_eq!(run(&f, &udp4(v4("10.0.0.1"), 4791), &IN4), ACCEPT);
        let last = Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, MAX_GIDS as u16);
        assert_eq!(run(&f, &udp6(last, 4791), &IN6), ACCEPT);
        // Far more than an interface is given: an error, not a panic.
        let too_many: Vec<IpAddr> = (0..64u16)
            .map(|i| IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, i + 1)))
            .chain([IpAddr::V4(v4("10.0.0.1"))])
            .collect();
        assert!(roce_filter(&too_many, None).is_err());
    }

    #[test]
    fn gids_are_in_a_roce_ports_order() {
        let given = vec![
            IpAddr::V6(v6("fd00::1")),
            IpAddr::V4(v4("10.0.0.1")),
            IpAddr::V6(v6("fe80::1")),
            IpAddr::V6(v6("::ffff:10.0.0.1")),
            IpAddr::V4(v4("10.0.1.1")),
        ];
        assert_eq!(
            gid_order(given),
            [
                IpAddr::V6(v6("fe80::1")),
                IpAddr::V4(v4("10.0.0.1")),
                IpAddr::V4(v4("10.0.1.1")),
                IpAddr::V6(v6("fd00::1")),
            ]
        );
        let i = Interface {
            name: "x".into(),
            index: 7,
            gids: gid_order(vec![IpAddr::V6(v6("fe80::1")), IpAddr::V6(v6("fd00::1"))]),
            mtu: 1500,
        };
        assert_eq!(i.addr(), IpAddr::V6(v6("fd00::1")));
        assert_eq!(i.scope_of(IpAddr::V6(v6("fe80::1"))), 7);
        assert_eq!(i.scope_of(IpAddr::V6(v6("fd00::1"))), 0);
    }

    #[test]
    fn the_ib_packet_follows_the_ip_and_udp_headers() {
        let me = v4("10.0.0.1");
        let mut p = udp4(me, 4791);
        p[28] = 0x0A;
        assert_eq!(ib_packet(&p).first(), Some(&0x0A));
        assert_eq!(ib_packet(&p).len(), 64);
        p[0] = 0x46; // four bytes of options: the payload starts later
        assert_eq!(ib_packet(&p).len(), 60);
        assert!(ib_packet(&p[..20]).is_empty());
        assert!(ib_packet(&[]).is_empty());
        let mut q = udp6(v6("fd00::1"), 4791);
        q[48] = 0x0B;
        assert_eq!(ib_packet(&q).first(), Some(&0x0B));
        assert_eq!(ib_packet(&q).len(), 64);
    }

    #[test]
    fn the_udp_socket_filter_drops_everything() {
        assert_eq!(
            run(&[op(RET_K, 0, 0, 0)], &udp4(v4("10.0.0.1"), 4791), &IN4),
            0
        );
    }
}
