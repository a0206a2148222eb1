//! The engine's sockets: UDP port 4791 of each of the NIC's addresses
//! (shared with other processes' NICs where the frame transport or the
//! response socket needs it), a queue pair's own source port, and the
//! claim that keeps an address one NIC's.

use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::AsFd;
use std::os::unix::net::UnixDatagram;

use rustix::net::sockopt::{set_ip_mtu_discover, Ipv4PathMtuDiscovery};

use super::ROCE_PORT;
use crate::udp::ask_recv_buffer;

pub(super) fn open_socket(addr: IpAddr, port: u16, scope: u32) -> io::Result<UdpSocket> {
    open_socket_shared(addr, port, scope, false)
}

/// A UDP socket on `addr`:`port` to send from; with `shared`, one that
/// other processes' NICs on the same address may bind too (SO_REUSEPORT:
/// on the frame transport, where port 4791 only keeps the kernel from
/// answering, and each NIC takes its packets in from its frame socket).
pub(super) fn open_socket_shared(
    addr: IpAddr,
    port: u16,
    scope: u32,
    shared: bool,
) -> io::Result<UdpSocket> {
    let at = match addr {
        IpAddr::V6(a) => SocketAddr::V6(std::net::SocketAddrV6::new(a, port, 0, scope)),
        IpAddr::V4(_) => SocketAddr::new(addr, port),
    };
    let family = if addr.is_ipv4() {
        rustix::net::AddressFamily::INET
    } else {
        rustix::net::AddressFamily::INET6
    };
    let fd = rustix::net::socket_with(
        family,
        rustix::net::SocketType::DGRAM,
        rustix::net::SocketFlags::CLOEXEC,
        None,
    )?;
    if shared {
        rustix::net::sockopt::set_socket_reuseport(&fd, true)?;
    }
    rustix::net::bind(&fd, &at)?;
    let socket = UdpSocket::from(fd);
    socket.set_nonblocking(true)?;
    if addr.is_ipv4() {
        // DF on every datagram and IPv4 identification 0: the ICRC convention.
        set_ip_mtu_discover(&socket, Ipv4PathMtuDiscovery::DO)?;
    }
    ask_recv_buffer(socket.as_fd());
    crate::udp::ask_send_buffer(socket.as_fd());
    Ok(socket)
}

/// Claim UDP port 4791 of `addr` (link-local IPv6: on interface `scope`)
/// for one NIC, for as long as the returned socket is open. The NIC's two
/// sockets on the port let sockets that ask for SO_REUSEPORT join them, so
/// the port alone no longer says the address is taken: an abstract Unix
/// socket named after it does (as [`super::relay::claim_slot`]'s). A
/// program that binds the port without SO_REUSEPORT is refused by the
/// kernel as before.
///
/// A claim this process already holds for a NIC still to come is taken
/// over instead: one [`reserve_loopback`] made, or one inherited across
/// `exec` ([`reserve_loopback_for_exec`]).
pub(super) fn claim_udp(addr: IpAddr, scope: u32) -> io::Result<UnixDatagram> {
    if let Some(c) = take_reserved(addr, scope) {
        return Ok(c);
    }
    bind_claim(addr, scope).map_err(|e| {
        if e.kind() == io::ErrorKind::AddrInUse {
            io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("UDP port {ROCE_PORT} of {addr} is taken by another rnic NIC"),
            )
        } else {
            e
        }
    })
}

fn claim_name(addr: IpAddr, scope: u32) -> String {
    format!("rnic/udp/{addr}%{scope}/{ROCE_PORT}")
}

fn bind_claim(addr: IpAddr, scope: u32) -> io::Result<UnixDatagram> {
    bind_abstract(&claim_name(addr, scope))
}

/// A claim among every process of the network namespace: an abstract Unix
/// socket bound to `name` (`AddrInUse` if another holds it), which the
/// kernel frees when its last descriptor closes, however the holder ends.
/// rnic's claims on addresses, QP-number slots and rdma_cm ports are these.
pub(crate) fn bind_abstract(name: &str) -> io::Result<UnixDatagram> {
    use std::os::linux::net::SocketAddrExt;
    let at = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
    UnixDatagram::bind_addr(&at)
}

fn ring_name(addr: IpAddr) -> String {
    format!("rnic/ring/{addr}/{ROCE_PORT}")
}

/// What tells every process's NICs that a receive ring on `lo` takes in
/// the packets to port 4791 of `addr`, for as long as it is held: they may
/// send there past IP and UDP (see [`crate::frames::FrameSender`]). The
/// kernel's IP layer drops such a packet to a loopback address as a
/// martian (it comes with no route, and `lo` does not route 127.0.0.0/8
/// unless told to), so a UDP socket never sees it.
pub(super) fn mark_ring(addr: IpAddr) -> io::Result<UnixDatagram> {
    bind_abstract(&ring_name(addr))
}

/// Whether a receive ring takes in the packets to `addr` ([`mark_ring`]).
pub(super) fn ring_marked(addr: IpAddr) -> bool {
    use std::os::linux::net::SocketAddrExt;
    std::os::unix::net::SocketAddr::from_abstract_name(ring_name(addr))
        .and_then(|at| UnixDatagram::unbound()?.connect_addr(&at))
        .is_ok()
}

/// Whether an rnic NIC of any process (this one's too) holds UDP port 4791
/// of `addr` on the UDP transport: someone a CM request to `addr` can
/// reach.
pub fn nic_on(addr: IpAddr) -> bool {
    matches!(bind_claim(addr, 0), Err(e) if e.kind() == io::ErrorKind::AddrInUse)
}

/// Claims taken before their NIC opens ([`reserve_loopback`]).
static RESERVED: parking_lot::Mutex<Vec<(IpAddr, UnixDatagram)>> =
    parking_lot::Mutex::new(Vec::new());

