//! The NIC's spare packet buffers. A datagram's buffer comes back after it
//! was sent ([`crate::Nic::recycle`]) and the next packet is built in it,
//! so a steady flow allocates nothing.

/// How many packet buffers the NIC keeps for reuse.
pub const POOL: usize = 256;

/// The room every packet buffer is made with: the largest payload and the
/// largest headers (BTH, an extended header or two, pad and ICRC come to
/// under 64 bytes). A buffer reused for any packet never has to grow, so
/// which packet a recycled buffer served before does not matter.
pub const PACKET_CAPACITY: usize = rnic_wire::ib::MAX_PAYLOAD + 64;

/// Buffers to build packets in, at most [`POOL`] of them.
#[derive(Debug)]
pub(crate) struct BufferPool(Vec<Vec<u8>>);

impl Default for BufferPool {
    fn default() -> BufferPool {
        BufferPool(Vec::with_capacity(POOL))
    }
}

impl BufferPool {
    /// A buffer to build a packet in: a spare one, or a new one of
    /// [`PACKET_CAPACITY`].
    pub fn take(&mut self) -> Vec<u8> {
        self.0
            .pop()
            .unwrap_or_else(|| Vec::with_capacity(PACKET_CAPACITY))
    }

    /// Keep `buf` for a later packet: a buffer of the size packets are
    /// built in, while fewer than [`POOL`] are kept.
    pub fn keep(&mut self, buf: Vec<u8>) {
        if self.0.len() < POOL && buf.capacity() >= PACKET_CAPACITY {
            self.0.push(buf);
        }
    }

    /// Buffers kept.
    pub fn len(&self) -> usize {
        self.0.len()
    }
}
