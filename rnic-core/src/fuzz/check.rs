//! `rnic check`'s state rebuild on arbitrary frames: the body of the
//! `check` fuzz target. The input is a run of frames, each a 2-byte
//! big-endian length and that many bytes of an Ethernet frame (the seeds
//! are real captures cut this way, so the fuzzer mutates real traffic), and
//! the same bytes are read as a capture file too, by the in-memory reader
//! and by the stream, which must read the same records. Nothing may panic,
//! and every finding names packets that were fed.

use rnic_wire::pcap::{PcapReader, PcapStream};
use rnic_wire::LinkType;

use crate::check::Checker;

/// Frames fed at most, per reading.
const MAX_FRAMES: u64 = 4096;

/// Run one input.
pub fn run(data: &[u8]) {
    let mut c = Checker::new();
    let mut rest = data;
    let mut n = 0u64;
    let mut t = 0u64;
    while rest.len() >= 2 && n < MAX_FRAMES {
        let len = usize::from(u16::from_be_bytes([rest[0], rest[1]]));
        rest = &rest[2..];
        let (frame, tail) = rest.split_at(len.min(rest.len()));
        n += 1;
        // Time moves on by an amount the input picks (a copy the network
        // made comes within microseconds; a retransmission later).
        t += u64::from(frame.last().copied().unwrap_or(0)) * 20_000;
        c.frame(n, t, Some(LinkType::Ethernet), frame);
        rest = tail;
    }
    judge(c, n);

    let Ok(reader) = PcapReader::new(data) else {
        assert!(
            PcapStream::new(data).map_or(true, |mut s| !matches!(s.next(), Some(Ok(_)))),
            "the stream read a record of what the reader refuses"
        );
        return;
    };
    // The stream, a record or block at a time, reads the records the
    // reader reads. Where the file goes bad, both stop, not always at the
    // same block (the reader wants a block whole before it skips it, the
    // stream skips what there is), but neither reads a record the other
    // did not.
    let mut stream = PcapStream::new(data).ok();
    let mut c = Checker::new();
    let mut n = 0u64;
    for rec in reader.take(MAX_FRAMES as usize) {
        let streamed = stream.as_mut().map(Iterator::next);
        let Ok(r) = rec else {
            assert!(
                !matches!(streamed, Some(Some(Ok(_)))),
                "the stream read a record where the reader found the file bad"
            );
            break;
        };
        match streamed {
            Some(Some(Ok(s))) => assert!(
                s.data == r.data && s.timestamp_ns == r.timestamp_ns && s.link_type == r.link_type,
                "the stream read another record"
            ),
            other => panic!("the stream read {other:?} where the reader read a record"),
        }
        n += 1;
        c.frame(n, r.timestamp_ns, LinkType::from_pcap(r.link_type), r.data);
    }
    judge(c, n);
}

fn judge(c: Checker, fed: u64) {
    let (found, stats) = c.finish();
    assert_eq!(stats.frames, fed, "every frame counted");
    assert!(stats.roce + stats.other + stats.malformed == fed);
    for f in &found {
        assert!(!f.packets.is_empty(), "a finding names its packets: {f}");
        assert!(
            f.packets.iter().all(|&p| (1..=fed).contains(&p)),
            "a finding names a packet that was not fed: {f}"
        );
    }
}
