//! Address handles: where UD sends go.

use std::net::IpAddr;

use crate::{AttrMask, Error, ProtectionDomain, Result, VerbError};

impl ProtectionDomain {
    /// An address handle for UD sends to `dest` (`ibv_create_ah`), from
    /// the address the NIC chooses ([`rnic_core::Nic::source_for`]).
    pub fn create_ah(&self, dest: IpAddr) -> AddressHandle {
        AddressHandle { dest, src: None }
    }

    /// An address handle for UD sends to `dest` from GID `sgid_index` of
    /// the port's table ([`Device::gids`](crate::Device::gids)), which must be of `dest`'s
    /// family (IPv4 or IPv6).
    pub fn create_ah_from(&self, dest: IpAddr, sgid_index: usize) -> Result<AddressHandle> {
        let src = *self
            .dev
            .gids()
            .get(sgid_index)
            .ok_or(Error::NoSuchGid(sgid_index))?;
        if src.is_ipv4() != dest.is_ipv4() {
            return Err(Error::Verb(VerbError::Modify(
                rnic_core::qp::ModifyError::InvalidValue {
                    attr: AttrMask::AV,
                    value: sgid_index as u64,
                    rule: "the source GID must be of the destination's family",
                },
            )));
        }
        Ok(AddressHandle {
            dest,
            src: Some(src),
        })
    }
}

/// Where UD sends go: a peer's address (`ibv_ah`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddressHandle {
    /// The peer's IP address (its GID).
    pub dest: IpAddr,
    /// The address to send from; `None`: the NIC chooses.
    pub src: Option<IpAddr>,
}
