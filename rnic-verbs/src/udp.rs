//! Batched UDP I/O: `recvmmsg` and `sendmmsg`, up to [`BATCH`] messages per
//! system call, where one call per datagram would cost more than the engine
//! spends on the packet itself. Public so that a benchmark's raw UDP
//! baseline makes the same system calls as the engine does.
//!
//! [`send_groups`] also cuts runs of datagrams into UDP GSO sends
//! (`UDP_SEGMENT`): one message the kernel splits into datagrams. Linux
//! numbers the IPv4 identification of the datagrams it cuts from one send
//! 0, 1, 2, ... on rnic's sockets, and the ICRC covers that field, so the
//! caller prepares each segment's ICRC for the number it will carry
//! ([`rnic_wire::icrc::ipv4_id_delta`]; [`gso_run`] says which datagrams
//! share a send).

use std::io;
use std::mem::{size_of, zeroed, MaybeUninit};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, BorrowedFd};

use rustix::net::sockopt::{
    set_socket_recv_buffer_size, set_socket_recv_buffer_size_force, set_socket_send_buffer_size,
    set_socket_send_buffer_size_force,
};

/// Datagrams per system call.
pub const BATCH: usize = 32;

/// Socket buffer size asked for, each way.
pub(crate) const SOCKET_BUFFER: usize = 4 << 20;

/// A requester may have 1024 packets in flight; the default receive buffer
/// (about 200 KiB) drops a burst of them, and each tail loss costs a local
/// ACK timeout. Ask for 4 MiB on `fd` (beyond net.core.rmem_max only as
/// root), and settle for what the kernel grants.
pub(crate) fn ask_recv_buffer(fd: BorrowedFd<'_>) {
    if set_socket_recv_buffer_size_force(fd, SOCKET_BUFFER).is_err() {
        let _ = set_socket_recv_buffer_size(fd, SOCKET_BUFFER);
    }
}

/// Ask for a 4 MiB send buffer on `fd` (beyond net.core.wmem_max only as
/// root), and settle for what the kernel grants: a pump's burst is not
/// refused for want of room.
pub(crate) fn ask_send_buffer(fd: BorrowedFd<'_>) {
    if set_socket_send_buffer_size_force(fd, SOCKET_BUFFER).is_err() {
        let _ = set_socket_send_buffer_size(fd, SOCKET_BUFFER);
    }
}

/// Bytes per receive slot: a 4096-byte PMTU packet with every header fits; a
/// larger datagram is truncated and reported as such.
const SLOT: usize = 8192;

/// Bytes per receive slot with GRO: the largest UDP payload.
const GRO_SLOT: usize = 65536;

/// Receive buffers and what the last `recv` filled in. The message headers
/// are built once and point into the struct's own heap buffers, which never
/// move (they are never resized), so a receive allocates nothing.
pub struct RecvBatch {
    bufs: Vec<u8>,
    slot: usize,
    addrs: Vec<libc::sockaddr_storage>,
    iovs: Vec<libc::iovec>,
    hdrs: Vec<libc::mmsghdr>,
    /// Per slot, room for a `UDP_GRO` control message (empty without GRO).
    controls: Vec<GroCmsg>,
    lens: Vec<usize>,
    /// Per slot, the length of the datagrams GRO joined into it (its whole
    /// length when it holds one).
    segs: Vec<usize>,
    truncated: Vec<bool>,
    /// Headers the last receive filled (the kernel writes back into those
    /// alone): the next receive resets these, not all [`BATCH`], so a
    /// receive that finds nothing, most of a spinning poller's, costs the
    /// system call and little else.
    written: usize,
}

/// A `UDP_GRO` control message as the kernel writes it: a cmsghdr and the
/// size of the datagrams it joined, an int, in `CMSG_SPACE(4)` bytes.
#[repr(C)]
#[derive(Clone, Copy)]
struct GroCmsg {
    hdr: libc::cmsghdr,
    seg: libc::c_int,
    _pad: [u8; size_of::<usize>() - size_of::<libc::c_int>()],
}

// SAFETY: the raw pointers in `iovs` and `hdrs` point into `bufs`, `addrs`,
// `iovs` and `controls`, heap buffers owned by the same struct: moving the
// struct to another thread moves them with it, and nothing else refers to
// them.
unsafe impl Send for RecvBatch {}

impl Default for RecvBatch {
    fn default() -> RecvBatch {
        RecvBatch::new()
    }
}

