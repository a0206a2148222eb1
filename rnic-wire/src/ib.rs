//! An IB transport packet as RoCE v2 carries it in UDP: BTH, the extension headers
//! the opcode calls for, payload, pad, ICRC.

use core::fmt;

use crate::opcode::{ExtHeader, OpcodeInfo};
use crate::{
    aeth, atomic_ack_eth, atomic_eth, bth, cnp, deth, feth, ieth, immdt, reth, xrceth, Error,
    ErrorKind, Layer, Result, ICRC_LEN,
};

/// The largest payload an IB packet may carry: the largest path MTU (IBTA 7.7.8).
pub const MAX_PAYLOAD: usize = 4096;

/// Pad bytes that bring `payload_len` up to a multiple of four (the BTH PadCnt).
pub const fn pad_for(payload_len: usize) -> u8 {
    ((4 - (payload_len % 4)) % 4) as u8
}

/// A checked view of a whole IB transport packet: `buffer` runs from the first BTH
/// byte through the ICRC. The opcode is known, every header it calls for is
/// present, and the pad count fits the payload.
#[derive(Debug, Clone, Copy)]
pub struct IbPacket<T: AsRef<[u8]>> {
    buffer: T,
    info: &'static OpcodeInfo,
}

impl<T: AsRef<[u8]>> IbPacket<T> {
    /// Check and wrap a packet. Errors name the header that is short, an unknown
    /// opcode, a pad count that does not fit, or a payload over 4096 bytes.
    pub fn new_checked(buffer: T) -> Result<IbPacket<T>> {
        let b = buffer.as_ref();
        let bth = bth::Packet::new_checked(b)?;
        let info = bth.opcode().info().ok_or(Error::new(
            Layer::Bth,
            ErrorKind::UnknownOpcode(bth.opcode().0),
        ))?;
        let mut off = bth::HEADER_LEN;
        for &h in info.headers {
            if b.len() < off + h.wire_len() {
                return Err(Error::truncated(h.layer(), h.wire_len(), b.len() - off).at(off));
            }
            off += h.wire_len();
        }
        if b.len() < off + ICRC_LEN {
            return Err(Error::truncated(Layer::Icrc, ICRC_LEN, b.len() - off).at(off));
        }
        let padded_len = b.len() - off - ICRC_LEN;
        let pad_count = bth.pad_count();
        if !info.has_payload {
            if padded_len != 0 {
                return Err(Error::new(
                    Layer::Payload,
                    ErrorKind::Oversized {
                        max: 0,
                        actual: padded_len,
                    },
                )
                .at(off));
            }
            if pad_count != 0 {
                return Err(Error::new(
                    Layer::Bth,
                    ErrorKind::BadPadCount {
                        pad_count,
                        padded_len,
                    },
                ));
            }
        } else {
            // IBTA 9.2.4: the pad brings the payload to a multiple of four bytes.
            if usize::from(pad_count) > padded_len || padded_len % 4 != 0 {
                return Err(Error::new(
                    Layer::Bth,
                    ErrorKind::BadPadCount {
                        pad_count,
                        padded_len,
                    },
                ));
            }
            let payload_len = padded_len - usize::from(pad_count);
            if payload_len > MAX_PAYLOAD {
                return Err(Error::new(
                    Layer::Payload,
                    ErrorKind::Oversized {
                        max: MAX_PAYLOAD,
                        actual: payload_len,
                    },
                )
                .at(off));
            }
        }
        Ok(IbPacket { buffer, info })
    }

