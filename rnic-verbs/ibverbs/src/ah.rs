//! Address handles (`ibv_create_ah`): where a UD send goes.

use std::ffi::c_int;
use std::net::{IpAddr, Ipv6Addr};

use rnic_verbs::{AddressHandle, DomainHold};

use crate::device::Context;
use crate::ffi::{self, object, Object};
use crate::pd::{next_handle, Pd};
use crate::sys;

#[repr(C)]
pub(crate) struct Ah {
    c: sys::ibv_ah,
    magic: u64,
    pub ah: AddressHandle,
    /// The domain may not go while the handle is in it.
    _hold: DomainHold,
}
object!(Ah, sys::ibv_ah, b"rnic-ah\0");

/// The peer an address vector names: its GID (an IPv4-mapped GID is the
/// IPv4 address), or, without a GRH, its LID on this host (see
/// `Context::lid`).
pub(crate) fn dest_of(ctx: &Context, ah: &sys::ibv_ah_attr) -> Result<IpAddr, i32> {
    if ah.is_global != 0 {
        // SAFETY: every bit pattern of the union is a valid [u8; 16].
        let gid = Ipv6Addr::from(unsafe { ah.grh.dgid.raw });
        return Ok(match gid.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(gid),
        });
    }
    ctx.addr_of_lid(ah.dlid).ok_or_else(|| {
        eprintln!(
            "rnic: {}: an address without a GRH (is_global 0) and LID {} names no peer; \
             RoCE addresses peers by GID (ibv_rc_pingpong: -g 0)",
            crate::device::name_of(ctx),
            ah.dlid
        );
        libc::EINVAL
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_create_ah(
    pd: *mut sys::ibv_pd,
    attr: *mut sys::ibv_ah_attr,
) -> *mut sys::ibv_ah {
    ffi::ptr_call(|| {
        // SAFETY: the program's pointers.
        let (pd, attr) = unsafe { (Pd::from_c(pd)?, ffi::input(attr)?) };
        let dest = dest_of(pd.context(), attr)?;
        let src = src_of(pd.context(), attr)?;
        let hold = pd.pd.hold().map_err(|e| ffi::errno_of(&e))?;
        Ok(Ah {
            _hold: hold,
            c: sys::ibv_ah {
                context: pd.ctx,
                pd: pd.as_c(),
                handle: next_handle(),
            },
            magic: Ah::MAGIC,
            ah: rnic_verbs::AddressHandle { dest, src },
        }
        .into_c())
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_ah(ah: *mut sys::ibv_ah) -> c_int {
    ffi::errno_call(|| {
        // SAFETY: the program's pointer.
        unsafe { ffi::free::<Ah>(ah) }.ok_or(libc::EINVAL)?;
        Ok(())
    })
}

/// The address a GRH's `sgid_index` names in the port's GID table (EINVAL
/// past its end, or of another family than the destination's); without a
/// GRH, the NIC's choice.
pub(crate) fn src_of(ctx: &Context, ah: &sys::ibv_ah_attr) -> Result<Option<IpAddr>, i32> {
    if ah.is_global == 0 {
        return Ok(None);
    }
    let gids = ctx.nic.gids();
    let Some(&src) = gids.get(usize::from(ah.grh.sgid_index)) else {
        eprintln!(
            "rnic: {}: no GID {} (the port has {}; `ibv_devinfo -v` lists them)",
            crate::device::name_of(ctx),
            ah.grh.sgid_index,
            gids.len()
        );
        return Err(libc::EINVAL);
    };
    if src.is_ipv4() != dest_of(ctx, ah)?.is_ipv4() {
        eprintln!(
            "rnic: {}: GID {} ({}) cannot reach a GID of the other IP version",
            crate::device::name_of(ctx),
            ah.grh.sgid_index,
            rnic_verbs::gid_of(src)
        );
        return Err(libc::EINVAL);
    }
    Ok(Some(src))
}

/// rdma-core's helper for answering a UD sender: the address its receive
/// completion and GRH name.
#[no_mangle]
pub unsafe extern "C" fn ibv_init_ah_from_wc(
    ctx: *mut sys::ibv_context,
    port_num: u8,
    _wc: *mut sys::ibv_wc,
    grh: *mut sys::ibv_grh,
    ah_attr: *mut sys::ibv_ah_attr,
) -> c_int {
    // -1 with errno on failure, as rdma-core returns it.
    ffi::minus_one_call(|| {
        // SAFETY: the program's pointers.
        let (c, grh, attr) =
            unsafe { (Context::from_c(ctx)?, ffi::input(grh)?, ffi::out(ah_attr)?) };
        // SAFETY: ibv_grh is 40 bytes of plain data.
        let raw: &[u8; 40] = unsafe { &*(grh as *const sys::ibv_grh).cast() };
        // RoCE v2 over IPv4 puts the IPv4 header in the GRH's last 20 bytes.
        let (sender, receiver): (IpAddr, IpAddr) = if raw[20] >> 4 == 4 {
            let v4 = |at: usize| -> IpAddr {
                let b: [u8; 4] = raw[at..at + 4].try_into().unwrap_or_default();
                std::net::Ipv4Addr::from(b).into()
            };
            (v4(32), v4(36))
        } else {
            let v6 = |at: usize| -> IpAddr {
                let b: [u8; 16] = raw[at..at + 16].try_into().unwrap_or_default();
                std::net::Ipv6Addr::from(b).into()
            };
            (v6(8), v6(24))
        };
        // SAFETY: plain data.
        *attr = unsafe { std::mem::zeroed() };
        attr.is_global = 1;
        attr.port_num = port_num;
        attr.grh.dgid.raw = rnic_verbs::gid_of(sender).octets();
        // The reply leaves from the address the request came to (rdma-core
        // looks the GRH's destination GID up in the port's table).
        let gids = c.nic.gids();
        let index = gids
            .iter()
            .position(|&g| g == receiver)
            .or_else(|| gids.iter().position(|g| g.is_ipv4() == sender.is_ipv4()))
            .ok_or(libc::EINVAL)?;
        attr.grh.sgid_index = index as u8;
        attr.grh.hop_limit = 0xFF;
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_create_ah_from_wc(
    pd: *mut sys::ibv_pd,
    wc: *mut sys::ibv_wc,
    grh: *mut sys::ibv_grh,
    port_num: u8,
) -> *mut sys::ibv_ah {
    ffi::ptr_call(|| {
        // SAFETY: the program's pointers.
        let p = unsafe { Pd::from_c(pd)? };
        // SAFETY: plain data.
        let mut attr: sys::ibv_ah_attr = unsafe { std::mem::zeroed() };
        // SAFETY: the program's pointers, passed on.
        if unsafe { ibv_init_ah_from_wc(p.ctx, port_num, wc, grh, &mut attr) } != 0 {
            return Err(libc::EINVAL);
        }
        // SAFETY: as above.
        let ah = unsafe { ibv_create_ah(pd, &mut attr) };
        if ah.is_null() {
            Err(libc::EINVAL)
        } else {
            Ok(ah)
        }
    })
}
