//! `rnic dump` end to end: the binary on real captures, damaged captures, and the
//! same capture converted to pcapng by Wireshark's editcap.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use rnic_wire::pcap::{PcapReader, PcapWriter};

fn captures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/captures")
}

fn rnic(args: &[&str], file: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rnic"))
        .arg("dump")
        .args(args)
        .arg(file)
        .output()
        .expect("run rnic")
}

/// A file under the temp dir, removed when dropped.
struct Scratch(PathBuf);

impl std::ops::Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for Scratch {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn scratch(name: &str) -> Scratch {
    Scratch(std::env::temp_dir().join(format!("rnic-dump-test-{}-{name}", std::process::id())))
}

/// Rewrite `src` with `edit` applied to the bytes of frame `index`.
fn edited(src: &Path, dst: &Path, index: usize, edit: impl Fn(&mut Vec<u8>)) {
    let data = std::fs::read(src).unwrap();
    let mut w = PcapWriter::new(std::fs::File::create(dst).unwrap(), 1).unwrap();
    for (i, rec) in PcapReader::new(&data).unwrap().enumerate() {
        let rec = rec.unwrap();
        let mut bytes = rec.data.to_vec();
        if i == index {
            edit(&mut bytes);
        }
        w.write_packet(rec.timestamp_ns, &bytes).unwrap();
    }
}

#[test]
fn decodes_a_real_capture() {
    let out = rnic(&[], &captures().join("rxe-ops_rnr.pcap"));
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.iter().filter(|l| l.ends_with("icrc=ok")).count(), 12);
    assert!(lines[0].contains(
        "10.77.0.1:49552 > 10.77.0.2:4791 RC_SEND_ONLY qp=0x000014 psn=0x00a000 [A] len=64 icrc=ok"
    ));
    assert!(lines[1].contains(
        "RC_ACKNOWLEDGE qp=0x000014 psn=0x00a000 RNR-NAK timer=20 (10.24 ms) msn=0 icrc=ok"
    ));
    assert!(text
        .contains("12 RoCE v2 packets, 0 ICRC failures, 0 malformed, 0 non-RoCE frames skipped"));
}

/// A management datagram on QP1 is decoded as the CM message it carries,
/// with the rdma_cm header of a REQ.
#[test]
fn decodes_the_connection_manager_s_messages() {
    let out = rnic(&[], &captures().join("cm/cm-rping.pcap"));
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    for needle in [
        "| CM REQ tid=0x00000002de6adbc3 comm=0xc3db6ade sid=0x0000000001061c06 qpn=0x000011 psn=0x35907a mtu=3 rr=1 id=1 retry=7 rnr=7 rdma_cm 10.77.0.1:51929 -> 10.77.0.2 icrc=ok",
        "| CM REP tid=0x00000002de6adbc3 comm=0xc0db6ade/0xc3db6ade qpn=0x000011 psn=0x049db3",
        "| CM RTU tid=0x00000002de6adbc3",
        "| CM DREQ tid=0x00000002de6adbc3 comm=0xc3db6ade/0xc0db6ade qpn=0x000011",
        "| CM DREP tid=0x00000002de6adbc3",
    ] {
        assert!(text.contains(needle), "{needle}\n{text}");
    }
    let out = rnic(&["-v"], &captures().join("cm/cm-rping-rej.pcap"));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains(
            "MAD class=0x07 v2 method=0x03 status=0x0000 tid=0x00000002de6adbc6 attr=0x0012"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "CM REJ tid=0x00000002de6adbc6 comm=0x00000000/0xc6db6ade rejected=Req reason=8"
        ),
        "{text}"
    );
}

/// A MAD that is not a CM message (the kernel MAD layer's GetResp to a Get
/// nobody serves, in a capture of the kernel's answers to hostile MADs)
/// is shown by its common header.
#[test]
fn a_mad_of_another_class_shows_its_header() {
    let out = rnic(&["--check"], &captures().join("hostile/cm-hostile.pcap"));
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let resp = text
        .lines()
        .find(|l| l.contains("10.88.0.2:55410 > 10.88.0.3:4791") && l.contains("class=0x03"))
        .unwrap_or_else(|| panic!("no GetResp from the kernel:\n{text}"));
    assert!(
        resp.contains(
            "| MAD class=0x03 v2 method=0x81 status=0x000c tid=0x4841725400000005 attr=0x0035 \
             (not a CM message"
        ),
        "{resp}"
    );
}

