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
//! The frame socket's own filter, in the kernel, passes only IPv4 UDP to
//! port 4791 at the NIC's address, unfragmented. It sees the packet from
//! its IP header (SOCK_DGRAM); the interface's MTU bounds what arrives.

use std::ffi::CString;
use std::io;
use std::mem::size_of;
use std::net::{Ipv4Addr, UdpSocket};
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
const LDX_B_MSH: u16 = 0xb1;
const ALU_AND_K: u16 = 0x54;
const JEQ_K: u16 = 0x15;
const JSET_K: u16 = 0x45;
const RET_K: u16 = 0x06;

/// The filter for an IP-level packet socket: IPv4, UDP, no fragment, to
/// `addr`, destination port 4791; everything else is dropped in the kernel.
fn roce_filter(addr: Ipv4Addr) -> Vec<libc::sock_filter> {
    const ACCEPT: u32 = 0xFFFF;
    // A jump goes 1 + its offset forward; every drop lands on 12.
    vec![
        op(LD_B_ABS, 0, 0, 0),                               // 0: version and IHL
        op(ALU_AND_K, 0, 0, 0xF0),                           // 1
        op(JEQ_K, 0, 9, 0x40),                               // 2: IPv4, else drop
        op(LD_B_ABS, 0, 0, 9),                               // 3: protocol
        op(JEQ_K, 0, 7, u32::from(libc::IPPROTO_UDP as u8)), // 4: UDP, else drop
        op(LD_H_ABS, 0, 0, 6),                               // 5: flags and fragment offset
        op(JSET_K, 5, 0, 0x3FFF),                            // 6: MF or an offset: drop
        op(LD_W_ABS, 0, 0, 16),                              // 7: destination address
        op(JEQ_K, 0, 3, u32::from(addr)),                    // 8: ours, else drop
        op(LDX_B_MSH, 0, 0, 0),                              // 9: X = header length
        op(LD_H_IND, 0, 0, 2),                               // 10: UDP destination port
        op(JEQ_K, 1, 0, u32::from(rnic_wire::ROCE_V2_PORT)), // 11: 4791: accept
        op(RET_K, 0, 0, 0),                                  // 12: drop
        op(RET_K, 0, 0, ACCEPT),                             // 13: accept
    ]
}

fn attach(fd: BorrowedFd<'_>, filter: &[libc::sock_filter]) -> io::Result<()> {
    let prog = libc::sock_fprog {
        len: filter.len() as u16,
        filter: filter.as_ptr().cast_mut(),
    };
    // SAFETY: `prog` points at `filter`, live for the call; the kernel
    // copies and checks the program.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ATTACH_FILTER,
            (&prog as *const libc::sock_fprog).cast(),
            size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Keep `socket` bound but receiving nothing (its packets come in through
/// the frame socket).
pub(crate) fn receive_nothing(socket: &UdpSocket) -> io::Result<()> {
    attach(socket.as_fd(), &[op(RET_K, 0, 0, 0)])
}

/// An interface, by name: its index and first IPv4 address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interface {
    /// Its name.
    pub name: String,
    /// Its index.
    pub index: u32,
    /// Its first IPv4 address: the NIC's.
    pub addr: Ipv4Addr,
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
        let addr = ipv4_of(name)?.ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("network interface {name} has no IPv4 address"),
            )
        })?;
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
            addr,
            mtu,
        })
    }
}

/// The first IPv4 address of interface `name`.
fn ipv4_of(name: &str) -> io::Result<Option<Ipv4Addr>> {
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `list`, freed below.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut found = None;
    let mut p = list;
    while !p.is_null() && found.is_none() {
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
                found = Some(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)));
            }
        }
        p = a.ifa_next;
    }
    // SAFETY: the list from getifaddrs, freed once.
    unsafe { libc::freeifaddrs(list) };
    Ok(found)
}

/// The packet socket on an interface, filtered to the NIC's RoCE v2 packets.
pub(crate) fn open(iface: &Interface) -> io::Result<OwnedFd> {
    let proto = (libc::ETH_P_IP as u16).to_be();
    // SAFETY: plain socket(2); the descriptor is owned below.
    let raw = unsafe {
        libc::socket(
            libc::AF_PACKET,
            libc::SOCK_DGRAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            i32::from(proto),
        )
    };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new descriptor, owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // The filter goes on before the bind: no packet is queued unfiltered.
    attach(fd.as_fd(), &roce_filter(iface.addr))?;
    // SAFETY: sockaddr_ll is plain data; all zeroes is valid.
    let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sll.sll_family = libc::AF_PACKET as u16;
    sll.sll_protocol = proto;
    sll.sll_ifindex = iface.index as i32;
    // SAFETY: binds the descriptor to a valid sockaddr_ll of the right size.
    let r = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&sll as *const libc::sockaddr_ll).cast(),
            size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    crate::engine::ask_recv_buffer(fd.as_fd());
    Ok(fd)
}

/// The IB packet (BTH through ICRC) of an IPv4 packet the frame socket
/// took in: past the IP header (its IHL words) and the UDP header; empty if
/// the packet is shorter than that. Enough to look at the opcode and the
/// QP before the NIC parses and verifies the whole packet.
pub(crate) fn ib_packet(ip_packet: &[u8]) -> &[u8] {
    let ip_len = ip_packet.first().map_or(0, |b| usize::from(b & 0x0F) * 4);
    ip_packet.get(ip_len + 8..).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Run a classic BPF program over `pkt` as the kernel would (only the
    /// instructions the filters here use): what it returns.
    fn run(prog: &[libc::sock_filter], pkt: &[u8]) -> u32 {
        let (mut a, mut x, mut pc) = (0u32, 0u32, 0usize);
        let byte = |i: usize| pkt.get(i).copied();
        loop {
            let i = prog[pc];
            let k = i.k as usize;
            pc += 1;
            let load = match i.code {
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

    #[test]
    fn the_filter_passes_roce_to_this_address_only() {
        let me: Ipv4Addr = "10.0.0.1".parse().unwrap();
        let f = roce_filter(me);
        let pass = |p: &[u8]| run(&f, p) != 0;
        assert!(pass(&udp4(me, 4791)));
        // IP options: the UDP header moves, and the port is found there.
        let mut opts = udp4(me, 4791);
        opts[0] = 0x46;
        opts.splice(20..20, [1, 1, 1, 1]);
        assert!(pass(&opts));
        assert!(!pass(&udp4(me, 4790)), "another port");
        assert!(
            !pass(&udp4("10.0.0.3".parse().unwrap(), 4791)),
            "another address"
        );
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
        assert!(!pass(&v6), "IPv6");
        assert!(!pass(&udp4(me, 4791)[..22]), "cut short before the port");
    }

    #[test]
    fn the_ib_packet_follows_the_ip_and_udp_headers() {
        let me: Ipv4Addr = "10.0.0.1".parse().unwrap();
        let mut p = udp4(me, 4791);
        p[28] = 0x0A;
        assert_eq!(ib_packet(&p).first(), Some(&0x0A));
        assert_eq!(ib_packet(&p).len(), 64);
        p[0] = 0x46; // four bytes of options: the payload starts later
        assert_eq!(ib_packet(&p).len(), 60);
        assert!(ib_packet(&p[..20]).is_empty());
        assert!(ib_packet(&[]).is_empty());
    }

    #[test]
    fn the_udp_socket_filter_drops_everything() {
        assert_eq!(
            run(
                &[op(RET_K, 0, 0, 0)],
                &udp4("10.0.0.1".parse().unwrap(), 4791)
            ),
            0
        );
    }
}
