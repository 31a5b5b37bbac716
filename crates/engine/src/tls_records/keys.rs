//! One direction's record protection: ring's AEAD key, the iv and the
//! sequence number (RFC 8446 section 5.3), sealing and opening a record
//! in place in the buffer it lies in. The framing rules are in
//! `protocol::tls_record`; the secrets come from rustls.

use ring::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey};
use rustls::ConnectionTrafficSecrets;

use protocol::tls_record::{self as rec, RecordError, HEADER_LEN, NONCE_LEN, TAG_LEN};

#[derive(Debug, thiserror::Error)]
#[error("TLS traffic secrets for an AEAD this record layer does not implement")]
pub struct UnsupportedSuite;

pub struct RecordKey {
    key: LessSafeKey,
    iv: [u8; NONCE_LEN],
    seq: u64,
}

impl RecordKey {
    pub fn new(secrets: ConnectionTrafficSecrets, seq: u64) -> Result<Self, UnsupportedSuite> {
        let (alg, key, iv) = match secrets {
            ConnectionTrafficSecrets::Aes128Gcm { key, iv } => (&aead::AES_128_GCM, key, iv),
            ConnectionTrafficSecrets::Aes256Gcm { key, iv } => (&aead::AES_256_GCM, key, iv),
            ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => {
                (&aead::CHACHA20_POLY1305, key, iv)
            }
            _ => return Err(UnsupportedSuite),
        };
        let key = UnboundKey::new(alg, key.as_ref()).map_err(|_| UnsupportedSuite)?;
        let iv: [u8; NONCE_LEN] = iv.as_ref().try_into().map_err(|_| UnsupportedSuite)?;
        Ok(RecordKey {
            key: LessSafeKey::new(key),
            iv,
            seq,
        })
    }

    /// Records sealed or opened with this key.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// Seals the record that starts at `start` of `buf`: a header's room,
    /// then the inner plaintext (content and content type) up to the end;
    /// writes the header and appends the tag.
    pub fn seal(&mut self, buf: &mut bytes::BytesMut, start: usize) {
        let inner = buf.len() - start - HEADER_LEN;
        let header = rec::header(inner + TAG_LEN);
        buf[start..start + HEADER_LEN].copy_from_slice(&header);
        let nonce = Nonce::assume_unique_for_key(rec::nonce(&self.iv, self.seq));
        self.seq += 1;
        let tag = self
            .key
            .seal_in_place_separate_tag(nonce, Aad::from(header), &mut buf[start + HEADER_LEN..])
            .expect("a record within the limits seals");
        buf.extend_from_slice(tag.as_ref());
    }

    /// Opens a whole record (header included) in place; returns the
    /// length of its inner plaintext, which now starts at `HEADER_LEN`.
    pub fn open(&mut self, record: &mut [u8]) -> Result<usize, RecordError> {
        let (header, body) = record.split_at_mut(HEADER_LEN);
        let aad: [u8; HEADER_LEN] = (&*header).try_into().expect("a header's length");
        let nonce = Nonce::assume_unique_for_key(rec::nonce(&self.iv, self.seq));
        let plain = self
            .key
            .open_in_place(nonce, Aad::from(aad), body)
            .map_err(|_| RecordError::BadRecordMac)?;
        self.seq += 1;
        Ok(plain.len())
    }
}
