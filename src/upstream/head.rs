//! An upstream request head. HTTP/1.1 writes it straight to bytes with the body;
//! only an HTTP/2 connection needs Pingora's `RequestHeader`. Names and values are
//! checked as HTTP tokens and field values: a line break never reaches the wire.

use pingora::http::RequestHeader;

/// A header value of an upstream request.
pub(super) enum Val<'a> {
    Str(&'a str),
    /// `Bearer <token>`, written without formatting a string first.
    Bearer(&'a str),
    Len(usize),
}

/// An upstream request head. HTTP/1.1 writes it straight to bytes, with the body
/// (one send, no header map built and dropped per request); only an HTTP/2
/// connection needs Pingora's `RequestHeader`.
pub(super) struct Head<'a> {
    method: &'static str,
    path: &'a str,
    fields: Vec<(&'a str, Val<'a>)>,
}

impl<'a> Head<'a> {
    pub(super) fn new(method: &'static str, path: &'a str) -> Head<'a> {
        Head {
            method,
            path,
            fields: Vec::with_capacity(8),
        }
    }

    pub(super) fn field(&mut self, name: &'a str, value: Val<'a>) {
        self.fields.push((name, value));
    }

    /// The request as HTTP/1.1 bytes followed by `body` (the whole body, or none
    /// when the caller sends it beside the head); `None` when a name or value
    /// could break the framing (a credential with a line break, say).
    pub(super) fn to_h1(&self, body: &[impl AsRef<[u8]>]) -> Option<Vec<u8>> {
        if !self.path.bytes().all(|b| b.is_ascii_graphic()) {
            return None;
        }
        let len: usize = body.iter().map(|p| p.as_ref().len()).sum();
        let mut out = Vec::with_capacity(256 + len);
        out.extend_from_slice(self.method.as_bytes());
        out.push(b' ');
        out.extend_from_slice(self.path.as_bytes());
        out.extend_from_slice(b" HTTP/1.1\r\n");
        for (name, value) in &self.fields {
            if name.is_empty() || !name.bytes().all(is_token) {
                return None;
            }
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(b": ");
            match value {
                Val::Str(v) => push_value(&mut out, v)?,
                Val::Bearer(v) => {
                    out.extend_from_slice(b"Bearer ");
                    push_value(&mut out, v)?;
                }
                Val::Len(n) => out.extend_from_slice(itoa::Buffer::new().format(*n).as_bytes()),
            }
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"\r\n");
        for p in body {
            out.extend_from_slice(p.as_ref());
        }
        Some(out)
    }

    pub(super) fn to_request_header(&self) -> Option<RequestHeader> {
        let mut req = RequestHeader::build_no_case(
            self.method,
            self.path.as_bytes(),
            Some(self.fields.len()),
        )
        .ok()?;
        for (name, value) in &self.fields {
            let value = match value {
                Val::Str(v) => v.to_string(),
                Val::Bearer(v) => format!("Bearer {v}"),
                Val::Len(n) => n.to_string(),
            };
            req.insert_header(name.to_ascii_lowercase(), value).ok()?;
        }
        Some(req)
    }
}

/// RFC 9110 token characters (header names), looked up rather than searched:
/// every byte of every name is checked on every request.
pub(super) fn is_token(b: u8) -> bool {
    const TOKEN: [bool; 256] = {
        let mut t = [false; 256];
        let mut i = 0;
        while i < 256 {
            let c = i as u8;
            t[i] = c.is_ascii_alphanumeric()
                || matches!(
                    c,
                    b'!' | b'#'
                        | b'$'
                        | b'%'
                        | b'&'
                        | b'\''
                        | b'*'
                        | b'+'
                        | b'-'
                        | b'.'
                        | b'^'
                        | b'_'
                        | b'`'
                        | b'|'
                        | b'~'
                );
            i += 1;
        }
        t
    };
    TOKEN[usize::from(b)]
}

/// A field value: visible characters, spaces and tabs only.
pub(super) fn push_value(out: &mut Vec<u8>, v: &str) -> Option<()> {
    if v.bytes().any(|b| (b < 0x20 && b != b'\t') || b == 0x7f) {
        return None;
    }
    out.extend_from_slice(v.as_bytes());
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_heads_are_written_once_and_refuse_line_breaks() {
        let mut head = Head::new("POST", "/v1/chat/completions");
        head.field("Host", Val::Str("api.example.com"));
        head.field("Content-Length", Val::Len(1024));
        head.field("Authorization", Val::Bearer("sk-1"));
        assert_eq!(
            head.to_h1(&[b"{}"]).unwrap(),
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: api.example.com\r\nContent-Length: 1024\r\nAuthorization: Bearer sk-1\r\n\r\n{}"
        );
        let req = head.to_request_header().unwrap();
        assert_eq!(req.headers.get("authorization").unwrap(), "Bearer sk-1");
        assert_eq!(req.headers.get("content-length").unwrap(), "1024");
        // A secret with a line break would smuggle a header: never written.
        head.field("api-key", Val::Str("k\r\nX-Evil: 1"));
        assert!(head.to_h1(&[b""]).is_none());
        assert!(head.to_request_header().is_none());
        let mut bad_name = Head::new("POST", "/");
        bad_name.field("a b", Val::Str("x"));
        assert!(bad_name.to_h1(&[b""]).is_none());
        assert!(Head::new("POST", "/a b").to_h1(&[b""]).is_none());
    }
}
