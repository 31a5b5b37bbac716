//! TLS 1.3 records after the handshake, sans-I/O (RFC 8446 section 5): the
//! record header, finding whole records in a byte stream, the per-record
//! nonce and additional data, the inner plaintext's content type and zero
//! padding, and the post-handshake messages (KeyUpdate, NewSessionTicket)
//! and alerts a peer may send once application data flows.
//!
//! It owns the framing and the rules, never the keys: sealing and opening
//! (AES-GCM, ChaCha20-Poly1305) are done by the caller in place, in the
//! buffer the record lies in (`engine::tls_records`). It does no I/O and
//! holds at most one partial post-handshake message
//! ([`MAX_HANDSHAKE_MESSAGE`] bytes): a length field that lies gives an
//! error, never an allocation of what it claims.
//!
//! What it does not do: the handshake (rustls does it) and TLS 1.2 records
//! (a TLS 1.2 link stays on rustls).

/// Bytes of a record header: type, legacy version (2), length (2).
pub const HEADER_LEN: usize = 5;
/// Most plaintext bytes one record may carry (2^14).
pub const MAX_PLAINTEXT: usize = 1 << 14;
/// Most bytes of a record's encrypted part (2^14 + 256).
pub const MAX_CIPHERTEXT: usize = MAX_PLAINTEXT + 256;
/// The AEAD tag of every TLS 1.3 suite.
pub const TAG_LEN: usize = 16;
/// Bytes of a nonce (the `iv` of every TLS 1.3 suite).
pub const NONCE_LEN: usize = 12;
/// The largest post-handshake message held while its records arrive (a
/// NewSessionTicket with a large ticket fits well within).
pub const MAX_HANDSHAKE_MESSAGE: usize = 64 * 1024;
/// A whole record at most: header and encrypted part.
pub const MAX_RECORD: usize = HEADER_LEN + MAX_CIPHERTEXT;

/// Record content types (RFC 8446 section 5.1).
pub const CHANGE_CIPHER_SPEC: u8 = 20;
pub const ALERT: u8 = 21;
pub const HANDSHAKE: u8 = 22;
pub const APPLICATION_DATA: u8 = 23;

/// Handshake message types that may follow the handshake.
const NEW_SESSION_TICKET: u8 = 4;
const KEY_UPDATE: u8 = 24;

/// Alert levels and the descriptions this layer sends or treats apart.
pub const ALERT_WARNING: u8 = 1;
pub const ALERT_FATAL: u8 = 2;
pub const CLOSE_NOTIFY: u8 = 0;
pub const UNEXPECTED_MESSAGE: u8 = 10;
pub const BAD_RECORD_MAC: u8 = 20;
pub const RECORD_OVERFLOW: u8 = 22;
pub const DECODE_ERROR: u8 = 50;
const USER_CANCELED: u8 = 90;

/// What is wrong with what the peer sent; each maps to the alert this end
/// answers with ([`RecordError::alert`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    #[error(
        "TLS record of outer type {0} after the handshake (TLS 1.3 allows only application_data)"
    )]
    UnexpectedOuterType(u8),
    #[error("TLS record of {len} encrypted bytes, more than the {MAX_CIPHERTEXT} TLS 1.3 allows (record_overflow)")]
    Overflow { len: usize },
    #[error("TLS record of {len} encrypted bytes, too short for a content type and a {TAG_LEN}-byte tag")]
    TooShort { len: usize },
    #[error("TLS record failed authentication (bad_record_mac): corrupted in transit or not sealed with this link's key")]
    BadRecordMac,
    #[error("decrypted TLS record has no content type (only zero padding)")]
    NoContentType,
    #[error("decrypted TLS record of {len} bytes, more than the 2^14 + 1 TLS 1.3 allows (record_overflow)")]
    PlaintextOverflow { len: usize },
    #[error("TLS record of inner content type {0} after the handshake")]
    UnexpectedInnerType(u8),
    #[error("empty TLS {0} record")]
    Empty(&'static str),
    #[error(
        "TLS post-handshake message of {len} bytes, more than the {MAX_HANDSHAKE_MESSAGE} accepted"
    )]
    HandshakeTooLarge { len: usize },
    #[error("TLS post-handshake message of type {0} not expected here")]
    UnexpectedHandshake(u8),
    #[error("malformed TLS KeyUpdate")]
    BadKeyUpdate,
    #[error("TLS KeyUpdate not at the end of its record")]
    KeyUpdateNotAligned,
    #[error("TLS {0} record interleaved with a fragmented handshake message")]
    Interleaved(&'static str),
    #[error("malformed TLS alert of {0} bytes")]
    BadAlert(usize),
    #[error("peer sent TLS alert {} ({code})", alert_name(*.code))]
    AlertReceived { code: u8 },
    #[error("more than {MAX_EMPTY_RECORDS} empty TLS records in a row")]
    TooManyEmptyRecords,
    #[error("more than {MAX_KEY_UPDATES} TLS KeyUpdates without application data between them")]
    TooManyKeyUpdates,
    #[error("more than {MAX_WARNING_ALERTS} TLS warning alerts")]
    TooManyWarningAlerts,
}

