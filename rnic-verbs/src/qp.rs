//! Queue pairs: how one is built, connected (as ibv_rc_pingpong connects
//! one), modified and posted to.

use std::io;
use std::net::IpAddr;
use std::sync::atomic::Ordering;

use crate::device::os_random;
use crate::{
    Access, AddressHandle, AddressVector, AttrMask, CompletionQueue, Device, Error, MemoryRegion,
    MemoryWindow, Mtu, MwBind, ProtectionDomain, QpAttr, QpCaps, QpState, QpType, RecvWr, Result,
    SendOp, SendWr, SgList, SharedReceiveQueue, UdDest, VerbError,
};

impl ProtectionDomain {
    /// A builder for a queue pair on `send_cq` and `recv_cq`, in the manner
    /// of `ibv_qp_init_attr`: RC with default capacities unless told
    /// otherwise.
    pub fn qp_builder<'a>(
        &'a self,
        send_cq: &'a CompletionQueue,
        recv_cq: &'a CompletionQueue,
    ) -> QpBuilder<'a> {
        QpBuilder {
            pd: self,
            send_cq,
            recv_cq,
            qp_type: QpType::Rc,
            caps: QpCaps::default(),
            srq: None,
        }
    }

    /// Create a reliable connected queue pair.
    pub fn create_rc_qp(
        &self,
        send_cq: &CompletionQueue,
        recv_cq: &CompletionQueue,
        caps: QpCaps,
    ) -> Result<QueuePair> {
        self.create_qp(QpType::Rc, send_cq, recv_cq, caps, None)
    }

    /// Create a queue pair of any type (`ibv_create_qp`), taking its receives
    /// from `srq` if one is given.
    pub fn create_qp(
        &self,
        qp_type: QpType,
        send_cq: &CompletionQueue,
        recv_cq: &CompletionQueue,
        caps: QpCaps,
        srq: Option<&SharedReceiveQueue>,
    ) -> Result<QueuePair> {
        let (pd, s, r) = (self.pd, send_cq.cq, recv_cq.cq);
        let srq = srq.map(|q| q.srq);
        let qpn = self
            .dev
            .call(move |st| -> std::result::Result<u32, VerbError> {
                let qpn = st.nic.create_qp(pd, qp_type, s, r, caps)?;
                if let Some(h) = srq {
                    st.nic.attach_srq(qpn, h)?;
                }
                let span = tracing::debug_span!(
                    parent: &st.span,
                    "qp",
                    qpn = format_args!("{qpn:#x}"),
                    ?qp_type
                );
                st.qp_spans.insert(qpn, span);
                Ok(qpn)
            })??;
        tracing::debug!(device = %self.dev.addr(), qpn, ?qp_type, "queue pair created");
        Ok(QueuePair {
            dev: self.dev.clone(),
            qpn,
            sq_psn: rand_psn()?,
            src: None,
        })
    }
}

/// A random first PSN, from the system: a connection's PSNs are what an
/// off-path attacker must guess to inject into it.
fn rand_psn() -> io::Result<u32> {
    Ok(u32::from_ne_bytes(os_random()?) & 0xFF_FFFF)
}

/// Builds a queue pair (`ProtectionDomain::qp_builder`).
#[derive(Debug)]
pub struct QpBuilder<'a> {
    pub(crate) pd: &'a ProtectionDomain,
    pub(crate) send_cq: &'a CompletionQueue,
    pub(crate) recv_cq: &'a CompletionQueue,
    pub(crate) qp_type: QpType,
    pub(crate) caps: QpCaps,
    pub(crate) srq: Option<&'a SharedReceiveQueue>,
}

