//! Property tests of the sans-I/O protocol core: packet encode/decode round
//! trips (and the hand-rolled DATA encoder against prost), gRPC framing under
//! any chunking, agent identifiers, and the CONNECT head parser.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use bytes::Bytes;
use proptest::collection::vec;
use proptest::prelude::*;
use prost::Message;
use protocol::anp::agent_identifiers::{Cidr, Identifiers};
use protocol::anp::grpc_frame::{self, FrameDecoder, FrameError, HEADER_LEN};
use protocol::anp::http_connect::{self, ConnectRequest};
use protocol::anp::packet::{self, Frame};
use protocol::anp::pb::{
    CloseDial, CloseRequest, CloseResponse, Data, DialRequest, DialResponse, Packet,
};
use protocol::anp::routing::{dest_host, Registry, Strategy as Route};

// ---------------------------------------------------------------- strategies

/// Any i64, with the varint edge cases drawn often.
fn int64() -> impl Strategy<Value = i64> {
    prop_oneof![
        3 => any::<i64>(),
        1 => prop::sample::select(vec![0, 1, -1, 127, 128, 16383, 16384, i64::MAX, i64::MIN]),
    ]
}

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        "[a-z0-9.:\\[\\]-]{1,30}",
        any::<String>(),
    ]
}

/// Payload bytes, including lengths around the varint boundaries.
fn payload() -> impl Strategy<Value = Bytes> {
    prop_oneof![
        4 => vec(any::<u8>(), 0..300).prop_map(Bytes::from),
        1 => (prop::sample::select(vec![127usize, 128, 16383, 16384, 70_000]), any::<u8>())
            .prop_map(|(n, b)| Bytes::from(vec![b; n])),
    ]
}

fn frame() -> impl Strategy<Value = Frame> {
    prop_oneof![
        (text(), text(), int64()).prop_map(|(protocol, address, random)| {
            Frame::DialRequest(DialRequest {
                protocol,
                address,
                random,
            })
        }),
        (text(), int64(), int64()).prop_map(|(error, connect_id, random)| {
            Frame::DialResponse(DialResponse {
                error,
                connect_id,
                random,
            })
        }),
        int64().prop_map(|connect_id| Frame::CloseRequest(CloseRequest { connect_id })),
        (text(), int64()).prop_map(|(error, connect_id)| Frame::CloseResponse(CloseResponse {
            error,
            connect_id
        })),
        (int64(), prop_oneof![Just(String::new()), text()], payload()).prop_map(
            |(connect_id, error, data)| Frame::Data(Data {
                connect_id,
                error,
                data
            })
        ),
        int64().prop_map(|random| Frame::DialClose(CloseDial { random })),
        Just(Frame::Drain),
    ]
}

fn cidr() -> impl Strategy<Value = Cidr> {
    prop_oneof![
        (any::<u32>(), 0u8..=32).prop_map(|(a, prefix)| Cidr {
            addr: IpAddr::V4(Ipv4Addr::from(a)),
            prefix
        }),
        (any::<u128>(), 0u8..=128).prop_map(|(a, prefix)| Cidr {
            addr: IpAddr::V6(Ipv6Addr::from(a)),
            prefix
        }),
    ]
}

fn identifiers() -> impl Strategy<Value = Identifiers> {
    (
        vec(text(), 0..4),
        vec(any::<u32>().prop_map(Ipv4Addr::from), 0..3),
        vec(any::<u128>().prop_map(Ipv6Addr::from), 0..3),
        vec(cidr(), 0..3),
        any::<bool>(),
    )
        .prop_map(|(hosts, ipv4, ipv6, cidrs, default_route)| Identifiers {
            hosts,
            ipv4,
            ipv6,
            cidrs,
            default_route,
        })
}

/// A well-formed CONNECT head (as kube-apiserver sends) and its address.
fn connect_head() -> impl Strategy<Value = (String, String)> {
    let host = prop_oneof![
        // DNS names the strict CONNECT parser accepts: labels of 1-63
        // letters, digits and hyphens, not all-numeric.
        "[a-z]([a-z0-9-]{0,8}[a-z0-9])?(\\.[a-z0-9]([a-z0-9-]{0,8}[a-z0-9])?){0,3}",
        any::<u32>().prop_map(|a| Ipv4Addr::from(a).to_string()),
        any::<u128>().prop_map(|a| format!("[{}]", Ipv6Addr::from(a))),
    ];
    let headers = vec(("[A-Za-z][A-Za-z0-9-]{0,15}", "[ -~]{0,30}"), 0..6);
    (host, 1..=u16::MAX, headers, any::<bool>()).prop_map(|(host, port, headers, http10)| {
        let address = format!("{host}:{port}");
        let mut head = format!(
            "CONNECT {address} HTTP/1.{}\r\nHost: {address}\r\n",
            if http10 { 0 } else { 1 }
        );
        for (k, v) in headers {
            head.push_str(&format!("{k}: {}\r\n", v.trim()));
        }
        head.push_str("\r\n");
        (head, address)
    })
}

