//! Standard base64 (RFC 4648), the one codec of the formats: embedding vectors
//! asked as base64, and base64 text documents. Through the `base64` crate, which
//! the gateway already builds.

use base64::alphabet::STANDARD;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use base64::Engine;

/// Padding written; read whether there or not (providers differ).
const CODEC: GeneralPurpose = GeneralPurpose::new(
    &STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// `bytes` in base64 with padding, appended to `out`.
pub fn encode_base64(bytes: &[u8], out: &mut Vec<u8>) {
    let at = out.len();
    out.resize(at + bytes.len().div_ceil(3) * 4, 0);
    let written = CODEC.encode_slice(bytes, &mut out[at..]).unwrap_or(0);
    out.truncate(at + written);
}

/// Decodes base64 (padding optional); `None` when malformed.
pub fn decode_base64(text: &str) -> Option<Vec<u8>> {
    CODEC.decode(text).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_round_trips_with_and_without_padding() {
        for plain in ["", "f", "fo", "foo", "foobar", "\u{e9}t\u{e9}"] {
            let mut out = b"x".to_vec();
            encode_base64(plain.as_bytes(), &mut out);
            let enc = std::str::from_utf8(&out[1..]).unwrap();
            assert_eq!(enc.len() % 4, 0, "{enc}");
            assert_eq!(decode_base64(enc).unwrap(), plain.as_bytes());
            assert_eq!(
                decode_base64(enc.trim_end_matches('=')).unwrap(),
                plain.as_bytes()
            );
        }
        assert_eq!(decode_base64("Zm9vYmFy").unwrap(), b"foobar");
        assert_eq!(decode_base64("Z"), None);
        assert_eq!(decode_base64("Zm9v!"), None);
    }
}