/// Empty records in a row the receiver takes; one more ends the
/// connection (rustls 0.23 `ALLOWED_CONSECUTIVE_EMPTY_FRAGMENTS_MAX`,
/// src/conn.rs: its `TooManyEmptyFragments`).
pub const MAX_EMPTY_RECORDS: u8 = 32;
/// KeyUpdates the receiver takes without application data in between
/// (rustls 0.23 `INITIAL_KEY_UPDATE_REQUESTS`, src/common_state.rs: its
/// `TooManyKeyUpdateRequests`).
pub const MAX_KEY_UPDATES: u8 = 32;
/// Warning alerts (user_canceled; every other warning is fatal in TLS 1.3)
/// the receiver takes over the connection's life (rustls 0.23
/// `allowed_warning_alerts`, after BoringSSL's `kMaxWarningAlerts`).
pub const MAX_WARNING_ALERTS: u8 = 4;

impl RecordError {
    /// The alert description this end sends before closing.
    pub fn alert(&self) -> Option<u8> {
        Some(match self {
            Self::Overflow { .. } | Self::PlaintextOverflow { .. } => RECORD_OVERFLOW,
            Self::BadRecordMac => BAD_RECORD_MAC,
            Self::TooShort { .. } | Self::BadKeyUpdate | Self::BadAlert(_) => DECODE_ERROR,
            Self::AlertReceived { .. } => return None,
            _ => UNEXPECTED_MESSAGE,
        })
    }
}

/// A name for an alert description (RFC 8446 section 6).
pub fn alert_name(code: u8) -> &'static str {
    match code {
        0 => "close_notify",
        10 => "unexpected_message",
        20 => "bad_record_mac",
        22 => "record_overflow",
        40 => "handshake_failure",
        42 => "bad_certificate",
        43 => "unsupported_certificate",
        44 => "certificate_revoked",
        45 => "certificate_expired",
        46 => "certificate_unknown",
        47 => "illegal_parameter",
        48 => "unknown_ca",
        49 => "access_denied",
        50 => "decode_error",
        51 => "decrypt_error",
        70 => "protocol_version",
        71 => "insufficient_security",
        80 => "internal_error",
        86 => "inappropriate_fallback",
        90 => "user_canceled",
        109 => "missing_extension",
        110 => "unsupported_extension",
        112 => "unrecognized_name",
        113 => "bad_certificate_status_response",
        115 => "unknown_psk_identity",
        116 => "certificate_required",
        120 => "no_application_protocol",
        _ => "unknown",
    }
}

/// The header of a record whose encrypted part is `len` bytes (also its
/// additional data for the AEAD).
pub fn header(len: usize) -> [u8; HEADER_LEN] {
    debug_assert!(len <= MAX_CIPHERTEXT);
    let l = (len as u16).to_be_bytes();
    [APPLICATION_DATA, 3, 3, l[0], l[1]]
}

