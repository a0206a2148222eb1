//! The `*_str` helpers and rate conversions, as rdma-core spells them.

use std::ffi::{c_char, c_int, CStr};

use crate::sys;

fn s(c: &'static CStr) -> *const c_char {
    c.as_ptr()
}

#[no_mangle]
pub extern "C" fn ibv_wc_status_str(status: sys::ibv_wc_status) -> *const c_char {
    const NAMES: [&CStr; 23] = [
        c"success",
        c"local length error",
        c"local QP operation error",
        c"local EE context operation error",
        c"local protection error",
        c"Work Request Flushed Error",
        c"memory management operation error",
        c"bad response error",
        c"local access error",
        c"remote invalid request error",
        c"remote access error",
        c"remote operation error",
        c"transport retry counter exceeded",
        c"RNR retry counter exceeded",
        c"local RDD violation error",
        c"remote invalid RD request",
        c"aborted error",
        c"invalid EE context number",
        c"invalid EE context state",
        c"fatal error",
        c"response timeout error",
        c"general error",
        c"TM error",
    ];
    match NAMES.get(status as usize) {
        Some(n) => s(n),
        None if status == sys::IBV_WC_TM_RNDV_INCOMPLETE => s(c"TM software rendezvous"),
        None => s(c"unknown"),
    }
}

#[no_mangle]
pub extern "C" fn ibv_node_type_str(t: sys::ibv_node_type) -> *const c_char {
    s(match t {
        sys::IBV_NODE_CA => c"InfiniBand channel adapter",
        sys::IBV_NODE_SWITCH => c"InfiniBand switch",
        sys::IBV_NODE_ROUTER => c"InfiniBand router",
        sys::IBV_NODE_RNIC => c"iWARP NIC",
        sys::IBV_NODE_USNIC => c"usNIC",
        sys::IBV_NODE_USNIC_UDP => c"usNIC UDP",
        sys::IBV_NODE_UNSPECIFIED => c"unspecified",
        _ => c"unknown",
    })
}

#[no_mangle]
pub extern "C" fn ibv_port_state_str(p: sys::ibv_port_state) -> *const c_char {
    const NAMES: [&CStr; 6] = [
        c"no state change (NOP)",
        c"down",
        c"init",
        c"armed",
        c"active",
        c"active deferred",
    ];
    NAMES.get(p as usize).map_or(s(c"unknown"), |n| s(n))
}

#[no_mangle]
pub extern "C" fn ibv_event_type_str(e: sys::ibv_event_type) -> *const c_char {
    const NAMES: [&CStr; 20] = [
        c"CQ error",
        c"local work queue catastrophic error",
        c"invalid request local work queue error",
        c"local access violation work queue error",
        c"communication established",
        c"send queue drained",
        c"path migrated",
        c"path migration request error",
        c"local catastrophic error",
        c"port active",
        c"port error",
        c"LID change",
        c"P_Key change",
        c"SM change",
        c"SRQ catastrophic error",
        c"SRQ limit reached",
        c"last WQE reached",
        c"client reregistration",
        c"GID table change",
        c"WQ fatal",
    ];
    NAMES.get(e as usize).map_or(s(c"unknown"), |n| s(n))
}

/// (ibv_rate, Gb/s x 10, multiple of 2.5 Gb/s)
const RATES: [(sys::ibv_rate, c_int, c_int); 23] = [
    (sys::IBV_RATE_2_5_GBPS, 2500, 1),
    (sys::IBV_RATE_5_GBPS, 5000, 2),
    (sys::IBV_RATE_10_GBPS, 10000, 4),
    (sys::IBV_RATE_20_GBPS, 20000, 8),
    (sys::IBV_RATE_30_GBPS, 30000, 12),
    (sys::IBV_RATE_40_GBPS, 40000, 16),
    (sys::IBV_RATE_60_GBPS, 60000, 24),
    (sys::IBV_RATE_80_GBPS, 80000, 32),
    (sys::IBV_RATE_120_GBPS, 120000, 48),
    (sys::IBV_RATE_14_GBPS, 14062, 0),
    (sys::IBV_RATE_56_GBPS, 56250, 0),
    (sys::IBV_RATE_112_GBPS, 112500, 0),
    (sys::IBV_RATE_168_GBPS, 168750, 0),
    (sys::IBV_RATE_25_GBPS, 25781, 10),
    (sys::IBV_RATE_100_GBPS, 103125, 40),
    (sys::IBV_RATE_200_GBPS, 206250, 80),
    (sys::IBV_RATE_300_GBPS, 309375, 120),
    (sys::IBV_RATE_28_GBPS, 28125, 11),
    (sys::IBV_RATE_50_GBPS, 53125, 20),
    (sys::IBV_RATE_400_GBPS, 425000, 160),
    (sys::IBV_RATE_600_GBPS, 637500, 240),
    (sys::IBV_RATE_800_GBPS, 850000, 320),
    (sys::IBV_RATE_1200_GBPS, 1275000, 480),
];

#[no_mangle]
pub extern "C" fn ibv_rate_to_mbps(rate: sys::ibv_rate) -> c_int {
    RATES.iter().find(|r| r.0 == rate).map_or(0, |r| r.1)
}

#[no_mangle]
pub extern "C" fn mbps_to_ibv_rate(mbps: c_int) -> sys::ibv_rate {
    RATES
        .iter()
        .find(|r| r.1 == mbps)
        .map_or(sys::IBV_RATE_MAX, |r| r.0)
}

#[no_mangle]
pub extern "C" fn ibv_rate_to_mult(rate: sys::ibv_rate) -> c_int {
    RATES
        .iter()
        .find(|r| r.0 == rate && r.2 != 0)
        .map_or(0, |r| r.2)
}

#[no_mangle]
pub extern "C" fn mult_to_ibv_rate(mult: c_int) -> sys::ibv_rate {
    RATES
        .iter()
        .find(|r| r.2 == mult && mult != 0)
        .map_or(sys::IBV_RATE_MAX, |r| r.0)
}

/// rnic writes a message's bytes in order (PSN order, ascending within a
/// packet): `IBV_QUERY_QP_DATA_IN_ORDER_WHOLE_MSG`.
#[no_mangle]
pub extern "C" fn ibv_query_qp_data_in_order(
    _qp: *mut sys::ibv_qp,
    _op: sys::ibv_wr_opcode,
    _flags: u32,
) -> c_int {
    1
}
