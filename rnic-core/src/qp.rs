//! Queue pair types, states and attributes, and the state machine of
//! `ibv_modify_qp`: which transitions exist, which attributes each one requires
//! and allows for each QP type (the table of IBTA 11.2.4.2 as Linux enforces it
//! in `ib_modify_qp_is_ok`), and the range of each attribute's value.

use core::fmt;
use core::net::IpAddr;

use crate::mem::Access;
use rnic_wire::Psn;

/// The transport service of a QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpType {
    /// Reliable Connected.
    Rc,
    /// Unreliable Connected.
    Uc,
    /// Unreliable Datagram.
    Ud,
}

/// QP states (`ibv_qp_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpState {
    /// IBV_QPS_RESET.
    Reset,
    /// IBV_QPS_INIT.
    Init,
    /// IBV_QPS_RTR: ready to receive.
    Rtr,
    /// IBV_QPS_RTS: ready to send.
    Rts,
    /// IBV_QPS_SQD: send queue drained.
    Sqd,
    /// IBV_QPS_SQE: send queue error (UC and UD).
    Sqe,
    /// IBV_QPS_ERR.
    Err,
}

impl QpState {
    /// The `ibv_qp_state` name.
    pub const fn name(self) -> &'static str {
        match self {
            QpState::Reset => "RESET",
            QpState::Init => "INIT",
            QpState::Rtr => "RTR",
            QpState::Rts => "RTS",
            QpState::Sqd => "SQD",
            QpState::Sqe => "SQE",
            QpState::Err => "ERR",
        }
    }
}

impl fmt::Display for QpState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Which attributes a modify call sets, with the bits of `ibv_qp_attr_mask`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AttrMask(pub u32);

macro_rules! attr_bits {
    ($($name:ident = $bit:literal,)*) => {
        impl AttrMask {
            $(
                #[doc = concat!("IBV_QP_", stringify!($name), ".")]
                pub const $name: AttrMask = AttrMask(1 << $bit);
            )*
            const NAMES: &'static [(u32, &'static str)] = &[$((1 << $bit, concat!("IBV_QP_", stringify!($name))),)*];
        }
    };
}

attr_bits! {
    STATE = 0,
    CUR_STATE = 1,
    EN_SQD_ASYNC_NOTIFY = 2,
    ACCESS_FLAGS = 3,
    PKEY_INDEX = 4,
    PORT = 5,
    QKEY = 6,
    AV = 7,
    PATH_MTU = 8,
    TIMEOUT = 9,
    RETRY_CNT = 10,
    RNR_RETRY = 11,
    RQ_PSN = 12,
    MAX_QP_RD_ATOMIC = 13,
    ALT_PATH = 14,
    MIN_RNR_TIMER = 15,
    SQ_PSN = 16,
    MAX_DEST_RD_ATOMIC = 17,
    PATH_MIG_STATE = 18,
    CAP = 19,
    DEST_QPN = 20,
}

impl AttrMask {
    /// No attribute.
    pub const EMPTY: AttrMask = AttrMask(0);

    /// Whether every bit of `other` is set.
    pub const fn contains(self, other: AttrMask) -> bool {
        self.0 & other.0 == other.0
    }
    /// Bits of `self` not in `other`.
    pub const fn minus(self, other: AttrMask) -> AttrMask {
        AttrMask(self.0 & !other.0)
    }
    /// Whether no bit is set.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }
}

impl core::ops::BitOr for AttrMask {
    type Output = AttrMask;
    fn bitor(self, rhs: AttrMask) -> AttrMask {
        AttrMask(self.0 | rhs.0)
    }
}

impl fmt::Display for AttrMask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        let mut rest = self.0;
        for &(bit, name) in AttrMask::NAMES {
            if self.0 & bit != 0 {
                if !first {
                    f.write_str(" | ")?;
                }
                f.write_str(name)?;
                first = false;
                rest &= !bit;
            }
        }
        if rest != 0 {
            if !first {
                f.write_str(" | ")?;
            }
            write!(f, "{rest:#x}")?;
        } else if first {
            f.write_str("none")?;
        }
        Ok(())
    }
}

/// Path MTU (`ibv_mtu`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Mtu {
    /// 256 bytes (IBV_MTU_256 = 1).
    Mtu256,
    /// 512 bytes (2).
    Mtu512,
    /// 1024 bytes (3).
    Mtu1024,
    /// 2048 bytes (4).
    Mtu2048,
    /// 4096 bytes (5).
    Mtu4096,
}

