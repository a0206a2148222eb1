//! Whole-frame parse and ICRC verify on arbitrary bytes, under every link type,
//! plus the IB packet parser, the CM MAD parser and the pcap reader on the same
//! bytes. Nothing may panic, and whatever parses must re-emit to a packet that
//! parses the same.

#![no_main]

use libfuzzer_sys::fuzz_target;
use rnic_wire::cm::{CmaHeader, Mad};
use rnic_wire::pcap::PcapReader;
use rnic_wire::{icrc, Frame, IbPacket, IbRepr, LinkType};

fuzz_target!(|data: &[u8]| {
    for link in [
        LinkType::Ethernet,
        LinkType::LinuxSll,
        LinkType::LinuxSll2,
        LinkType::RawIp,
    ] {
        if let Ok(frame) = Frame::parse(link, data) {
            let ok = frame.icrc_ok();
            assert_eq!(ok, icrc::verify(frame.ip_packet) == Ok(true));
            if let Ok(repr) = IbRepr::parse(&frame.ib) {
                let mut buf = vec![0u8; repr.buffer_len()];
                let n = repr
                    .emit(&mut buf, frame.ib.payload())
                    .expect("a parsed packet re-emits");
                assert_eq!(n, frame.ib.as_bytes().len());
                // Reserved bits are emitted as zero, so compare values, not bytes.
                let again = IbPacket::new_checked(&buf[..]).expect("re-emitted packet parses");
                assert_eq!(IbRepr::parse(&again), Ok(repr));
                assert_eq!(again.payload(), frame.ib.payload());
            }
        }
    }
    if let Ok(p) = IbPacket::new_checked(data) {
        let _ = IbRepr::parse(&p);
    }
    if let Ok(m) = Mad::parse(data) {
        let mut buf = [0u8; rnic_wire::mad::MAD_LEN];
        m.emit(&mut buf);
        assert_eq!(Mad::parse(&buf), Ok(m), "a parsed MAD re-emits to itself");
    }
    if let Some(h) = CmaHeader::parse(data) {
        let mut buf = [0u8; rnic_wire::cm::CMA_HEADER_LEN];
        h.emit(&mut buf);
        assert_eq!(CmaHeader::parse(&buf), Some(h));
    }
    if let Ok(reader) = PcapReader::new(data) {
        for rec in reader.take(256) {
            let _ = rec.map(|r| r.data.len());
        }
    }
});