impl RecvBatch {
    /// Room for [`BATCH`] datagrams of up to 8 KiB each.
    pub fn new() -> RecvBatch {
        RecvBatch::with_slots(SLOT, false)
    }

    /// A batch with no room at all, allocating nothing: what stands in for
    /// one lent out (see `engine::receive`). A receive into it fails.
    pub(crate) fn unallocated() -> RecvBatch {
        RecvBatch {
            bufs: Vec::new(),
            slot: 0,
            addrs: Vec::new(),
            iovs: Vec::new(),
            hdrs: Vec::new(),
            controls: Vec::new(),
            lens: Vec::new(),
            segs: Vec::new(),
            truncated: Vec::new(),
            written: 0,
        }
    }

    /// Room for [`BATCH`] messages of up to 64 KiB each, for a socket with
    /// `UDP_GRO` on ([`enable_gro`]): the kernel may hand over several
    /// datagrams of one sender joined into one message, which
    /// [`RecvBatch::get`] gives back one by one.
    pub fn with_gro() -> RecvBatch {
        RecvBatch::with_slots(GRO_SLOT, true)
    }

    fn with_slots(slot: usize, gro: bool) -> RecvBatch {
        let mut b = RecvBatch {
            bufs: vec![0; slot * BATCH],
            slot,
            // SAFETY: sockaddr_storage is plain data; all zeroes is valid.
            addrs: vec![unsafe { zeroed() }; BATCH],
            iovs: Vec::with_capacity(BATCH),
            hdrs: Vec::with_capacity(BATCH),
            // SAFETY: plain data; all zeroes is valid.
            controls: vec![unsafe { zeroed() }; if gro { BATCH } else { 0 }],
            lens: vec![0; BATCH],
            segs: vec![0; BATCH],
            truncated: vec![false; BATCH],
            // The first receive sets every header's lengths.
            written: BATCH,
        };
        for slot in b.bufs.chunks_mut(slot) {
            b.iovs.push(libc::iovec {
                iov_base: slot.as_mut_ptr().cast(),
                iov_len: slot.len(),
            });
        }
        for (i, (iov, addr)) in b.iovs.iter_mut().zip(b.addrs.iter_mut()).enumerate() {
            // SAFETY: mmsghdr is plain data; all zeroes is a valid empty one.
            let mut h: libc::mmsghdr = unsafe { zeroed() };
            h.msg_hdr.msg_name = (addr as *mut libc::sockaddr_storage).cast();
            h.msg_hdr.msg_iov = iov;
            h.msg_hdr.msg_iovlen = 1;
            if let Some(c) = b.controls.get_mut(i) {
                h.msg_hdr.msg_control = (c as *mut GroCmsg).cast();
            }
            b.hdrs.push(h);
        }
        b
    }

    /// Receive up to [`BATCH`] datagrams without blocking; how many (0 if none waits).
    pub fn recv(&mut self, fd: BorrowedFd<'_>) -> io::Result<usize> {
        self.recv_at_most(fd, BATCH)
    }

    /// [`RecvBatch::recv`], but at most `most` messages (1 to [`BATCH`]).
    /// Having filled a header, the kernel tries the next one, and when
    /// nothing more waits that try costs about what an empty receive
    /// does (a header and its iovec copied in, the socket queue locked):
    /// a caller that expects one message saves it by asking for one.
    pub fn recv_at_most(&mut self, fd: BorrowedFd<'_>, most: usize) -> io::Result<usize> {
        let most = most.clamp(1, BATCH).min(self.hdrs.len());
        if most == 0 {
            return Err(io::Error::other("a receive batch with no room"));
        }
        let control = if self.controls.is_empty() {
            0
        } else {
            size_of::<GroCmsg>()
        };
        // The kernel wrote back the address's length, the control
        // message's and the flags of the headers it filled last time;
        // the others are as `with_slots` and this left them.
        for h in &mut self.hdrs[..std::mem::take(&mut self.written)] {
            h.msg_hdr.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            h.msg_hdr.msg_controllen = control as _;
            h.msg_hdr.msg_flags = 0;
        }
        // SAFETY: every header points at a live iovec over a live slot of
        // `self.bufs` and at a live address slot (see the struct), all
        // outliving the call.
        let n = unsafe {
            libc::recvmmsg(
                fd.as_raw_fd(),
                self.hdrs.as_mut_ptr(),
                most as libc::c_uint,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if n < 0 {
            // Nothing waiting is what a poller finds most of the time: the
            // error number alone, not the error's kind (a table lookup).
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::EAGAIN | libc::EINTR) => Ok(0),
                _ => Err(e),
            };
        }
        let n = n as usize;
        self.written = n;
        for (i, h) in self.hdrs.iter().take(n).enumerate() {
            let len = (h.msg_len as usize).min(self.slot);
            self.lens[i] = len;
            self.truncated[i] = h.msg_hdr.msg_flags & (libc::MSG_TRUNC | libc::MSG_CTRUNC) != 0;
            self.segs[i] = len;
            if let Some(c) = self.controls.get(i) {
                let joined = h.msg_hdr.msg_controllen >= size_of::<libc::cmsghdr>()
                    && c.hdr.cmsg_level == libc::SOL_UDP
                    && c.hdr.cmsg_type == libc::UDP_GRO;
                if joined && c.seg > 0 {
                    self.segs[i] = c.seg as usize;
                }
            }
        }
        Ok(n)
    }

