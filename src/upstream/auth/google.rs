//! Google Cloud access tokens for Vertex AI from a service-account key: the key file
//! (the `GOOGLE_APPLICATION_CREDENTIALS` convention, or the JSON itself), the signed
//! JWT assertion of the OAuth 2.0 JWT-bearer grant (RFC 7523), the token endpoint's
//! request and answer, a cache that hands out the token until shortly before it
//! expires, and Vertex's hosts and paths.
//!
//! No I/O but reading the key file: the caller POSTs [`token_request_body`] to
//! [`ServiceAccount::token_uri`] with `content-type: application/x-www-form-urlencoded`
//! and gives the answer to [`parse_token_response`].

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine;
use ring::rand::SystemRandom;
use ring::signature::{RsaKeyPair, RSA_PKCS1_SHA256};
use serde_json::{json, Value};
use std::fmt;
use std::path::Path;
use std::sync::{Arc, Mutex};

/// The OAuth scope that covers Vertex AI.
pub const SCOPE: &str = "https://www.googleapis.com/auth/cloud-platform";

/// Google's token endpoint, when the key file does not name one.
pub const DEFAULT_TOKEN_URI: &str = "https://oauth2.googleapis.com/token";

/// Lifetime of an assertion (Google accepts at most one hour).
const ASSERTION_TTL_SECS: u64 = 3600;

/// A token is refreshed this long before it expires (at most half its lifetime).
pub const REFRESH_MARGIN_SECS: u64 = 300;

const JWT_BEARER_GRANT: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";

/// A service-account key, its private key parsed (and so checked) at load.
#[derive(Clone)]
pub struct ServiceAccount {
    pub client_email: String,
    /// Where the assertion is exchanged for an access token.
    pub token_uri: String,
    pub project_id: String,
    /// The key's id, sent as the JWT's `kid` so Google need not try every key.
    pub private_key_id: Option<String>,
    key: Arc<RsaKeyPair>,
}

impl ServiceAccount {
    /// Reads `GOOGLE_APPLICATION_CREDENTIALS` (see [`ServiceAccount::load`]):
    /// `Ok(None)` when it is unset or empty.
    pub fn from_env() -> Result<Option<ServiceAccount>, String> {
        match std::env::var("GOOGLE_APPLICATION_CREDENTIALS") {
            Ok(v) if !v.trim().is_empty() => ServiceAccount::load(&v)
                .map(Some)
                .map_err(|e| format!("GOOGLE_APPLICATION_CREDENTIALS: {e}")),
            _ => Ok(None),
        }
    }

    /// A key given the way `GOOGLE_APPLICATION_CREDENTIALS` gives it: the path of the
    /// JSON key file, or (when it starts with `{`) the JSON itself.
    pub fn load(value: &str) -> Result<ServiceAccount, String> {
        let value = value.trim();
        if value.starts_with('{') {
            ServiceAccount::from_json(value)
        } else {
            ServiceAccount::from_file(Path::new(value))
        }
    }

    /// Reads a JSON key file.
    pub fn from_file(path: &Path) -> Result<ServiceAccount, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read service-account key {}: {e}", path.display()))?;
        ServiceAccount::from_json(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Parses the JSON of a service-account key (as the Cloud console downloads it).
    /// Errors never quote the key's contents.
    pub fn from_json(text: &str) -> Result<ServiceAccount, String> {
        // Syntax errors only give the position: serde's messages may quote values.
        let v: Value = serde_json::from_str(text).map_err(|e| {
            format!(
                "service-account key is not valid JSON (line {}, column {})",
                e.line(),
                e.column()
            )
        })?;
        let field = |name: &str| -> Result<Option<String>, String> {
            match v.get(name) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) if s.trim().is_empty() => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.trim().to_string())),
                Some(_) => Err(format!("service-account key: `{name}` is not a string")),
            }
        };
        let required = |name: &str| {
            field(name)?.ok_or_else(|| format!("service-account key: `{name}` is missing"))
        };
        if let Some(kind) = field("type")? {
            if kind != "service_account" {
                return Err(format!(
                    "credentials of type `{kind}` are not supported: a service-account key \
                     (type `service_account`) is needed"
                ));
            }
        }
        let key = parse_private_key(&required("private_key")?)?;
        Ok(ServiceAccount {
            client_email: required("client_email")?,
            token_uri: field("token_uri")?.unwrap_or_else(|| DEFAULT_TOKEN_URI.to_string()),
            project_id: required("project_id")?,
            private_key_id: field("private_key_id")?,
            key: Arc::new(key),
        })
    }
}

