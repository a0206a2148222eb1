//! Capture files: read classic pcap and pcapng, write classic pcap.
//!
//! [`PcapReader`] works on the whole file in memory and borrows packet bytes
//! from it; [`PcapStream`] reads from any `std::io::Read`, one record or
//! block at a time, so that a capture of any size costs only its largest
//! packet. Nothing here opens files. Writing goes to any `std::io::Write`.

use std::io::{self, Read, Write};

use crate::{Error, ErrorKind, Layer, Result};

const PCAP_MAGIC_US: u32 = 0xA1B2_C3D4;
const PCAP_MAGIC_NS: u32 = 0xA1B2_3C4D;
const PCAPNG_SHB: u32 = 0x0A0D_0D0A;
const PCAPNG_BYTE_ORDER: u32 = 0x1A2B_3C4D;
const PCAPNG_IDB: u32 = 1;
const PCAPNG_OPB: u32 = 2;
const PCAPNG_SPB: u32 = 3;
const PCAPNG_EPB: u32 = 6;
/// Largest record accepted, so that a corrupt length cannot claim gigabytes.
const MAX_RECORD: usize = 256 * 1024;

/// One captured packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record<'a> {
    /// Capture time in nanoseconds since the Unix epoch.
    pub timestamp_ns: u64,
    /// The link type number of the interface it was captured on.
    pub link_type: u32,
    /// The captured bytes.
    pub data: &'a [u8],
    /// The length of the packet on the wire (more than `data.len()` when truncated).
    pub orig_len: u32,
}

#[derive(Debug, Clone, Copy)]
struct Interface {
    link_type: u32,
    snaplen: u32,
    /// Timestamp unit: `Ok(k)` = 10^-k s, `Err(k)` = 2^-k s (if_tsresol).
    resolution: core::result::Result<u8, u8>,
}

#[derive(Debug)]
enum Format {
    Classic { nanos: bool, link_type: u32 },
    Ng { interfaces: Vec<Interface> },
}

/// A reader of classic pcap (either byte order, micro- or nanosecond) and pcapng
/// (sections, interfaces with their link types and timestamp resolutions,
/// enhanced, simple and obsolete packet blocks).
#[derive(Debug)]
pub struct PcapReader<'a> {
    data: &'a [u8],
    pos: usize,
    big_endian: bool,
    format: Format,
    failed: bool,
}

fn pcap_err(offset: usize, kind: ErrorKind) -> Error {
    Error::new(Layer::Pcap, kind).at(offset)
}