    /// Frame `i` of the last batch, from a packet socket: its bytes, or
    /// None if it was truncated.
    pub fn frame(&self, i: usize) -> Option<&[u8]> {
        (!self.truncated[i]).then(|| &self.bufs[i * self.slot..i * self.slot + self.lens[i]])
    }

    /// Message `i` of the last batch: the datagrams in it (more than one
    /// only where GRO joined them) and their sender, or None if it was
    /// empty or truncated or its sender is not an IP address.
    pub fn get(&self, i: usize) -> Option<(std::slice::Chunks<'_, u8>, SocketAddr)> {
        if self.truncated[i] || self.lens[i] == 0 {
            return None;
        }
        let from = from_sockaddr(&self.addrs[i])?;
        let bytes = &self.bufs[i * self.slot..i * self.slot + self.lens[i]];
        Some((bytes.chunks(self.segs[i].max(1)), from))
    }
}

/// Turn `UDP_GRO` on for `fd`: the kernel may then hand over datagrams of
/// one sender joined into one message (a UDP GSO send arrives whole), to
/// be received with [`RecvBatch::with_gro`]. Fails on kernels without it.
pub fn enable_gro(fd: BorrowedFd<'_>) -> io::Result<()> {
    set_option(fd, libc::SOL_UDP, libc::UDP_GRO, &(1 as libc::c_int))
}

/// The first and last BTH opcode of what a requester receives on RC:
/// RDMA READ response First, Middle, Last, Only, ACKNOWLEDGE, ATOMIC
/// ACKNOWLEDGE.
const RESPONSES: std::ops::RangeInclusive<u8> = 0x0D..=0x12;

/// With `on`, steer the datagrams of `fd`'s `SO_REUSEPORT` group by their
/// first payload byte, a RoCE packet's BTH opcode: RC responses
/// (opcodes 0x0D to 0x12) to the group's second socket, everything else (and
/// anything too short to have a first byte) to its first; without, all to
/// the first. The kernel runs the classic BPF program below on each
/// datagram with the UDP payload at offset 0 (`SO_ATTACH_REUSEPORT_CBPF`;
/// attaching one replaces the last), and falls back to its hash only if
/// the group has fewer sockets than the index. Fails on kernels without it.
pub fn steer_responses(fd: BorrowedFd<'_>, on: bool) -> io::Result<()> {
    let insn = |code: u16, jt: u8, jf: u8, k: u32| libc::sock_filter { code, jt, jf, k };
    let (lo, hi) = (*RESPONSES.start(), *RESPONSES.end());
    let mut all_to_first = [insn((libc::BPF_RET | libc::BPF_K) as u16, 0, 0, 0)];
    let mut steer = [
        // A = payload[0] (a load past the end returns 0 from the program).
        insn((libc::BPF_LD | libc::BPF_B | libc::BPF_ABS) as u16, 0, 0, 0),
        // A >= lo: go on, else to "return 0".
        insn(
            (libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K) as u16,
            0,
            2,
            lo.into(),
        ),
        // A > hi: "return 0", else "return 1".
        insn(
            (libc::BPF_JMP | libc::BPF_JGT | libc::BPF_K) as u16,
            1,
            0,
            hi.into(),
        ),
        insn((libc::BPF_RET | libc::BPF_K) as u16, 0, 0, 1),
        insn((libc::BPF_RET | libc::BPF_K) as u16, 0, 0, 0),
    ];
    let program: &mut [libc::sock_filter] = if on { &mut steer } else { &mut all_to_first };
    let prog = libc::sock_fprog {
        len: program.len() as u16,
        filter: program.as_mut_ptr(),
    };
    set_option(fd, libc::SOL_SOCKET, libc::SO_ATTACH_REUSEPORT_CBPF, &prog)
}