impl fmt::Debug for ServiceAccount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServiceAccount")
            .field("client_email", &self.client_email)
            .field("token_uri", &self.token_uri)
            .field("project_id", &self.project_id)
            .field("private_key_id", &self.private_key_id)
            .field("private_key", &"<redacted>")
            .finish()
    }
}

/// An RSA private key from PEM: PKCS#8 (`BEGIN PRIVATE KEY`, what Google issues) or
/// PKCS#1 (`BEGIN RSA PRIVATE KEY`). Tolerates `\n` left escaped by a shell or a
/// secrets store.
fn parse_private_key(pem: &str) -> Result<RsaKeyPair, String> {
    let pem = pem.replace("\\n", "\n");
    let begin = pem
        .find("-----BEGIN ")
        .ok_or("private_key: no PEM `-----BEGIN` line")?;
    let after = &pem[begin + "-----BEGIN ".len()..];
    let label_end = after
        .find("-----")
        .ok_or("private_key: malformed PEM header")?;
    let label = &after[..label_end];
    let body_and_rest = &after[label_end + "-----".len()..];
    let end_marker = format!("-----END {label}-----");
    let body_end = body_and_rest
        .find(&end_marker)
        .ok_or_else(|| format!("private_key: no `{end_marker}` line"))?;
    let b64: String = body_and_rest[..body_end]
        .chars()
        .filter(|c| !c.is_ascii_whitespace())
        .collect();
    let der = STANDARD
        .decode(b64.as_bytes())
        .map_err(|_| format!("private_key: the {label} PEM body is not valid base64"))?;
    let key = match label {
        "PRIVATE KEY" => RsaKeyPair::from_pkcs8(&der),
        "RSA PRIVATE KEY" => RsaKeyPair::from_der(&der),
        other => {
            return Err(format!(
                "private_key: a PEM `PRIVATE KEY` (PKCS#8) is needed, not `{other}`"
            ))
        }
    };
    key.map_err(|e| format!("private_key: not a usable RSA key ({e})"))
}

/// The signed JWT (RS256) that asks `sa.token_uri` for an access token with [`SCOPE`],
/// valid from `now_unix` (seconds since the Unix epoch) for one hour.
pub fn assertion(sa: &ServiceAccount, now_unix: u64) -> Result<String, String> {
    let mut header = json!({"alg": "RS256", "typ": "JWT"});
    if let Some(kid) = &sa.private_key_id {
        header["kid"] = Value::String(kid.clone());
    }
    let claims = json!({
        "iss": sa.client_email,
        "scope": SCOPE,
        "aud": sa.token_uri,
        "iat": now_unix,
        "exp": now_unix + ASSERTION_TTL_SECS,
    });
    let mut jwt = String::with_capacity(1024);
    jwt.push_str(&URL_SAFE_NO_PAD.encode(header.to_string()));
    jwt.push('.');
    jwt.push_str(&URL_SAFE_NO_PAD.encode(claims.to_string()));
    let mut sig = vec![0u8; sa.key.public().modulus_len()];
    sa.key
        .sign(
            &RSA_PKCS1_SHA256,
            &SystemRandom::new(),
            jwt.as_bytes(),
            &mut sig,
        )
        .map_err(|_| format!("RS256 signing failed for {}", sa.client_email))?;
    jwt.push('.');
    jwt.push_str(&URL_SAFE_NO_PAD.encode(&sig));
    Ok(jwt)
}

