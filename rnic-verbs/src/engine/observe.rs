//! What a person sees of the packets: a tap (the demo), a capture file,
//! the trace log. Each sees a packet as it leaves (with the ICRC it
//! carries) or as it came in.

use std::time::Duration;

use rnic_core::time::Time;
use rnic_core::Datagram;

use super::state::EngineState;

/// A packet seen by the engine, for taps (the demo, captures).
#[derive(Debug, Clone)]
pub struct TapEvent {
    /// Sent (true) or received.
    pub sent: bool,
    /// When, since the engine started.
    pub at: Duration,
    /// The datagram.
    pub datagram: Datagram,
}

impl EngineState {
    /// Whether packets are shown anywhere (a tap, a capture, the trace log).
    pub(super) fn observed(&self) -> bool {
        self.tap.is_some() || self.capture.is_some() || tracing::enabled!(tracing::Level::TRACE)
    }

    /// Show a packet sent or received to the tap, the capture file and the
    /// trace log, if any.
    pub(super) fn observe(&self, sent: bool, now: Time, d: &Datagram) {
        if tracing::enabled!(tracing::Level::TRACE) {
            let dir = if sent { "tx" } else { "rx" };
            match d.header {
                Some(h) => tracing::trace!(
                    dir,
                    src = %d.src,
                    dst = %d.dst,
                    opcode = h.name(),
                    dest_qp = format_args!("{:#x}", h.dest_qp),
                    psn = h.psn.value(),
                    bytes = d.payload.len(),
                    "packet"
                ),
                None => tracing::trace!(dir, src = %d.src, "unparsable packet"),
            }
        }
        if let Some(tap) = &self.tap {
            let _ = tap.send(TapEvent {
                sent,
                at: now - Time::ZERO,
                datagram: d.clone(),
            });
        }
        if let Some(c) = &self.capture {
            c.record(sent, d);
        }
    }
}
