//! What the device supports (`ibv_query_device`), enforced where queue
//! pairs and completion queues are created and modified.

/// What the NIC supports (`ibv_device_attr`), enforced where QPs and CQs are
/// created and modified.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceAttr {
    /// Queue pairs (24-bit QPNs from 0x11).
    pub max_qp: u32,
    /// Work requests per queue.
    pub max_qp_wr: u32,
    /// Scatter/gather entries per work request.
    pub max_sge: u32,
    /// Entries per completion queue.
    pub max_cqe: u32,
    /// Outstanding READs/atomics per QP as responder.
    pub max_qp_rd_atom: u8,
    /// Outstanding READs/atomics per QP as requester.
    pub max_qp_init_rd_atom: u8,
    /// The largest message.
    pub max_msg_sz: u32,
    /// The most inline data a send may carry.
    pub max_inline_data: u32,
}

/// rnic's device attributes.
pub const DEVICE_ATTR: DeviceAttr = DeviceAttr {
    max_qp: QPNS.1 - QPNS.0 + 1,
    max_qp_wr: 32_768,
    max_sge: 32,
    max_cqe: 1 << 20,
    max_qp_rd_atom: 128,
    max_qp_init_rd_atom: 128,
    max_msg_sz: 1 << 31,
    max_inline_data: crate::wr::MAX_INLINE_DATA as u32,
};

/// The QP numbers handed out: 0 and 1 are the special QPs and 0xFFFFFF
/// multicast; rdma_rxe starts at 0x11.
pub(crate) const QPNS: (u32, u32) = (0x11, 0xFF_FFFE);

/// The node GUID of a NIC whose address is `addr`, as the eight bytes of an
/// EUI-64 in network order: an IPv4 address as a MAC address
/// 02:00:a:b:c:d would give it (`02 00 a ff fe b c d`), an IPv6 address's
/// interface identifier. RoCE NICs derive theirs from their MAC address;
/// rnic has none, and its address names it as well.
pub fn node_guid_bytes(addr: core::net::IpAddr) -> [u8; 8] {
    match addr {
        core::net::IpAddr::V4(a) => {
            let o = a.octets();
            [0x02, 0, o[0], 0xFF, 0xFE, o[1], o[2], o[3]]
        }
        core::net::IpAddr::V6(a) => {
            let mut b = [0; 8];
            b.copy_from_slice(&a.octets()[8..16]);
            b
        }
    }
}

/// [`node_guid_bytes`] as the number the CM's messages carry (read
/// big-endian).
pub fn node_guid(addr: core::net::IpAddr) -> u64 {
    u64::from_be_bytes(node_guid_bytes(addr))
}
