//! ACK Extended Transport Header (IBTA 9.3.5): syndrome and MSN.
//!
//! The syndrome's bits 6-5 say what it is: 00 ACK (bits 4-0: credit count),
//! 01 RNR NAK (bits 4-0: RNR timer), 11 NAK (bits 4-0: NAK code); 10 is reserved.

use core::fmt;

use crate::field::*;
use crate::{Layer, Result};

mod field {
    use crate::field::Field;
    pub const SYNDROME: usize = 0;
    pub const MSN: Field = 1..4;
}

crate::field::fixed_header_view!(
    /// A read/write view of an AETH.
    layer = Layer::Aeth, len = 4
);

impl<T: AsRef<[u8]>> Packet<T> {
    /// Syndrome (raw byte).
    pub fn syndrome(&self) -> u8 {
        self.buffer.as_ref()[field::SYNDROME]
    }
    /// MSN: message sequence number (24 bits).
    pub fn msn(&self) -> u32 {
        get_u24(self.buffer.as_ref(), field::MSN.start)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Set the Syndrome byte.
    pub fn set_syndrome(&mut self, v: u8) {
        self.buffer.as_mut()[field::SYNDROME] = v;
    }
    /// Set MSN (low 24 bits).
    pub fn set_msn(&mut self, v: u32) {
        set_u24(self.buffer.as_mut(), field::MSN.start, v);
    }
}

/// The credit count code meaning "no credit information" (IBTA 9.7.5.1.2):
/// what rdma_rxe always sends.
pub const CREDITS_INVALID: u8 = 0x1F;

/// Credit count codes 0-30 to the number of receive WQEs they stand for
/// (IBTA Table 44; code 31 means the field carries no credit information).
pub const CREDIT_COUNTS: [u32; 31] = [
    0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536,
    2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768,
];

/// The credit count code that advertises `available` receive WQEs: the largest
/// code whose value does not exceed it (advertising more than is there would
/// let the requester overrun the receive queue).
pub fn encode_credits(available: u32) -> u8 {
    // CREDIT_COUNTS is sorted and starts at 0, so the index is at least 1.
    (CREDIT_COUNTS.partition_point(|&c| c <= available) - 1) as u8
}

/// The number of receive WQEs a credit code stands for; `None` for code 31
/// ("invalid": no credit information, the requester may send freely).
pub fn decode_credits(code: u8) -> Option<u32> {
    CREDIT_COUNTS.get(usize::from(code & 0x1F)).copied()
}

/// RNR NAK timer codes to the minimum wait in microseconds (IBTA Table 45).
/// Code 0 is the longest (655.36 ms); 1 is 0.01 ms.
pub const RNR_TIMER_MICROS: [u32; 32] = [
    655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920, 2_560, 3_840,
    5_120, 7_680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880, 163_840,
    245_760, 327_680, 491_520,
];

/// The minimum RNR wait in microseconds for timer code `code` (low five bits).
pub fn rnr_timer_micros(code: u8) -> u32 {
    RNR_TIMER_MICROS[usize::from(code & 0x1F)]
}

/// NAK codes (IBTA Table 43).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NakCode {
    /// 0: PSN sequence error (implies an ACK of everything before the PSN).
    PsnSeqError,
    /// 1: invalid request.
    InvalidRequest,
    /// 2: remote access error.
    RemoteAccessError,
    /// 3: remote operational error.
    RemoteOperationalError,
    /// 4: invalid RD request.
    InvalidRdRequest,
    /// 5-31: reserved.
    Reserved(u8),
}

impl NakCode {
    /// The code from the low five bits of a syndrome.
    pub const fn from_code(code: u8) -> NakCode {
        match code & 0x1F {
            0 => NakCode::PsnSeqError,
            1 => NakCode::InvalidRequest,
            2 => NakCode::RemoteAccessError,
            3 => NakCode::RemoteOperationalError,
            4 => NakCode::InvalidRdRequest,
            c => NakCode::Reserved(c),
        }
    }
    /// The five-bit code.
    pub const fn code(self) -> u8 {
        match self {
            NakCode::PsnSeqError => 0,
            NakCode::InvalidRequest => 1,
            NakCode::RemoteAccessError => 2,
            NakCode::RemoteOperationalError => 3,
            NakCode::InvalidRdRequest => 4,
            NakCode::Reserved(c) => c & 0x1F,
        }
    }
    /// The IBTA name.
    pub const fn name(self) -> &'static str {
        match self {
            NakCode::PsnSeqError => "PSN sequence error",
            NakCode::InvalidRequest => "invalid request",
            NakCode::RemoteAccessError => "remote access error",
            NakCode::RemoteOperationalError => "remote operational error",
            NakCode::InvalidRdRequest => "invalid RD request",
            NakCode::Reserved(_) => "reserved",
        }
    }
}

/// A decoded AETH syndrome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Syndrome {
    /// ACK with a credit count code (0-30, or [`CREDITS_INVALID`]).
    Ack {
        /// Credit count code; see [`decode_credits`].
        credits: u8,
    },
    /// Receiver not ready, with the RNR timer code; see [`rnr_timer_micros`].
    RnrNak {
        /// RNR timer code.
        timer: u8,
    },
    /// Negative acknowledgement.
    Nak(NakCode),
    /// Bits 6-5 = 10, reserved; the raw syndrome byte.
    Reserved(u8),
}