/// The form body (`application/x-www-form-urlencoded`) that trades an assertion for
/// an access token.
pub fn token_request_body(assertion: &str) -> String {
    format!(
        "grant_type={}&assertion={}",
        form_encode(JWT_BEARER_GRANT),
        form_encode(assertion)
    )
}

/// `application/x-www-form-urlencoded` encoding of one value. A JWT is all
/// unreserved characters and passes unchanged.
fn form_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 16);
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'*' => {
                out.push(char::from(b))
            }
            b' ' => out.push('+'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// The access token and its lifetime in seconds (`expires_in`, 3600 when absent) from
/// the token endpoint's JSON answer; its OAuth error (`error`, `error_description`)
/// otherwise.
pub fn parse_token_response(body: &[u8]) -> Result<(String, u64), String> {
    let v: Value = serde_json::from_slice(body).map_err(|_| {
        format!(
            "token endpoint answered something other than JSON ({} bytes)",
            body.len()
        )
    })?;
    if let Some(err) = v.get("error") {
        let code = err.as_str().unwrap_or("unknown error");
        let detail = v
            .get("error_description")
            .and_then(Value::as_str)
            .unwrap_or("");
        return Err(format!("token endpoint refused: {code} {detail}")
            .trim_end()
            .to_string());
    }
    let token = v
        .get("access_token")
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty())
        .ok_or("token endpoint answer has no access_token")?;
    let expires_in = match v.get("expires_in") {
        None | Some(Value::Null) => ASSERTION_TTL_SECS,
        Some(Value::Number(n)) => n
            .as_u64()
            .ok_or("token endpoint answer: expires_in is not a whole number of seconds")?,
        // Some proxies send it as a string.
        Some(Value::String(s)) => s
            .parse()
            .map_err(|_| "token endpoint answer: expires_in is not a number")?,
        Some(_) => return Err("token endpoint answer: expires_in is not a number".into()),
    };
    Ok((token.to_string(), expires_in))
}

/// The current access token of one service account, shared by every request.
///
/// Times are seconds since the Unix epoch. A token is handed out until
/// [`REFRESH_MARGIN_SECS`] before it expires (or half its lifetime, if shorter), so a
/// request never leaves with a token that dies on the way. The lock is held only to
/// copy the token out.
#[derive(Default)]
pub struct TokenCache {
    slot: Mutex<Option<Cached>>,
}

struct Cached {
    token: String,
    /// From this time on, `get` answers `None`.
    refresh_at: u64,
}

impl TokenCache {
    pub fn new() -> TokenCache {
        TokenCache::default()
    }

    /// The token, while it is fresh.
    pub fn get(&self, now: u64) -> Option<String> {
        let slot = self.slot.lock().unwrap_or_else(|e| e.into_inner());
        slot.as_ref()
            .filter(|c| now < c.refresh_at)
            .map(|c| c.token.clone())
    }

    /// Stores a token the endpoint issued at `now`, valid for `expires_in` seconds.
    pub fn put(&self, token: String, expires_in: u64, now: u64) {
        let margin = REFRESH_MARGIN_SECS.min(expires_in / 2);
        let refresh_at = now.saturating_add(expires_in - margin);
        *self.slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(Cached { token, refresh_at });
    }

    /// Forgets the token (say after the provider answered 401 to it).
    pub fn clear(&self) {
        *self.slot.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

impl fmt::Debug for TokenCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let slot = self.slot.lock().unwrap_or_else(|e| e.into_inner());
        f.debug_struct("TokenCache")
            .field("token", &slot.as_ref().map(|_| "<redacted>"))
            .field("refresh_at", &slot.as_ref().map(|c| c.refresh_at))
            .finish()
    }
}