/// The length of the first whole record in `buf` (header included), `None`
/// while it is incomplete. Checks the header as soon as it is there, so a
/// record that could never be valid fails before its bytes are awaited.
pub fn complete_record(buf: &[u8]) -> Result<Option<usize>, RecordError> {
    if buf.len() < HEADER_LEN {
        return Ok(None);
    }
    // The legacy version is ignored (RFC 8446 section 5.1: "MUST be
    // ignored for all purposes").
    if buf[0] != APPLICATION_DATA {
        return Err(RecordError::UnexpectedOuterType(buf[0]));
    }
    let len = usize::from(u16::from_be_bytes([buf[3], buf[4]]));
    if len > MAX_CIPHERTEXT {
        return Err(RecordError::Overflow { len });
    }
    if len < TAG_LEN + 1 {
        return Err(RecordError::TooShort { len });
    }
    Ok((buf.len() >= HEADER_LEN + len).then_some(HEADER_LEN + len))
}

/// The nonce of record `seq`: the sequence number, big-endian, XORed into
/// the right of the iv (RFC 8446 section 5.3).
pub fn nonce(iv: &[u8; NONCE_LEN], seq: u64) -> [u8; NONCE_LEN] {
    let mut n = *iv;
    for (b, s) in n[NONCE_LEN - 8..].iter_mut().zip(seq.to_be_bytes()) {
        *b ^= s;
    }
    n
}

/// The content type of a decrypted inner plaintext and the length of its
/// content: the last non-zero byte is the type, zeros after it padding.
pub fn inner_content(plain: &[u8]) -> Result<(u8, usize), RecordError> {
    if plain.len() > MAX_PLAINTEXT + 1 {
        return Err(RecordError::PlaintextOverflow { len: plain.len() });
    }
    match plain.iter().rposition(|&b| b != 0) {
        Some(i) => Ok((plain[i], i)),
        None => Err(RecordError::NoContentType),
    }
}

/// A post-handshake message to act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// The peer now seals with its next key; `update_requested`: it asks
    /// us to update ours too.
    KeyUpdate { update_requested: bool },
    /// A session ticket (body without the 4-byte message header), for a
    /// client only.
    NewSessionTicket(Vec<u8>),
}

/// What one decrypted record asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Inbound {
    /// Application data: the record's content, possibly empty.
    Data,
    /// close_notify: the peer sends nothing more (clean EOF).
    Close,
    /// Post-handshake messages completed by this record (possibly none
    /// yet: a message fragmented over records).
    Messages(Vec<Message>),
    /// Nothing to do (a user_canceled warning).
    Nothing,
}

/// The receiving side's state between records: a partial post-handshake
/// message, which side this is (only a client takes tickets), and the
/// anti-flood counters rustls keeps ([`MAX_EMPTY_RECORDS`],
/// [`MAX_KEY_UPDATES`], [`MAX_WARNING_ALERTS`]): records that carry no
/// data cost the receiver work without bound otherwise.
///
/// One deliberate difference: the KeyUpdate count starts again only on
/// application data that is not empty (rustls also on an empty record), so
/// that alternating empty records and KeyUpdates, which each reset the
/// other's count there, is bounded here too.
#[derive(Debug, Default)]
pub struct Receiver {
    is_client: bool,
    partial: Vec<u8>,
    empty_run: u8,
    key_updates: u8,
    warnings: u8,
}

impl Receiver {
    pub fn new(is_client: bool) -> Self {
        Receiver {
            is_client,
            ..Receiver::default()
        }
    }

    /// Bytes held of a fragmented handshake message.
    pub fn held(&self) -> usize {
        self.partial.len()
    }

    /// Takes a decrypted record's content of type `typ` (from
    /// [`inner_content`]).
    pub fn record(&mut self, typ: u8, content: &[u8]) -> Result<Inbound, RecordError> {
        if content.is_empty() {
            if self.empty_run == MAX_EMPTY_RECORDS {
                return Err(RecordError::TooManyEmptyRecords);
            }
            self.empty_run += 1;
        } else {
            self.empty_run = 0;
        }
        match typ {
            APPLICATION_DATA => {
                if !self.partial.is_empty() {
                    return Err(RecordError::Interleaved("application_data"));
                }
                if !content.is_empty() {
                    self.key_updates = 0;
                }
                Ok(Inbound::Data)
            }
            ALERT => {
                if !self.partial.is_empty() {
                    return Err(RecordError::Interleaved("alert"));
                }
                let a = alert(content)?;
                if a == Inbound::Nothing {
                    if self.warnings == MAX_WARNING_ALERTS {
                        return Err(RecordError::TooManyWarningAlerts);
                    }
                    self.warnings += 1;
                }
                Ok(a)
            }
            HANDSHAKE => self.handshake(content).map(Inbound::Messages),
            other => Err(RecordError::UnexpectedInnerType(other)),
        }
    }

