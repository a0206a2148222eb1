//! A hardware RoCE NIC's traffic replayed into rnic (tests/captures/
//! hw-rc-send-imm.pcap: two hosts, 192.168.70.4 with RC QP 0x45 and
//! 192.168.70.6 with QP 0x48, PMTU 1024, PSNs from 0). Unlike rdma_rxe, the
//! hardware sets MigReq, counts real credits in its ACKs, sends AckReq on
//! some SEND_FIRST packets and not others, and puts IPv4 ID 0 and small
//! UDP source ports on the wire.
//!
//! rnic stands in for 192.168.70.4, set up as it was: the same QP number
//! and PSNs. It takes the frames the other host sent, exactly as captured
//! (their ICRCs verified over the headers they came with), and must answer
//! as the hardware did.

use std::net::{IpAddr, Ipv4Addr};

use rnic_core::cq::CqHandle;
use rnic_core::mem::{Access, MrKeys, PdHandle};
use rnic_core::qp::{AddressVector, Mtu, QpAttr, QpType};
use rnic_core::time::Time;
use rnic_core::wr::{sg_list, RecvWr, SendOp, SendWr, Sge, WcOpcode, WcStatus};
use rnic_core::{Nic, QpCaps};
use rnic_wire::aeth::Syndrome;
use rnic_wire::encap::{Frame, LinkType};
use rnic_wire::pcap::PcapReader;
use rnic_wire::{IbPacket, Opcode};

const HOST_4: IpAddr = IpAddr::V4(Ipv4Addr::new(192, 168, 70, 4));
const HOST_6: IpAddr = IpAddr::V4(Ipv4Addr::new(192, 168, 70, 6));
const QP_4: u32 = 0x45;
const QP_6: u32 = 0x48;
const IOVA: u64 = 0x10_0000;
const SLOT: u64 = 4096;

/// The capture's RoCE frames, in order.
fn roce_frames() -> Vec<Vec<u8>> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/captures/hw-rc-send-imm.pcap"
    );
    let bytes = std::fs::read(path).unwrap();
    PcapReader::new(&bytes)
        .unwrap()
        .map(|r| r.unwrap().data.to_vec())
        .filter(|f| Frame::parse(LinkType::Ethernet, f).is_ok())
        .collect()
}

struct Host4 {
    nic: Nic,
    pd: PdHandle,
    cq: CqHandle,
    mr: MrKeys,
}

/// rnic as 192.168.70.4: QP 0x45 connected to 0x48 at 192.168.70.6, both
/// directions' PSNs from 0, PMTU 1024; 40 receive slots of 4 KiB posted.
fn host_4() -> Host4 {
    let mut nic = Nic::new(HOST_4, 1);
    let pd = nic.alloc_pd();
    let cq = nic.create_cq(256);
    let qpn = nic
        .create_qp_numbered(pd, QpType::Rc, cq, cq, QpCaps::default(), Some(QP_4))
        .unwrap();
    assert_eq!(qpn, QP_4);
    let mr = nic
        .reg_mr(
            pd,
            IOVA,
            Box::new(vec![0u8; 64 * SLOT as usize]),
            Access::LOCAL_WRITE,
        )
        .unwrap();
    let attr = QpAttr {
        ah_attr: Some(AddressVector {
            dest: HOST_6,
            src: None,
            traffic_class: 0,
            hop_limit: 64,
            flow_label: 0,
        }),
        path_mtu: Mtu::Mtu1024,
        dest_qp_num: QP_6,
        rq_psn: 0,
        sq_psn: 0,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        max_dest_rd_atomic: 1,
        max_rd_atomic: 1,
        ..QpAttr::default()
    };
    nic.to_rts(Time::ZERO, QP_4, &attr).unwrap();
    for i in 0..40u64 {
        let sg_list = sg_list![Sge {
            addr: IOVA + i * SLOT,
            length: SLOT as u32,
            lkey: mr.lkey,
        }];
        nic.post_recv(Time::ZERO, QP_4, RecvWr { wr_id: i, sg_list })
            .unwrap();
    }
    Host4 { nic, pd, cq, mr }
}

/// What an ACK says: PSN, MSN, and whether it is an ACK (not a NAK).
fn ack_of(p: &IbPacket<&[u8]>) -> Option<(u32, u32, bool)> {
    if p.bth().opcode() != Opcode::RC_ACKNOWLEDGE {
        return None;
    }
    let a = p.aeth()?;
    let ok = matches!(Syndrome::from_byte(a.syndrome()), Syndrome::Ack { .. });
    Some((p.bth().psn().value(), a.msn(), ok))
}