    /// The opcode's table entry.
    pub fn info(&self) -> &'static OpcodeInfo {
        self.info
    }

    /// The whole packet, BTH through ICRC.
    pub fn as_bytes(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// The BTH.
    pub fn bth(&self) -> bth::Packet<&[u8]> {
        bth::Packet::new_unchecked(&self.buffer.as_ref()[..bth::HEADER_LEN])
    }

    /// The bytes of extension header `h`, if the opcode has it.
    pub fn ext(&self, h: ExtHeader) -> Option<&[u8]> {
        let off = self.info.offset_of(h)?;
        Some(&self.buffer.as_ref()[off..off + h.wire_len()])
    }

    /// XRCETH, on XRC requests.
    pub fn xrceth(&self) -> Option<xrceth::Packet<&[u8]>> {
        self.ext(ExtHeader::XrcEth)
            .map(xrceth::Packet::new_unchecked)
    }
    /// DETH, on UD packets.
    pub fn deth(&self) -> Option<deth::Packet<&[u8]>> {
        self.ext(ExtHeader::Deth).map(deth::Packet::new_unchecked)
    }
    /// FETH, on FLUSH.
    pub fn feth(&self) -> Option<feth::Packet<&[u8]>> {
        self.ext(ExtHeader::Feth).map(feth::Packet::new_unchecked)
    }
    /// RETH, on WRITE FIRST/ONLY, READ requests, FLUSH and ATOMIC WRITE.
    pub fn reth(&self) -> Option<reth::Packet<&[u8]>> {
        self.ext(ExtHeader::Reth).map(reth::Packet::new_unchecked)
    }
    /// AtomicETH, on CmpSwap and FetchAdd.
    pub fn atomic_eth(&self) -> Option<atomic_eth::Packet<&[u8]>> {
        self.ext(ExtHeader::AtomicEth)
            .map(atomic_eth::Packet::new_unchecked)
    }
    /// ImmDt, on the "with immediate" opcodes.
    pub fn immdt(&self) -> Option<immdt::Packet<&[u8]>> {
        self.ext(ExtHeader::ImmDt).map(immdt::Packet::new_unchecked)
    }
    /// IETH, on the "with invalidate" opcodes.
    pub fn ieth(&self) -> Option<ieth::Packet<&[u8]>> {
        self.ext(ExtHeader::Ieth).map(ieth::Packet::new_unchecked)
    }
    /// AETH, on ACKs, atomic ACKs and READ responses FIRST/LAST/ONLY.
    pub fn aeth(&self) -> Option<aeth::Packet<&[u8]>> {
        self.ext(ExtHeader::Aeth).map(aeth::Packet::new_unchecked)
    }
    /// AtomicAckETH, on atomic ACKs.
    pub fn atomic_ack_eth(&self) -> Option<atomic_ack_eth::Packet<&[u8]>> {
        self.ext(ExtHeader::AtomicAckEth)
            .map(atomic_ack_eth::Packet::new_unchecked)
    }
    /// The CNP's reserved bytes.
    pub fn cnp(&self) -> Option<cnp::Packet<&[u8]>> {
        self.ext(ExtHeader::CnpPad).map(cnp::Packet::new_unchecked)
    }

    /// Bytes of the BTH and the extension headers.
    pub fn header_len(&self) -> usize {
        self.info.header_len()
    }

    /// The PadCnt field.
    pub fn pad_count(&self) -> u8 {
        self.bth().pad_count()
    }

    /// The payload, without pad.
    pub fn payload(&self) -> &[u8] {
        let b = self.buffer.as_ref();
        let end = b.len() - ICRC_LEN - usize::from(self.pad_count());
        &b[self.header_len()..end]
    }

    /// The payload followed by its pad bytes.
    pub fn padded_payload(&self) -> &[u8] {
        let b = self.buffer.as_ref();
        &b[self.header_len()..b.len() - ICRC_LEN]
    }

    /// Everything the ICRC covers after the BTH: extension headers, payload, pad.
    pub fn covered(&self) -> &[u8] {
        let b = self.buffer.as_ref();
        &b[..b.len() - ICRC_LEN]
    }

    /// The ICRC as stored (the CRC value; the wire holds it little-endian).
    pub fn icrc(&self) -> u32 {
        let b = self.buffer.as_ref();
        let n = b.len();
        u32::from_le_bytes([b[n - 4], b[n - 3], b[n - 2], b[n - 1]])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> IbPacket<T> {
    /// The payload, mutable.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let start = self.header_len();
        let pad = usize::from(self.pad_count());
        let b = self.buffer.as_mut();
        let end = b.len() - ICRC_LEN - pad;
        &mut b[start..end]
    }

    /// The BTH, mutable.
    pub fn bth_mut(&mut self) -> bth::Packet<&mut [u8]> {
        bth::Packet::new_unchecked(&mut self.buffer.as_mut()[..bth::HEADER_LEN])
    }

    /// Store the ICRC (little-endian, as on the wire).
    pub fn set_icrc(&mut self, icrc: u32) {
        let b = self.buffer.as_mut();
        let n = b.len();
        b[n - 4..].copy_from_slice(&icrc.to_le_bytes());
    }
}

/// The headers of an IB transport packet as plain values, plus the payload length.
///
/// The extension headers present must be exactly those the opcode calls for;
/// [`IbRepr::emit`] checks this.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IbRepr {
    /// BTH.
    pub bth: bth::Repr,
    /// XRCETH.
    pub xrceth: Option<xrceth::Repr>,
    /// DETH.
    pub deth: Option<deth::Repr>,
    /// FETH.
    pub feth: Option<feth::Repr>,
    /// RETH.
    pub reth: Option<reth::Repr>,
    /// AtomicETH.
    pub atomic_eth: Option<atomic_eth::Repr>,
    /// ImmDt.
    pub immdt: Option<immdt::Repr>,
    /// IETH.
    pub ieth: Option<ieth::Repr>,
    /// AETH.
    pub aeth: Option<aeth::Repr>,
    /// AtomicAckETH.
    pub atomic_ack_eth: Option<atomic_ack_eth::Repr>,
    /// Payload bytes (without pad).
    pub payload_len: usize,
}

