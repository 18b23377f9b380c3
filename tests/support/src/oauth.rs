//! The mock's OAuth 2.0 token endpoint, `POST /token`, standing in for Google's
//! `https://oauth2.googleapis.com/token` in Vertex tests (point a service account's
//! `token_uri` at `{base_url}/token`).
//!
//! It takes the JWT-bearer grant (RFC 7523) as a form body, checks the grant type and
//! that the assertion is a three-part JWT (RS256 header; claims with `iss`, `iat`,
//! `exp` and the cloud-platform `scope`) but not its signature (the mock knows no
//! key), and answers `{"access_token":"mock-token-<n>","expires_in":3600,
//! "token_type":"Bearer"}`, `n` counting the token requests served (since the last
//! [`crate::Mock::clear`]). A refused request gets Google's error shape,
//! `{"error":"invalid_grant","error_description":"..."}` with status 400.
//!
//! Requests are recorded like the others and scripted under the key [`SCRIPT_KEY`]:
//! `mock.script(sluice_mock::oauth::SCRIPT_KEY, vec![Step::Status(500)])`, and
//! `mock.count(SCRIPT_KEY)` is the number of token requests. Steps that apply:
//! `Status`, `CloseConnection`, `DelayHeaders` / `DelayFirstToken`; the others answer
//! normally.

use axum::{
    extract::{Request, State},
    http::StatusCode,
    response::{IntoResponse, Response},
    Json,
};
use bytes::Bytes;
use serde_json::{json, Value};

use crate::{
    handlers::Shared,
    sse::{self, Item},
    Step,
};

/// The script and count key of token requests.
pub const SCRIPT_KEY: &str = "oauth-token";

/// The scope an assertion must ask for.
pub const SCOPE: &str = "https://www.googleapis.com/auth/cloud-platform";

const JWT_BEARER_GRANT: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";

/// Largest token request body read (a real one is about 1 KiB).
const BODY_LIMIT: usize = 64 << 10;

pub(crate) async fn token(State(m): Shared, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let body = axum::body::to_bytes(body, BODY_LIMIT)
        .await
        .unwrap_or_default();
    let step = m.admit(&parts, &body, Some(SCRIPT_KEY));
    // Two concurrent requests may read the same count; tests of concurrency
    // should count requests, not compare token names.
    let n = m.lock().counts.get(SCRIPT_KEY).copied().unwrap_or(0);
    match step {
        Step::Status(code) => {
            return oauth_error(code, "server_error", &format!("scripted status {code}"))
        }
        Step::CloseConnection => {
            return Response::new(sse::body(vec![Item::Fail]));
        }
        Step::DelayHeaders(d) | Step::DelayFirstToken(d) => tokio::time::sleep(d).await,
        _ => {}
    }
    if let Err((error, description)) = check(&body) {
        return oauth_error(400, error, &description);
    }
    Json(json!({
        "access_token": format!("mock-token-{n}"),
        "expires_in": 3600,
        "token_type": "Bearer",
    }))
    .into_response()
}

fn oauth_error(status: u16, error: &str, description: &str) -> Response {
    let code = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let body = json!({"error": error, "error_description": description});
    (code, Json(body)).into_response()
}

/// Checks a token request body: `Err((oauth error code, description))`.
fn check(body: &Bytes) -> Result<(), (&'static str, String)> {
    let form = parse_form(body);
    let field = |name: &str| {
        form.iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    match field("grant_type") {
        Some(JWT_BEARER_GRANT) => {}
        Some(other) => {
            return Err((
                "unsupported_grant_type",
                format!("Invalid grant_type: {other}"),
            ))
        }
        None => {
            return Err((
                "invalid_request",
                "Missing required parameter: grant_type".into(),
            ))
        }
    }
    let assertion = field("assertion").ok_or((
        "invalid_request",
        "Missing required parameter: assertion".to_owned(),
    ))?;
    check_jwt(assertion).map_err(|why| ("invalid_grant", why))
}

fn check_jwt(jwt: &str) -> Result<(), String> {
    let parts: Vec<&str> = jwt.split('.').collect();
    let [header, claims, signature] = parts[..] else {
        return Err(format!(
            "Invalid JWT: {} parts, expected three",
            parts.len()
        ));
    };
    let header = decode_json(header).ok_or("Invalid JWT: the header is not base64url JSON")?;
    let claims = decode_json(claims).ok_or("Invalid JWT: the claims are not base64url JSON")?;
    if header.get("alg").and_then(Value::as_str) != Some("RS256") {
        return Err("Invalid JWT: alg must be RS256".into());
    }
    if base64url_decode(signature).is_none_or(|s| s.is_empty()) {
        return Err("Invalid JWT: no signature".into());
    }
    let scope = claims.get("scope").and_then(Value::as_str).unwrap_or("");
    if !scope.split(' ').any(|s| s == SCOPE) {
        return Err(format!("Invalid JWT: scope must include {SCOPE}"));
    }
    if claims
        .get("iss")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
    {
        return Err("Invalid JWT: no iss".into());
    }
    let iat = claims.get("iat").and_then(Value::as_u64);
    let exp = claims.get("exp").and_then(Value::as_u64);
    match (iat, exp) {
        (Some(iat), Some(exp)) if exp > iat && exp - iat <= 3600 => Ok(()),
        _ => Err("Invalid JWT: iat and exp must be set, exp within an hour of iat".into()),
    }
}

fn decode_json(part: &str) -> Option<Value> {
    serde_json::from_slice(&base64url_decode(part)?).ok()
}

/// Unpadded (or padded) base64url, as JWTs use it.
fn base64url_decode(s: &str) -> Option<Vec<u8>> {
    let s = s.trim_end_matches('=');
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in s.bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'-' => 62,
            b'_' => 63,
            _ => return None,
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}

/// `application/x-www-form-urlencoded` pairs, decoded.
fn parse_form(body: &[u8]) -> Vec<(String, String)> {
    body.split(|&b| b == b'&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = match kv.iter().position(|&b| b == b'=') {
                Some(i) => (&kv[..i], &kv[i + 1..]),
                None => (kv, &[][..]),
            };
            (form_decode(k), form_decode(v))
        })
        .collect()
}