    fn handshake(&mut self, content: &[u8]) -> Result<Vec<Message>, RecordError> {
        if content.is_empty() {
            return Err(RecordError::Empty("handshake"));
        }
        let mut out = Vec::new();
        // The common case, whole messages in one record, needs no copy.
        let joined;
        let mut rest: &[u8] = if self.partial.is_empty() {
            content
        } else {
            self.partial.extend_from_slice(content);
            joined = std::mem::take(&mut self.partial);
            &joined
        };
        while let Some(&ty) = rest.first() {
            // A type that will be refused is refused at its first byte,
            // not once up to 64 KiB of it arrived (issue 39, finding 11).
            match ty {
                KEY_UPDATE => {}
                NEW_SESSION_TICKET if self.is_client => {}
                other => return Err(RecordError::UnexpectedHandshake(other)),
            }
            if rest.len() < 4 {
                break;
            }
            let len = usize::from(rest[1]) << 16 | usize::from(rest[2]) << 8 | usize::from(rest[3]);
            if len > MAX_HANDSHAKE_MESSAGE {
                return Err(RecordError::HandshakeTooLarge { len });
            }
            if ty == KEY_UPDATE && len != 1 {
                return Err(RecordError::BadKeyUpdate);
            }
            if rest.len() < 4 + len {
                break;
            }
            let body = &rest[4..4 + len];
            match rest[0] {
                KEY_UPDATE => {
                    let update_requested = match body {
                        [0] => false,
                        [1] => true,
                        _ => return Err(RecordError::BadKeyUpdate),
                    };
                    // Keys change after this message: it must end its
                    // record (RFC 8446 section 5.1).
                    if rest.len() != 4 + len {
                        return Err(RecordError::KeyUpdateNotAligned);
                    }
                    if self.key_updates == MAX_KEY_UPDATES {
                        return Err(RecordError::TooManyKeyUpdates);
                    }
                    self.key_updates += 1;
                    out.push(Message::KeyUpdate { update_requested });
                }
                NEW_SESSION_TICKET if self.is_client => {
                    out.push(Message::NewSessionTicket(body.to_vec()))
                }
                other => return Err(RecordError::UnexpectedHandshake(other)),
            }
            rest = &rest[4 + len..];
        }
        // At most one message's header and body, less a byte.
        debug_assert!(rest.len() < 4 + MAX_HANDSHAKE_MESSAGE);
        self.partial = rest.to_vec();
        Ok(out)
    }
}

/// An alert's meaning (RFC 8446 section 6): close_notify ends the stream
/// cleanly, user_canceled is noted and ignored (a close_notify follows),
/// any other alert (whatever its level) ends the connection with an error.
pub fn alert(content: &[u8]) -> Result<Inbound, RecordError> {
    match content {
        [_, CLOSE_NOTIFY] => Ok(Inbound::Close),
        [ALERT_WARNING, USER_CANCELED] => Ok(Inbound::Nothing),
        [_, code] => Err(RecordError::AlertReceived { code: *code }),
        other => Err(RecordError::BadAlert(other.len())),
    }
}

/// The KeyUpdate message this end sends.
pub fn key_update(update_requested: bool) -> [u8; 5] {
    [KEY_UPDATE, 0, 0, 1, u8::from(update_requested)]
}

/// An alert this end sends: close_notify as a warning, the rest fatal.
pub fn alert_message(code: u8) -> [u8; 2] {
    let level = if code == CLOSE_NOTIFY {
        ALERT_WARNING
    } else {
        ALERT_FATAL
    };
    [level, code]
}

