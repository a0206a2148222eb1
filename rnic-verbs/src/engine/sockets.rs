//! The engine's sockets: UDP port 4791 of each of the NIC's addresses
//! (shared with other processes' NICs where the frame transport or the
//! response socket needs it), a queue pair's own source port, and the
//! claim that keeps an address one NIC's.

use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::AsFd;

use rustix::net::sockopt::{
    set_ip_mtu_discover, set_socket_send_buffer_size, set_socket_send_buffer_size_force,
    Ipv4PathMtuDiscovery,
};

use super::ROCE_PORT;
use crate::udp::{ask_recv_buffer, SOCKET_BUFFER};

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
    if set_socket_send_buffer_size_force(&socket, SOCKET_BUFFER).is_err() {
        let _ = set_socket_send_buffer_size(&socket, SOCKET_BUFFER);
    }
    Ok(socket)
}

/// Claim UDP port 4791 of `addr` (link-local IPv6: on interface `scope`)
/// for one NIC, for as long as the returned socket is open. The NIC's two
/// sockets on the port let sockets that ask for SO_REUSEPORT join them, so
/// the port alone no longer says the address is taken: an abstract Unix
/// socket named after it does (as [`crate::frames::claim_slot`]'s). A
/// program that binds the port without SO_REUSEPORT is refused by the
/// kernel as before.
pub(super) fn claim_udp(addr: IpAddr, scope: u32) -> io::Result<std::os::unix::net::UnixDatagram> {
    use std::os::linux::net::SocketAddrExt;
    let name = format!("rnic/udp/{addr}%{scope}/{ROCE_PORT}");
    let at = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
    std::os::unix::net::UnixDatagram::bind_addr(&at).map_err(|e| {
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