impl IbRepr {
    /// A packet with this BTH and no extension headers or payload yet.
    pub const fn new(bth: bth::Repr) -> IbRepr {
        IbRepr {
            bth,
            xrceth: None,
            deth: None,
            feth: None,
            reth: None,
            atomic_eth: None,
            immdt: None,
            ieth: None,
            aeth: None,
            atomic_ack_eth: None,
            payload_len: 0,
        }
    }

    /// Parse every header of a checked packet.
    pub fn parse<T: AsRef<[u8]>>(packet: &IbPacket<T>) -> Result<IbRepr> {
        let mut repr = IbRepr::new(bth::Repr::parse(&packet.bth())?);
        if let Some(p) = packet.xrceth() {
            repr.xrceth = Some(xrceth::Repr::parse(&p)?);
        }
        if let Some(p) = packet.deth() {
            repr.deth = Some(deth::Repr::parse(&p)?);
        }
        if let Some(p) = packet.feth() {
            repr.feth = Some(feth::Repr::parse(&p)?);
        }
        if let Some(p) = packet.reth() {
            repr.reth = Some(reth::Repr::parse(&p)?);
        }
        if let Some(p) = packet.atomic_eth() {
            repr.atomic_eth = Some(atomic_eth::Repr::parse(&p)?);
        }
        if let Some(p) = packet.immdt() {
            repr.immdt = Some(immdt::Repr::parse(&p)?);
        }
        if let Some(p) = packet.ieth() {
            repr.ieth = Some(ieth::Repr::parse(&p)?);
        }
        if let Some(p) = packet.aeth() {
            repr.aeth = Some(aeth::Repr::parse(&p)?);
        }
        if let Some(p) = packet.atomic_ack_eth() {
            repr.atomic_ack_eth = Some(atomic_ack_eth::Repr::parse(&p)?);
        }
        repr.payload_len = packet.payload().len();
        Ok(repr)
    }