/// Whether the ClientHello that opens a connection offers TLS 1.3 (its
/// supported_versions extension lists 0x0304), read from the bytes
/// received so far: `None` while the first record is incomplete, and
/// `Some(false)` for anything that is not a whole ClientHello in one
/// record (then the connection stays on rustls, which says what is
/// wrong). A server that allows TLS 1.3, as ours always does, settles on
/// it exactly when the client offers it (RFC 8446 section 4.2.1).
pub fn client_hello_offers_tls13(buf: &[u8]) -> Option<bool> {
    if buf.len() < HEADER_LEN {
        return if buf.first().is_some_and(|&t| t != HANDSHAKE) {
            Some(false)
        } else {
            None
        };
    }
    if buf[0] != HANDSHAKE {
        return Some(false);
    }
    let len = usize::from(u16::from_be_bytes([buf[3], buf[4]]));
    if len > MAX_PLAINTEXT {
        return Some(false);
    }
    let record = buf.get(HEADER_LEN..HEADER_LEN + len)?;
    Some(offers_tls13(record).unwrap_or(false))
}

/// Reads a ClientHello handshake message; `None` if it is cut or malformed.
fn offers_tls13(msg: &[u8]) -> Option<bool> {
    struct Cursor<'a>(&'a [u8]);
    impl<'a> Cursor<'a> {
        fn take(&mut self, n: usize) -> Option<&'a [u8]> {
            if self.0.len() < n {
                return None;
            }
            let (a, b) = self.0.split_at(n);
            self.0 = b;
            Some(a)
        }
        fn u8(&mut self) -> Option<usize> {
            self.take(1).map(|b| usize::from(b[0]))
        }
        fn u16(&mut self) -> Option<usize> {
            self.take(2)
                .map(|b| usize::from(u16::from_be_bytes([b[0], b[1]])))
        }
    }
    let mut c = Cursor(msg);
    if c.u8()? != 1 {
        return None; // not a ClientHello
    }
    let len = c.take(3)?;
    let len = usize::from(len[0]) << 16 | usize::from(len[1]) << 8 | usize::from(len[2]);
    let mut c = Cursor(c.take(len)?);
    c.take(2 + 32)?; // legacy_version, random
    let n = c.u8()?;
    c.take(n)?; // legacy_session_id
    let n = c.u16()?;
    c.take(n)?; // cipher_suites
    let n = c.u8()?;
    c.take(n)?; // legacy_compression_methods
    if c.0.is_empty() {
        return Some(false); // no extensions: TLS 1.2 at most
    }
    let n = c.u16()?;
    let mut exts = Cursor(c.take(n)?);
    while !exts.0.is_empty() {
        let typ = exts.u16()?;
        let n = exts.u16()?;
        let data = exts.take(n)?;
        if typ == 43 {
            let mut v = Cursor(data);
            let n = v.u8()?;
            let list = v.take(n)?;
            return Some(list.chunks_exact(2).any(|p| p == [3, 4]));
        }
    }
    Some(false)
}

#[cfg(test)]
mod tests {

    /// rustls' anti-flood bounds, ported: 32 empty records in a row are
    /// taken and the 33rd ends the connection; any record with content
    /// starts the count again.
    #[test]
    fn empty_record_runs_are_bounded() {
        let mut r = Receiver::new(false);
        for _ in 0..3 {
            for _ in 0..MAX_EMPTY_RECORDS {
                assert_eq!(r.record(APPLICATION_DATA, &[]), Ok(Inbound::Data));
            }
            assert_eq!(r.record(APPLICATION_DATA, b"x"), Ok(Inbound::Data));
        }
        for _ in 0..MAX_EMPTY_RECORDS {
            r.record(APPLICATION_DATA, &[]).unwrap();
        }
        assert_eq!(
            r.record(APPLICATION_DATA, &[]),
            Err(RecordError::TooManyEmptyRecords)
        );
        assert_eq!(
            RecordError::TooManyEmptyRecords.alert(),
            Some(UNEXPECTED_MESSAGE)
        );
    }

    /// 32 KeyUpdates without application data are taken, the 33rd ends the
    /// connection; data with content starts the count again, empty data
    /// (which would reset the empty-record count in turn) does not.
    #[test]
    fn key_update_runs_are_bounded_and_reset_by_data_only() {
        let ku = key_update(true);
        let mut r = Receiver::new(false);
        for _ in 0..MAX_KEY_UPDATES {
            assert!(matches!(r.record(HANDSHAKE, &ku), Ok(Inbound::Messages(m)) if m.len() == 1));
        }
        r.record(APPLICATION_DATA, b"data").unwrap();
        for _ in 0..MAX_KEY_UPDATES {
            r.record(HANDSHAKE, &ku).unwrap();
            r.record(APPLICATION_DATA, &[]).unwrap();
        }
        assert_eq!(
            r.record(HANDSHAKE, &ku),
            Err(RecordError::TooManyKeyUpdates)
        );
    }