impl<'a> PcapReader<'a> {
    /// Start reading a capture held in memory.
    pub fn new(data: &'a [u8]) -> Result<PcapReader<'a>> {
        crate::error::need(Layer::Pcap, data, 4)?;
        let le = u32::from_le_bytes([data[0], data[1], data[2], data[3]]);
        let be = u32::from_be_bytes([data[0], data[1], data[2], data[3]]);
        let mut r = PcapReader {
            data,
            pos: 0,
            big_endian: false,
            format: Format::Ng {
                interfaces: Vec::new(),
            },
            failed: false,
        };
        if le == PCAPNG_SHB {
            // The section header's own byte-order magic tells the endianness.
            crate::error::need(Layer::Pcap, data, 12)?;
            r.big_endian = match u32::from_le_bytes([data[8], data[9], data[10], data[11]]) {
                PCAPNG_BYTE_ORDER => false,
                m if m.swap_bytes() == PCAPNG_BYTE_ORDER => true,
                m => return Err(pcap_err(8, ErrorKind::BadMagic(m))),
            };
            return Ok(r);
        }
        let (big_endian, nanos) = match (le, be) {
            (PCAP_MAGIC_US, _) => (false, false),
            (PCAP_MAGIC_NS, _) => (false, true),
            (_, PCAP_MAGIC_US) => (true, false),
            (_, PCAP_MAGIC_NS) => (true, true),
            _ => return Err(pcap_err(0, ErrorKind::BadMagic(le))),
        };
        crate::error::need(Layer::Pcap, data, 24)?;
        r.big_endian = big_endian;
        let major = r.u16_at(4);
        if major != 2 {
            return Err(pcap_err(4, ErrorKind::BadVersion(major as u8)));
        }
        r.format = Format::Classic {
            nanos,
            link_type: r.u32_at(20) & 0x0FFF_FFFF,
        };
        r.pos = 24;
        Ok(r)
    }

    /// The link type of a classic pcap file, or of the first pcapng interface seen so far.
    pub fn link_type(&self) -> Option<u32> {
        match &self.format {
            Format::Classic { link_type, .. } => Some(*link_type),
            Format::Ng { interfaces } => interfaces.first().map(|i| i.link_type),
        }
    }

    fn u16_at(&self, at: usize) -> u16 {
        let b = [self.data[at], self.data[at + 1]];
        if self.big_endian {
            u16::from_be_bytes(b)
        } else {
            u16::from_le_bytes(b)
        }
    }

    fn u32_at(&self, at: usize) -> u32 {
        let b = [
            self.data[at],
            self.data[at + 1],
            self.data[at + 2],
            self.data[at + 3],
        ];
        if self.big_endian {
            u32::from_be_bytes(b)
        } else {
            u32::from_le_bytes(b)
        }
    }

    fn need(&self, at: usize, n: usize) -> Result<()> {
        let available = self.data.len().saturating_sub(at);
        if available < n {
            Err(Error::truncated(Layer::Pcap, n, available).at(at))
        } else {
            Ok(())
        }
    }

    fn next_classic(&mut self, nanos: bool, link_type: u32) -> Result<Option<Record<'a>>> {
        let at = self.pos;
        if at == self.data.len() {
            return Ok(None);
        }
        self.need(at, 16)?;
        let secs = u64::from(self.u32_at(at));
        let frac = u64::from(self.u32_at(at + 4));
        let incl = self.u32_at(at + 8) as usize;
        let orig_len = self.u32_at(at + 12);
        if incl > MAX_RECORD {
            return Err(pcap_err(
                at + 8,
                ErrorKind::Oversized {
                    max: MAX_RECORD,
                    actual: incl,
                },
            ));
        }
        self.need(at + 16, incl)?;
        self.pos = at + 16 + incl;
        let frac_ns = if nanos { frac } else { frac * 1000 };
        Ok(Some(Record {
            timestamp_ns: secs.saturating_mul(1_000_000_000).saturating_add(frac_ns),
            link_type,
            data: &self.data[at + 16..at + 16 + incl],
            orig_len,
        }))
    }