/// The Vertex region a host serves: `us-central1-aiplatform.googleapis.com` gives
/// `us-central1`; `aiplatform.googleapis.com` and any other host (a proxy, the mock
/// provider) give `global`.
pub fn region_from_host(host: &str) -> String {
    let host = host.to_ascii_lowercase();
    let host = host.split(':').next().unwrap_or(&host);
    host.strip_suffix("-aiplatform.googleapis.com")
        .filter(|r| {
            !r.is_empty()
                && r.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        })
        .unwrap_or("global")
        .to_string()
}

/// The path of a Vertex model method:
/// `/v1/projects/{project}/locations/{region}/publishers/{publisher}/models/{model}:{method}`.
/// Publisher `google` (Gemini: `generateContent`, `streamGenerateContent` with `?alt=sse`
/// appended by the caller) or `anthropic` (`rawPredict`, `streamRawPredict`).
pub fn vertex_path(
    project: &str,
    region: &str,
    publisher: &str,
    model: &str,
    method: &str,
) -> String {
    format!(
        "/v1/projects/{project}/locations/{region}/publishers/{publisher}/models/{model}:{method}"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use ring::signature::{UnparsedPublicKey, RSA_PKCS1_2048_8192_SHA256};

    const FIXTURE: &str = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/vertex-test-sa.json"
    );

    fn sa() -> ServiceAccount {
        ServiceAccount::from_file(Path::new(FIXTURE)).unwrap()
    }

    fn decode_json(part: &str) -> Value {
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(part).unwrap()).unwrap()
    }

    #[test]
    fn loads_from_path_and_inline_json() {
        let from_path = ServiceAccount::load(FIXTURE).unwrap();
        assert_eq!(
            from_path.client_email,
            "sluice-test@sluice-test-project.iam.gserviceaccount.com"
        );
        assert_eq!(from_path.project_id, "sluice-test-project");
        assert_eq!(from_path.token_uri, "https://oauth2.googleapis.com/token");
        let text = std::fs::read_to_string(FIXTURE).unwrap();
        let inline = ServiceAccount::load(&format!("  {text}")).unwrap();
        assert_eq!(inline.client_email, from_path.client_email);
        assert_eq!(
            inline.key.public().as_ref(),
            from_path.key.public().as_ref()
        );
    }

    #[test]
    fn assertion_is_a_verifiable_rs256_jwt() {
        let sa = sa();
        let now = 1_700_000_000;
        let jwt = assertion(&sa, now).unwrap();
        let parts: Vec<&str> = jwt.split('.').collect();
        assert_eq!(parts.len(), 3);

        let header = decode_json(parts[0]);
        assert_eq!(header["alg"], "RS256");
        assert_eq!(header["typ"], "JWT");
        assert_eq!(header["kid"], "0123456789abcdef0123456789abcdef01234567");
        let claims = decode_json(parts[1]);
        assert_eq!(
            claims,
            json!({
                "iss": "sluice-test@sluice-test-project.iam.gserviceaccount.com",
                "scope": "https://www.googleapis.com/auth/cloud-platform",
                "aud": "https://oauth2.googleapis.com/token",
                "iat": 1_700_000_000u64,
                "exp": 1_700_003_600u64,
            })
        );

        let sig = URL_SAFE_NO_PAD.decode(parts[2]).unwrap();
        assert_eq!(sig.len(), 256);
        let public = UnparsedPublicKey::new(&RSA_PKCS1_2048_8192_SHA256, sa.key.public().as_ref());
        let signed = format!("{}.{}", parts[0], parts[1]);
        public.verify(signed.as_bytes(), &sig).unwrap();

        // Another payload under the same signature does not verify.
        let mut forged = decode_json(parts[1]);
        forged["scope"] = json!("https://www.googleapis.com/auth/everything");
        let forged = format!(
            "{}.{}",
            parts[0],
            URL_SAFE_NO_PAD.encode(forged.to_string())
        );
        assert!(public.verify(forged.as_bytes(), &sig).is_err());
    }

    #[test]
    fn pkcs1_and_escaped_newlines_are_accepted() {
        let text = std::fs::read_to_string(FIXTURE).unwrap();
        let v: Value = serde_json::from_str(&text).unwrap();
        let pem = v["private_key"].as_str().unwrap();
        let want = sa().key.public().as_ref().to_vec();

        // A key whose newlines a secrets store left as the two characters `\n`.
        let escaped = pem.replace('\n', "\\n");
        let key = parse_private_key(&escaped).unwrap();
        assert_eq!(key.public().as_ref(), want);

        // The same key as PKCS#1: the OCTET STRING inside the PKCS#8 wrapper
        // (SEQUENCE, version, rsaEncryption AlgorithmIdentifier, OCTET STRING).
        let b64: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
        let der = STANDARD.decode(b64).unwrap();
        assert_eq!(der[22..24], [0x04, 0x82], "2048-bit PKCS#8 layout");
        let pkcs1 = STANDARD.encode(&der[26..]);
        let pkcs1 =
            format!("-----BEGIN RSA PRIVATE KEY-----\n{pkcs1}\n-----END RSA PRIVATE KEY-----\n");
        let key = parse_private_key(&pkcs1).unwrap();
        assert_eq!(key.public().as_ref(), want);
    }

    #[test]
    fn bad_keys_are_refused_without_quoting_them() {
        let text = std::fs::read_to_string(FIXTURE).unwrap();
        let mut v: Value = serde_json::from_str(&text).unwrap();
        let pem = v["private_key"].as_str().unwrap().to_string();

        let mut truncated = v.clone();
        truncated["private_key"] = json!(pem.replacen("MII", "MIA", 1));
        let e = ServiceAccount::from_json(&truncated.to_string()).unwrap_err();
        assert!(e.starts_with("private_key: not a usable RSA key"), "{e}");
        assert!(!e.contains("MIA"), "{e}");

        let mut cert = v.clone();
        cert["private_key"] =
            json!("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n");
        let e = ServiceAccount::from_json(&cert.to_string()).unwrap_err();
        assert!(e.contains("not `CERTIFICATE`"), "{e}");

        let mut user = v.clone();
        user["type"] = json!("authorized_user");
        let e = ServiceAccount::from_json(&user.to_string()).unwrap_err();
        assert!(e.contains("`authorized_user` are not supported"), "{e}");

        v.as_object_mut().unwrap().remove("client_email");
        let e = ServiceAccount::from_json(&v.to_string()).unwrap_err();
        assert_eq!(e, "service-account key: `client_email` is missing");

        let e = ServiceAccount::from_json(&text[..text.len() / 2]).unwrap_err();
        assert!(
            e.starts_with("service-account key is not valid JSON"),
            "{e}"
        );
        assert!(!e.contains("BEGIN"), "{e}");

        let e = ServiceAccount::load("/nonexistent/sa.json").unwrap_err();
        assert!(e.contains("/nonexistent/sa.json"), "{e}");
    }

    #[test]
    fn debug_hides_the_key() {
        let shown = format!("{:?}", sa());
        assert!(shown.contains("sluice-test@"), "{shown}");
        assert!(
            !shown.contains("MII") && !shown.contains("PRIVATE"),
            "{shown}"
        );
        let cache = TokenCache::new();
        cache.put("ya29.secret".into(), 3600, 0);
        let shown = format!("{cache:?}");
        assert!(!shown.contains("ya29"), "{shown}");
    }

    #[test]
    fn token_request_body_is_form_encoded() {
        assert_eq!(
            token_request_body("aGVhZA.Y2xhaW1z.c2ln-_"),
            "grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer&assertion=aGVhZA.Y2xhaW1z.c2ln-_"
        );
        assert_eq!(form_encode("a b&c=d/é"), "a+b%26c%3Dd%2F%C3%A9");
    }

    #[test]
    fn token_responses() {
        assert_eq!(
            parse_token_response(
                br#"{"access_token":"ya29.a","expires_in":3599,"token_type":"Bearer"}"#
            ),
            Ok(("ya29.a".to_string(), 3599))
        );
        assert_eq!(
            parse_token_response(br#"{"access_token":"t","expires_in":"120"}"#),
            Ok(("t".to_string(), 120))
        );
        assert_eq!(
            parse_token_response(br#"{"access_token":"t"}"#),
            Ok(("t".into(), 3600))
        );
        assert_eq!(
            parse_token_response(
                br#"{"error":"invalid_grant","error_description":"Invalid JWT Signature."}"#
            ),
            Err("token endpoint refused: invalid_grant Invalid JWT Signature.".into())
        );
        assert!(parse_token_response(br#"{"access_token":""}"#).is_err());
        assert!(parse_token_response(br#"{"access_token":"t","expires_in":-1}"#).is_err());
        let e = parse_token_response(b"<html>502</html>").unwrap_err();
        assert!(e.contains("16 bytes"), "{e}");
    }

    #[test]
    fn cache_refreshes_five_minutes_early() {
        let c = TokenCache::new();
        assert_eq!(c.get(1000), None);
        c.put("t1".into(), 3600, 1000);
        assert_eq!(c.get(1000).as_deref(), Some("t1"));
        assert_eq!(c.get(1000 + 3600 - 301).as_deref(), Some("t1"));
        assert_eq!(c.get(1000 + 3600 - 300), None);
        c.put("t2".into(), 3600, 4300);
        assert_eq!(c.get(4300).as_deref(), Some("t2"));
        // A short-lived token is used for half its life, not refetched at once.
        c.put("t3".into(), 60, 5000);
        assert_eq!(c.get(5029).as_deref(), Some("t3"));
        assert_eq!(c.get(5030), None);
        c.put("t4".into(), 0, 6000);
        assert_eq!(c.get(6000), None);
        c.put("t5".into(), 3600, 7000);
        c.clear();
        assert_eq!(c.get(7000), None);
    }

    #[test]
    fn cache_is_shared_across_threads() {
        let c = Arc::new(TokenCache::new());
        let writers: Vec<_> = (0..4)
            .map(|i| {
                let c = c.clone();
                std::thread::spawn(move || c.put(format!("t{i}"), 3600, 0))
            })
            .collect();
        for w in writers {
            w.join().unwrap();
        }
        assert!(c.get(1).unwrap().starts_with('t'));
    }

    /// The whole exchange against the mock provider's token endpoint.
    #[tokio::test]
    async fn mock_token_endpoint_accepts_the_assertion() {
        let mock = sluice_mock::Mock::start().await;
        let mut sa = sa();
        sa.token_uri = format!("{}/token", mock.base_url());
        let body = token_request_body(&assertion(&sa, 1_700_000_000).unwrap());
        let answer = reqwest::Client::new()
            .post(&sa.token_uri)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 200);
        let (token, expires_in) = parse_token_response(&answer.bytes().await.unwrap()).unwrap();
        assert_eq!((token.as_str(), expires_in), ("mock-token-1", 3600));
        assert_eq!(mock.count(sluice_mock::oauth::SCRIPT_KEY), 1);
        mock.shutdown();
    }

    #[test]
    fn regions_hosts_and_paths() {
        assert_eq!(
            region_from_host("us-central1-aiplatform.googleapis.com"),
            "us-central1"
        );
        assert_eq!(
            region_from_host("europe-west4-aiplatform.googleapis.com:443"),
            "europe-west4"
        );
        assert_eq!(region_from_host("aiplatform.googleapis.com"), "global");
        assert_eq!(region_from_host("127.0.0.1"), "global");
        assert_eq!(
            vertex_path("p1", "us-east5", "anthropic", "claude-sonnet-4@20250514", "streamRawPredict"),
            "/v1/projects/p1/locations/us-east5/publishers/anthropic/models/claude-sonnet-4@20250514:streamRawPredict"
        );
        assert_eq!(
            vertex_path("p1", "global", "google", "gemini-2.5-flash", "generateContent"),
            "/v1/projects/p1/locations/global/publishers/google/models/gemini-2.5-flash:generateContent"
        );
    }
}