    /// Four user_canceled warnings over a connection's life, not five.
    #[test]
    fn warning_alerts_are_bounded() {
        let mut r = Receiver::new(false);
        let warn = [ALERT_WARNING, USER_CANCELED];
        for _ in 0..MAX_WARNING_ALERTS {
            assert_eq!(r.record(ALERT, &warn), Ok(Inbound::Nothing));
            r.record(APPLICATION_DATA, b"x").unwrap();
        }
        assert_eq!(
            r.record(ALERT, &warn),
            Err(RecordError::TooManyWarningAlerts)
        );
    }

    use super::*;

    fn record(body_len: usize) -> Vec<u8> {
        let mut r = header(body_len).to_vec();
        r.extend((0..body_len).map(|i| i as u8));
        r
    }

    /// Splits `stream` into records by [`complete_record`] feeding it in
    /// chunks of `sizes` (cycled) as a reader would.
    fn split(stream: &[u8], sizes: &[usize]) -> (Vec<Vec<u8>>, Option<RecordError>, usize) {
        let mut buf = Vec::new();
        let mut out = Vec::new();
        let mut pos = 0;
        let mut k = 0;
        while pos < stream.len() {
            let n = sizes[k % sizes.len()].max(1).min(stream.len() - pos);
            k += 1;
            buf.extend_from_slice(&stream[pos..pos + n]);
            pos += n;
            loop {
                match complete_record(&buf) {
                    Ok(Some(len)) => out.push(buf.drain(..len).collect()),
                    Ok(None) => break,
                    Err(e) => return (out, Some(e), buf.len()),
                }
            }
            assert!(buf.len() < MAX_RECORD, "held more than one record");
        }
        let left = buf.len();
        (out, None, left)
    }

    #[test]
    fn any_split_gives_the_same_records() {
        let mut stream = Vec::new();
        for len in [17, 100, MAX_CIPHERTEXT, 4000, 17, 16_000] {
            stream.extend(record(len));
        }
        stream.extend(&record(300)[..200]); // a cut record at the end
        let whole = split(&stream, &[stream.len()]);
        assert_eq!(whole.0.len(), 6);
        assert_eq!(whole.2, 200);
        for sizes in [
            &[1][..],
            &[5],
            &[4, 1, 7000],
            &[16_389],
            &[3, 65_536],
            &[2, 17, 9],
        ] {
            assert_eq!(split(&stream, sizes), whole, "sizes {sizes:?}");
        }
        // Bad input ends at the same record whatever the split.
        let mut bad = record(100);
        bad.extend([APPLICATION_DATA, 3, 3, 0xff, 0xff]);
        let whole = split(&bad, &[bad.len()]);
        assert_eq!(whole.1, Some(RecordError::Overflow { len: 0xffff }));
        for sizes in [&[1][..], &[104], &[3, 50]] {
            assert_eq!(split(&bad, sizes), whole);
        }
    }

    #[test]
    fn headers_are_checked_before_the_body_arrives() {
        assert_eq!(complete_record(&[23, 3, 3]), Ok(None));
        assert_eq!(
            complete_record(&[22, 3, 3, 0, 40]),
            Err(RecordError::UnexpectedOuterType(22))
        );
        assert_eq!(
            complete_record(&[23, 3, 3, 0x41, 0x01]),
            Err(RecordError::Overflow { len: 0x4101 })
        );
        assert_eq!(
            complete_record(&[23, 3, 3, 0, 16]),
            Err(RecordError::TooShort { len: 16 })
        );
        assert_eq!(complete_record(&[23, 3, 3, 0x41, 0x00]), Ok(None));
        assert_eq!(complete_record(&record(17)), Ok(Some(22)));
    }