    fn next_ng(&mut self) -> Result<Option<Record<'a>>> {
        loop {
            let at = self.pos;
            if at == self.data.len() {
                return Ok(None);
            }
            self.need(at, 12)?;
            let block_type = self.u32_at(at);
            if block_type == PCAPNG_SHB {
                // A new section may switch byte order and resets the interfaces.
                self.big_endian = match u32::from_le_bytes([
                    self.data[at + 8],
                    self.data[at + 9],
                    self.data[at + 10],
                    self.data[at + 11],
                ]) {
                    PCAPNG_BYTE_ORDER => false,
                    m if m.swap_bytes() == PCAPNG_BYTE_ORDER => true,
                    m => return Err(pcap_err(at + 8, ErrorKind::BadMagic(m))),
                };
                if let Format::Ng { interfaces } = &mut self.format {
                    interfaces.clear();
                }
            }
            let len = self.u32_at(at + 4) as usize;
            if len < 12 || len % 4 != 0 {
                return Err(pcap_err(
                    at + 4,
                    ErrorKind::BadLength {
                        field: len,
                        actual: self.data.len() - at,
                    },
                ));
            }
            self.need(at, len)?;
            self.pos = at + len;
            let body = at + 8..at + len - 4;
            match block_type {
                PCAPNG_IDB => self.read_idb(body)?,
                PCAPNG_EPB | PCAPNG_OPB | PCAPNG_SPB => {
                    return self.read_packet_block(block_type, body).map(Some)
                }
                _ => {} // SHB, statistics, name resolution, custom: nothing to return
            }
        }
    }

    fn read_idb(&mut self, body: core::ops::Range<usize>) -> Result<()> {
        self.need(body.start, 8)?;
        if body.len() < 8 {
            return Err(Error::truncated(Layer::Pcap, 8, body.len()).at(body.start));
        }
        let link_type = u32::from(self.u16_at(body.start));
        let snaplen = self.u32_at(body.start + 4);
        let mut resolution = Ok(6);
        // Options: code, length, value padded to 4 bytes; code 0 ends them.
        let mut o = body.start + 8;
        while o + 4 <= body.end {
            let code = self.u16_at(o);
            let olen = usize::from(self.u16_at(o + 2));
            if code == 0 || o + 4 + olen > body.end {
                break;
            }
            if code == 9 && olen >= 1 {
                let v = self.data[o + 4];
                resolution = if v & 0x80 == 0 { Ok(v) } else { Err(v & 0x7F) };
            }
            o += 4 + olen.div_ceil(4) * 4;
        }
        if let Format::Ng { interfaces } = &mut self.format {
            interfaces.push(Interface {
                link_type,
                snaplen,
                resolution,
            });
        }
        Ok(())
    }

    fn interface(&self, id: usize, at: usize) -> Result<Interface> {
        match &self.format {
            Format::Ng { interfaces } => interfaces.get(id).copied().ok_or(pcap_err(
                at,
                ErrorKind::BadLength {
                    field: id,
                    actual: interfaces.len(),
                },
            )),
            Format::Classic { .. } => Err(pcap_err(at, ErrorKind::BadMagic(0))),
        }
    }

    fn read_packet_block(
        &mut self,
        block_type: u32,
        body: core::ops::Range<usize>,
    ) -> Result<Record<'a>> {
        let (iface, ts, caplen, orig_len, data_at) = match block_type {
            PCAPNG_SPB => {
                if body.len() < 4 {
                    return Err(Error::truncated(Layer::Pcap, 4, body.len()).at(body.start));
                }
                let iface = self.interface(0, body.start)?;
                let orig_len = self.u32_at(body.start);
                let mut caplen = (orig_len as usize).min(body.len() - 4);
                if iface.snaplen != 0 {
                    caplen = caplen.min(iface.snaplen as usize);
                }
                (iface, 0u64, caplen, orig_len, body.start + 4)
            }
            _ => {
                if body.len() < 20 {
                    return Err(Error::truncated(Layer::Pcap, 20, body.len()).at(body.start));
                }
                let id = if block_type == PCAPNG_EPB {
                    self.u32_at(body.start) as usize
                } else {
                    usize::from(self.u16_at(body.start))
                };
                let iface = self.interface(id, body.start)?;
                let ts = (u64::from(self.u32_at(body.start + 4)) << 32)
                    | u64::from(self.u32_at(body.start + 8));
                let caplen = self.u32_at(body.start + 12) as usize;
                let orig_len = self.u32_at(body.start + 16);
                (iface, ts, caplen, orig_len, body.start + 20)
            }
        };
        if data_at + caplen > body.end {
            return Err(pcap_err(
                data_at,
                ErrorKind::BadLength {
                    field: caplen,
                    actual: body.end - data_at,
                },
            ));
        }
        let timestamp_ns = match iface.resolution {
            Ok(k) if k <= 9 => ts.saturating_mul(10u64.pow(9 - u32::from(k))),
            Ok(k) => ts / 10u64.saturating_pow(u32::from(k) - 9),
            Err(k) => ((u128::from(ts) * 1_000_000_000) >> k.min(127)) as u64,
        };
        Ok(Record {
            timestamp_ns,
            link_type: iface.link_type,
            data: &self.data[data_at..data_at + caplen],
            orig_len,
        })
    }
}

