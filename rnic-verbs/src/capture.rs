//! Packet capture: every packet the devices of this process send, and every
//! one they receive from elsewhere, as whole frames (Ethernet, IP as the
//! socket sends it, UDP) in a pcap file that Wireshark and `rnic dump` read.
//! A segment of a UDP GSO send shows with the IPv4 identification the
//! kernel gave it, which its ICRC covers.
//!
//! Devices share one writer per file; a packet between two devices of this
//! process is recorded once, when it is sent.

use std::collections::{HashMap, HashSet};
use std::io::{self, BufWriter};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use rnic_core::sim::frame_of;
use rnic_core::Datagram;
use rnic_wire::pcap::PcapWriter;

type Writer = Arc<Mutex<PcapWriter<BufWriter<std::fs::File>>>>;

#[derive(Default)]
struct Registry {
    writers: HashMap<PathBuf, Writer>,
    local: HashSet<IpAddr>,
}

fn registry() -> &'static Mutex<Registry> {
    static R: OnceLock<Mutex<Registry>> = OnceLock::new();
    R.get_or_init(|| Mutex::new(Registry::default()))
}

/// Note that a device of this process has `addr`.
pub(crate) fn register_local(addr: IpAddr) {
    if let Ok(mut r) = registry().lock() {
        r.local.insert(addr);
    }
}

/// Forget a device's address (it closed).
pub(crate) fn unregister_local(addr: IpAddr) {
    if let Ok(mut r) = registry().lock() {
        r.local.remove(&addr);
    }
}

/// A device's handle on a capture file.
#[derive(Clone)]
pub(crate) struct Capture {
    writer: Writer,
}

impl Capture {
    /// The shared writer for `path`, created (truncated) by the first device.
    pub fn open(path: &Path) -> io::Result<Capture> {
        let mut r = registry()
            .lock()
            .map_err(|_| io::Error::other("capture registry poisoned"))?;
        if let Some(w) = r.writers.get(path) {
            return Ok(Capture { writer: w.clone() });
        }
        let file = BufWriter::new(std::fs::File::create(path)?);
        let w = Arc::new(Mutex::new(PcapWriter::new(file, 1)?));
        r.writers.insert(path.to_path_buf(), w.clone());
        Ok(Capture { writer: w })
    }

    /// Record a packet this device sent, or received (`sent` false): a
    /// received packet from another device of this process was recorded when
    /// that device sent it.
    pub fn record(&self, sent: bool, d: &Datagram) {
        if !sent {
            let local = registry()
                .lock()
                .map(|r| r.local.contains(&d.src))
                .unwrap_or(false);
            if local {
                return;
            }
        }
        let ts = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|t| t.as_nanos() as u64)
            .unwrap_or(0);
        if let Ok(mut w) = self.writer.lock() {
            let _ = w.write_packet(ts, &frame_of(d));
            // Keep the file readable while the process runs.
            let _ = w.flush();
        }
    }
}