    #[test]
    fn nonce_xors_the_sequence_number() {
        let iv = [0xff; 12];
        let n = nonce(&iv, 0x0102);
        assert_eq!(n[..10], [0xff; 10]);
        assert_eq!(n[10..], [0xfe, 0xfd]);
        assert_eq!(nonce(&iv, 0), iv);
    }

    #[test]
    fn inner_content_strips_padding() {
        assert_eq!(inner_content(&[1, 2, 23, 0, 0]), Ok((23, 2)));
        assert_eq!(inner_content(&[21]), Ok((21, 0)));
        assert_eq!(inner_content(&[0, 0]), Err(RecordError::NoContentType));
        assert_eq!(inner_content(&[]), Err(RecordError::NoContentType));
        let big = vec![1u8; MAX_PLAINTEXT + 2];
        assert_eq!(
            inner_content(&big),
            Err(RecordError::PlaintextOverflow {
                len: MAX_PLAINTEXT + 2
            })
        );
        assert!(inner_content(&big[1..]).is_ok());
    }

    #[test]
    fn post_handshake_messages() {
        let mut r = Receiver::new(true);
        assert_eq!(r.record(APPLICATION_DATA, b""), Ok(Inbound::Data));
        assert_eq!(
            r.record(HANDSHAKE, &key_update(true)),
            Ok(Inbound::Messages(vec![Message::KeyUpdate {
                update_requested: true
            }]))
        );
        // A ticket cut over two records, then a KeyUpdate with it.
        let mut t = vec![NEW_SESSION_TICKET, 0, 0, 3, 7, 8, 9];
        t.extend(key_update(false));
        assert_eq!(r.record(HANDSHAKE, &t[..2]), Ok(Inbound::Messages(vec![])));
        assert_eq!(r.held(), 2);
        assert_eq!(
            r.record(APPLICATION_DATA, b"x"),
            Err(RecordError::Interleaved("application_data"))
        );
        let mut r = Receiver::new(true);
        r.record(HANDSHAKE, &t[..2]).unwrap();
        assert_eq!(
            r.record(HANDSHAKE, &t[2..]),
            Ok(Inbound::Messages(vec![
                Message::NewSessionTicket(vec![7, 8, 9]),
                Message::KeyUpdate {
                    update_requested: false
                }
            ]))
        );
        assert_eq!(r.held(), 0);
        // A KeyUpdate must end its record.
        let mut two = key_update(false).to_vec();
        two.extend(key_update(false));
        assert_eq!(
            Receiver::new(true).record(HANDSHAKE, &two),
            Err(RecordError::KeyUpdateNotAligned)
        );
        assert_eq!(
            Receiver::new(true).record(HANDSHAKE, &[24, 0, 0, 1, 2]),
            Err(RecordError::BadKeyUpdate)
        );
        // A server takes no ticket; nobody takes other messages.
        assert_eq!(
            Receiver::new(false).record(HANDSHAKE, &[4, 0, 0, 0]),
            Err(RecordError::UnexpectedHandshake(4))
        );
        assert_eq!(
            Receiver::new(true).record(HANDSHAKE, &[13, 0, 0, 0]),
            Err(RecordError::UnexpectedHandshake(13))
        );
        assert_eq!(
            Receiver::new(true).record(20, &[1]),
            Err(RecordError::UnexpectedInnerType(20))
        );
    }

    /// Issue 39, finding 11: a fragmented message of a type that will be
    /// refused is refused at its first byte, and a KeyUpdate of the wrong
    /// length at its header, not once its body arrived.
    #[test]
    fn a_refused_handshake_type_is_refused_before_its_body_is_held() {
        // A server is sent a NewSessionTicket (only a client takes one),
        // 60 KiB announced, its first byte alone in a record.
        let mut r = Receiver::new(false);
        assert_eq!(
            r.record(HANDSHAKE, &[NEW_SESSION_TICKET]),
            Err(RecordError::UnexpectedHandshake(NEW_SESSION_TICKET))
        );
        let mut r = Receiver::new(true);
        assert_eq!(
            r.record(HANDSHAKE, &[13, 0, 0xf0]),
            Err(RecordError::UnexpectedHandshake(13))
        );
        let mut r = Receiver::new(true);
        assert_eq!(
            r.record(HANDSHAKE, &[KEY_UPDATE, 0, 0xf0, 0, 1, 1]),
            Err(RecordError::BadKeyUpdate)
        );
        // A KeyUpdate split across records is still taken.
        let mut r = Receiver::new(true);
        assert_eq!(
            r.record(HANDSHAKE, &[KEY_UPDATE, 0]),
            Ok(Inbound::Messages(vec![]))
        );
        assert_eq!(r.held(), 2);
    }