impl<'a> Iterator for PcapReader<'a> {
    type Item = Result<Record<'a>>;

    /// The next packet; after an error, `None`.
    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        let r = match self.format {
            Format::Classic { nanos, link_type } => self.next_classic(nanos, link_type),
            Format::Ng { .. } => self.next_ng(),
        };
        match r {
            Ok(Some(rec)) => Some(Ok(rec)),
            Ok(None) => None,
            Err(e) => {
                self.failed = true;
                Some(Err(e))
            }
        }
    }
}

/// One captured packet, owning its bytes (what [`PcapStream`] yields).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnedRecord {
    /// Capture time in nanoseconds since the Unix epoch.
    pub timestamp_ns: u64,
    /// The link type number of the interface it was captured on.
    pub link_type: u32,
    /// The captured bytes.
    pub data: Vec<u8>,
    /// The length of the packet on the wire.
    pub orig_len: u32,
}

/// A reader of the same formats as [`PcapReader`] from a `std::io::Read`,
/// holding one record (classic) or block (pcapng) at a time, with the
/// file's header (classic) or its section's header and interface blocks
/// (pcapng). Each unit is parsed by [`PcapReader`], put behind that
/// header: the two readers cannot disagree.
#[derive(Debug)]
pub struct PcapStream<R: Read> {
    input: R,
    /// Classic: the file header. Pcapng: the section header block and
    /// the interface blocks seen since.
    header: Vec<u8>,
    ng: bool,
    big_endian: bool,
    /// Bytes of the file consumed (for an error's offset).
    pos: usize,
    failed: bool,
}

impl<R: Read> PcapStream<R> {
    /// Start reading: the file header is read and checked now.
    pub fn new(mut input: R) -> Result<PcapStream<R>> {
        let mut first = [0u8; 12];
        let got = read_full(&mut input, &mut first)?;
        let le = u32::from_le_bytes([first[0], first[1], first[2], first[3]]);
        let mut header = first[..got].to_vec();
        if le == PCAPNG_SHB {
            // Checked by `PcapReader` (byte order), then the rest of the
            // section header block.
            PcapReader::new(&header)?;
            let big_endian =
                u32::from_le_bytes([first[8], first[9], first[10], first[11]]) != PCAPNG_BYTE_ORDER;
            let len = word(&first[4..8], big_endian) as usize;
            check_block_len(len, 4)?;
            let mut s = PcapStream {
                input,
                header,
                ng: true,
                big_endian,
                pos: got,
                failed: false,
            };
            s.read_more(len.saturating_sub(12), 4)?;
            return Ok(s);
        }
        let mut rest = [0u8; 12];
        let more = read_full(&mut input, &mut rest)?;
        header.extend_from_slice(&rest[..more]);
        PcapReader::new(&header)?;
        let big_endian = le != PCAP_MAGIC_US && le != PCAP_MAGIC_NS;
        Ok(PcapStream {
            input,
            header,
            ng: false,
            big_endian,
            pos: got + more,
            failed: false,
        })
    }

    /// Read `n` more bytes onto the header (a block's rest), checking `n`.
    fn read_more(&mut self, n: usize, at: usize) -> Result<()> {
        if n > MAX_RECORD + 64 {
            return Err(pcap_err(
                self.pos.saturating_sub(at),
                ErrorKind::Oversized {
                    max: MAX_RECORD,
                    actual: n,
                },
            ));
        }
        let start = self.header.len();
        self.header.resize(start + n, 0);
        let got = read_full(&mut self.input, &mut self.header[start..])?;
        self.pos += got;
        if got < n {
            return Err(Error::truncated(Layer::Pcap, n, got).at(self.pos));
        }
        Ok(())
    }