    /// The opcode's table entry; an error for an unknown opcode.
    pub fn info(&self) -> Result<&'static OpcodeInfo> {
        self.bth.opcode.info().ok_or(Error::new(
            Layer::Bth,
            ErrorKind::UnknownOpcode(self.bth.opcode.0),
        ))
    }

    /// One [`ExtHeader::bit`] per extension header present.
    fn header_mask(&self) -> u16 {
        let mut m = 0;
        for (present, h) in [
            (self.xrceth.is_some(), ExtHeader::XrcEth),
            (self.deth.is_some(), ExtHeader::Deth),
            (self.feth.is_some(), ExtHeader::Feth),
            (self.reth.is_some(), ExtHeader::Reth),
            (self.atomic_eth.is_some(), ExtHeader::AtomicEth),
            (self.immdt.is_some(), ExtHeader::ImmDt),
            (self.ieth.is_some(), ExtHeader::Ieth),
            (self.aeth.is_some(), ExtHeader::Aeth),
            (self.atomic_ack_eth.is_some(), ExtHeader::AtomicAckEth),
        ] {
            if present {
                m |= h.bit();
            }
        }
        m
    }

    /// Check that the headers present are exactly the opcode's and the payload fits.
    pub fn check(&self) -> Result<&'static OpcodeInfo> {
        let info = self.info()?;
        // The CNP's reserved bytes carry nothing: they are always "present".
        let wanted = info.header_mask & !ExtHeader::CnpPad.bit();
        let have = self.header_mask();
        if have != wanted {
            let diff = have ^ wanted;
            let h = [
                ExtHeader::XrcEth,
                ExtHeader::Deth,
                ExtHeader::Feth,
                ExtHeader::Reth,
                ExtHeader::AtomicEth,
                ExtHeader::ImmDt,
                ExtHeader::Ieth,
                ExtHeader::Aeth,
                ExtHeader::AtomicAckEth,
            ]
            .into_iter()
            .find(|h| diff & h.bit() != 0)
            .unwrap_or(ExtHeader::Aeth);
            return Err(if wanted & h.bit() != 0 {
                Error::truncated(h.layer(), h.wire_len(), 0)
            } else {
                Error::new(
                    h.layer(),
                    ErrorKind::Oversized {
                        max: 0,
                        actual: h.wire_len(),
                    },
                )
            });
        }
        let max = if info.has_payload { MAX_PAYLOAD } else { 0 };
        if self.payload_len > max {
            return Err(Error::new(
                Layer::Payload,
                ErrorKind::Oversized {
                    max,
                    actual: self.payload_len,
                },
            ));
        }
        Ok(info)
    }

    /// The PadCnt this packet gets.
    pub const fn pad_count(&self) -> u8 {
        pad_for(self.payload_len)
    }

    /// Bytes of BTH and extension headers.
    pub fn header_len(&self) -> usize {
        self.info()
            .map(|i| i.header_len())
            .unwrap_or(bth::HEADER_LEN)
    }

    /// Bytes the whole packet takes, ICRC included.
    pub fn buffer_len(&self) -> usize {
        self.header_len() + self.payload_len + usize::from(self.pad_count()) + ICRC_LEN
    }

    /// Write the packet into `buf` (which must be at least [`IbRepr::buffer_len`]
    /// bytes), letting `fill` write the payload in place; pad bytes are zero and
    /// the ICRC is left zero for the caller, who knows the IP and UDP headers.
    /// Returns the length written.
    pub fn emit_with(&self, buf: &mut [u8], fill: impl FnOnce(&mut [u8])) -> Result<usize> {
        let info = self.check()?;
        let len = self.buffer_len();
        if buf.len() < len {
            return Err(Error::truncated(Layer::Bth, len, buf.len()));
        }
        let buf = &mut buf[..len];
        self.bth.emit(
            &mut bth::Packet::new_unchecked(&mut buf[..bth::HEADER_LEN]),
            self.pad_count(),
        );
        let mut off = bth::HEADER_LEN;
        for &h in info.headers {
            let b = &mut buf[off..off + h.wire_len()];
            match h {
                ExtHeader::XrcEth => emit_opt(self.xrceth, |r| {
                    r.emit(&mut xrceth::Packet::new_unchecked(b))
                }),
                ExtHeader::Deth => {
                    emit_opt(self.deth, |r| r.emit(&mut deth::Packet::new_unchecked(b)))
                }
                ExtHeader::Feth => {
                    emit_opt(self.feth, |r| r.emit(&mut feth::Packet::new_unchecked(b)))
                }
                ExtHeader::Reth => {
                    emit_opt(self.reth, |r| r.emit(&mut reth::Packet::new_unchecked(b)))
                }
                ExtHeader::AtomicEth => emit_opt(self.atomic_eth, |r| {
                    r.emit(&mut atomic_eth::Packet::new_unchecked(b))
                }),
                ExtHeader::ImmDt => {
                    emit_opt(self.immdt, |r| r.emit(&mut immdt::Packet::new_unchecked(b)))
                }
                ExtHeader::Ieth => {
                    emit_opt(self.ieth, |r| r.emit(&mut ieth::Packet::new_unchecked(b)))
                }
                ExtHeader::Aeth => {
                    emit_opt(self.aeth, |r| r.emit(&mut aeth::Packet::new_unchecked(b)))
                }
                ExtHeader::AtomicAckEth => emit_opt(self.atomic_ack_eth, |r| {
                    r.emit(&mut atomic_ack_eth::Packet::new_unchecked(b))
                }),
                ExtHeader::CnpPad => b.fill(0),
            }
            off += h.wire_len();
        }
        fill(&mut buf[off..off + self.payload_len]);
        off += self.payload_len;
        buf[off..].fill(0); // pad and ICRC
        Ok(len)
    }

    /// [`IbRepr::emit_with`], copying `payload` (which must be `payload_len` bytes).
    pub fn emit(&self, buf: &mut [u8], payload: &[u8]) -> Result<usize> {
        if payload.len() != self.payload_len {
            return Err(Error::new(
                Layer::Payload,
                ErrorKind::BadLength {
                    field: self.payload_len,
                    actual: payload.len(),
                },
            ));
        }
        self.emit_with(buf, |b| b.copy_from_slice(payload))
    }
}