impl<'a> QpBuilder<'a> {
    /// RC (the default), UC or UD.
    pub fn qp_type(mut self, t: QpType) -> Self {
        self.qp_type = t;
        self
    }
    /// All capacities at once.
    pub fn caps(mut self, caps: QpCaps) -> Self {
        self.caps = caps;
        self
    }
    /// Send queue depth.
    pub fn max_send_wr(mut self, n: u32) -> Self {
        self.caps.max_send_wr = n;
        self
    }
    /// Receive queue depth.
    pub fn max_recv_wr(mut self, n: u32) -> Self {
        self.caps.max_recv_wr = n;
        self
    }
    /// Scatter/gather entries per send.
    pub fn max_send_sge(mut self, n: u32) -> Self {
        self.caps.max_send_sge = n;
        self
    }
    /// Scatter/gather entries per receive.
    pub fn max_recv_sge(mut self, n: u32) -> Self {
        self.caps.max_recv_sge = n;
        self
    }
    /// Take receives from a shared receive queue.
    pub fn srq(mut self, srq: &'a SharedReceiveQueue) -> Self {
        self.srq = Some(srq);
        self
    }
    /// Create it (in RESET: [`QueuePair::modify`] or `connect` takes it on).
    pub fn build(self) -> Result<QueuePair> {
        self.pd.create_qp(
            self.qp_type,
            self.send_cq,
            self.recv_cq,
            self.caps,
            self.srq,
        )
    }
}

/// What a peer needs to connect to a queue pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Endpoint {
    /// The NIC's address (its GID).
    pub addr: IpAddr,
    /// Queue pair number.
    pub qpn: u32,
    /// First PSN the queue pair sends.
    pub psn: u32,
}

/// How to connect.
#[derive(Debug, Clone, Copy)]
pub struct ConnectOptions {
    /// Path MTU.
    pub mtu: Mtu,
    /// Local ACK timeout exponent (4.096 us x 2^timeout).
    pub timeout: u8,
    /// Retries after a timeout or sequence error.
    pub retry_cnt: u8,
    /// Retries after an RNR NAK (7 = forever).
    pub rnr_retry: u8,
    /// Remote access allowed to this QP.
    pub access: Access,
    /// Outstanding READs/atomics, each way (max_rd_atomic and
    /// max_dest_rd_atomic). The default, 16, is what a ConnectX responder
    /// takes; between rnic NICs up to
    /// [`DEVICE_ATTR`](crate::DEVICE_ATTR)`.max_qp_rd_atom` (128, as
    /// rdma_rxe) keeps a stream of small READs going several times faster
    /// (`rnic perf read -o`).
    pub max_rd_atomic: u8,
}

impl Default for ConnectOptions {
    fn default() -> ConnectOptions {
        ConnectOptions {
            mtu: Mtu::Mtu1024,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            access: Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC,
            max_rd_atomic: 16,
        }
    }
}

/// A queue pair. Dropping it destroys it.
#[derive(Debug)]
pub struct QueuePair {
    pub(crate) dev: Device,
    pub(crate) qpn: u32,
    pub(crate) sq_psn: u32,
    /// The address it sends from, if chosen ([`QueuePair::use_gid`]).
    pub(crate) src: Option<IpAddr>,
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        let _ = self.destroy_now();
    }
}

impl QueuePair {
    /// The QP number.
    pub fn qpn(&self) -> u32 {
        self.qpn
    }

    /// What the peer needs to connect to this QP.
    pub fn endpoint(&self) -> Endpoint {
        Endpoint {
            addr: self.src.unwrap_or_else(|| self.dev.addr()),
            qpn: self.qpn,
            psn: self.sq_psn,
        }
    }

    /// Start this QP's send queue at `psn` instead of the random PSN it was
    /// given (a verbs program chooses `sq_psn` itself): to make a transfer
    /// cross the 24-bit wrap, say. Before [`QueuePair::endpoint`] is handed
    /// to the peer and before [`QueuePair::connect`].
    pub fn set_psn(&mut self, psn: rnic_wire::Psn) {
        self.sq_psn = psn.value();
    }

    /// Send from, and be reached at, GID `index` of the port's table
    /// ([`Device::gids`]) rather than the device's own address (`-g` of
    /// ibv_rc_pingpong): an IPv6 address, say. Before
    /// [`QueuePair::endpoint`] is handed to the peer.
    pub fn use_gid(&mut self, index: usize) -> Result<()> {
        let addr = *self.dev.gids().get(index).ok_or(Error::NoSuchGid(index))?;
        self.src = Some(addr);
        Ok(())
    }