    /// The one record behind the header, parsed by [`PcapReader`].
    fn parse_last(&self) -> Result<Option<OwnedRecord>> {
        let mut reader = PcapReader::new(&self.header)?;
        match reader.next() {
            Some(Ok(rec)) => Ok(Some(OwnedRecord {
                timestamp_ns: rec.timestamp_ns,
                link_type: rec.link_type,
                data: rec.data.to_vec(),
                orig_len: rec.orig_len,
            })),
            Some(Err(e)) => Err(e),
            None => Ok(None),
        }
    }

    /// The next unit: `Ok(None)` at the end of the file.
    fn next_record(&mut self) -> Result<Option<OwnedRecord>> {
        loop {
            let mut head = [0u8; 8];
            let got = read_full(&mut self.input, &mut head)?;
            if got == 0 {
                return Ok(None);
            }
            let unit_at = self.pos;
            self.pos += got;
            if self.ng {
                if got < 8 {
                    return Err(Error::truncated(Layer::Pcap, 8, got).at(unit_at));
                }
                let ty = word(&head[0..4], self.big_endian);
                if ty == PCAPNG_SHB {
                    // A new section: its own byte order, no interfaces yet.
                    let mut magic = [0u8; 4];
                    let m = read_full(&mut self.input, &mut magic)?;
                    self.pos += m;
                    self.big_endian = u32::from_le_bytes(magic) != PCAPNG_BYTE_ORDER;
                    let len = word(&head[4..8], self.big_endian) as usize;
                    check_block_len(len, unit_at + 4)?;
                    self.header.clear();
                    self.header.extend_from_slice(&head);
                    self.header.extend_from_slice(&magic[..m]);
                    PcapReader::new(&self.header)?;
                    self.read_more(len.saturating_sub(12), 12)?;
                    continue;
                }
                let len = word(&head[4..8], self.big_endian) as usize;
                check_block_len(len, unit_at + 4)?;
                if ty == PCAPNG_IDB {
                    self.header.extend_from_slice(&head);
                    self.read_more(len - 8, 8)?;
                    // Judged now, as the reader judges it on its way.
                    if let Some(Err(e)) = PcapReader::new(&self.header)?.next() {
                        return Err(e);
                    }
                    continue;
                }
                if ty != PCAPNG_EPB && ty != PCAPNG_OPB && ty != PCAPNG_SPB {
                    // Statistics, name resolution, custom: skipped.
                    let mut skip = (&mut self.input).take((len - 8) as u64);
                    let skipped = io::copy(&mut skip, &mut io::sink())
                        .map_err(|_| Error::truncated(Layer::Pcap, len - 8, 0).at(self.pos))?;
                    self.pos += skipped as usize;
                    continue;
                }
                let keep = self.header.len();
                self.header.extend_from_slice(&head);
                let r = self.read_more(len - 8, 8);
                let out = r.and_then(|()| self.parse_last());
                self.header.truncate(keep);
                return out;
            }
            // A classic record: a 16-byte header, then its captured bytes.
            let mut rest = [0u8; 8];
            let r = read_full(&mut self.input, &mut rest)?;
            self.pos += r;
            if got + r < 16 {
                return Err(Error::truncated(Layer::Pcap, 16, got + r).at(unit_at));
            }
            let incl = word(&rest[0..4], self.big_endian) as usize;
            let keep = self.header.len();
            self.header.extend_from_slice(&head);
            self.header.extend_from_slice(&rest);
            let r = self.read_more(incl, 16);
            let out = r.and_then(|()| self.parse_last());
            self.header.truncate(keep);
            return out;
        }
    }
}

impl<R: Read> Iterator for PcapStream<R> {
    type Item = Result<OwnedRecord>;

    /// The next packet; after an error, `None`.
    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        match self.next_record() {
            Ok(Some(r)) => Some(Ok(r)),
            Ok(None) => None,
            Err(e) => {
                self.failed = true;
                Some(Err(e))
            }
        }
    }
}