#[test]
fn rnic_answers_the_hardware_requester_as_the_hardware_responder_did() {
    let mut h = host_4();
    let frames = roce_frames();
    let (mut ours, mut theirs, mut payloads) = (Vec::new(), Vec::new(), Vec::new());
    let mut message = Vec::new();
    let mut asked = Vec::new();
    for f in &frames {
        let frame = Frame::parse(LinkType::Ethernet, f).unwrap();
        let (src, ib) = (frame.ip.src_addr(), &frame.ib);
        let to_us = ib.bth().dest_qp() == QP_4 && ib.info().is_request();
        if src == HOST_6 && to_us {
            if ib.bth().ack_req() {
                asked.push(ib.bth().psn().value());
            }
            message.extend_from_slice(ib.payload());
            if matches!(
                ib.bth().opcode(),
                Opcode::RC_SEND_LAST_WITH_IMMEDIATE | Opcode::RC_SEND_ONLY_WITH_IMMEDIATE
            ) {
                payloads.push(std::mem::take(&mut message));
            }
            h.nic.handle_frame(Time::ZERO, LinkType::Ethernet, f);
            while let Some(d) = h.nic.poll_transmit() {
                let p = IbPacket::new_checked(&d.payload[..]).unwrap();
                assert_eq!(d.dst, HOST_6);
                assert_eq!(p.bth().dest_qp(), QP_6);
                ours.extend(ack_of(&p));
            }
        } else if src == HOST_4 && ib.bth().dest_qp() == QP_6 {
            theirs.extend(ack_of(ib));
        }
    }
    let c = h.nic.counters();
    assert_eq!((c.icrc_errors, c.malformed, c.unknown_qp), (0, 0, 0));
    // The hardware ACKed every packet that asked (AckReq), each with the
    // MSN of the messages complete so far: rnic sends the same ACKs.
    let (solicited, unsolicited): (Vec<_>, Vec<_>) =
        theirs.iter().partition(|(psn, _, _)| asked.contains(psn));
    assert_eq!(solicited.len(), 35);
    assert_eq!(ours, solicited);
    // And one more, for a SEND_FIRST that did not ask (PSN 0x40, frame
    // 116: its credit count, 6, is what changed). IBTA lets a responder
    // acknowledge any packet; rnic answers AckReq, as rdma_rxe does.
    assert_eq!(unsolicited, [(0x40, 32, true)]);
    // Every message completed, with its immediate and its bytes.
    let done = h.nic.poll_cq(h.cq, usize::MAX).unwrap();
    assert_eq!(done.len(), payloads.len());
    assert_eq!(done.len(), 34);
    for (k, (c, sent)) in done.iter().zip(&payloads).enumerate() {
        assert_eq!(c.status, WcStatus::Success);
        assert_eq!(c.opcode, WcOpcode::Recv);
        assert_eq!(c.wr_id, k as u64);
        assert_eq!(c.byte_len as usize, sent.len());
        assert!(c.imm_data.is_some());
        let mut got = vec![0u8; sent.len()];
        h.nic
            .read_mr(h.pd, h.mr.lkey, IOVA + k as u64 * SLOT, &mut got)
            .unwrap();
        assert_eq!(&got, sent, "message {k}");
    }
}

#[test]
fn rnic_sends_what_the_hardware_requester_sent_and_takes_its_ack() {
    let mut h = host_4();
    let frames = roce_frames();
    let parsed: Vec<Frame<'_>> = frames
        .iter()
        .map(|f| Frame::parse(LinkType::Ethernet, f).unwrap())
        .collect();
    // The hardware at 192.168.70.4 sent one request: a SEND with immediate
    // data of 141 bytes, answered by 192.168.70.6's ACK.
    let (i, request) = parsed
        .iter()
        .enumerate()
        .find(|(_, f)| f.ip.src_addr() == HOST_4 && f.ib.info().is_request())
        .unwrap();
    let ack = &frames[i + 1];
    let answer = &parsed[i + 1];
    assert_eq!(answer.ib.bth().opcode(), Opcode::RC_ACKNOWLEDGE);
    let data = request.ib.payload();
    let imm = request.ib.immdt().unwrap().immediate();
    // rnic posts the same request, from a region holding the same bytes.
    let base = 0x90_0000;
    let src = h
        .nic
        .reg_mr(h.pd, base, Box::new(data.to_vec()), Access::NONE)
        .unwrap();
    let wr = SendWr::new(
        7,
        SendOp::send_imm(imm),
        sg_list![Sge {
            addr: base,
            length: data.len() as u32,
            lkey: src.lkey,
        }],
    );
    h.nic.post_send(Time::ZERO, QP_4, wr).unwrap();
    let sent = h.nic.poll_transmit().expect("the SEND");
    assert!(h.nic.poll_transmit().is_none());
    let ours = IbPacket::new_checked(&sent.payload[..]).unwrap();
    let theirs = &request.ib;
    // Every field the two transports must agree on. (MigReq differs: the
    // hardware sets it, rnic does not migrate paths and sends 0, as rdma_rxe
    // does; the ICRC covers different IPv4 headers.)
    assert_eq!(ours.bth().opcode(), theirs.bth().opcode());
    assert_eq!(ours.bth().dest_qp(), theirs.bth().dest_qp());
    assert_eq!(ours.bth().psn(), theirs.bth().psn());
    assert_eq!(ours.bth().ack_req(), theirs.bth().ack_req());
    assert_eq!(ours.bth().solicited(), theirs.bth().solicited());
    assert_eq!(ours.bth().pad_count(), theirs.bth().pad_count());
    assert_eq!(ours.bth().p_key(), theirs.bth().p_key());
    let imm_of = |p: &IbPacket<&[u8]>| p.immdt().map(|i| i.immediate());
    assert_eq!(imm_of(&ours), imm_of(theirs));
    assert_eq!(ours.payload(), theirs.payload());
    // The hardware's ACK completes it.
    h.nic.handle_frame(Time::ZERO, LinkType::Ethernet, ack);
    let done = h.nic.poll_cq(h.cq, usize::MAX).unwrap();
    assert_eq!(done.len(), 1);
    assert_eq!(
        (done[0].wr_id, done[0].status, done[0].opcode),
        (7, WcStatus::Success, WcOpcode::Send)
    );
    assert_eq!(h.nic.counters().icrc_errors, 0);
}