    /// Take the QP through INIT, RTR and RTS to `remote`, as ibv_rc_pingpong does.
    pub fn connect(&self, remote: &Endpoint, o: &ConnectOptions) -> Result<()> {
        let qpn = self.qpn;
        let attr = QpAttr {
            qp_access_flags: o.access,
            ah_attr: Some(AddressVector {
                dest: remote.addr,
                src: self.src,
                traffic_class: 0,
                hop_limit: 64,
                flow_label: 0,
            }),
            path_mtu: o.mtu,
            dest_qp_num: remote.qpn,
            rq_psn: remote.psn,
            max_dest_rd_atomic: o.max_rd_atomic,
            min_rnr_timer: 12,
            sq_psn: self.sq_psn,
            timeout: o.timeout,
            retry_cnt: o.retry_cnt,
            rnr_retry: o.rnr_retry,
            max_rd_atomic: o.max_rd_atomic,
            ..QpAttr::default()
        };
        let port = self.dev.call(move |st| {
            let now = st.now();
            st.nic.to_rts(now, qpn, &attr)?;
            st.give_source_port(qpn)
        })??;
        tracing::debug!(device = %self.dev.addr(), qpn, remote = %remote.addr, remote_qpn = remote.qpn, udp_source_port = port, "queue pair connected");
        Ok(())
    }

    /// Take the QP from RESET to INIT, allowing `access` to its peer:
    /// receives can be posted from then on (as rdma_cm's `rdma_create_qp`
    /// leaves a QP, before it connects it).
    pub fn init(&self, access: Access) -> Result<()> {
        let attr = QpAttr {
            qp_state: QpState::Init,
            qp_access_flags: access,
            ..QpAttr::default()
        };
        let mask = AttrMask::STATE | AttrMask::ACCESS_FLAGS | AttrMask::PKEY_INDEX | AttrMask::PORT;
        self.modify(&attr, mask)
    }

    /// Bring a UD QP to RTS with Q_Key `qkey`, as ibv_ud_pingpong does.
    pub fn ready_ud(&self, qkey: u32) -> Result<()> {
        let qpn = self.qpn;
        let attr = QpAttr {
            qkey,
            sq_psn: self.sq_psn,
            ..QpAttr::default()
        };
        self.dev.call(move |st| {
            let now = st.now();
            st.nic.to_rts(now, qpn, &attr)
        })??;
        Ok(())
    }

    /// Post a UD send to QP `remote_qpn` with Q_Key `remote_qkey` at `ah`.
    pub fn post_send_ud(
        &self,
        wr: SendWr,
        ah: &AddressHandle,
        remote_qpn: u32,
        remote_qkey: u32,
    ) -> Result<()> {
        let qpn = self.qpn;
        let to = UdDest {
            dest: ah.dest,
            src: ah.src,
            qpn: remote_qpn,
            qkey: remote_qkey,
        };
        self.dev.post(move |st| {
            let now = st.now();
            st.nic.post_send_ud(now, qpn, wr, to)
        })??;
        Ok(())
    }

    /// Post a send work request.
    pub fn post_send(&self, wr: SendWr) -> Result<()> {
        let qpn = self.qpn;
        self.dev.post(move |st| {
            let now = st.now();
            let _in_qp = st.qp_span(qpn).entered();
            tracing::trace!(wr_id = wr.wr_id, op = ?wr.op, sges = wr.sg_list.len(), "post_send");
            st.nic.post_send(now, qpn, wr)
        })??;
        Ok(())
    }