/// A pcapng block's total length: at least its 12 bytes of framing, in
/// whole words.
fn check_block_len(len: usize, at: usize) -> Result<()> {
    if len < 12 || len % 4 != 0 {
        return Err(pcap_err(
            at,
            ErrorKind::BadLength {
                field: len,
                actual: 0,
            },
        ));
    }
    Ok(())
}

fn word(b: &[u8], big_endian: bool) -> u32 {
    let b = [b[0], b[1], b[2], b[3]];
    if big_endian {
        u32::from_be_bytes(b)
    } else {
        u32::from_le_bytes(b)
    }
}

/// Fill `buf` as far as the input goes: how many bytes it got.
fn read_full(input: &mut impl Read, buf: &mut [u8]) -> Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match input.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return Err(Error::truncated(Layer::Pcap, buf.len(), n)),
        }
    }
    Ok(n)
}

/// A writer of classic pcap with nanosecond timestamps.
#[derive(Debug)]
pub struct PcapWriter<W: Write> {
    out: W,
}

impl<W: Write> PcapWriter<W> {
    /// Write the file header for `link_type` (e.g. 1 for Ethernet).
    pub fn new(mut out: W, link_type: u32) -> io::Result<PcapWriter<W>> {
        let mut h = [0u8; 24];
        h[0..4].copy_from_slice(&PCAP_MAGIC_NS.to_le_bytes());
        h[4..6].copy_from_slice(&2u16.to_le_bytes());
        h[6..8].copy_from_slice(&4u16.to_le_bytes());
        h[16..20].copy_from_slice(&(MAX_RECORD as u32).to_le_bytes());
        h[20..24].copy_from_slice(&link_type.to_le_bytes());
        out.write_all(&h)?;
        Ok(PcapWriter { out })
    }

