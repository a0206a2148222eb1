//! What went wrong, for every verb of the crate.

use core::fmt;
use std::io;

use crate::VerbError;

/// What went wrong.
#[derive(Debug)]
pub enum Error {
    /// The operating system refused (socket, thread).
    Io(io::Error),
    /// The NIC refused the verb.
    Verb(VerbError),
    /// No free loopback address with port 4791 available.
    NoFreeAddress,
    /// A wait ended without a completion.
    Timeout,
    /// A buffer handed in for registration is not 8-byte aligned (it comes
    /// back with the error).
    Unaligned(Vec<u8>),
    /// The region's memory is still held by the NIC (it was not given by the
    /// caller, or something still refers to it).
    NotReturnable,
    /// No entry at this index in the port's GID table ([`Device::gids`](crate::Device::gids)).
    NoSuchGid(usize),
    /// An environment variable rnic reads has a value it cannot use.
    BadEnv {
        /// The variable.
        var: String,
        /// Its value.
        value: String,
        /// What it should be.
        expected: &'static str,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Io(e) => write!(f, "{e}"),
            Error::Verb(e) => write!(f, "{e}"),
            Error::NoFreeAddress => {
                f.write_str("no loopback address 127.0.0.1-127.0.0.254 has UDP port 4791 free")
            }
            Error::Timeout => f.write_str("timed out waiting for a completion"),
            Error::Unaligned(_) => f.write_str("the buffer is not 8-byte aligned"),
            Error::NotReturnable => {
                f.write_str("the region's memory was not the caller's, or is still in use")
            }
            Error::NoSuchGid(i) => write!(f, "the port has no GID {i}"),
            Error::BadEnv {
                var,
                value,
                expected,
            } => write!(f, "{var}={value:?}: expected {expected}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<io::Error> for Error {
    fn from(e: io::Error) -> Error {
        Error::Io(e)
    }
}

impl From<VerbError> for Error {
    fn from(e: VerbError) -> Error {
        Error::Verb(e)
    }
}

/// The result of a verb.
pub type Result<T> = std::result::Result<T, Error>;