impl Mtu {
    /// Payload bytes per packet.
    pub const fn bytes(self) -> usize {
        match self {
            Mtu::Mtu256 => 256,
            Mtu::Mtu512 => 512,
            Mtu::Mtu1024 => 1024,
            Mtu::Mtu2048 => 2048,
            Mtu::Mtu4096 => 4096,
        }
    }
    /// From the `ibv_mtu` value (1-5).
    pub const fn from_ibv(v: u32) -> Option<Mtu> {
        match v {
            1 => Some(Mtu::Mtu256),
            2 => Some(Mtu::Mtu512),
            3 => Some(Mtu::Mtu1024),
            4 => Some(Mtu::Mtu2048),
            5 => Some(Mtu::Mtu4096),
            _ => None,
        }
    }
    /// From its size in bytes (256, 512, 1024, 2048 or 4096).
    pub const fn from_bytes(bytes: u32) -> Option<Mtu> {
        match bytes {
            256 => Some(Mtu::Mtu256),
            512 => Some(Mtu::Mtu512),
            1024 => Some(Mtu::Mtu1024),
            2048 => Some(Mtu::Mtu2048),
            4096 => Some(Mtu::Mtu4096),
            _ => None,
        }
    }
    /// The largest MTU whose packets fit a link MTU of `link_mtu` bytes with
    /// `overhead` bytes of IP, UDP and IB headers.
    pub fn for_link(link_mtu: usize, overhead: usize) -> Option<Mtu> {
        [
            Mtu::Mtu4096,
            Mtu::Mtu2048,
            Mtu::Mtu1024,
            Mtu::Mtu512,
            Mtu::Mtu256,
        ]
        .into_iter()
        .find(|m| m.bytes() + overhead <= link_mtu)
    }
}

/// Where a connected QP sends (the address vector, `ibv_ah_attr` with a GRH).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AddressVector {
    /// The peer's IP address (its RoCE v2 GID).
    pub dest: IpAddr,
    /// The local address the QP sends from and takes packets at (the
    /// source GID, `sgid_index` in verbs): one of the NIC's addresses, of
    /// the peer's family. `None` lets the NIC choose ([`crate::Nic::source_for`]);
    /// `ibv_modify_qp` fills it in either way.
    pub src: Option<IpAddr>,
    /// IPv4 TOS / IPv6 traffic class.
    pub traffic_class: u8,
    /// IPv4 TTL / IPv6 hop limit.
    pub hop_limit: u8,
    /// IPv6 flow label.
    pub flow_label: u32,
}

/// The address of `addrs` to reach `dest` from ([`crate::Nic::source_for`]):
/// one of its family, in its scope (link-local or not) if there is one.
pub(crate) fn source_for(addrs: &[IpAddr], dest: IpAddr) -> Option<IpAddr> {
    let family = |a: &&IpAddr| a.is_ipv4() == dest.is_ipv4();
    let scope = |a: &&IpAddr| link_local(**a) == link_local(dest);
    let mut same = addrs.iter().filter(family);
    same.clone().find(scope).or_else(|| same.next()).copied()
}

/// An IPv6 link-local address (fe80::/10).
fn link_local(a: IpAddr) -> bool {
    matches!(a, IpAddr::V6(v) if v.segments()[0] & 0xFFC0 == 0xFE80)
}

/// The values `ibv_modify_qp` can set; which of them count is said by an
/// [`AttrMask`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpAttr {
    /// Target state (IBV_QP_STATE).
    pub qp_state: QpState,
    /// Asserted current state (IBV_QP_CUR_STATE).
    pub cur_qp_state: QpState,
    /// IBV_QP_EN_SQD_ASYNC_NOTIFY.
    pub en_sqd_async_notify: bool,
    /// Remote access the responder allows (IBV_QP_ACCESS_FLAGS).
    pub qp_access_flags: Access,
    /// P_Key table index (IBV_QP_PKEY_INDEX); rnic has one entry, 0xFFFF.
    pub pkey_index: u16,
    /// Port (IBV_QP_PORT); rnic has port 1.
    pub port_num: u8,
    /// Q_Key (IBV_QP_QKEY), UD only.
    pub qkey: u32,
    /// Address vector (IBV_QP_AV).
    pub ah_attr: Option<AddressVector>,
    /// Path MTU (IBV_QP_PATH_MTU).
    pub path_mtu: Mtu,
    /// Local ACK timeout exponent, 0-31 (IBV_QP_TIMEOUT).
    pub timeout: u8,
    /// Retries on timeout or sequence error, 0-7 (IBV_QP_RETRY_CNT). 7
    /// means seven retries, as IBTA says (rdma_rxe treats 7 as forever;
    /// rnr_retry 7 is forever for both).
    pub retry_cnt: u8,
    /// Retries on RNR NAK, 0-7, 7 = forever (IBV_QP_RNR_RETRY).
    pub rnr_retry: u8,
    /// First expected receive PSN (IBV_QP_RQ_PSN).
    pub rq_psn: u32,
    /// First send PSN (IBV_QP_SQ_PSN).
    pub sq_psn: u32,
    /// Outstanding READs/atomics as requester (IBV_QP_MAX_QP_RD_ATOMIC).
    pub max_rd_atomic: u8,
    /// Outstanding READs/atomics as responder (IBV_QP_MAX_DEST_RD_ATOMIC).
    pub max_dest_rd_atomic: u8,
    /// RNR NAK timer code this responder sends, 0-31 (IBV_QP_MIN_RNR_TIMER).
    pub min_rnr_timer: u8,
    /// Remote QP number (IBV_QP_DEST_QPN).
    pub dest_qp_num: u32,
}