    /// Append one packet captured at `timestamp_ns` (since the Unix epoch).
    pub fn write_packet(&mut self, timestamp_ns: u64, data: &[u8]) -> io::Result<()> {
        if data.len() > MAX_RECORD {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "packet of {} bytes exceeds the pcap snaplen {MAX_RECORD}",
                    data.len()
                ),
            ));
        }
        let secs = u32::try_from(timestamp_ns / 1_000_000_000).unwrap_or(u32::MAX);
        let mut h = [0u8; 16];
        h[0..4].copy_from_slice(&secs.to_le_bytes());
        h[4..8].copy_from_slice(&((timestamp_ns % 1_000_000_000) as u32).to_le_bytes());
        h[8..12].copy_from_slice(&(data.len() as u32).to_le_bytes());
        h[12..16].copy_from_slice(&(data.len() as u32).to_le_bytes());
        self.out.write_all(&h)?;
        self.out.write_all(data)
    }

    /// Flush the underlying writer.
    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }

    /// The underlying writer, borrowed.
    pub fn get_ref(&self) -> &W {
        &self.out
    }

    /// The underlying writer.
    pub fn into_inner(self) -> W {
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classic_round_trip() {
        let mut w = PcapWriter::new(Vec::new(), 1).unwrap();
        w.write_packet(1_700_000_000_123_456_789, &[1, 2, 3])
            .unwrap();
        w.write_packet(5, &[]).unwrap();
        let bytes = w.into_inner();
        let r = PcapReader::new(&bytes).unwrap();
        assert_eq!(r.link_type(), Some(1));
        let recs: Vec<_> = r.collect::<Result<_>>().unwrap();
        assert_eq!(recs.len(), 2);
        assert_eq!(recs[0].timestamp_ns, 1_700_000_000_123_456_789);
        assert_eq!(recs[0].data, &[1, 2, 3]);
        assert_eq!(recs[1].data, &[] as &[u8]);
    }

    #[test]
    fn classic_big_endian_microseconds() {
        let mut f = Vec::new();
        f.extend_from_slice(&PCAP_MAGIC_US.to_be_bytes());
        f.extend_from_slice(&2u16.to_be_bytes());
        f.extend_from_slice(&4u16.to_be_bytes());
        f.extend_from_slice(&[0; 8]);
        f.extend_from_slice(&65535u32.to_be_bytes());
        f.extend_from_slice(&113u32.to_be_bytes());
        for v in [10u32, 20, 2, 2] {
            f.extend_from_slice(&v.to_be_bytes());
        }
        f.extend_from_slice(&[0xAB, 0xCD]);
        let recs: Vec<_> = PcapReader::new(&f).unwrap().collect::<Result<_>>().unwrap();
        assert_eq!(recs[0].timestamp_ns, 10_000_020_000);
        assert_eq!(recs[0].link_type, 113);
        assert_eq!(recs[0].data, &[0xAB, 0xCD]);
    }

    fn block(ty: u32, body: &[u8]) -> Vec<u8> {
        let len = (12 + body.len()) as u32;
        let mut b = ty.to_le_bytes().to_vec();
        b.extend_from_slice(&len.to_le_bytes());
        b.extend_from_slice(body);
        b.extend_from_slice(&len.to_le_bytes());
        b
    }

    #[test]
    fn pcapng_interfaces_and_resolution() {
        let mut shb = PCAPNG_BYTE_ORDER.to_le_bytes().to_vec();
        shb.extend_from_slice(&[1, 0, 0, 0]);
        shb.extend_from_slice(&u64::MAX.to_le_bytes());
        let mut f = block(PCAPNG_SHB, &shb);
        // Interface 0: Ethernet, microseconds. Interface 1: SLL2, if_tsresol = 9 (ns).
        f.extend(block(PCAPNG_IDB, &[1, 0, 0, 0, 0, 0, 4, 0]));
        f.extend(block(
            PCAPNG_IDB,
            &[
                0x14, 0x01, 0, 0, 0, 0, 4, 0, 9, 0, 1, 0, 9, 0, 0, 0, 0, 0, 0, 0,
            ],
        ));
        let epb = |iface: u32, ts: u64, data: &[u8]| {
            let mut b = iface.to_le_bytes().to_vec();
            b.extend_from_slice(&((ts >> 32) as u32).to_le_bytes());
            b.extend_from_slice(&(ts as u32).to_le_bytes());
            b.extend_from_slice(&(data.len() as u32).to_le_bytes());
            b.extend_from_slice(&(data.len() as u32).to_le_bytes());
            b.extend_from_slice(data);
            b.resize(b.len().div_ceil(4) * 4, 0);
            b
        };
        f.extend(block(PCAPNG_EPB, &epb(0, 7, &[1, 2, 3, 4, 5])));
        f.extend(block(PCAPNG_EPB, &epb(1, 7, &[9])));
        f.extend(block(PCAPNG_SPB, &[2, 0, 0, 0, 0xEE, 0xFF, 0, 0]));
        let recs: Vec<_> = PcapReader::new(&f).unwrap().collect::<Result<_>>().unwrap();
        assert_eq!(recs.len(), 3);
        assert_eq!((recs[0].link_type, recs[0].timestamp_ns), (1, 7_000));
        assert_eq!(recs[0].data, &[1, 2, 3, 4, 5]);
        assert_eq!((recs[1].link_type, recs[1].timestamp_ns), (276, 7));
        assert_eq!(recs[2].data, &[0xEE, 0xFF]);
    }

    /// What [`PcapStream`] reads of `f`, as [`PcapReader`]'s records.
    fn streamed(f: &[u8]) -> Vec<Result<OwnedRecord>> {
        PcapStream::new(f).map_or_else(|e| vec![Err(e)], |s| s.collect())
    }

    fn read(f: &[u8]) -> Vec<Result<OwnedRecord>> {
        PcapReader::new(f).map_or_else(
            |e| vec![Err(e)],
            |r| {
                r.map(|x| {
                    x.map(|x| OwnedRecord {
                        timestamp_ns: x.timestamp_ns,
                        link_type: x.link_type,
                        data: x.data.to_vec(),
                        orig_len: x.orig_len,
                    })
                })
                .collect()
            },
        )
    }

    #[test]
    fn the_stream_reads_what_the_reader_reads() {
        let mut w = PcapWriter::new(Vec::new(), 1).unwrap();
        for k in 0..50u8 {
            w.write_packet(u64::from(k) * 1000, &vec![k; usize::from(k)])
                .unwrap();
        }
        let classic = w.into_inner();
        assert_eq!(streamed(&classic), read(&classic));
        assert_eq!(streamed(&classic).len(), 50);
        // pcapng: two sections, interfaces, every packet block kind, and a
        // block to skip.
        let mut shb = PCAPNG_BYTE_ORDER.to_le_bytes().to_vec();
        shb.extend_from_slice(&[1, 0, 0, 0]);
        shb.extend_from_slice(&u64::MAX.to_le_bytes());
        let mut f = block(PCAPNG_SHB, &shb);
        f.extend(block(PCAPNG_IDB, &[1, 0, 0, 0, 0, 0, 4, 0]));
        f.extend(block(5, &[0; 8]));
        let mut epb = 0u32.to_le_bytes().to_vec();
        for v in [0u32, 9, 3, 3] {
            epb.extend_from_slice(&v.to_le_bytes());
        }
        epb.extend_from_slice(&[7, 8, 9, 0]);
        f.extend(block(PCAPNG_EPB, &epb));
        f.extend(block(PCAPNG_SPB, &[2, 0, 0, 0, 0xEE, 0xFF, 0, 0]));
        f.extend(block(PCAPNG_SHB, &shb));
        f.extend(block(PCAPNG_IDB, &[0x14, 0x01, 0, 0, 0, 0, 4, 0]));
        f.extend(block(PCAPNG_EPB, &epb));
        let s = streamed(&f);
        assert_eq!(s, read(&f));
        assert_eq!(s.len(), 3);
        assert_eq!(s[2].as_ref().unwrap().link_type, 276);
        // Cut anywhere: the same records, then the same kind of end.
        for cut in [1, 5, 13, 30, classic.len() - 1] {
            let a = streamed(&classic[..cut]);
            let b = read(&classic[..cut]);
            assert_eq!(a.len(), b.len(), "cut at {cut}");
            for (x, y) in a.iter().zip(&b) {
                assert_eq!(x.is_ok(), y.is_ok(), "cut at {cut}");
                if let (Ok(x), Ok(y)) = (x, y) {
                    assert_eq!(x, y);
                }
            }
        }
        for cut in [4, 20, 40, f.len() - 2] {
            let a = streamed(&f[..cut]);
            let b = read(&f[..cut]);
            assert_eq!(
                a.iter().filter(|r| r.is_ok()).count(),
                b.iter().filter(|r| r.is_ok()).count(),
                "cut at {cut}"
            );
            assert_eq!(
                a.last().map(Result::is_err),
                b.last().map(Result::is_err),
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn corrupt_files_are_errors() {
        assert!(PcapReader::new(&[]).is_err());
        assert_eq!(
            PcapReader::new(&[1, 2, 3, 4, 5]).unwrap_err().kind,
            ErrorKind::BadMagic(0x0403_0201)
        );
        let mut w = PcapWriter::new(Vec::new(), 1).unwrap();
        w.write_packet(0, &[0; 10]).unwrap();
        let bytes = w.into_inner();
        let mut r = PcapReader::new(&bytes[..bytes.len() - 1]).unwrap();
        let e = r.next().unwrap().unwrap_err();
        assert_eq!((e.layer, e.offset), (Layer::Pcap, 40));
        assert!(r.next().is_none());
    }
}
