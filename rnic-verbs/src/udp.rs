//! Batched UDP I/O: `recvmmsg` and `sendmmsg`, up to [`BATCH`] datagrams per
//! system call, where one call per datagram would cost more than the engine
//! spends on the packet itself. Public so that a benchmark's raw UDP
//! baseline makes the same system calls as the engine does.
//!
//! Not used, on purpose: UDP GSO. Linux numbers the IPv4 identification of
//! the segments it cuts from one GSO send 0, 1, 2, ..., and the ICRC covers
//! that field, so every segment after the first would carry a wrong ICRC on
//! a real wire (rnic's convention is identification 0, see `engine`).

use std::io;
use std::mem::{size_of, zeroed};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, BorrowedFd};

/// Datagrams per system call.
pub const BATCH: usize = 32;

/// Bytes per receive slot: a 4096-byte PMTU packet with every header fits; a
/// larger datagram is truncated and reported as such.
const SLOT: usize = 8192;

/// Receive buffers and what the last `recv` filled in. The message headers
/// are built once and point into the struct's own heap buffers, which never
/// move (they are never resized), so a receive allocates nothing.
pub struct RecvBatch {
    bufs: Vec<u8>,
    addrs: Vec<libc::sockaddr_storage>,
    iovs: Vec<libc::iovec>,
    hdrs: Vec<libc::mmsghdr>,
    lens: Vec<usize>,
    truncated: Vec<bool>,
}

// SAFETY: the raw pointers in `iovs` and `hdrs` point into `bufs`, `addrs`
// and `iovs`, heap buffers owned by the same struct: moving the struct to
// another thread moves them with it, and nothing else refers to them.
unsafe impl Send for RecvBatch {}

impl Default for RecvBatch {
    fn default() -> RecvBatch {
        RecvBatch::new()
    }
}

impl RecvBatch {
    /// Room for [`BATCH`] datagrams of up to 8 KiB each.
    pub fn new() -> RecvBatch {
        let mut b = RecvBatch {
            bufs: vec![0; SLOT * BATCH],
            // SAFETY: sockaddr_storage is plain data; all zeroes is valid.
            addrs: vec![unsafe { zeroed() }; BATCH],
            iovs: Vec::with_capacity(BATCH),
            hdrs: Vec::with_capacity(BATCH),
            lens: vec![0; BATCH],
            truncated: vec![false; BATCH],
        };
        for slot in b.bufs.chunks_mut(SLOT) {
            b.iovs.push(libc::iovec {
                iov_base: slot.as_mut_ptr().cast(),
                iov_len: slot.len(),
            });
        }
        for (iov, addr) in b.iovs.iter_mut().zip(b.addrs.iter_mut()) {
            // SAFETY: mmsghdr is plain data; all zeroes is a valid empty one.
            let mut h: libc::mmsghdr = unsafe { zeroed() };
            h.msg_hdr.msg_name = (addr as *mut libc::sockaddr_storage).cast();
            h.msg_hdr.msg_iov = iov;
            h.msg_hdr.msg_iovlen = 1;
            b.hdrs.push(h);
        }
        b
    }

    /// Receive up to [`BATCH`] datagrams without blocking; how many (0 if none waits).
    pub fn recv(&mut self, fd: BorrowedFd<'_>) -> io::Result<usize> {
        for h in &mut self.hdrs {
            // The kernel writes back the address's length and the flags.
            h.msg_hdr.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            h.msg_hdr.msg_flags = 0;
        }
        // SAFETY: every header points at a live iovec over a live slot of
        // `self.bufs` and at a live address slot (see the struct), all
        // outliving the call.
        let n = unsafe {
            libc::recvmmsg(
                fd.as_raw_fd(),
                self.hdrs.as_mut_ptr(),
                BATCH as libc::c_uint,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(0),
                _ => Err(e),
            };
        }
        let n = n as usize;
        for (i, h) in self.hdrs.iter().take(n).enumerate() {
            self.lens[i] = (h.msg_len as usize).min(SLOT);
            self.truncated[i] = h.msg_hdr.msg_flags & libc::MSG_TRUNC != 0;
        }
        Ok(n)
    }

    /// Frame `i` of the last batch, from a packet socket: its bytes, or
    /// None if it was truncated.
    pub fn frame(&self, i: usize) -> Option<&[u8]> {
        (!self.truncated[i]).then(|| &self.bufs[i * SLOT..i * SLOT + self.lens[i]])
    }

    /// Datagram `i` of the last batch: its bytes and sender, or None if it
    /// was truncated or its sender is not an IP address.
    pub fn get(&self, i: usize) -> Option<(&[u8], SocketAddr)> {
        if self.truncated[i] {
            return None;
        }
        let from = from_sockaddr(&self.addrs[i])?;
        Some((&self.bufs[i * SLOT..i * SLOT + self.lens[i]], from))
    }
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
    // SAFETY (all three): plain data; all zeroes is valid.
    let mut addrs: [libc::sockaddr_storage; BATCH] = unsafe { zeroed() };
    let mut iovs: [libc::iovec; BATCH] = unsafe { zeroed() };
    let mut hdrs: [libc::mmsghdr; BATCH] = unsafe { zeroed() };
    let mut sent = 0;
    while sent < count {
        let chunk = (count - sent).min(BATCH);
        for j in 0..chunk {
            let (to, data) = datagram(sent + j);
            let len;
            (addrs[j], len) = to_sockaddr(to);
            iovs[j] = libc::iovec {
                iov_base: data.as_ptr() as *mut libc::c_void,
                iov_len: data.len(),
            };
            hdrs[j].msg_hdr.msg_name = (&mut addrs[j] as *mut libc::sockaddr_storage).cast();
            hdrs[j].msg_hdr.msg_namelen = len;
            hdrs[j].msg_hdr.msg_iov = &mut iovs[j];
            hdrs[j].msg_hdr.msg_iovlen = 1;
        }
        // SAFETY: every header points at a live address and a live iovec over
        // bytes borrowed for the duration of the call; the kernel only reads them.
        let n = unsafe {
            libc::sendmmsg(
                fd.as_raw_fd(),
                hdrs.as_mut_ptr(),
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

fn to_sockaddr(to: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain data; all zeroes is valid.
    let mut s: libc::sockaddr_storage = unsafe { zeroed() };
    let len = match to {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is large and aligned enough for any sockaddr.
            unsafe {
                (&mut s as *mut libc::sockaddr_storage)
                    .cast::<libc::sockaddr_in>()
                    .write(sin)
            };
            size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: as above.
            unsafe {
                (&mut s as *mut libc::sockaddr_storage)
                    .cast::<libc::sockaddr_in6>()
                    .write(sin6)
            };
            size_of::<libc::sockaddr_in6>()
        }
    };
    (s, len as libc::socklen_t)
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
                    let (data, from) = rb.get(i).unwrap();
                    assert_eq!(from, a.local_addr().unwrap());
                    got.push(data.to_vec());
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
}