impl Default for QpAttr {
    fn default() -> QpAttr {
        QpAttr {
            qp_state: QpState::Reset,
            cur_qp_state: QpState::Reset,
            en_sqd_async_notify: false,
            qp_access_flags: Access::NONE,
            pkey_index: 0,
            port_num: 1,
            qkey: 0,
            ah_attr: None,
            path_mtu: Mtu::Mtu1024,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            rq_psn: 0,
            sq_psn: 0,
            max_rd_atomic: 1,
            max_dest_rd_atomic: 1,
            min_rnr_timer: 12,
            dest_qp_num: 0,
        }
    }
}

/// Device limits that bound attribute values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest max_rd_atomic (`ibv_device_attr.max_qp_init_rd_atom`).
    pub max_qp_init_rd_atom: u8,
    /// Largest max_dest_rd_atomic (`ibv_device_attr.max_qp_rd_atom`).
    pub max_qp_rd_atom: u8,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_qp_init_rd_atom: 128,
            max_qp_rd_atom: 128,
        }
    }
}

/// Why a modify was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModifyError {
    /// No such transition for this QP type.
    InvalidTransition {
        /// Current state.
        from: QpState,
        /// Requested state.
        to: QpState,
    },
    /// IBV_QP_CUR_STATE named a state the QP is not in, or was given where it is not allowed.
    CurrentStateMismatch {
        /// What the caller asserted.
        claimed: QpState,
        /// The QP's state.
        actual: QpState,
    },
    /// Required attributes absent.
    MissingAttributes {
        /// Current state.
        from: QpState,
        /// Requested state.
        to: QpState,
        /// The attributes that are missing.
        missing: AttrMask,
    },
    /// Attributes this transition does not take (or rnic does not support).
    UnexpectedAttributes {
        /// Current state.
        from: QpState,
        /// Requested state.
        to: QpState,
        /// The attributes that are not allowed.
        unexpected: AttrMask,
    },
    /// An attribute value out of range.
    InvalidValue {
        /// The attribute.
        attr: AttrMask,
        /// The value given.
        value: u64,
        /// The rule it breaks.
        rule: &'static str,
    },
}

impl fmt::Display for ModifyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            ModifyError::InvalidTransition { from, to } => {
                write!(f, "no transition from {from} to {to}")
            }
            ModifyError::CurrentStateMismatch { claimed, actual } => write!(
                f,
                "IBV_QP_CUR_STATE says {claimed}, but the QP is in {actual}"
            ),
            ModifyError::MissingAttributes { from, to, missing } => {
                write!(f, "{from} -> {to} requires {missing}")
            }
            ModifyError::UnexpectedAttributes {
                from,
                to,
                unexpected,
            } => write!(f, "{from} -> {to} does not take {unexpected}"),
            ModifyError::InvalidValue { attr, value, rule } => {
                write!(f, "{attr} = {value}: {rule}")
            }
        }
    }
}

impl std::error::Error for ModifyError {}