    /// Bind `mw` to `len` bytes of `mr` at `offset`, for this QP, with remote
    /// rights `access` (a BIND_MW work request, `ibv_bind_mw` for a type 2
    /// window). Returns the window's new R_Key (its low byte moved on, as
    /// `ibv_inc_rkey` does), valid for this QP's peer once the bind
    /// completes, in send-queue order, as IBV_WC_BIND_MW.
    pub fn bind_mw(
        &self,
        wr_id: u64,
        mw: &MemoryWindow,
        mr: &MemoryRegion,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Result<u32> {
        let new_rkey = mw.next_rkey();
        self.post_bind_mw(
            wr_id,
            mw,
            mr.lkey(),
            mr.addr().wrapping_add(offset as u64),
            len as u64,
            access,
            new_rkey,
            true,
        )?;
        Ok(new_rkey)
    }

    /// Bind `mw` to `length` bytes at `addr` of the region with local key
    /// `mr_lkey`, giving it `new_rkey` (a BIND_MW work request as
    /// `ibv_post_send` and `ibv_wr_bind_mw` take it: the caller chose the
    /// key, normally with `ibv_inc_rkey`).
    #[allow(clippy::too_many_arguments)]
    pub fn post_bind_mw(
        &self,
        wr_id: u64,
        mw: &MemoryWindow,
        mr_lkey: u32,
        addr: u64,
        length: u64,
        access: Access,
        new_rkey: u32,
        signaled: bool,
    ) -> Result<()> {
        self.post_send(
            SendWr::new(
                wr_id,
                SendOp::BindMw(MwBind {
                    mw_rkey: mw.rkey(),
                    new_rkey,
                    mr_lkey,
                    addr,
                    length,
                    access,
                }),
                SgList::new(),
            )
            .signaled(signaled),
        )?;
        mw.rkey.store(new_rkey, Ordering::Relaxed);
        Ok(())
    }

    /// Post a receive work request.
    pub fn post_recv(&self, wr: RecvWr) -> Result<()> {
        let qpn = self.qpn;
        self.dev.post(move |st| {
            let now = st.now();
            let _in_qp = st.qp_span(qpn).entered();
            tracing::trace!(wr_id = wr.wr_id, sges = wr.sg_list.len(), "post_recv");
            st.nic.post_recv(now, qpn, wr)
        })??;
        Ok(())
    }

    /// `ibv_modify_qp`: the attributes in `mask` from `attr`, with the
    /// required and optional attributes of the transition checked as Linux
    /// checks them.
    pub fn modify(&self, attr: &QpAttr, mask: AttrMask) -> Result<()> {
        let (qpn, attr) = (self.qpn, *attr);
        self.dev.call(move |st| {
            let now = st.now();
            let _in_qp = st.qp_span(qpn).entered();
            tracing::debug!(?mask, state = %attr.qp_state, "modify_qp");
            st.nic.modify_qp(now, qpn, &attr, mask)?;
            if mask.contains(AttrMask::STATE) && attr.qp_state == QpState::Reset {
                st.remove_delivered(qpn, st.nic.qp_cqs(qpn));
            }
            // A new path (only RC and UC QPs take one): a UDP source port
            // for it, as rdma_rxe gives it.
            if mask.contains(AttrMask::AV) {
                st.give_source_port(qpn)?;
            }
            Ok::<(), VerbError>(())
        })??;
        Ok(())
    }

    /// `ibv_query_qp`: every attribute.
    pub fn query(&self) -> Result<QpAttr> {
        let qpn = self.qpn;
        Ok(self.dev.call(move |st| st.nic.query_qp(qpn))??)
    }

    /// Destroy the QP now (`ibv_destroy_qp`; dropping it does the same).
    pub fn destroy(mut self) -> Result<()> {
        self.destroy_now()
    }

    /// Destroy the QP in the engine; the drop that follows finds nothing to
    /// destroy (QP 0 is never one rnic creates).
    fn destroy_now(&mut self) -> Result<()> {
        let qpn = std::mem::replace(&mut self.qpn, 0);
        self.dev.call(move |st| st.destroy_qp(qpn))??;
        Ok(())
    }

    /// The QP's state.
    pub fn state(&self) -> Result<QpState> {
        let qpn = self.qpn;
        Ok(self
            .dev
            .call(move |st| st.nic.query_qp(qpn).map(|a| a.qp_state))??)
    }
}