/// `setsockopt(fd, level, name, value)`, for an option whose value is a
/// plain `T` the kernel copies.
pub(crate) fn set_option<T>(
    fd: BorrowedFd<'_>,
    level: libc::c_int,
    name: libc::c_int,
    value: &T,
) -> io::Result<()> {
    // SAFETY: a valid descriptor, and a pointer to a live `T` with its size.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (value as *const T).cast(),
            size_of::<T>() as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Send `count` datagrams, the `i`th being `datagram(i)` (destination,
/// bytes), with as few system calls as the socket buffer allows, and no
/// allocation (the headers live on the stack, a batch at a time). Returns
/// how many went; the rest were refused for want of buffer space (the
/// transport will retransmit them, as after a loss).
pub fn send<'a>(
    fd: BorrowedFd<'_>,
    count: usize,
    datagram: impl Fn(usize) -> (SocketAddr, &'a [u8]),
) -> io::Result<usize> {
    // Filled as used, never cleared: a send is a few datagrams, the arrays
    // are room for BATCH (zeroing them cost more than filling the few).
    let mut addrs = [const { MaybeUninit::<RawAddr>::uninit() }; BATCH];
    let mut iovs = [const { MaybeUninit::<libc::iovec>::uninit() }; BATCH];
    let mut hdrs = [const { MaybeUninit::<libc::mmsghdr>::uninit() }; BATCH];
    let mut sent = 0;
    while sent < count {
        let chunk = (count - sent).min(BATCH);
        for j in 0..chunk {
            let (to, data) = datagram(sent + j);
            let (addr, len) = to_raw(to);
            let addr: *mut RawAddr = addrs[j].write(addr);
            let iov: *mut libc::iovec = iovs[j].write(libc::iovec {
                iov_base: data.as_ptr() as *mut libc::c_void,
                iov_len: data.len(),
            });
            hdrs[j].write(message(addr, len, iov, 1));
        }
        // SAFETY: the first `chunk` headers are filled in, each pointing at a
        // live address and a live iovec over bytes borrowed for the duration
        // of the call; the kernel reads them and writes each sent header's
        // length.
        let n = unsafe {
            libc::sendmmsg(
                fd.as_raw_fd(),
                hdrs.as_mut_ptr().cast::<libc::mmsghdr>(),
                chunk as libc::c_uint,
                libc::MSG_DONTWAIT,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::WouldBlock => Ok(sent),
                io::ErrorKind::Interrupted => continue,
                // An ICMP error from an earlier datagram (a peer gone) is
                // reported here once; the datagram at the head was not sent.
                _ if sent + 1 < count => {
                    sent += 1;
                    continue;
                }
                _ => Err(e),
            };
        }
        if n == 0 {
            break;
        }
        sent += n as usize;
    }
    Ok(sent)
}

/// Most datagrams in one GSO send: Linux's `UDP_MAX_SEGMENTS` before 6.2,
/// and the identifications a receiver on a UDP socket accepts
/// ([`rnic_wire::icrc::UDP_GSO_IDS`]).
pub const GSO_SEGMENTS: usize = rnic_wire::icrc::UDP_GSO_IDS as usize;

/// Most bytes in one GSO send: what one IPv4 or IPv6 datagram can carry.
const GSO_BYTES: usize = 65_000;

/// Datagrams per [`send_groups`] system call, at most.
const IOVS: usize = 256;

/// How many datagrams from the first of `count` one GSO send can carry: the
/// first and those after it to the same destination, all of the first's
/// length but the last, which may be shorter, at most [`GSO_SEGMENTS`] and
/// 65,000 bytes. `datagram(i)` gives the `i`th's destination and length.
pub fn gso_run(count: usize, datagram: impl Fn(usize) -> (SocketAddr, usize)) -> usize {
    let Some((to, seg)) = (count > 0).then(|| datagram(0)) else {
        return 0;
    };
    let mut n = 1;
    let mut bytes = seg;
    while n < count.min(GSO_SEGMENTS) {
        let (next_to, len) = datagram(n);
        if next_to != to || len > seg || len == 0 || bytes + len > GSO_BYTES {
            break;
        }
        n += 1;
        bytes += len;
        if len < seg {
            break; // a shorter one ends the send
        }
    }
    n
}

/// What [`send_groups`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sent {
    /// Datagrams handed to the kernel.
    pub datagrams: usize,
    /// The kernel refused a GSO send for a reason that will not pass (no
    /// `UDP_SEGMENT`, a path it cannot segment on): its datagrams and the
    /// rest were dropped, and the caller should send one datagram per
    /// message from now on.
    pub gso_refused: bool,
}

/// Send `groups.len()` messages, message `g` being the `groups[g]`
/// datagrams that follow the previous messages' (`datagram(i)` gives the
/// `i`th's destination and bytes): a message of more than one datagram goes
/// as one GSO send, and must be what [`gso_run`] would make of them. As few
/// system calls as the socket buffer allows, and no allocation. Messages
/// the socket buffer refused are lost, as on a full link (the transport
/// retransmits).
pub fn send_groups<'a>(
    fd: BorrowedFd<'_>,
    groups: &[usize],
    datagram: impl Fn(usize) -> (SocketAddr, &'a [u8]),
) -> io::Result<Sent> {
    // Filled as used, never cleared (as in `send`).
    let mut addrs = [const { MaybeUninit::<RawAddr>::uninit() }; BATCH];
    let mut iovs = [const { MaybeUninit::<libc::iovec>::uninit() }; IOVS];
    let mut hdrs = [const { MaybeUninit::<libc::mmsghdr>::uninit() }; BATCH];
    let mut controls = [const { MaybeUninit::<SegmentCmsg>::uninit() }; BATCH];
    let mut out = Sent::default();
    let mut g = 0; // the next message
    let mut first = 0; // its first datagram
    while g < groups.len() {
        // Messages for this call: up to BATCH of them and IOVS datagrams.
        let mut msgs = 0;
        let mut iov_at = 0;
        let mut at = first;
        while g + msgs < groups.len() && msgs < BATCH {
            let n = groups[g + msgs];
            if iov_at + n > IOVS {
                break;
            }
            let (to, first_data) = datagram(at);
            let (addr, len) = to_raw(to);
            let addr: *mut RawAddr = addrs[msgs].write(addr);
            for k in 0..n {
                let data = datagram(at + k).1;
                iovs[iov_at + k].write(libc::iovec {
                    iov_base: data.as_ptr() as *mut libc::c_void,
                    iov_len: data.len(),
                });
            }
            // The message's iovecs, from the array (the kernel reads n).
            let iov = iovs.as_mut_ptr().wrapping_add(iov_at).cast();
            let mut m = message(addr, len, iov, n);
            if n > 1 {
                let c: *mut SegmentCmsg =
                    controls[msgs].write(SegmentCmsg::new(first_data.len() as u16));
                m.msg_hdr.msg_control = c.cast();
                m.msg_hdr.msg_controllen = size_of::<SegmentCmsg>() as _;
            }
            hdrs[msgs].write(m);
            iov_at += n;
            at += n;
            msgs += 1;
        }
        // SAFETY: the first `msgs` headers are filled in, each pointing at
        // a live address, live iovecs over bytes borrowed for the duration
        // of the call and, for GSO, a live control buffer; the kernel reads
        // them and writes each sent header's length.
        let sent = unsafe {
            libc::sendmmsg(
                fd.as_raw_fd(),
                hdrs.as_mut_ptr().cast::<libc::mmsghdr>(),
                msgs as libc::c_uint,
                libc::MSG_DONTWAIT,
            )
        };
        if sent < 0 {
            let e = io::Error::last_os_error();
            let head = groups[g];
            match e.raw_os_error() {
                Some(libc::EAGAIN) => return Ok(out),
                Some(libc::EINTR) => continue,
                Some(libc::EIO | libc::EINVAL | libc::EMSGSIZE | libc::ENOPROTOOPT) if head > 1 => {
                    // The rest would be refused alike: dropped, as on a
                    // full link, once.
                    out.gso_refused = true;
                    return Ok(out);
                }
                // An ICMP error from an earlier datagram (a peer gone) is
                // reported here once; the message at the head was not sent.
                _ if g + 1 < groups.len() => {}
                _ => return Err(e),
            }
            first += head;
            g += 1;
            continue;
        }
        if sent == 0 {
            break;
        }
        for &n in &groups[g..g + sent as usize] {
            out.datagrams += n;
            first += n;
        }
        g += sent as usize;
    }
    Ok(out)
}

/// A `UDP_SEGMENT` control message: a cmsghdr and the segment size, laid
/// out as `CMSG_SPACE(2)` bytes (the data follows the header, which is a
/// multiple of the alignment, `size_of::<usize>()`, long).
#[repr(C)]
#[derive(Clone, Copy)]
struct SegmentCmsg {
    hdr: libc::cmsghdr,
    seg: u16,
    _pad: [u8; size_of::<usize>() - size_of::<u16>()],
}

impl SegmentCmsg {
    fn new(seg: u16) -> SegmentCmsg {
        // SAFETY: cmsghdr is plain data; all zeroes is valid.
        let mut hdr: libc::cmsghdr = unsafe { zeroed() };
        hdr.cmsg_level = libc::SOL_UDP;
        hdr.cmsg_type = libc::UDP_SEGMENT;
        hdr.cmsg_len = (size_of::<libc::cmsghdr>() + size_of::<u16>()) as _;
        SegmentCmsg {
            hdr,
            seg,
            _pad: [0; size_of::<usize>() - size_of::<u16>()],
        }
    }
}

/// A destination as `sendmmsg` reads it: a `sockaddr_in` or a
/// `sockaddr_in6` (28 bytes, where a `sockaddr_storage` is 128).
#[repr(C)]
#[derive(Clone, Copy)]
union RawAddr {
    v4: libc::sockaddr_in,
    v6: libc::sockaddr_in6,
}

fn to_raw(to: SocketAddr) -> (RawAddr, libc::socklen_t) {
    match to {
        SocketAddr::V4(a) => (
            RawAddr {
                v4: libc::sockaddr_in {
                    sin_family: libc::AF_INET as libc::sa_family_t,
                    sin_port: a.port().to_be(),
                    sin_addr: libc::in_addr {
                        s_addr: u32::from_ne_bytes(a.ip().octets()),
                    },
                    sin_zero: [0; 8],
                },
            },
            size_of::<libc::sockaddr_in>() as libc::socklen_t,
        ),
        SocketAddr::V6(a) => (
            RawAddr {
                v6: libc::sockaddr_in6 {
                    sin6_family: libc::AF_INET6 as libc::sa_family_t,
                    sin6_port: a.port().to_be(),
                    sin6_flowinfo: a.flowinfo(),
                    sin6_addr: libc::in6_addr {
                        s6_addr: a.ip().octets(),
                    },
                    sin6_scope_id: a.scope_id(),
                },
            },
            size_of::<libc::sockaddr_in6>() as libc::socklen_t,
        ),
    }
}

/// A `sendmmsg` header for `iovlen` iovecs from `iov` to `addr`, with no
/// control message.
fn message(
    addr: *mut RawAddr,
    len: libc::socklen_t,
    iov: *mut libc::iovec,
    iovlen: usize,
) -> libc::mmsghdr {
    // SAFETY: mmsghdr is plain data; all zeroes is a valid empty one.
    let mut m: libc::mmsghdr = unsafe { zeroed() };
    m.msg_hdr.msg_name = addr.cast();
    m.msg_hdr.msg_namelen = len;
    m.msg_hdr.msg_iov = iov;
    m.msg_hdr.msg_iovlen = iovlen as _;
    m
}

fn from_sockaddr(s: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match i32::from(s.ss_family) {
        libc::AF_INET => {
            // SAFETY: the kernel wrote a sockaddr_in for AF_INET.
            let sin = unsafe { *(s as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            let ip = Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
            Some(SocketAddr::V4(SocketAddrV4::new(
                ip,
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: the kernel wrote a sockaddr_in6 for AF_INET6.
            let sin6 =
                unsafe { *(s as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            Some(SocketAddr::V6(SocketAddrV6::new(
                ip,
                u16::from_be(sin6.sin6_port),
                sin6.sin6_flowinfo,
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
    .map(|a: SocketAddr| match a.ip() {
        // An IPv4 peer on a dual-stack socket shows as ::ffff:a.b.c.d.
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(IpAddr::V4(v4), a.port()),
            None => a,
        },
        IpAddr::V4(_) => a,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::UdpSocket;
    use std::os::fd::AsFd;

    /// Two sockets of one `SO_REUSEPORT` group on `at` (port 0: any).
    fn group(at: SocketAddr) -> (UdpSocket, UdpSocket) {
        let open = |at: SocketAddr| {
            let fd = rustix::net::socket(
                rustix::net::AddressFamily::INET,
                rustix::net::SocketType::DGRAM,
                None,
            )
            .unwrap();
            rustix::net::sockopt::set_socket_reuseport(&fd, true).unwrap();
            rustix::net::bind(&fd, &at).unwrap();
            let s = UdpSocket::from(fd);
            s.set_nonblocking(true).unwrap();
            // Room for all 257 test datagrams at once.
            ask_recv_buffer(s.as_fd());
            s
        };
        let first = open(at);
        let second = open(first.local_addr().unwrap());
        (first, second)
    }

    /// Steered, RC responses reach the group's second socket, every other
    /// opcode (and an empty datagram) its first; not steered, all reach the
    /// first.
    #[test]
    fn responses_are_steered_to_a_socket_of_their_own() {
        let (first, second) = group("127.0.0.1:0".parse().unwrap());
        let to = first.local_addr().unwrap();
        let peer = UdpSocket::bind("127.0.0.1:0").unwrap();
        let send_all = || {
            for op in 0..=0xFFu8 {
                peer.send_to(&[op, 0, 0, 0], to).unwrap();
            }
            peer.send_to(&[], to).unwrap();
        };
        // What `s` has, waiting up to 5 s for `expect` datagrams.
        let drain = |s: &UdpSocket, expect: usize| {
            let mut got = Vec::new();
            let mut buf = [0u8; 8];
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
            loop {
                match s.recv(&mut buf) {
                    Ok(n) => got.push(buf[..n].first().copied()),
                    Err(_) if got.len() < expect && std::time::Instant::now() < deadline => {
                        std::thread::yield_now()
                    }
                    Err(_) => return got,
                }
            }
        };
        steer_responses(first.as_fd(), true).unwrap();
        send_all();
        let want: Vec<Option<u8>> = RESPONSES.map(Some).collect();
        let responses = drain(&second, want.len());
        let others = drain(&first, 257 - want.len());
        assert_eq!(responses, want);
        assert_eq!(others.len(), 256 - want.len() + 1);
        assert!(others
            .iter()
            .all(|op| op.is_none_or(|op| !RESPONSES.contains(&op))));
        steer_responses(second.as_fd(), false).unwrap();
        send_all();
        assert_eq!(drain(&first, 257).len(), 257);
        assert!(drain(&second, 0).is_empty());
    }

    #[test]
    fn a_batch_each_way_v4_and_v6() {
        for local in ["127.0.0.1:0", "[::1]:0"] {
            let (Ok(a), Ok(b)) = (UdpSocket::bind(local), UdpSocket::bind(local)) else {
                continue; // no IPv6 here
            };
            let to = b.local_addr().unwrap();
            let payloads: Vec<Vec<u8>> = (0..40u8).map(|i| vec![i; 100 + i as usize]).collect();
            let out: Vec<(SocketAddr, &[u8])> =
                payloads.iter().map(|p| (to, p.as_slice())).collect();
            assert_eq!(send(a.as_fd(), out.len(), |i| out[i]).unwrap(), 40);
            let mut rb = RecvBatch::new();
            let mut got = Vec::new();
            for _ in 0..100 {
                let n = rb.recv(b.as_fd()).unwrap();
                for i in 0..n {
                    let (mut data, from) = rb.get(i).unwrap();
                    assert_eq!(from, a.local_addr().unwrap());
                    got.push(data.next().unwrap().to_vec());
                    assert!(
                        data.next().is_none(),
                        "one datagram per message without GRO"
                    );
                }
                if got.len() == 40 {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            assert_eq!(got, payloads);
            // Oversized: reported, not passed on cut short.
            let big = vec![7u8; SLOT + 1];
            assert_eq!(send(a.as_fd(), 1, |_| (to, &big[..])).unwrap(), 1);
            std::thread::sleep(std::time::Duration::from_millis(5));
            assert_eq!(rb.recv(b.as_fd()).unwrap(), 1);
            assert!(rb.get(0).is_none());
        }
    }

    #[test]
    fn the_segment_message_is_laid_out_as_cmsg_space() {
        // SAFETY: pure arithmetic.
        let (space, len) = unsafe { (libc::CMSG_SPACE(2), libc::CMSG_LEN(2)) };
        assert_eq!(size_of::<SegmentCmsg>(), space as usize);
        assert_eq!(SegmentCmsg::new(9).hdr.cmsg_len, len as usize);
    }

    #[test]
    fn runs_end_at_a_new_destination_a_longer_or_shorter_datagram_or_the_limits() {
        let a: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let b: SocketAddr = "127.0.0.2:1".parse().unwrap();
        let run = |d: &[(SocketAddr, usize)]| gso_run(d.len(), |i| d[i]);
        assert_eq!(run(&[]), 0);
        assert_eq!(run(&[(a, 100)]), 1);
        assert_eq!(run(&[(a, 100), (a, 100), (b, 100)]), 2);
        assert_eq!(run(&[(a, 100), (a, 100), (a, 101)]), 2);
        assert_eq!(
            run(&[(a, 100), (a, 60), (a, 60)]),
            2,
            "a shorter one is the last"
        );
        assert_eq!(run(&[(a, 100), (a, 0)]), 1);
        let many = vec![(a, 100); 100];
        assert_eq!(run(&many), GSO_SEGMENTS);
        let big = vec![(a, 4000); 40];
        assert_eq!(run(&big), 16, "65,000 bytes at most");
    }

    /// GSO sends arrive as the datagrams they were cut from, in order, each
    /// its own length, next to single ones; IPv4 and IPv6; at a socket
    /// without GRO (the kernel cuts them on the way in) and with it (they
    /// arrive joined, and come out of the batch cut).
    #[test]
    fn gso_groups_arrive_as_their_datagrams() {
        for (local, gro) in [
            ("127.0.0.1:0", false),
            ("[::1]:0", false),
            ("127.0.0.1:0", true),
            ("[::1]:0", true),
        ] {
            let (Ok(a), Ok(b)) = (UdpSocket::bind(local), UdpSocket::bind(local)) else {
                continue; // no IPv6 here
            };
            if gro {
                enable_gro(b.as_fd()).unwrap();
            }
            let to = b.local_addr().unwrap();
            // 3 x 1000 + 400, 1 x 50, 5 x 700, 2 x 1000
            let lens = [
                1000, 1000, 1000, 400, 50, 700, 700, 700, 700, 700, 1000, 1000,
            ];
            let payloads: Vec<Vec<u8>> = lens
                .iter()
                .enumerate()
                .map(|(i, &n)| (0..n).map(|j| (i * 31 + j) as u8).collect())
                .collect();
            let out: Vec<(SocketAddr, &[u8])> =
                payloads.iter().map(|p| (to, p.as_slice())).collect();
            let mut groups = Vec::new();
            let mut at = 0;
            while at < out.len() {
                let n = gso_run(out.len() - at, |i| (out[at + i].0, out[at + i].1.len()));
                groups.push(n);
                at += n;
            }
            assert_eq!(groups, [4, 1, 5, 2]);
            let sent = send_groups(a.as_fd(), &groups, |i| out[i]).unwrap();
            assert_eq!(
                sent,
                Sent {
                    datagrams: lens.len(),
                    gso_refused: false
                }
            );
            let mut rb = if gro {
                RecvBatch::with_gro()
            } else {
                RecvBatch::new()
            };
            let mut got = Vec::new();
            let mut messages = 0;
            for _ in 0..100 {
                let n = rb.recv(b.as_fd()).unwrap();
                messages += n;
                for i in 0..n {
                    got.extend(rb.get(i).unwrap().0.map(<[u8]>::to_vec));
                }
                if got.len() >= lens.len() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            assert_eq!(got, payloads, "{local} GRO {gro}");
            let want = if gro { groups.len() } else { lens.len() };
            assert_eq!(messages, want, "{local} GRO {gro}: messages received");
        }
    }

    /// A socket that sends without UDP checksums cannot send GSO (the
    /// kernel says EINVAL): the refusal is reported, the send dropped, and
    /// single datagrams still go.
    #[test]
    fn a_refused_gso_send_is_reported() {
        let (a, b) = (
            UdpSocket::bind("127.0.0.1:0").unwrap(),
            UdpSocket::bind("127.0.0.1:0").unwrap(),
        );
        set_option(
            a.as_fd(),
            libc::SOL_SOCKET,
            libc::SO_NO_CHECK,
            &(1 as libc::c_int),
        )
        .unwrap();
        let to = b.local_addr().unwrap();
        let p = [7u8; 100];
        let refused = send_groups(a.as_fd(), &[3, 1], |_| (to, &p[..])).unwrap();
        assert_eq!(
            refused,
            Sent {
                datagrams: 0,
                gso_refused: true
            }
        );
        let single = send_groups(a.as_fd(), &[1, 1], |_| (to, &p[..])).unwrap();
        assert_eq!(
            single,
            Sent {
                datagrams: 2,
                gso_refused: false
            }
        );
    }
}
