//! Frame types, error codes, SETTINGS identifiers and protocol limits
//! (RFC 9113 sections 6, 7 and 6.5.2), and the two control frames the
//! connection writes itself (WINDOW_UPDATE, GOAWAY); the frame header and
//! header blocks are in [`super::wire`].

use super::*;

/// Frame types (RFC 9113 section 6).
pub mod frame_type {
    pub const DATA: u8 = 0x0;
    pub const HEADERS: u8 = 0x1;
    pub const PRIORITY: u8 = 0x2;
    pub const RST_STREAM: u8 = 0x3;
    pub const SETTINGS: u8 = 0x4;
    pub const PUSH_PROMISE: u8 = 0x5;
    pub const PING: u8 = 0x6;
    pub const GOAWAY: u8 = 0x7;
    pub const WINDOW_UPDATE: u8 = 0x8;
    pub const CONTINUATION: u8 = 0x9;
}
use frame_type::*;

pub(super) const ACK: u8 = 0x1;

/// Error codes (RFC 9113 section 7).
pub mod reason {
    pub const NO_ERROR: u32 = 0x0;
    pub const PROTOCOL_ERROR: u32 = 0x1;
    pub const INTERNAL_ERROR: u32 = 0x2;
    pub const FLOW_CONTROL_ERROR: u32 = 0x3;
    pub const STREAM_CLOSED: u32 = 0x5;
    pub const FRAME_SIZE_ERROR: u32 = 0x6;
    pub const REFUSED_STREAM: u32 = 0x7;
    pub const CANCEL: u32 = 0x8;
    pub const COMPRESSION_ERROR: u32 = 0x9;
    pub const ENHANCE_YOUR_CALM: u32 = 0xb;
}

/// SETTINGS identifiers.
pub(super) const SETTINGS_HEADER_TABLE_SIZE: u16 = 0x1;
pub(super) const SETTINGS_ENABLE_PUSH: u16 = 0x2;
pub(super) const SETTINGS_MAX_CONCURRENT_STREAMS: u16 = 0x3;
pub(super) const SETTINGS_INITIAL_WINDOW_SIZE: u16 = 0x4;
pub(super) const SETTINGS_MAX_FRAME_SIZE: u16 = 0x5;
pub(super) const SETTINGS_MAX_HEADER_LIST_SIZE: u16 = 0x6;

pub(super) const DEFAULT_WINDOW: i64 = 65_535;
pub(super) const MAX_WINDOW: i64 = (1 << 31) - 1;
pub(super) const MIN_MAX_FRAME: u32 = 16_384;
pub(super) const MAX_MAX_FRAME: u32 = (1 << 24) - 1;

pub(super) fn put_window_update(out: &mut Vec<u8>, id: u32, inc: u32) {
    put_frame_header(out, 4, WINDOW_UPDATE, 0, id);
    out.extend_from_slice(&(inc & 0x7fff_ffff).to_be_bytes());
}

pub(super) fn put_goaway(out: &mut Vec<u8>, last: u32, code: u32) {
    put_frame_header(out, 8, GOAWAY, 0, 0);
    out.put_u32(last & 0x7fff_ffff);
    out.put_u32(code);
}
