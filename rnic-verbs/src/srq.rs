//! Shared receive queues.

use std::sync::atomic::{AtomicBool, Ordering};

use rnic_core::srq::SrqHandle;

use crate::{Device, ProtectionDomain, RecvWr, Result};

impl ProtectionDomain {
    /// A shared receive queue of `max_wr` receives of up to `max_sge`
    /// entries, in this domain (which it holds until it is destroyed).
    pub fn create_srq(&self, max_wr: u32, max_sge: u32) -> Result<SharedReceiveQueue> {
        let pd = self.pd;
        let srq = self
            .dev
            .call(move |st| st.nic.create_srq(pd, max_wr, max_sge))??;
        Ok(SharedReceiveQueue {
            dev: self.dev.clone(),
            srq,
            destroyed: AtomicBool::new(false),
        })
    }
}

/// A shared receive queue.
#[derive(Debug)]
pub struct SharedReceiveQueue {
    pub(crate) dev: Device,
    pub(crate) srq: SrqHandle,
    /// Destroyed in the NIC already: the drop must not destroy the SRQ
    /// made in the same slot since.
    pub(crate) destroyed: AtomicBool,
}

impl Drop for SharedReceiveQueue {
    fn drop(&mut self) {
        let _ = self.destroy_now();
    }
}

impl SharedReceiveQueue {
    /// Destroy it now (`ibv_destroy_srq`; dropping it does the same, or
    /// leaves it to the NIC if it cannot). Refused while queue pairs take
    /// their receives from it; the receives still posted go without a
    /// completion.
    pub fn destroy_now(&self) -> Result<()> {
        if self.destroyed.load(Ordering::Acquire) {
            return Ok(());
        }
        let srq = self.srq;
        self.dev.call(move |st| st.nic.destroy_srq(srq))??;
        self.destroyed.store(true, Ordering::Release);
        Ok(())
    }
    /// Its number, as `AsyncEvent::SrqLimitReached` reports it.
    pub fn id(&self) -> u32 {
        self.srq.0
    }
    /// Post a receive (`ibv_post_srq_recv`).
    pub fn post_recv(&self, wr: RecvWr) -> Result<()> {
        let srq = self.srq;
        self.dev.post(move |st| st.nic.post_srq_recv(srq, wr))??;
        Ok(())
    }
    /// Raise `AsyncEvent::SrqLimitReached` once, when fewer than `limit`
    /// receives remain (`ibv_modify_srq` with IBV_SRQ_LIMIT).
    pub fn arm(&self, limit: u32) -> Result<()> {
        let srq = self.srq;
        self.dev.call(move |st| st.nic.arm_srq(srq, limit))??;
        Ok(())
    }
}