    #[test]
    fn a_lying_handshake_length_is_refused_before_it_is_held() {
        let mut r = Receiver::new(true);
        assert_eq!(
            r.record(HANDSHAKE, &[4, 0xff, 0xff, 0xff, 1]),
            Err(RecordError::HandshakeTooLarge { len: 0xff_ffff })
        );
        // At the limit the parts are held, one record's worth at a time.
        let mut r = Receiver::new(true);
        let len = MAX_HANDSHAKE_MESSAGE;
        let l = (len as u32).to_be_bytes();
        let mut msg = vec![NEW_SESSION_TICKET, l[1], l[2], l[3]];
        msg.resize(4 + len, 1);
        let mut got = Vec::new();
        for chunk in msg.chunks(MAX_PLAINTEXT) {
            if let Inbound::Messages(m) = r.record(HANDSHAKE, chunk).unwrap() {
                got.extend(m);
            }
            assert!(r.held() <= MAX_HANDSHAKE_MESSAGE + 4);
        }
        assert_eq!(got.len(), 1);
    }

    #[test]
    fn alerts() {
        assert_eq!(alert(&[1, 0]), Ok(Inbound::Close));
        assert_eq!(alert(&[2, 0]), Ok(Inbound::Close));
        assert_eq!(alert(&[1, 90]), Ok(Inbound::Nothing));
        let e = alert(&[2, 20]).unwrap_err();
        assert_eq!(e.to_string(), "peer sent TLS alert bad_record_mac (20)");
        assert_eq!(alert(&[1]), Err(RecordError::BadAlert(1)));
        assert_eq!(alert_message(CLOSE_NOTIFY), [1, 0]);
        assert_eq!(alert_message(BAD_RECORD_MAC), [2, 20]);
    }

    /// A ClientHello as a client writes it, with `versions` in its
    /// supported_versions extension (none: no such extension).
    fn client_hello(versions: Option<&[u16]>) -> Vec<u8> {
        let mut body = vec![3, 3];
        body.extend([7u8; 32]);
        body.extend([0]); // session id
        body.extend([0, 2, 0x13, 0x01]); // suites
        body.extend([1, 0]); // compression
        let mut exts = vec![0, 10, 0, 4, 0, 2, 0, 29]; // supported_groups
        if let Some(v) = versions {
            exts.extend([0, 43, 0, (1 + 2 * v.len()) as u8, (2 * v.len()) as u8]);
            for x in v {
                exts.extend(x.to_be_bytes());
            }
        }
        body.extend((exts.len() as u16).to_be_bytes());
        body.extend(exts);
        let mut msg = vec![1, 0, 0, 0];
        msg[3] = body.len() as u8;
        msg.extend(body);
        let mut rec = vec![HANDSHAKE, 3, 1, 0, msg.len() as u8];
        rec.extend(msg);
        rec
    }

    #[test]
    fn client_hello_versions() {
        let tls13 = client_hello(Some(&[0x0304, 0x0303]));
        assert_eq!(client_hello_offers_tls13(&tls13), Some(true));
        for cut in [0, 3, 5, tls13.len() - 1] {
            assert_eq!(client_hello_offers_tls13(&tls13[..cut]), None, "cut {cut}");
        }
        assert_eq!(
            client_hello_offers_tls13(&client_hello(Some(&[0x0303]))),
            Some(false)
        );
        assert_eq!(client_hello_offers_tls13(&client_hello(None)), Some(false));
        assert_eq!(client_hello_offers_tls13(b"GET / HTTP/1.1"), Some(false));
        let mut lying = tls13.clone();
        lying[8] = 0xff; // the message claims more than the record holds
        assert_eq!(client_hello_offers_tls13(&lying), Some(false));
    }
}