/// (required, optional) attributes of a transition for a QP type; `None` when
/// the transition does not exist.
fn transition_attrs(t: QpType, from: QpState, to: QpState) -> Option<(AttrMask, AttrMask)> {
    use AttrMask as M;
    use QpState::*;
    use QpType::*;
    let none = M::EMPTY;
    let (req, opt) = match (from, to) {
        (Reset, Reset) => (none, none),
        (Reset, Init) => match t {
            Ud => (M::PKEY_INDEX | M::PORT | M::QKEY, none),
            Rc | Uc => (M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS, none),
        },
        // From any state but RESET, to RESET or ERR, with no attributes.
        (_, Reset) | (Init | Rtr | Rts | Sqd | Sqe | Err, Err) => (none, none),
        (Init, Init) => match t {
            Ud => (none, M::PKEY_INDEX | M::PORT | M::QKEY),
            Rc | Uc => (none, M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS),
        },
        (Init, Rtr) => match t {
            Ud => (none, M::PKEY_INDEX | M::QKEY),
            Uc => (
                M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN,
                M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX,
            ),
            Rc => (
                M::AV
                    | M::PATH_MTU
                    | M::DEST_QPN
                    | M::RQ_PSN
                    | M::MAX_DEST_RD_ATOMIC
                    | M::MIN_RNR_TIMER,
                M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX,
            ),
        },
        (Rtr, Rts) => match t {
            Ud => (M::SQ_PSN, M::CUR_STATE | M::QKEY),
            Uc => (
                M::SQ_PSN,
                M::CUR_STATE | M::ALT_PATH | M::ACCESS_FLAGS | M::PATH_MIG_STATE,
            ),
            Rc => (
                M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::SQ_PSN | M::MAX_QP_RD_ATOMIC,
                M::CUR_STATE | M::ALT_PATH | M::ACCESS_FLAGS | M::MIN_RNR_TIMER | M::PATH_MIG_STATE,
            ),
        },
        (Rts, Rts) | (Sqd, Rts) => match t {
            Ud => (none, M::CUR_STATE | M::QKEY),
            Uc => (
                none,
                M::CUR_STATE | M::ALT_PATH | M::ACCESS_FLAGS | M::PATH_MIG_STATE,
            ),
            Rc => (
                none,
                M::CUR_STATE | M::ALT_PATH | M::ACCESS_FLAGS | M::MIN_RNR_TIMER | M::PATH_MIG_STATE,
            ),
        },
        (Rts, Sqd) => (none, M::EN_SQD_ASYNC_NOTIFY),
        (Sqd, Sqd) => match t {
            Ud => (none, M::PKEY_INDEX | M::QKEY),
            Uc => (
                none,
                M::AV | M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX | M::PATH_MIG_STATE,
            ),
            Rc => (
                none,
                M::PORT
                    | M::AV
                    | M::TIMEOUT
                    | M::RETRY_CNT
                    | M::RNR_RETRY
                    | M::MAX_QP_RD_ATOMIC
                    | M::MAX_DEST_RD_ATOMIC
                    | M::ALT_PATH
                    | M::ACCESS_FLAGS
                    | M::PKEY_INDEX
                    | M::MIN_RNR_TIMER
                    | M::PATH_MIG_STATE,
            ),
        },
        (Sqe, Rts) => match t {
            Ud => (none, M::CUR_STATE | M::QKEY),
            Uc => (none, M::CUR_STATE | M::ACCESS_FLAGS),
            Rc => return None,
        },
        _ => return None,
    };
    Some((req, opt))
}

/// Attributes rnic accepts in the table but cannot honour: automatic path
/// migration needs a second port.
const UNSUPPORTED: AttrMask = AttrMask(AttrMask::ALT_PATH.0 | AttrMask::PATH_MIG_STATE.0);

/// A validated change of state and attributes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transition {
    /// The state before.
    pub from: QpState,
    /// The state after.
    pub to: QpState,
}