fn form_decode(s: &[u8]) -> String {
    let hex = |b: u8| char::from(b).to_digit(16);
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        match s[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < s.len() => match (hex(s[i + 1]), hex(s[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push((h * 16 + l) as u8);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Mock;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn b64url(data: &[u8]) -> String {
        const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
        let mut out = String::new();
        for chunk in data.chunks(3) {
            let n = chunk
                .iter()
                .enumerate()
                .fold(0u32, |acc, (i, &b)| acc | (u32::from(b) << (16 - 8 * i)));
            for i in 0..=chunk.len() {
                out.push(char::from(ABC[((n >> (18 - 6 * i)) & 63) as usize]));
            }
        }
        out
    }

    fn jwt(claims: Value) -> String {
        let header = json!({"alg": "RS256", "typ": "JWT"});
        format!(
            "{}.{}.{}",
            b64url(header.to_string().as_bytes()),
            b64url(claims.to_string().as_bytes()),
            b64url(&[7u8; 256])
        )
    }

    fn good_claims() -> Value {
        json!({"iss": "sa@p.iam.gserviceaccount.com", "scope": SCOPE,
               "aud": "http://127.0.0.1/token", "iat": 1000, "exp": 4600})
    }

    fn form(assertion: &str) -> String {
        format!("grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer&assertion={assertion}")
    }

    #[test]
    fn base64url_round_trip() {
        for s in [
            "",
            "f",
            "fo",
            "foo",
            "foob",
            "fooba",
            "foobar",
            "{\"a\":\"é\"}",
        ] {
            assert_eq!(
                base64url_decode(&b64url(s.as_bytes())).unwrap(),
                s.as_bytes()
            );
        }
        assert_eq!(base64url_decode("Zm9v").unwrap(), b"foo");
        assert_eq!(base64url_decode("Zg==").unwrap(), b"f");
        assert!(base64url_decode("Zm9v!").is_none());
    }

    #[test]
    fn form_decoding() {
        assert_eq!(
            parse_form(b"a=b+c&d=%3A%2f&e&bad=%zz%4"),
            vec![
                ("a".into(), "b c".into()),
                ("d".into(), ":/".into()),
                ("e".into(), String::new()),
                ("bad".into(), "%zz%4".into()),
            ]
        );
    }

    #[test]
    fn checks() {
        assert_eq!(check(&Bytes::from(form(&jwt(good_claims())))), Ok(()));
        let refused = |body: String| check(&Bytes::from(body)).unwrap_err();
        assert_eq!(
            refused("grant_type=password".into()).0,
            "unsupported_grant_type"
        );
        assert_eq!(refused("assertion=x".into()).0, "invalid_request");
        assert_eq!(refused(form("a.b")).0, "invalid_grant");
        let mut c = good_claims();
        c["scope"] = json!("https://www.googleapis.com/auth/devstorage.read_only");
        assert!(refused(form(&jwt(c))).1.contains("scope"));
        let mut c = good_claims();
        c["exp"] = json!(900);
        assert_eq!(refused(form(&jwt(c))).0, "invalid_grant");
        let mut c = good_claims();
        c.as_object_mut().unwrap().remove("iss");
        assert!(refused(form(&jwt(c))).1.contains("iss"));
    }

    async fn post(mock: &Mock, body: &str) -> (u16, Value) {
        let mut s = tokio::net::TcpStream::connect(mock.addr()).await.unwrap();
        let req = format!(
            "POST /token HTTP/1.1\r\nhost: x\r\ncontent-type: application/x-www-form-urlencoded\r\n\
             content-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        s.write_all(req.as_bytes()).await.unwrap();
        let mut raw = Vec::new();
        let _ = s.read_to_end(&mut raw).await;
        let text = String::from_utf8_lossy(&raw).into_owned();
        let status = text[9..12].parse().unwrap();
        let json = text
            .split_once("\r\n\r\n")
            .and_then(|(_, b)| serde_json::from_str(b).ok())
            .unwrap_or(Value::Null);
        (status, json)
    }

    #[tokio::test]
    async fn token_endpoint() {
        let mock = Mock::start().await;
        let good = form(&jwt(good_claims()));
        let (status, body) = post(&mock, &good).await;
        assert_eq!(status, 200);
        assert_eq!(
            body,
            json!({"access_token": "mock-token-1", "expires_in": 3600, "token_type": "Bearer"})
        );
        assert_eq!(post(&mock, &good).await.1["access_token"], "mock-token-2");

        let (status, body) = post(&mock, "grant_type=client_credentials").await;
        assert_eq!(status, 400);
        assert_eq!(body["error"], "unsupported_grant_type");

        mock.script(SCRIPT_KEY, vec![Step::Status(503)]);
        let (status, body) = post(&mock, &good).await;
        assert_eq!(status, 503);
        assert_eq!(body["error"], "server_error");

        assert_eq!(mock.count(SCRIPT_KEY), 4);
        let recorded = mock.requests_for(SCRIPT_KEY);
        assert_eq!(recorded.len(), 4);
        assert_eq!(recorded[0].path, "/token");
        assert_eq!(recorded[0].body_str(), good);
        mock.shutdown();
    }
}
