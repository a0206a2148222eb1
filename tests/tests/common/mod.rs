//! Shared helpers: where the captures are, and whether external tools must be there.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// The directory of real captures (see `tests/captures/README.md`).
pub fn captures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("captures")
}

/// Every `.pcap` in the captures directory, sorted.
pub fn captures() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(captures_dir())
        .expect("tests/captures exists")
        .map(|e| e.expect("readable directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "pcap"))
        .collect();
    v.sort();
    assert!(
        v.len() >= 50,
        "expected the reference captures, found {}",
        v.len()
    );
    v
}

/// Whether `program` runs (`program --version` or `-c` succeeds). When it does not
/// and `RNIC_REQUIRE_TOOLS=1` (as `.ci/run` sets), the calling test fails; otherwise
/// it prints why it did nothing and passes, so a plain `cargo test` works on a
/// machine without the tool.
pub fn tool_available(program: &str, probe: &[&str]) -> bool {
    let ok = Command::new(program)
        .args(probe)
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        let required = std::env::var("RNIC_REQUIRE_TOOLS").is_ok_and(|v| v == "1");
        assert!(
            !required,
            "{program} is required (RNIC_REQUIRE_TOOLS=1) but does not run; .ci/run installs it"
        );
        eprintln!("NOTE: {program} is not installed; this test checked nothing (set RNIC_REQUIRE_TOOLS=1 to make that a failure)");
    }
    ok
}

/// All values under `v` (recursively) keyed by field name, as `tshark -T
/// json` nests them; a name can repeat.
pub fn flatten(v: &serde_json::Value, out: &mut std::collections::HashMap<String, Vec<String>>) {
    use serde_json::Value;
    if let Value::Object(map) = v {
        for (k, v) in map {
            match v {
                Value::String(s) => out.entry(k.clone()).or_default().push(s.clone()),
                Value::Object(_) => flatten(v, out),
                _ => {}
            }
        }
    }
}

/// A tshark number: decimal, or hex with 0x.
pub fn num(s: &str) -> u64 {
    match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16),
        None => s.parse(),
    }
    .unwrap_or_else(|e| panic!("tshark value {s:?} is not a number: {e}"))
}

/// The Python interpreter to use for the Scapy tests.
pub fn python() -> String {
    std::env::var("PYTHON").unwrap_or_else(|_| "python3".to_string())
}

use rnic_wire::opcode::{ExtHeader, OpcodeInfo};
use rnic_wire::{
    aeth, atomic_ack_eth, atomic_eth, bth, deth, feth, ieth, immdt, reth, xrceth, IbRepr, Psn,
};

/// An `IbRepr` for `info` with every header it needs, its fields drawn from `next`.
pub fn ib_repr_for(
    info: &OpcodeInfo,
    payload_len: usize,
    next: &mut impl FnMut() -> u64,
) -> IbRepr {
    let mut b = bth::Repr::new(
        info.opcode,
        next() as u32 & 0xFF_FFFF,
        Psn::new(next() as u32),
    );
    b.solicited = next() & 1 == 1;
    b.mig_req = next() & 1 == 1;
    b.p_key = next() as u16;
    b.fecn = next() & 1 == 1;
    b.becn = next() & 1 == 1;
    b.ack_req = next() & 1 == 1;
    let mut r = IbRepr::new(b);
    for &h in info.headers {
        match h {
            ExtHeader::XrcEth => {
                r.xrceth = Some(xrceth::Repr {
                    xrc_srq: next() as u32 & 0xFF_FFFF,
                })
            }
            ExtHeader::Deth => {
                r.deth = Some(deth::Repr {
                    q_key: next() as u32,
                    src_qp: next() as u32 & 0xFF_FFFF,
                })
            }
            ExtHeader::Feth => {
                r.feth = Some(feth::Repr {
                    sel: next() as u8 & 0x3,
                    plt: next() as u8 & 0xF,
                })
            }
            ExtHeader::Reth => {
                r.reth = Some(reth::Repr {
                    va: next(),
                    r_key: next() as u32,
                    dma_length: next() as u32,
                })
            }
            ExtHeader::AtomicEth => {
                r.atomic_eth = Some(atomic_eth::Repr {
                    va: next(),
                    r_key: next() as u32,
                    swap_or_add_data: next(),
                    compare_data: next(),
                })
            }
            ExtHeader::ImmDt => {
                r.immdt = Some(immdt::Repr {
                    immediate: next() as u32,
                })
            }
            ExtHeader::Ieth => {
                r.ieth = Some(ieth::Repr {
                    r_key: next() as u32,
                })
            }
            ExtHeader::Aeth => {
                r.aeth = Some(aeth::Repr {
                    // Bit 7 of the syndrome is reserved: the Repr does not keep it.
                    syndrome: aeth::Syndrome::from_byte(next() as u8 & 0x7F),
                    msn: next() as u32 & 0xFF_FFFF,
                })
            }
            ExtHeader::AtomicAckEth => {
                r.atomic_ack_eth = Some(atomic_ack_eth::Repr {
                    orig_rem_dt: next(),
                })
            }
            ExtHeader::CnpPad => {}
        }
    }
    r.payload_len = if info.has_payload { payload_len } else { 0 };
    r
}

/// A small deterministic generator (xorshift64*), for tests that build many packets.
pub fn rng(seed: u64) -> impl FnMut() -> u64 {
    let mut s = seed | 1;
    move || {
        s ^= s >> 12;
        s ^= s << 25;
        s ^= s >> 27;
        s.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

/// A scratch directory removed when dropped.
pub struct TempDir(pub PathBuf);

impl TempDir {
    /// A fresh directory under the system temp dir.
    pub fn new(tag: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!("rnic-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("create temp dir");
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