/// Check a modify request against the state machine and attribute rules, and
/// apply it to `current` (the QP's attributes) if it is valid. Nothing changes
/// on error.
pub fn modify(
    qp_type: QpType,
    current: &mut QpAttr,
    attr: &QpAttr,
    mask: AttrMask,
    limits: &Limits,
) -> Result<Transition, ModifyError> {
    let actual = current.qp_state;
    if mask.contains(AttrMask::CUR_STATE) {
        let allowed = matches!(
            actual,
            QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
        );
        if !allowed || attr.cur_qp_state != actual {
            return Err(ModifyError::CurrentStateMismatch {
                claimed: attr.cur_qp_state,
                actual,
            });
        }
    }
    let to = if mask.contains(AttrMask::STATE) {
        attr.qp_state
    } else {
        actual
    };
    let (req, opt) = transition_attrs(qp_type, actual, to)
        .ok_or(ModifyError::InvalidTransition { from: actual, to })?;
    let given = mask.minus(AttrMask::STATE);
    let missing = req.minus(given);
    if !missing.is_empty() {
        return Err(ModifyError::MissingAttributes {
            from: actual,
            to,
            missing,
        });
    }
    let unexpected = given.minus(req | opt);
    if !unexpected.is_empty() {
        return Err(ModifyError::UnexpectedAttributes {
            from: actual,
            to,
            unexpected,
        });
    }
    let unsupported = AttrMask(given.0 & UNSUPPORTED.0);
    if !unsupported.is_empty() {
        return Err(ModifyError::InvalidValue {
            attr: unsupported,
            value: 1,
            rule: "alternate paths and path migration are not supported (one port)",
        });
    }
    validate(attr, given, limits)?;

    let mut next = *current;
    let set = |m: AttrMask| given.contains(m);
    if set(AttrMask::ACCESS_FLAGS) {
        next.qp_access_flags = attr.qp_access_flags;
    }
    if set(AttrMask::PKEY_INDEX) {
        next.pkey_index = attr.pkey_index;
    }
    if set(AttrMask::PORT) {
        next.port_num = attr.port_num;
    }
    if set(AttrMask::QKEY) {
        next.qkey = attr.qkey;
    }
    if set(AttrMask::AV) {
        next.ah_attr = attr.ah_attr;
    }
    if set(AttrMask::PATH_MTU) {
        next.path_mtu = attr.path_mtu;
    }
    if set(AttrMask::TIMEOUT) {
        next.timeout = attr.timeout;
    }
    if set(AttrMask::RETRY_CNT) {
        next.retry_cnt = attr.retry_cnt;
    }
    if set(AttrMask::RNR_RETRY) {
        next.rnr_retry = attr.rnr_retry;
    }
    if set(AttrMask::RQ_PSN) {
        next.rq_psn = attr.rq_psn;
    }
    if set(AttrMask::SQ_PSN) {
        next.sq_psn = attr.sq_psn;
    }
    if set(AttrMask::MAX_QP_RD_ATOMIC) {
        next.max_rd_atomic = attr.max_rd_atomic;
    }
    if set(AttrMask::MAX_DEST_RD_ATOMIC) {
        next.max_dest_rd_atomic = attr.max_dest_rd_atomic;
    }
    if set(AttrMask::MIN_RNR_TIMER) {
        next.min_rnr_timer = attr.min_rnr_timer;
    }
    if set(AttrMask::DEST_QPN) {
        next.dest_qp_num = attr.dest_qp_num;
    }
    if set(AttrMask::EN_SQD_ASYNC_NOTIFY) {
        next.en_sqd_async_notify = attr.en_sqd_async_notify;
    }
    next.qp_state = to;
    next.cur_qp_state = to;
    *current = next;
    Ok(Transition { from: actual, to })
}