/// `check` has made sure every header the opcode needs is `Some`.
fn emit_opt<R>(repr: Option<R>, emit: impl FnOnce(R)) {
    if let Some(r) = repr {
        emit(r);
    }
}

impl fmt::Display for IbRepr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.bth)?;
        if let Some(h) = self.xrceth {
            write!(f, " | {h}")?;
        }
        if let Some(h) = self.deth {
            write!(f, " | {h}")?;
        }
        if let Some(h) = self.feth {
            write!(f, " | {h}")?;
        }
        if let Some(h) = self.reth {
            write!(f, " | {h}")?;
        }
        if let Some(h) = self.atomic_eth {
            write!(f, " | {h}")?;
        }
        if let Some(h) = self.immdt {
            write!(f, " | {h}")?;
        }
        if let Some(h) = self.ieth {
            write!(f, " | {h}")?;
        }
        if let Some(h) = self.aeth {
            write!(f, " | {h}")?;
        }
        if let Some(h) = self.atomic_ack_eth {
            write!(f, " | {h}")?;
        }
        if self.payload_len > 0 {
            write!(f, " | payload {} B", self.payload_len)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Opcode, Psn};

    // The first RC ACK of rxe-rc_pingpong.pcap, BTH through ICRC.
    static ACK: [u8; 20] = [
        0x11, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x11, 0x00, 0x74, 0xe0, 0x70, 0x1f, 0x00, 0x00,
        0x01, 0x52, 0xf1, 0xd5, 0x81,
    ];

    #[test]
    fn parses_an_ack() {
        let p = IbPacket::new_checked(&ACK[..]).unwrap();
        assert_eq!(p.info().opcode, Opcode::RC_ACKNOWLEDGE);
        let repr = IbRepr::parse(&p).unwrap();
        assert_eq!(repr.aeth.unwrap().syndrome, aeth::Syndrome::ACK_NO_CREDITS);
        assert_eq!(repr.aeth.unwrap().msn, 1);
        assert_eq!(p.payload(), &[] as &[u8]);
        assert_eq!(p.icrc(), 0x81d5_f152);
        assert_eq!(p.bth().psn(), Psn::new(0x74e070));
        let mut buf = [0u8; 20];
        assert_eq!(repr.emit(&mut buf, &[]).unwrap(), 20);
        assert_eq!(buf[..16], ACK[..16]);
    }

    /// Every byte of an emitted packet is written (headers, reserved
    /// fields, payload, pad and ICRC): a buffer that held another packet
    /// gives the same bytes as a zeroed one. Senders reuse buffers on that.
    #[test]
    fn emitting_overwrites_every_byte() {
        let mut emitted = 0;
        for op in 0..=255u8 {
            let Some(info) = Opcode(op).info() else {
                continue;
            };
            let mut bth = bth::Repr::new(Opcode(op), 0x12_3456, Psn::new(0xAB_CDEF));
            bth.solicited = true;
            let mut ib = IbRepr::new(bth);
            for h in info.headers {
                match h {
                    ExtHeader::XrcEth => ib.xrceth = Some(xrceth::Repr { xrc_srq: 0x77 }),
                    ExtHeader::Deth => {
                        ib.deth = Some(deth::Repr {
                            q_key: 0x1111_2222,
                            src_qp: 0x33,
                        })
                    }
                    ExtHeader::Feth => ib.feth = Some(feth::Repr { sel: 1, plt: 2 }),
                    ExtHeader::Reth => {
                        ib.reth = Some(reth::Repr {
                            va: 0x1000,
                            r_key: 0x4444,
                            dma_length: 7,
                        })
                    }
                    ExtHeader::AtomicEth => {
                        ib.atomic_eth = Some(atomic_eth::Repr {
                            va: 0x2000,
                            r_key: 0x5555,
                            swap_or_add_data: 9,
                            compare_data: 10,
                        })
                    }
                    ExtHeader::ImmDt => ib.immdt = Some(immdt::Repr { immediate: 0x66 }),
                    ExtHeader::Ieth => ib.ieth = Some(ieth::Repr { r_key: 0x88 }),
                    ExtHeader::Aeth => {
                        ib.aeth = Some(aeth::Repr {
                            syndrome: aeth::Syndrome::ACK_NO_CREDITS,
                            msn: 3,
                        })
                    }
                    ExtHeader::AtomicAckEth => {
                        ib.atomic_ack_eth = Some(atomic_ack_eth::Repr { orig_rem_dt: 11 })
                    }
                    ExtHeader::CnpPad => {}
                }
            }
            if info.has_payload {
                ib.payload_len = 7;
            }
            let payload = vec![0x5A; ib.payload_len];
            let mut clean = vec![0u8; ib.buffer_len()];
            let mut dirty = vec![0xFFu8; ib.buffer_len()];
            let Ok(n) = ib.emit(&mut clean, &payload) else {
                continue;
            };
            assert_eq!(ib.emit(&mut dirty, &payload), Ok(n));
            assert_eq!(clean, dirty, "{}", info.name);
            emitted += 1;
        }
        assert!(emitted > 50, "{emitted} opcodes emitted");
    }

    #[test]
    fn errors_name_header_and_offset() {
        let e = IbPacket::new_checked(&ACK[..14]).unwrap_err();
        assert_eq!((e.layer, e.offset), (Layer::Aeth, 12));
        let e = IbPacket::new_checked(&ACK[..18]).unwrap_err();
        assert_eq!((e.layer, e.offset), (Layer::Icrc, 16));
        let mut bad = ACK;
        bad[0] = 0x15;
        let e = IbPacket::new_checked(&bad[..]).unwrap_err();
        assert_eq!(e.kind, ErrorKind::UnknownOpcode(0x15));
        let mut long = [0u8; 24];
        long[..16].copy_from_slice(&ACK[..16]);
        let e = IbPacket::new_checked(&long[..]).unwrap_err();
        assert_eq!((e.layer, e.offset), (Layer::Payload, 16));
    }

    #[test]
    fn pad_rules() {
        let mut repr = IbRepr::new(bth::Repr::new(Opcode::RC_SEND_ONLY, 0x11, Psn::new(7)));
        for (len, pad) in [(0, 0), (1, 3), (2, 2), (3, 1), (4, 0), (4095, 1)] {
            repr.payload_len = len;
            assert_eq!(repr.pad_count(), pad);
            let mut buf = vec![0xAA; repr.buffer_len()];
            let payload = vec![0x5A; len];
            repr.emit(&mut buf, &payload).unwrap();
            let p = IbPacket::new_checked(&buf[..]).unwrap();
            assert_eq!(p.payload(), &payload[..]);
            assert_eq!(IbRepr::parse(&p).unwrap(), repr);
        }
        // PadCnt 3 with 4 padded bytes is fine; PadCnt 1 with 2 bytes is not.
        let mut buf = [0u8; 12 + 2 + 4];
        buf[0] = Opcode::RC_SEND_ONLY.0;
        buf[1] = 0x10;
        let e = IbPacket::new_checked(&buf[..]).unwrap_err();
        assert_eq!(
            e.kind,
            ErrorKind::BadPadCount {
                pad_count: 1,
                padded_len: 2
            }
        );
        repr.payload_len = 4097;
        assert!(matches!(
            repr.check().unwrap_err().kind,
            ErrorKind::Oversized {
                max: 4096,
                actual: 4097
            }
        ));
    }

    #[test]
    fn emit_checks_headers_against_opcode() {
        let mut repr = IbRepr::new(bth::Repr::new(Opcode::RC_RDMA_WRITE_ONLY, 1, Psn::new(0)));
        let mut buf = [0u8; 64];
        assert_eq!(repr.emit(&mut buf, &[]).unwrap_err().layer, Layer::Reth);
        repr.reth = Some(reth::Repr::default());
        repr.aeth = Some(aeth::Repr {
            syndrome: aeth::Syndrome::ACK_NO_CREDITS,
            msn: 0,
        });
        assert_eq!(repr.emit(&mut buf, &[]).unwrap_err().layer, Layer::Aeth);
        repr.aeth = None;
        assert_eq!(repr.emit(&mut buf, &[]).unwrap(), 32);
        assert_eq!(
            repr.emit(&mut buf[..31], &[]).unwrap_err().layer,
            Layer::Bth
        );
    }
}