#[test]
fn verbose_prints_every_header() {
    let out = rnic(&["-v"], &captures().join("rxe-ops_atomic.pcap"));
    let text = String::from_utf8(out.stdout).unwrap();
    for needle in [
        "Ethernet 02:00:00:00:00:0a > 02:00:00:00:00:0b",
        "IPv4 10.77.0.1 > 10.77.0.2",
        "UDP 49881 > 4791",
        "BTH opcode=0x13 (RC_COMPARE_SWAP)",
        "AtomicETH va=0x562636c88800 rkey=0x00000c3c swap/add=0x2222222222222222 compare=0x1111111111111111",
        "AETH ACK credits=unlimited msn=1",
        "AtomicAckETH orig=0x1111111111111111",
        "ICRC stored=",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    }
}

#[test]
fn check_fails_on_a_bad_icrc() {
    let good = captures().join("rxe-write_bw.pcap");
    assert!(rnic(&["--check", "-q"], &good).status.success());
    let bad = scratch("bad-icrc.pcap");
    edited(&good, &bad, 3, |b| {
        let n = b.len();
        b[n - 10] ^= 0x01; // a payload bit
    });
    let out = rnic(&["--check"], &bad);
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(text.matches("icrc=BAD").count(), 1);
    assert!(text.contains("1 ICRC failures"));
    // Without --check the same file is only reported.
    assert!(rnic(&[], &bad).status.success());
}

#[test]
fn check_fails_on_a_malformed_packet() {
    let bad = scratch("malformed.pcap");
    edited(&captures().join("rxe-ops_imm.pcap"), &bad, 0, |b| {
        b[14 + 28] = 0x15; // a reserved RC opcode
    });
    let out = rnic(&["--check"], &bad);
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("malformed RoCE v2 packet: BTH at byte 42: unknown opcode 0x15"),
        "{text}"
    );
}

#[test]
fn bad_files() {
    let out = rnic(&[], Path::new("/nonexistent/x.pcap"));
    assert_eq!(out.status.code(), Some(2));
    let junk = scratch("junk.pcap");
    std::fs::write(&junk, b"this is not a capture").unwrap();
    let out = rnic(&["--check"], &junk);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8(out.stdout)
        .unwrap()
        .contains("not a capture file"));
    // Cut in the middle of a record: what was read is printed, then the error.
    let cut = scratch("cut.pcap");
    let data = std::fs::read(captures().join("rxe-ops_rnr.pcap")).unwrap();
    std::fs::write(&cut, &data[..data.len() - 7]).unwrap();
    let out = rnic(&["--check"], &cut);
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("11 RoCE v2 packets") && text.contains("reading stopped early"));
}

#[test]
fn pcapng_from_editcap_reads_the_same() {
    let ok = Command::new("editcap")
        .arg("-h")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            std::env::var("RNIC_REQUIRE_TOOLS").as_deref() != Ok("1"),
            "editcap (tshark's package) is required"
        );
        eprintln!("NOTE: editcap is not installed; this test checked nothing");
        return;
    }
    let src = captures().join("hw-rc-send-imm.pcap");
    let ng = scratch("hw.pcapng");
    let st = Command::new("editcap")
        .args(["-F", "pcapng"])
        .arg(&src)
        .arg(&*ng)
        .status()
        .unwrap();
    assert!(st.success());
    assert_ne!(
        std::fs::read(&ng).unwrap()[..4],
        std::fs::read(&src).unwrap()[..4]
    );
    let a = rnic(&["--check"], &src);
    let b = rnic(&["--check"], &ng);
    assert!(a.status.success() && b.status.success());
    assert_eq!(a.stdout, b.stdout);
    assert!(String::from_utf8(b.stdout)
        .unwrap()
        .contains("105 RoCE v2 packets, 0 ICRC failures, 0 malformed, 18 non-RoCE frames skipped"));
}