/// Claim the first loopback address a default NIC could open on (no
/// other NIC's, its port 4791 free), for a NIC this process opens later
/// with [`Device::open_with`](crate::Device::open_with): the address is
/// known, and settled, before the NIC exists, as a real port's is (the
/// drop-in library names its default device's GUID and GIDs from it when
/// listing devices). Held until that NIC takes it over, or the process ends.
pub fn reserve_loopback() -> crate::Result<IpAddr> {
    let (addr, claim) = pick_loopback()?;
    RESERVED.lock().push((addr, claim));
    Ok(addr)
}

/// [`reserve_loopback`] for the program this process is about to `exec`:
/// the claim's descriptor is left open across `exec`, and the program's
/// first NIC on the address takes it over (and closes it on its own
/// `exec`s). `rnic exec --sysfs` uses it, so that programs started
/// together never pick the same address.
pub fn reserve_loopback_for_exec() -> crate::Result<IpAddr> {
    let (addr, claim) = pick_loopback()?;
    let fd = std::os::fd::OwnedFd::from(claim);
    rustix::io::fcntl_setfd(&fd, rustix::io::FdFlags::empty()).map_err(io::Error::from)?;
    // Left open on purpose: it is the claim, for the program exec starts.
    let _ = std::os::fd::IntoRawFd::into_raw_fd(fd);
    Ok(addr)
}

fn pick_loopback() -> crate::Result<(IpAddr, UnixDatagram)> {
    for addr in crate::loopback_addrs() {
        let Ok(claim) = bind_claim(addr, 0) else {
            continue; // another rnic NIC's
        };
        // Not an rnic NIC's, but the port may still be another program's.
        if UdpSocket::bind((addr, ROCE_PORT)).is_ok() {
            return Ok((addr, claim));
        }
    }
    Err(crate::Error::NoFreeAddress)
}

/// A claim on `addr` this process holds for a NIC to come: reserved, or
/// inherited across `exec` (a descriptor of the claim's socket without
/// close-on-exec: a NIC's own claims always have it).
fn take_reserved(addr: IpAddr, scope: u32) -> Option<UnixDatagram> {
    {
        let mut r = RESERVED.lock();
        if let Some(i) = r.iter().position(|(a, _)| *a == addr && scope == 0) {
            return Some(r.swap_remove(i).1);
        }
    }
    inherited_claim(&claim_name(addr, scope))
}

/// The claim named `name` inherited across `exec` (see
/// [`reserve_loopback_for_exec`]), taken over: the one descriptor of this
/// process that is a Unix socket bound to that name and lacks
/// close-on-exec (it gets it now). A descriptor is borrowed here by its
/// number while the process's other threads run, which is sound as long as
/// none closes a descriptor it does not own; it is owned only if it is that
/// socket, which nothing else in the process knows of.
#[allow(unsafe_code)]
fn inherited_claim(name: &str) -> Option<UnixDatagram> {
    use rustix::io::{fcntl_getfd, fcntl_setfd, FdFlags};
    for entry in std::fs::read_dir("/proc/self/fd").ok()?.flatten() {
        let Some(fd) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        // SAFETY: see above.
        let b = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
        let inherited = fcntl_getfd(b).is_ok_and(|f| !f.contains(FdFlags::CLOEXEC));
        let named = rustix::net::getsockname(b)
            .ok()
            .and_then(|a| rustix::net::SocketAddrUnix::try_from(a).ok())
            .is_some_and(|u| u.abstract_name() == Some(name.as_bytes()));
        if inherited && named {
            let _ = fcntl_setfd(b, FdFlags::CLOEXEC);
            // SAFETY: the inherited claim, owned by nothing else (see above).
            return Some(unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) });
        }
    }
    None
}

/// Whether a NIC on `addr` sends runs of datagrams as UDP GSO sends:
/// as `configured` (`RNIC_GSO`) if it says; otherwise only on loopback with
/// the UDP transport, where the kernel cuts the segments itself (the way a
/// veth test proves correct) and every receiver is a UDP socket. On a real
/// interface a NIC's own segmentation offload might number the IPv4
/// identification otherwise, and a peer's frame socket on `lo` would see
/// the uncut message.
pub(super) fn gso_default(addr: IpAddr, frames: bool, configured: Option<bool>) -> bool {
    configured.unwrap_or(addr.is_loopback() && !frames)
}

/// The largest IP packet between `addr` and its peers: the interface's MTU
/// on the frame transport; loopback carries 64 KiB; any other address is
/// taken to be on 1500-byte Ethernet.
pub(super) fn link_mtu(addr: IpAddr, iface: Option<&crate::frames::Interface>) -> u32 {
    match iface {
        Some(i) => i.mtu,
        None if addr.is_loopback() => 65536,
        None => 1500,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The port's MTU follows the link: the interface's MTU on the frame
    /// transport (a tap at 9000 carries 4096-byte IB packets, Ethernet at
    /// 1500 only 1024), 64 KiB on loopback, 1500 elsewhere.
    #[test]
    fn the_link_mtu_is_the_interface_s() {
        let tap = |mtu| crate::frames::Interface {
            name: "tap0".into(),
            index: 7,
            gids: vec![IpAddr::from([10, 88, 0, 1])],
            mtu,
        };
        let v4 = IpAddr::from([10, 88, 0, 1]);
        assert_eq!(link_mtu(v4, Some(&tap(9000))), 9000);
        assert_eq!(link_mtu(v4, Some(&tap(1500))), 1500);
        assert_eq!(link_mtu(v4, None), 1500);
        assert_eq!(link_mtu(IpAddr::from([127, 0, 0, 1]), None), 65536);
    }
}