// ------------------------------------------------------------------- helpers

/// The whole message `encode` produced, checked for a correct gRPC prefix;
/// returns the body.
fn body_of(enc: &packet::Encoded) -> Vec<u8> {
    let wire = enc.to_vec();
    assert!(wire.len() >= HEADER_LEN);
    assert_eq!(wire[0], 0, "uncompressed flag");
    let len = u32::from_be_bytes([wire[1], wire[2], wire[3], wire[4]]) as usize;
    assert_eq!(len, wire.len() - HEADER_LEN, "length prefix");
    wire[HEADER_LEN..].to_vec()
}

fn prost_wire(p: &Packet) -> Vec<u8> {
    let body = p.encode_to_vec();
    let mut wire = grpc_frame::header(body.len()).to_vec();
    wire.extend_from_slice(&body);
    wire
}

/// Feeds `wire` in chunks cut at `cuts` and drains after each push.
fn decode_chunked(wire: &[u8], cuts: &[usize], max: usize) -> (Vec<Bytes>, FrameDecoder) {
    let mut d = FrameDecoder::new(max);
    let mut out = Vec::new();
    let mut start = 0;
    for &end in cuts.iter().chain(std::iter::once(&wire.len())) {
        d.push(Bytes::copy_from_slice(&wire[start..end]));
        start = end;
        while let Some(m) = d.next_message().expect("valid stream") {
            out.push(m);
        }
    }
    (out, d)
}

fn cut_points(len: usize, idx: &[prop::sample::Index]) -> Vec<usize> {
    let mut cuts: Vec<usize> = idx.iter().map(|i| i.index(len + 1)).collect();
    cuts.sort_unstable();
    cuts
}

// --------------------------------------------------------------- properties

