//! `x-request-id`: a client's own id is kept (when it is a sane token), else one
//! is made; either way the request header carries it for every step that logs,
//! and every answer the gateway writes (errors, streams, replays, `/api`) carries
//! it back. A Pingora downstream module, so no answer path can forget it.

use async_trait::async_trait;
use http::HeaderValue;
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::modules::http::{HttpModule, HttpModuleBuilder, Module};
use std::any::Any;

pub const HEADER: &str = "x-request-id";

/// The longest client id kept; a longer or odd one is replaced (it would go into
/// logs and traces as sent).
const MAX_LEN: usize = 128;

/// Registers the module on the gateway's downstream sessions.
pub struct RequestIds;

impl HttpModuleBuilder for RequestIds {
    fn init(&self) -> Module {
        Box::new(RequestId(None))
    }
}

struct RequestId(Option<HeaderValue>);

/// Whether a client's id may be kept: letters, digits and `-_.:`.
fn acceptable(v: &HeaderValue) -> bool {
    let b = v.as_bytes();
    !b.is_empty()
        && b.len() <= MAX_LEN
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.' | b':'))
}

/// A fresh id: 128 random bits in hex.
pub fn generate() -> HeaderValue {
    let mut out = [0u8; 32];
    super::context::hex_into(&rand::random::<[u8; 16]>(), &mut out);
    HeaderValue::from_bytes(&out).unwrap_or(HeaderValue::from_static("unknown"))
}

#[async_trait]
impl HttpModule for RequestId {
    async fn request_header_filter(&mut self, req: &mut RequestHeader) -> pingora::Result<()> {
        let id = match req.headers.get(HEADER) {
            Some(v) if acceptable(v) => v.clone(),
            _ => {
                let v = generate();
                req.insert_header(HEADER, v.clone())?;
                v
            }
        };
        self.0 = Some(id);
        Ok(())
    }

    async fn response_header_filter(
        &mut self,
        resp: &mut ResponseHeader,
        _end_of_stream: bool,
    ) -> pingora::Result<()> {
        if let Some(id) = &self.0 {
            resp.insert_header(HEADER, id.clone())?;
        }
        Ok(())
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_sane_client_ids_are_kept() {
        assert!(acceptable(&HeaderValue::from_static("req-42_a.b:c")));
        assert!(!acceptable(&HeaderValue::from_static("has space")));
        assert!(!acceptable(&HeaderValue::from_static("{\"json\":1}")));
        let long = "a".repeat(MAX_LEN + 1);
        assert!(!acceptable(&HeaderValue::from_str(&long).unwrap()));
        let g = generate();
        assert_eq!(g.len(), 32);
        assert!(acceptable(&g));
    }
}