fn validate(attr: &QpAttr, given: AttrMask, limits: &Limits) -> Result<(), ModifyError> {
    let bad =
        |attr: AttrMask, value: u64, rule| Err(ModifyError::InvalidValue { attr, value, rule });
    if given.contains(AttrMask::PORT) && attr.port_num != 1 {
        return bad(
            AttrMask::PORT,
            attr.port_num.into(),
            "rnic has one port, port 1",
        );
    }
    if given.contains(AttrMask::PKEY_INDEX) && attr.pkey_index != 0 {
        return bad(
            AttrMask::PKEY_INDEX,
            attr.pkey_index.into(),
            "the P_Key table has one entry (0xFFFF, index 0)",
        );
    }
    if given.contains(AttrMask::AV) && attr.ah_attr.is_none() {
        return bad(AttrMask::AV, 0, "an address vector is required");
    }
    if given.contains(AttrMask::TIMEOUT) && attr.timeout > 31 {
        return bad(AttrMask::TIMEOUT, attr.timeout.into(), "must be 0-31");
    }
    if given.contains(AttrMask::RETRY_CNT) && attr.retry_cnt > 7 {
        return bad(AttrMask::RETRY_CNT, attr.retry_cnt.into(), "must be 0-7");
    }
    if given.contains(AttrMask::RNR_RETRY) && attr.rnr_retry > 7 {
        return bad(AttrMask::RNR_RETRY, attr.rnr_retry.into(), "must be 0-7");
    }
    if given.contains(AttrMask::MIN_RNR_TIMER) && attr.min_rnr_timer > 31 {
        return bad(
            AttrMask::MIN_RNR_TIMER,
            attr.min_rnr_timer.into(),
            "must be 0-31",
        );
    }
    for (m, v) in [
        (AttrMask::RQ_PSN, attr.rq_psn),
        (AttrMask::SQ_PSN, attr.sq_psn),
        (AttrMask::DEST_QPN, attr.dest_qp_num),
    ] {
        if given.contains(m) && v > 0x00FF_FFFF {
            return bad(m, v.into(), "must fit in 24 bits");
        }
    }
    if given.contains(AttrMask::MAX_QP_RD_ATOMIC) && attr.max_rd_atomic > limits.max_qp_init_rd_atom
    {
        return bad(
            AttrMask::MAX_QP_RD_ATOMIC,
            attr.max_rd_atomic.into(),
            "exceeds the device's max_qp_init_rd_atom",
        );
    }
    if given.contains(AttrMask::MAX_DEST_RD_ATOMIC)
        && attr.max_dest_rd_atomic > limits.max_qp_rd_atom
    {
        return bad(
            AttrMask::MAX_DEST_RD_ATOMIC,
            attr.max_dest_rd_atomic.into(),
            "exceeds the device's max_qp_rd_atom",
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::net::Ipv4Addr;

    fn av() -> Option<AddressVector> {
        Some(AddressVector {
            dest: IpAddr::V4(Ipv4Addr::LOCALHOST),
            src: None,
            traffic_class: 0,
            hop_limit: 64,
            flow_label: 0,
        })
    }

    /// The modify calls of ibv_rc_pingpong, in order.
    fn rc_to_rts(qp: &mut QpAttr) -> Result<(), ModifyError> {
        let l = Limits::default();
        let mut a = QpAttr {
            qp_state: QpState::Init,
            ..QpAttr::default()
        };
        modify(
            QpType::Rc,
            qp,
            &a,
            AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS,
            &l,
        )?;
        a.qp_state = QpState::Rtr;
        a.ah_attr = av();
        a.dest_qp_num = 0x12;
        a.rq_psn = 0x00ab_cdef;
        a.path_mtu = Mtu::Mtu4096;
        modify(
            QpType::Rc,
            qp,
            &a,
            AttrMask::STATE
                | AttrMask::AV
                | AttrMask::PATH_MTU
                | AttrMask::DEST_QPN
                | AttrMask::RQ_PSN
                | AttrMask::MAX_DEST_RD_ATOMIC
                | AttrMask::MIN_RNR_TIMER,
            &l,
        )?;
        a.qp_state = QpState::Rts;
        a.sq_psn = 0x0012_3456;
        modify(
            QpType::Rc,
            qp,
            &a,
            AttrMask::STATE
                | AttrMask::TIMEOUT
                | AttrMask::RETRY_CNT
                | AttrMask::RNR_RETRY
                | AttrMask::SQ_PSN
                | AttrMask::MAX_QP_RD_ATOMIC,
            &l,
        )?;
        Ok(())
    }

    #[test]
    fn rc_pingpong_sequence() {
        let mut qp = QpAttr::default();
        rc_to_rts(&mut qp).unwrap();
        assert_eq!(qp.qp_state, QpState::Rts);
        assert_eq!(
            (qp.dest_qp_num, qp.rq_psn, qp.sq_psn),
            (0x12, 0x00ab_cdef, 0x0012_3456)
        );
        assert_eq!(qp.path_mtu, Mtu::Mtu4096);
    }

    #[test]
    fn errors_name_what_is_wrong() {
        let l = Limits::default();
        let mut qp = QpAttr::default();
        let a = QpAttr {
            qp_state: QpState::Rtr,
            ..QpAttr::default()
        };
        let e = modify(QpType::Rc, &mut qp, &a, AttrMask::STATE, &l).unwrap_err();
        assert_eq!(
            e,
            ModifyError::InvalidTransition {
                from: QpState::Reset,
                to: QpState::Rtr
            }
        );
        assert_eq!(e.to_string(), "no transition from RESET to RTR");

        let a = QpAttr {
            qp_state: QpState::Init,
            ..QpAttr::default()
        };
        let e = modify(
            QpType::Rc,
            &mut qp,
            &a,
            AttrMask::STATE | AttrMask::PORT,
            &l,
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "RESET -> INIT requires IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX"
        );
        let e = modify(
            QpType::Rc,
            &mut qp,
            &a,
            AttrMask::STATE
                | AttrMask::PORT
                | AttrMask::PKEY_INDEX
                | AttrMask::ACCESS_FLAGS
                | AttrMask::QKEY,
            &l,
        )
        .unwrap_err();
        assert_eq!(e.to_string(), "RESET -> INIT does not take IBV_QP_QKEY");
        let bad_port = QpAttr { port_num: 2, ..a };
        let e = modify(
            QpType::Rc,
            &mut qp,
            &bad_port,
            AttrMask::STATE | AttrMask::PORT | AttrMask::PKEY_INDEX | AttrMask::ACCESS_FLAGS,
            &l,
        )
        .unwrap_err();
        assert!(matches!(
            e,
            ModifyError::InvalidValue {
                attr: AttrMask::PORT,
                value: 2,
                ..
            }
        ));
        assert_eq!(
            qp.qp_state,
            QpState::Reset,
            "a refused modify changes nothing"
        );
    }

    #[test]
    fn value_ranges() {
        let l = Limits {
            max_qp_init_rd_atom: 16,
            max_qp_rd_atom: 16,
        };
        let mut qp = QpAttr::default();
        rc_to_rts(&mut qp).unwrap();
        // RTS -> SQD -> SQD with new values.
        let a = QpAttr {
            qp_state: QpState::Sqd,
            ..qp
        };
        modify(QpType::Rc, &mut qp, &a, AttrMask::STATE, &l).unwrap();
        for (mask, a, attr) in [
            (
                AttrMask::TIMEOUT,
                QpAttr { timeout: 32, ..qp },
                AttrMask::TIMEOUT,
            ),
            (
                AttrMask::RETRY_CNT,
                QpAttr { retry_cnt: 8, ..qp },
                AttrMask::RETRY_CNT,
            ),
            (
                AttrMask::RNR_RETRY,
                QpAttr { rnr_retry: 8, ..qp },
                AttrMask::RNR_RETRY,
            ),
            (
                AttrMask::MAX_QP_RD_ATOMIC,
                QpAttr {
                    max_rd_atomic: 17,
                    ..qp
                },
                AttrMask::MAX_QP_RD_ATOMIC,
            ),
            (
                AttrMask::MIN_RNR_TIMER,
                QpAttr {
                    min_rnr_timer: 32,
                    ..qp
                },
                AttrMask::MIN_RNR_TIMER,
            ),
        ] {
            let e = modify(QpType::Rc, &mut qp, &a, mask, &l).unwrap_err();
            assert!(
                matches!(e, ModifyError::InvalidValue { attr: x, .. } if x == attr),
                "{e}"
            );
        }
        let a = QpAttr { timeout: 31, ..qp };
        modify(QpType::Rc, &mut qp, &a, AttrMask::TIMEOUT, &l).unwrap();
        assert_eq!(qp.timeout, 31);
        // 24-bit PSNs on the way to RTR.
        let mut qp2 = QpAttr::default();
        let init = QpAttr {
            qp_state: QpState::Init,
            ..QpAttr::default()
        };
        modify(
            QpType::Uc,
            &mut qp2,
            &init,
            AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS,
            &l,
        )
        .unwrap();
        let rtr = QpAttr {
            qp_state: QpState::Rtr,
            ah_attr: av(),
            rq_psn: 1 << 24,
            ..QpAttr::default()
        };
        let e = modify(
            QpType::Uc,
            &mut qp2,
            &rtr,
            AttrMask::STATE
                | AttrMask::AV
                | AttrMask::PATH_MTU
                | AttrMask::DEST_QPN
                | AttrMask::RQ_PSN,
            &l,
        )
        .unwrap_err();
        assert!(matches!(
            e,
            ModifyError::InvalidValue {
                attr: AttrMask::RQ_PSN,
                ..
            }
        ));
    }

    #[test]
    fn cur_state_and_error_paths() {
        let l = Limits::default();
        let mut qp = QpAttr::default();
        rc_to_rts(&mut qp).unwrap();
        let wrong = QpAttr {
            cur_qp_state: QpState::Sqd,
            ..qp
        };
        assert!(matches!(
            modify(QpType::Rc, &mut qp, &wrong, AttrMask::CUR_STATE, &l),
            Err(ModifyError::CurrentStateMismatch { .. })
        ));
        let err = QpAttr {
            qp_state: QpState::Err,
            ..qp
        };
        assert_eq!(
            modify(QpType::Rc, &mut qp, &err, AttrMask::STATE, &l),
            Ok(Transition {
                from: QpState::Rts,
                to: QpState::Err
            })
        );
        // ERR -> RTS does not exist; ERR -> RESET does.
        let rts = QpAttr {
            qp_state: QpState::Rts,
            ..qp
        };
        assert!(modify(QpType::Rc, &mut qp, &rts, AttrMask::STATE, &l).is_err());
        let reset = QpAttr {
            qp_state: QpState::Reset,
            ..qp
        };
        modify(QpType::Rc, &mut qp, &reset, AttrMask::STATE, &l).unwrap();
        // RESET -> ERR does not exist (as in Linux).
        assert!(modify(QpType::Rc, &mut qp, &err, AttrMask::STATE, &l).is_err());
        // SQE -> RTS exists for UC and UD, not RC.
        assert!(transition_attrs(QpType::Rc, QpState::Sqe, QpState::Rts).is_none());
        assert!(transition_attrs(QpType::Ud, QpState::Sqe, QpState::Rts).is_some());
        // Path migration is in the table but not supported.
        let a = QpAttr { ..qp };
        let mut q = QpAttr::default();
        rc_to_rts(&mut q).unwrap();
        assert!(matches!(
            modify(QpType::Rc, &mut q, &a, AttrMask::PATH_MIG_STATE, &l),
            Err(ModifyError::InvalidValue { .. })
        ));
    }

    #[test]
    fn ud_sequence() {
        let l = Limits::default();
        let mut qp = QpAttr::default();
        let mut a = QpAttr {
            qp_state: QpState::Init,
            qkey: 0x1111_1111,
            ..QpAttr::default()
        };
        modify(
            QpType::Ud,
            &mut qp,
            &a,
            AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::QKEY,
            &l,
        )
        .unwrap();
        a.qp_state = QpState::Rtr;
        modify(QpType::Ud, &mut qp, &a, AttrMask::STATE, &l).unwrap();
        a.qp_state = QpState::Rts;
        let e = modify(QpType::Ud, &mut qp, &a, AttrMask::STATE, &l).unwrap_err();
        assert_eq!(e.to_string(), "RTR -> RTS requires IBV_QP_SQ_PSN");
        modify(
            QpType::Ud,
            &mut qp,
            &a,
            AttrMask::STATE | AttrMask::SQ_PSN,
            &l,
        )
        .unwrap();
        assert_eq!((qp.qp_state, qp.qkey), (QpState::Rts, 0x1111_1111));
    }

    #[test]
    fn mtu_for_link() {
        // RoCE v2 over IPv4 on a 1500-byte link: 20 + 8 + 12 + 4 + 28 (worst headers) = 72.
        assert_eq!(Mtu::for_link(1500, 72), Some(Mtu::Mtu1024));
        assert_eq!(Mtu::for_link(9000, 72), Some(Mtu::Mtu4096));
        assert_eq!(Mtu::for_link(300, 72), None);
        for v in 1..=5 {
            let m = Mtu::from_ibv(v).unwrap();
            assert_eq!(Mtu::from_bytes(m.bytes() as u32), Some(m));
        }
        assert_eq!(Mtu::from_bytes(1500), None);
        assert_eq!(Mtu::from_ibv(3), Some(Mtu::Mtu1024));
        assert_eq!(Mtu::from_ibv(6), None);
    }
}

/// What an RC or UC queue pair's transport is doing, as of a moment: the
/// state a person reading a capture needs to explain the next packet
/// (`rnic demo --scenario` prints it). A copy: it does not change with
/// the QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpView {
    /// The QP's state.
    pub state: QpState,
    /// Requester: the PSN the next new request packet gets.
    pub next_psn: Psn,
    /// Requester: the oldest PSN not yet acknowledged (equal to
    /// `next_psn` when nothing is outstanding).
    pub oldest_unacked: Psn,
    /// Requester: work requests posted and not yet completed.
    pub outstanding: usize,
    /// Requester: retries left for a timeout or sequence NAK.
    pub retries_left: u8,
    /// Requester: retries left for an RNR NAK.
    pub rnr_retries_left: u8,
    /// Requester: the local ACK timer is running.
    pub ack_timer: bool,
    /// Requester: waiting out an RNR NAK's timer.
    pub rnr_wait: bool,
    /// Requester: packets it may have unacknowledged now.
    pub window: u32,
    /// Requester: messages the responder's credits still allow to begin
    /// (`None`: the responder keeps no count).
    pub credits: Option<u32>,
    /// Responder: the PSN it expects next.
    pub expected_psn: Psn,
    /// Responder: messages completed (its MSN).
    pub msn: u32,
    /// Responder: receive work requests posted.
    pub receives: usize,
    /// Responder: READs and atomics it holds (answered or to answer).
    pub rd_atomic: usize,
    /// Responder: it has NAKed a sequence error and waits for the
    /// retransmission.
    pub nak_sent: bool,
    /// Responder: it is in the middle of a multi-packet message (its
    /// FIRST taken, its LAST not yet).
    pub in_message: bool,
}