proptest! {
    // 512 cases unless PROPTEST_CASES says otherwise.
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(512),
        ..ProptestConfig::default()
    })]

    #[test]
    fn every_frame_kind_roundtrips(f in frame()) {
        let enc = packet::encode(f.clone());
        let body = body_of(&enc);
        // What prost reads back is the same Packet...
        prop_assert_eq!(Packet::decode(&body[..]).unwrap(), packet::to_packet(f.clone()));
        // ...and the checked decode the same Frame.
        prop_assert_eq!(packet::decode(Bytes::from(body)).unwrap(), f.clone());
        // Through the frame decoder too, head and payload as separate chunks.
        let mut d = FrameDecoder::new(grpc_frame::DEFAULT_MAX_MESSAGE);
        d.push(enc.head.clone());
        d.push(enc.payload.clone());
        let m = d.next_message().unwrap().unwrap();
        prop_assert_eq!(packet::decode(m).unwrap(), f);
        prop_assert!(d.finish().is_ok());
    }

    #[test]
    fn non_data_frames_encode_exactly_as_prost(f in frame()) {
        let enc = packet::encode(f.clone());
        let is_fast_data = matches!(&f, Frame::Data(d) if d.error.is_empty());
        if !is_fast_data {
            prop_assert!(enc.payload.is_empty());
        }
        prop_assert_eq!(enc.to_vec(), prost_wire(&packet::to_packet(f)));
    }

    #[test]
    fn fast_data_path_is_byte_identical_to_prost(connect_id in int64(), data in payload()) {
        let fast = packet::encode_data(connect_id, data.clone());
        // The payload travels as its own buffer, never copied.
        prop_assert_eq!(&fast.payload, &data);
        if !data.is_empty() {
            prop_assert_eq!(fast.payload.as_ptr(), data.as_ptr());
        }
        let slow = prost_wire(&packet::to_packet(packet::data(connect_id, data.clone())));
        prop_assert_eq!(fast.to_vec(), slow);
        // And `encode` picks the fast path for plain DATA.
        prop_assert_eq!(packet::encode(packet::data(connect_id, data)).to_vec(), fast.to_vec());
    }

    #[test]
    fn frame_decoder_is_chunking_independent(
        msgs in vec(vec(any::<u8>(), 0..300), 0..8),
        idx in vec(any::<prop::sample::Index>(), 0..12),
    ) {
        let mut wire = Vec::new();
        for m in &msgs {
            wire.extend_from_slice(&grpc_frame::header(m.len()));
            wire.extend_from_slice(m);
        }
        let cuts = cut_points(wire.len(), &idx);
        let (got, d) = decode_chunked(&wire, &cuts, 300);
        let got: Vec<Vec<u8>> = got.iter().map(|b| b.to_vec()).collect();
        prop_assert_eq!(got, msgs);
        prop_assert_eq!(d.buffered(), 0);
        prop_assert!(d.finish().is_ok());
    }

    #[test]
    fn frame_decoder_chunked_packets_and_truncation(
        frames in vec(frame(), 1..6),
        idx in vec(any::<prop::sample::Index>(), 0..12),
        cut in any::<prop::sample::Index>(),
    ) {
        let mut wire = Vec::new();
        for f in &frames {
            wire.extend_from_slice(&packet::encode(f.clone()).to_vec());
        }
        let cuts = cut_points(wire.len(), &idx);
        let (got, d) = decode_chunked(&wire, &cuts, grpc_frame::DEFAULT_MAX_MESSAGE);
        let got: Vec<Frame> = got.into_iter().map(|m| packet::decode(m).unwrap()).collect();
        prop_assert_eq!(&got, &frames);
        prop_assert!(d.finish().is_ok());

        // Cut the stream short: a prefix of the messages, then Truncated
        // (unless the cut falls exactly between messages).
        let short = cut.index(wire.len());
        let cuts: Vec<usize> = cuts.into_iter().filter(|&c| c <= short).collect();
        let (got, d) = decode_chunked(&wire[..short], &cuts, grpc_frame::DEFAULT_MAX_MESSAGE);
        prop_assert!(got.len() < frames.len());
        let consumed: usize = frames[..got.len()]
            .iter()
            .map(|f| packet::encode(f.clone()).len())
            .sum();
        if consumed == short {
            prop_assert!(d.finish().is_ok());
        } else {
            prop_assert!(
                matches!(d.finish(), Err(FrameError::Truncated { .. })),
                "expected Truncated"
            );
        }
    }

    #[test]
    fn oversized_messages_are_refused_whatever_the_chunking(
        len in 11usize..100_000,
        idx in vec(any::<prop::sample::Index>(), 0..4),
    ) {
        let wire = grpc_frame::header(len);
        let mut d = FrameDecoder::new(10);
        let mut start = 0;
        let mut err = None;
        for &end in cut_points(wire.len(), &idx).iter().chain(std::iter::once(&wire.len())) {
            d.push(Bytes::copy_from_slice(&wire[start..end]));
            start = end;
            match d.next_message() {
                Ok(None) => {}
                Ok(Some(_)) => prop_assert!(false, "message returned"),
                Err(e) => { err = Some(e); break; }
            }
        }
        prop_assert_eq!(err, Some(FrameError::TooLarge { len, max: 10 }));
    }

    #[test]
    fn identifiers_encode_parse_roundtrip(ids in identifiers()) {
        let enc = ids.encode();
        let parsed = Identifiers::parse(&enc).unwrap();
        prop_assert_eq!(&parsed, &ids);
        prop_assert_eq!(parsed.encode(), enc);
    }

    #[test]
    fn identifiers_parse_of_any_text_is_canonical(s in any::<String>()) {
        if let Ok(ids) = Identifiers::parse(&s) {
            let enc = ids.encode();
            prop_assert_eq!(Identifiers::parse(&enc).unwrap(), ids);
        }
    }

    #[test]
    fn every_identifier_routes_to_its_agent(ids in identifiers(), port in any::<u16>()) {
        let mut r: Registry<u8> = Registry::default();
        r.insert(1, "a".into(), ids.clone(), 1);
        let dest = [Route::DestHost];
        for h in &ids.hosts {
            let addr = format!("{h}:{port}");
            if dest_host(&addr) == h.as_str() {
                prop_assert_eq!(r.pick(&addr, &dest), Some(1));
            }
        }
        for a in &ids.ipv4 {
            prop_assert_eq!(r.pick(&format!("{a}:{port}"), &dest), Some(1));
        }
        for a in &ids.ipv6 {
            prop_assert_eq!(r.pick(&format!("[{a}]:{port}"), &dest), Some(1));
        }
        for c in &ids.cidrs {
            prop_assert!(c.contains(c.addr));
            let addr = match c.addr {
                IpAddr::V4(a) => format!("{a}:{port}"),
                IpAddr::V6(a) => format!("[{a}]:{port}"),
            };
            prop_assert_eq!(r.pick(&addr, &dest), Some(1));
        }
    }

    #[test]
    fn http_connect_never_panics(buf in vec(any::<u8>(), 0..400)) {
        if let Ok(Some(r)) = http_connect::parse(&buf) {
            prop_assert!(r.head_len <= buf.len());
            prop_assert!(r.address.contains(':'));
        }
    }

    #[test]
    fn http_connect_mangled_heads_never_panic(
        (head, _) in connect_head(),
        at in any::<prop::sample::Index>(),
        junk in vec(any::<u8>(), 0..8),
    ) {
        let mut buf = head.into_bytes();
        let i = at.index(buf.len());
        buf.splice(i..i, junk);
        if let Ok(Some(r)) = http_connect::parse(&buf) {
            prop_assert!(r.head_len <= buf.len());
            prop_assert!(r.address.contains(':'));
        }
    }

    #[test]
    fn http_connect_valid_head_and_its_prefixes(
        (head, address) in connect_head(),
        tail in vec(any::<u8>(), 0..32),
    ) {
        let mut buf = head.clone().into_bytes();
        buf.extend_from_slice(&tail);
        let want = ConnectRequest { address, head_len: head.len() };
        prop_assert_eq!(http_connect::parse(&buf), Ok(Some(want)));
        for n in 0..head.len() {
            prop_assert_eq!(http_connect::parse(&buf[..n]), Ok(None), "prefix of {} bytes", n);
        }
    }
}