impl Syndrome {
    /// Decode a syndrome byte (bit 7 is reserved and ignored).
    pub const fn from_byte(b: u8) -> Syndrome {
        let value = b & 0x1F;
        match (b >> 5) & 0x3 {
            0b00 => Syndrome::Ack { credits: value },
            0b01 => Syndrome::RnrNak { timer: value },
            0b11 => Syndrome::Nak(NakCode::from_code(value)),
            _ => Syndrome::Reserved(b),
        }
    }
    /// Encode to a syndrome byte.
    pub const fn to_byte(self) -> u8 {
        match self {
            Syndrome::Ack { credits } => credits & 0x1F,
            Syndrome::RnrNak { timer } => 0x20 | (timer & 0x1F),
            Syndrome::Nak(code) => 0x60 | code.code(),
            Syndrome::Reserved(b) => b,
        }
    }
    /// An ACK without credit information (what rdma_rxe sends).
    pub const ACK_NO_CREDITS: Syndrome = Syndrome::Ack {
        credits: CREDITS_INVALID,
    };
}

impl fmt::Display for Syndrome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Syndrome::Ack { credits } => match decode_credits(credits) {
                Some(n) => write!(f, "ACK credits={n}"),
                None => write!(f, "ACK credits=unlimited"),
            },
            Syndrome::RnrNak { timer } => {
                let us = rnr_timer_micros(timer);
                write!(
                    f,
                    "RNR-NAK timer={timer} ({}.{:02} ms)",
                    us / 1000,
                    us % 1000 / 10
                )
            }
            Syndrome::Nak(code) => write!(f, "NAK {} ({})", code.code(), code.name()),
            Syndrome::Reserved(b) => write!(f, "reserved syndrome {b:#04x}"),
        }
    }
}

/// AETH fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// Syndrome.
    pub syndrome: Syndrome,
    /// MSN (24 bits).
    pub msn: u32,
}

impl Repr {
    /// Parse an AETH.
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Repr> {
        packet.check_len()?;
        Ok(Repr {
            syndrome: Syndrome::from_byte(packet.syndrome()),
            msn: packet.msn(),
        })
    }
    /// Bytes [`Repr::emit`] writes.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    /// Write the AETH.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_syndrome(self.syndrome.to_byte());
        packet.set_msn(self.msn);
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AETH {} msn={}", self.syndrome, self.msn)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rxe_ack() {
        // rxe-rc_pingpong.pcap: syndrome 0x1F (ACK, no credit information), MSN 1.
        let bytes = [0x1f, 0x00, 0x00, 0x01];
        let repr = Repr::parse(&Packet::new_checked(&bytes[..]).unwrap()).unwrap();
        assert_eq!(repr.syndrome, Syndrome::ACK_NO_CREDITS);
        assert_eq!(repr.msn, 1);
        let mut buf = [0u8; 4];
        repr.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, bytes);
    }

    #[test]
    fn hardware_credits() {
        // hw-rc-send-imm.pcap: syndromes 0x05 and 0x06 are ACKs with 6 and 8 credits.
        assert_eq!(decode_credits(0x05), Some(6));
        assert_eq!(decode_credits(0x06), Some(8));
        assert_eq!(Syndrome::from_byte(0x06), Syndrome::Ack { credits: 6 });
    }

    #[test]
    fn rnr_and_naks() {
        // rxe-ops_rnr.pcap: 0x34 = RNR NAK, timer 20 = 10.24 ms.
        assert_eq!(Syndrome::from_byte(0x34), Syndrome::RnrNak { timer: 20 });
        assert_eq!(rnr_timer_micros(20), 10_240);
        assert_eq!(
            Syndrome::from_byte(0x60),
            Syndrome::Nak(NakCode::PsnSeqError)
        );
        assert_eq!(
            Syndrome::from_byte(0x61),
            Syndrome::Nak(NakCode::InvalidRequest)
        );
        assert_eq!(
            Syndrome::from_byte(0x62),
            Syndrome::Nak(NakCode::RemoteAccessError)
        );
        assert_eq!(
            Syndrome::from_byte(0x63),
            Syndrome::Nak(NakCode::RemoteOperationalError)
        );
        assert_eq!(
            Syndrome::from_byte(0x64),
            Syndrome::Nak(NakCode::InvalidRdRequest)
        );
        assert_eq!(Syndrome::from_byte(0x40), Syndrome::Reserved(0x40));
        for b in 0..=0x7Fu8 {
            assert_eq!(Syndrome::from_byte(b).to_byte(), b);
        }
    }

    #[test]
    fn credit_encoding() {
        assert_eq!(encode_credits(0), 0);
        assert_eq!(encode_credits(5), 4); // 4 WQEs: code 4; 6 would overstate
        assert_eq!(encode_credits(6), 5);
        assert_eq!(encode_credits(100_000), 30);
        for (code, &n) in CREDIT_COUNTS.iter().enumerate() {
            assert_eq!(encode_credits(n), code as u8);
        }
        assert_eq!(decode_credits(CREDITS_INVALID), None);
    }

    #[test]
    fn rnr_table_is_increasing_after_code_0() {
        assert!(RNR_TIMER_MICROS[1..].windows(2).all(|w| w[0] < w[1]));
        assert!(RNR_TIMER_MICROS[0] > RNR_TIMER_MICROS[31]);
    }
}
