//! Building, encoding and decoding ANP `Packet`s (sans-I/O).
//!
//! Control packets are encoded with prost. DATA packets, the hot path, are
//! encoded as a small header (gRPC prefix + Packet/Data field tags) followed by
//! the payload `Bytes` untouched, so the payload is never copied by us.
//! Decoding from a `Bytes` message yields `Data.data` as a slice of it.

use bytes::{BufMut, Bytes, BytesMut};
use prost::Message;

use super::grpc_frame;
use super::pb::{
    packet::Payload, CloseDial, CloseRequest, CloseResponse, Data, DialRequest, DialResponse,
    Drain, Packet, PacketType,
};

/// Why a message is not a usable Packet.
#[derive(Debug, thiserror::Error)]
pub enum PacketError {
    #[error("undecodable Packet: {0}")]
    Decode(#[from] prost::DecodeError),
    #[error("Packet of type {kind} carries no {kind} payload")]
    MissingPayload { kind: &'static str },
    #[error("Packet type {0} is unknown")]
    UnknownType(i32),
}

/// A decoded packet, by kind, with the payload checked against the type.
#[derive(Debug, Clone, PartialEq)]
pub enum Frame {
    DialRequest(DialRequest),
    DialResponse(DialResponse),
    CloseRequest(CloseRequest),
    CloseResponse(CloseResponse),
    Data(Data),
    DialClose(CloseDial),
    Drain,
}

impl Frame {
    pub fn name(&self) -> &'static str {
        match self {
            Frame::DialRequest(_) => "DIAL_REQ",
            Frame::DialResponse(_) => "DIAL_RSP",
            Frame::CloseRequest(_) => "CLOSE_REQ",
            Frame::CloseResponse(_) => "CLOSE_RSP",
            Frame::Data(_) => "DATA",
            Frame::DialClose(_) => "DIAL_CLS",
            Frame::Drain => "DRAIN",
        }
    }
}

/// Decodes one gRPC message body into a checked [`Frame`].
pub fn decode(message: Bytes) -> Result<Frame, PacketError> {
    let packet = Packet::decode(message)?;
    from_packet(packet)
}

/// Checks that a packet's payload matches its type.
pub fn from_packet(packet: Packet) -> Result<Frame, PacketError> {
    let kind =
        PacketType::try_from(packet.r#type).map_err(|_| PacketError::UnknownType(packet.r#type))?;
    let missing = |kind| PacketError::MissingPayload { kind };
    Ok(match (kind, packet.payload) {
        (PacketType::DialReq, Some(Payload::DialRequest(p))) => Frame::DialRequest(p),
        (PacketType::DialRsp, Some(Payload::DialResponse(p))) => Frame::DialResponse(p),
        (PacketType::CloseReq, Some(Payload::CloseRequest(p))) => Frame::CloseRequest(p),
        (PacketType::CloseRsp, Some(Payload::CloseResponse(p))) => Frame::CloseResponse(p),
        (PacketType::Data, Some(Payload::Data(p))) => Frame::Data(p),
        (PacketType::DialCls, Some(Payload::CloseDial(p))) => Frame::DialClose(p),
        (PacketType::Drain, _) => Frame::Drain,
        (PacketType::DialReq, _) => return Err(missing("DIAL_REQ")),
        (PacketType::DialRsp, _) => return Err(missing("DIAL_RSP")),
        (PacketType::CloseReq, _) => return Err(missing("CLOSE_REQ")),
        (PacketType::CloseRsp, _) => return Err(missing("CLOSE_RSP")),
        (PacketType::Data, _) => return Err(missing("DATA")),
        (PacketType::DialCls, _) => return Err(missing("DIAL_CLS")),
    })
}

/// Converts a frame back into the protobuf Packet.
pub fn to_packet(frame: Frame) -> Packet {
    let (kind, payload) = match frame {
        Frame::DialRequest(p) => (PacketType::DialReq, Payload::DialRequest(p)),
        Frame::DialResponse(p) => (PacketType::DialRsp, Payload::DialResponse(p)),
        Frame::CloseRequest(p) => (PacketType::CloseReq, Payload::CloseRequest(p)),
        Frame::CloseResponse(p) => (PacketType::CloseRsp, Payload::CloseResponse(p)),
        Frame::Data(p) => (PacketType::Data, Payload::Data(p)),
        Frame::DialClose(p) => (PacketType::DialCls, Payload::CloseDial(p)),
        Frame::Drain => (PacketType::Drain, Payload::Drain(Drain {})),
    };
    Packet {
        r#type: kind as i32,
        payload: Some(payload),
    }
}

/// A gRPC message ready to send: one or two buffers (header, payload) that go
/// out back to back.
#[derive(Debug, Clone)]
pub struct Encoded {
    pub head: Bytes,
    pub payload: Bytes,
}

impl Encoded {
    pub fn len(&self) -> usize {
        self.head.len() + self.payload.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Both parts as one contiguous buffer (copies; for tests and tooling).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.len());
        v.extend_from_slice(&self.head);
        v.extend_from_slice(&self.payload);
        v
    }
}

/// Encodes any frame as a gRPC message (prefix included). DATA frames keep
/// their payload as a separate buffer.
pub fn encode(frame: Frame) -> Encoded {
    if let Frame::Data(d) = frame {
        if d.error.is_empty() {
            return encode_data(d.connect_id, d.data);
        }
        return encode_packet(&to_packet(Frame::Data(d)));
    }
    encode_packet(&to_packet(frame))
}

fn encode_packet(packet: &Packet) -> Encoded {
    let len = packet.encoded_len();
    let mut buf = BytesMut::with_capacity(grpc_frame::HEADER_LEN + len);
    buf.put_slice(&grpc_frame::header(len));
    packet
        .encode(&mut buf)
        .expect("buffer reserved for the whole message");
    Encoded {
        head: buf.freeze(),
        payload: Bytes::new(),
    }
}

fn varint_len(v: u64) -> usize {
    prost::encoding::encoded_len_varint(v)
}

/// Encodes `Packet{type: DATA, data: Data{connectID, data}}` without copying
/// `payload`. Byte-identical to prost's encoding of the same Packet.
pub fn encode_data(connect_id: i64, payload: Bytes) -> Encoded {
    // Data message: [0x08 connectID]? [0x1a len payload]?
    let id_len = if connect_id != 0 {
        1 + varint_len(connect_id as u64)
    } else {
        0
    };
    let payload_field_len = if payload.is_empty() {
        0
    } else {
        1 + varint_len(payload.len() as u64) + payload.len()
    };
    let data_msg_len = id_len + payload_field_len;
    // Packet: [0x08 0x04] [0x22 len DataMsg]
    let packet_len = 2 + 1 + varint_len(data_msg_len as u64) + data_msg_len;
    let mut head = BytesMut::with_capacity(grpc_frame::HEADER_LEN + 24);
    head.put_slice(&grpc_frame::header(packet_len));
    head.put_u8(0x08);
    head.put_u8(PacketType::Data as u8);
    head.put_u8(0x22);
    prost::encoding::encode_varint(data_msg_len as u64, &mut head);
    if connect_id != 0 {
        head.put_u8(0x08);
        prost::encoding::encode_varint(connect_id as u64, &mut head);
    }
    if !payload.is_empty() {
        head.put_u8(0x1a);
        prost::encoding::encode_varint(payload.len() as u64, &mut head);
    }
    Encoded {
        head: head.freeze(),
        payload,
    }
}

pub fn dial_request(protocol: &str, address: &str, random: i64) -> Frame {
    Frame::DialRequest(DialRequest {
        protocol: protocol.to_string(),
        address: address.to_string(),
        random,
    })
}

pub fn dial_response(random: i64, connect_id: i64, error: impl Into<String>) -> Frame {
    Frame::DialResponse(DialResponse {
        error: error.into(),
        connect_id,
        random,
    })
}

pub fn close_request(connect_id: i64) -> Frame {
    Frame::CloseRequest(CloseRequest { connect_id })
}

pub fn close_response(connect_id: i64, error: impl Into<String>) -> Frame {
    Frame::CloseResponse(CloseResponse {
        error: error.into(),
        connect_id,
    })
}

pub fn dial_close(random: i64) -> Frame {
    Frame::DialClose(CloseDial { random })
}

pub fn data(connect_id: i64, payload: Bytes) -> Frame {
    Frame::Data(Data {
        connect_id,
        error: String::new(),
        data: payload,
    })
}

/// Extension (negotiated, see [`crate::FEATURE_WINDOW`]): a DATA
/// packet with no payload and the error text `WINDOW <n>` acknowledges `n`
/// payload bytes of that connection. Go peers never see it.
const WINDOW_MARK: &str = "WINDOW ";

pub fn window_update(connect_id: i64, bytes: u64) -> Frame {
    Frame::Data(Data {
        connect_id,
        error: format!("{WINDOW_MARK}{bytes}"),
        data: Bytes::new(),
    })
}

/// The bytes a window update acknowledges, if `d` is one.
pub fn window_grant(d: &Data) -> Option<u64> {
    if !d.data.is_empty() {
        return None;
    }
    d.error.strip_prefix(WINDOW_MARK)?.parse().ok()
}

/// Extension (negotiated, see [`crate::FEATURES_HEADER`]): a DATA
/// packet with no payload and this error text means "no more data in this
/// direction" (TCP half-close). Go peers never see it.
pub const HALF_CLOSE_MARK: &str = "EOF";

/// The half-close mark for one connection: no more data this way.
pub fn half_close(connect_id: i64) -> Frame {
    Frame::Data(Data {
        connect_id,
        error: HALF_CLOSE_MARK.to_string(),
        data: Bytes::new(),
    })
}

/// Whether `d` is a half-close mark.
pub fn is_half_close(d: &Data) -> bool {
    d.data.is_empty() && d.error == HALF_CLOSE_MARK
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::anp::grpc_frame::FrameDecoder;

    #[test]
    fn half_close_mark_is_an_empty_data_packet_with_its_text() {
        let Frame::Data(d) = half_close(4) else {
            panic!("a DATA packet")
        };
        assert_eq!((d.connect_id, d.error.as_str()), (4, HALF_CLOSE_MARK));
        assert!(is_half_close(&d));
        let Frame::Data(with_payload) = data(4, Bytes::from_static(b"x")) else {
            panic!("a DATA packet")
        };
        assert!(!is_half_close(&with_payload));
        let Frame::Data(update) = window_update(4, 1) else {
            panic!("a DATA packet")
        };
        assert!(!is_half_close(&update));
    }

    #[test]
    fn window_updates_round_trip_and_nothing_else_is_one() {
        let Frame::Data(d) = window_update(9, 65536) else {
            panic!("a DATA packet")
        };
        assert_eq!((d.connect_id, window_grant(&d)), (9, Some(65536)));
        for error in ["", "EOF", "WINDOW", "WINDOW x", "WINDOW -1", "window 5"] {
            let d = Data {
                connect_id: 9,
                error: error.into(),
                data: Bytes::new(),
            };
            assert_eq!(window_grant(&d), None, "{error:?}");
        }
        let with_payload = Data {
            connect_id: 9,
            error: "WINDOW 5".into(),
            data: Bytes::from_static(b"x"),
        };
        assert_eq!(window_grant(&with_payload), None);
    }

    fn roundtrip(frame: Frame) -> Frame {
        let enc = encode(frame);
        let mut d = FrameDecoder::new(1 << 20);
        d.push(enc.head);
        d.push(enc.payload);
        decode(d.next_message().unwrap().unwrap()).unwrap()
    }

    #[test]
    fn every_kind_roundtrips() {
        for f in [
            dial_request("tcp", "node1:10250", -5),
            dial_response(7, 9, "boom"),
            close_request(3),
            close_response(3, ""),
            data(42, Bytes::from_static(b"xyz")),
            data(0, Bytes::new()),
            dial_close(11),
            Frame::Drain,
        ] {
            assert_eq!(roundtrip(f.clone()), f);
        }
    }

    #[test]
    fn fast_data_encoding_matches_prost() {
        for (id, len) in [
            (0i64, 0usize),
            (1, 1),
            (300, 127),
            (-1, 128),
            (i64::MAX, 70000),
        ] {
            let payload = Bytes::from(vec![0xab; len]);
            let fast = encode_data(id, payload.clone()).to_vec();
            let slow = encode_packet(&to_packet(data(id, payload))).to_vec();
            assert_eq!(fast, slow, "id={id} len={len}");
        }
    }

    #[test]
    fn decoded_data_is_a_slice_of_the_message() {
        let enc = encode_data(5, Bytes::from(vec![1u8; 1000])).to_vec();
        let msg = Bytes::from(enc).slice(grpc_frame::HEADER_LEN..);
        let range = msg.as_ptr() as usize..msg.as_ptr() as usize + msg.len();
        match decode(msg.clone()).unwrap() {
            Frame::Data(d) => assert!(range.contains(&(d.data.as_ptr() as usize))),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn mismatched_payload_is_an_error() {
        let p = Packet {
            r#type: PacketType::Data as i32,
            payload: Some(Payload::CloseRequest(CloseRequest { connect_id: 1 })),
        };
        assert!(matches!(
            from_packet(p),
            Err(PacketError::MissingPayload { kind: "DATA" })
        ));
        let p = Packet {
            r#type: 99,
            payload: None,
        };
        assert!(matches!(from_packet(p), Err(PacketError::UnknownType(99))));
    }

    #[test]
    fn unknown_fields_are_skipped() {
        // Packet{type=DRAIN, field 15 (varint) = 1}
        let msg = Bytes::from_static(&[0x08, 0x06, 0x78, 0x01]);
        assert_eq!(decode(msg).unwrap(), Frame::Drain);
    }
}
