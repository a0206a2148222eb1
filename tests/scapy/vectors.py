#!/usr/bin/env python3
"""Independent RoCE v2 vectors from Scapy's scapy.contrib.roce.

  vectors.py make OUT.pcap OUT.json   build packets with Scapy (its ICRC), and
                                      write what each one holds as JSON
  vectors.py check IN.pcap            recompute the ICRC of every RoCE v2 packet
                                      in IN.pcap with Scapy; exit 1 on a mismatch

Scapy knows BTH and AETH; the other extension headers are written here from
the IBTA layouts as raw bytes, which Scapy's ICRC covers like any payload.
"""
import json
import random
import struct
import sys

from scapy.all import Ether, IP, IPv6, UDP, Raw, rdpcap, wrpcap
from scapy.contrib.roce import BTH, AETH


def reth(va, rkey, length):
    return struct.pack(">QII", va, rkey, length)


def atomic_eth(va, rkey, swap, cmp):
    return struct.pack(">QIQQ", va, rkey, swap, cmp)


def deth(qkey, srcqp):
    return struct.pack(">II", qkey, srcqp & 0xFFFFFF)


def u32(v):
    return struct.pack(">I", v)


def make(pcap_path, json_path):
    rng = random.Random(4791)
    packets, expected = [], []
    # (opcode, extension headers as a function of rng, has payload)
    kinds = [
        (0x04, lambda r: b"", True),  # RC SEND_ONLY
        (0x05, lambda r: u32(r.getrandbits(32)), True),  # RC SEND_ONLY_WITH_IMMEDIATE
        (0x00, lambda r: b"", True),  # RC SEND_FIRST
        (0x0A, lambda r: reth(r.getrandbits(64), r.getrandbits(32), r.randrange(4097)), True),
        (0x0B, lambda r: reth(r.getrandbits(64), r.getrandbits(32), r.randrange(4097)) + u32(r.getrandbits(32)), True),
        (0x0C, lambda r: reth(r.getrandbits(64), r.getrandbits(32), r.randrange(1 << 31)), False),
        (0x10, None, True),  # RC RDMA_READ_RESPONSE_ONLY: AETH via Scapy
        (0x11, None, False),  # RC ACKNOWLEDGE: AETH via Scapy
        (0x13, lambda r: atomic_eth(r.getrandbits(64) & ~7, r.getrandbits(32), r.getrandbits(64), r.getrandbits(64)), False),
        (0x14, lambda r: atomic_eth(r.getrandbits(64) & ~7, r.getrandbits(32), r.getrandbits(64), 0), False),
        (0x17, lambda r: u32(r.getrandbits(32)), True),  # RC SEND_ONLY_WITH_INVALIDATE
        (0x24, lambda r: b"", True),  # UC SEND_ONLY
        (0x2A, lambda r: reth(r.getrandbits(64), r.getrandbits(32), r.randrange(4097)), True),
        (0x64, lambda r: deth(r.getrandbits(32), r.getrandbits(24)), True),  # UD SEND_ONLY
        (0x65, lambda r: deth(r.getrandbits(32), r.getrandbits(24)) + u32(r.getrandbits(32)), True),
    ]
    for i in range(200):
        opcode, ext, has_payload = kinds[i % len(kinds)]
        payload_len = rng.choice([0, 1, 2, 3, 4, 5, 63, 256, 1024, 4093, 4096]) if has_payload else 0
        payload = bytes(rng.getrandbits(8) for _ in range(payload_len))
        pad = (4 - payload_len % 4) % 4
        bth_fields = dict(
            opcode=opcode,
            solicited=rng.getrandbits(1),
            migreq=rng.getrandbits(1),
            padcount=pad,
            pkey=rng.getrandbits(16),
            fecn=rng.getrandbits(1),
            becn=rng.getrandbits(1),
            dqpn=rng.getrandbits(24),
            ackreq=rng.getrandbits(1),
            psn=rng.getrandbits(24),
        )
        if ext is None:
            # Scapy binds AETH after ACKNOWLEDGE only; stack it by hand for READ responses.
            aeth = AETH(syndrome=rng.choice([0x1F, 0x05, 0x34, 0x60, 0x62]), msn=rng.getrandbits(24))
            ib = BTH(**bth_fields) / aeth / Raw(payload + b"\0" * pad)
            ext_bytes = bytes(aeth)
        else:
            ext_bytes = ext(rng)
            ib = BTH(**bth_fields) / Raw(ext_bytes + payload + b"\0" * pad)
        v6 = i % 2 == 1
        if v6:
            ip = IPv6(src="fd00::1", dst="fd00::2", tc=rng.getrandbits(8), fl=rng.getrandbits(20), hlim=rng.randrange(1, 256))
        else:
            ip = IP(src="10.77.0.1", dst="10.77.0.2", tos=rng.getrandbits(8), ttl=rng.randrange(1, 256), id=rng.getrandbits(16), flags="DF")
        pkt = Ether(src="02:00:00:00:00:0a", dst="02:00:00:00:00:0b") / ip / UDP(sport=rng.randrange(0xC000, 0x10000), dport=4791) / ib
        raw = bytes(pkt)
        packets.append(Ether(raw))
        expected.append(dict(
            v6=v6,
            opcode=opcode,
            solicited=bth_fields["solicited"],
            migreq=bth_fields["migreq"],
            padcount=pad,
            pkey=bth_fields["pkey"],
            fecn=bth_fields["fecn"],
            becn=bth_fields["becn"],
            dqpn=bth_fields["dqpn"],
            ackreq=bth_fields["ackreq"],
            psn=bth_fields["psn"],
            ext=ext_bytes.hex(),
            payload=payload.hex(),
            icrc=raw[-4:].hex(),
        ))
    wrpcap(pcap_path, packets)
    with open(json_path, "w") as f:
        json.dump(expected, f)
    print(f"{len(packets)} packets written")


def check(pcap_path):
    passed = failed = 0
    for n, pkt in enumerate(rdpcap(pcap_path), 1):
        if BTH not in pkt:
            continue
        raw = bytes(pkt)
        ours = pkt[BTH].compute_icrc(None)
        if ours == raw[-4:]:
            passed += 1
        else:
            failed += 1
            print(f"packet {n}: stored ICRC {raw[-4:].hex()}, Scapy computes {ours.hex()}")
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 and passed > 0 else 1


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "make":
        make(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 3 and sys.argv[1] == "check":
        sys.exit(check(sys.argv[2]))
    else:
        sys.exit(__doc__)
