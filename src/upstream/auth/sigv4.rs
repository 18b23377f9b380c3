//! AWS Signature Version 4 for Bedrock runtime calls (`bedrock-runtime.<region>.amazonaws.com`),
//! over the `aws-sigv4` crate: credentials from the environment, the region from the
//! host, the model path encoded the way Bedrock expects, and the headers a signed
//! request must carry.
//!
//! Two encodings meet in a Bedrock path and are easy to confuse. The model id sits in
//! one path segment and is percent-encoded once on the wire
//! (`/model/anthropic.claude-3-5-sonnet-20240620-v1%3A0/converse`); SigV4 for every
//! service but S3 then encodes the path again in its canonical request (`%3A` becomes
//! `%253A`). `aws-sigv4`'s default (`PercentEncodingMode::Double`) does the second
//! step, so callers pass the path exactly as it goes on the wire ([`model_path`]).
//! Signing the singly-encoded path is the classic cause of Bedrock's 403 "signature
//! does not match" for every model id with a `:` in it.

use aws_credential_types::Credentials;
use aws_sigv4::http_request::{
    self, PayloadChecksumKind, PercentEncodingMode, SessionTokenMode, SignableBody,
    SignableRequest, SignatureLocation, SigningSettings, UriPathNormalizationMode,
};
use aws_sigv4::sign::v4;
use std::fmt;
use std::time::SystemTime;

/// The SigV4 signing name of Bedrock's runtime API (`bedrock-runtime` is only its host).
pub const SERVICE: &str = "bedrock";

/// The region used when the host does not name one.
pub const DEFAULT_REGION: &str = "us-east-1";

/// An access key pair, with the session token of temporary (STS) credentials.
#[derive(Clone, PartialEq, Eq)]
pub struct AwsCredentials {
    pub access_key_id: String,
    pub secret_access_key: String,
    pub session_token: Option<String>,
}

impl AwsCredentials {
    /// Reads `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` and, if set,
    /// `AWS_SESSION_TOKEN`. `None` unless both keys are set and non-empty.
    pub fn from_env() -> Option<AwsCredentials> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    fn from_vars(var: impl Fn(&str) -> Option<String>) -> Option<AwsCredentials> {
        let set = |name: &str| var(name).filter(|v| !v.trim().is_empty());
        Some(AwsCredentials {
            access_key_id: set("AWS_ACCESS_KEY_ID")?,
            secret_access_key: set("AWS_SECRET_ACCESS_KEY")?,
            session_token: set("AWS_SESSION_TOKEN"),
        })
    }
}

/// Shows the access key id (it names the key, it is not a secret) and hides the rest.
impl fmt::Debug for AwsCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AwsCredentials")
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &"<redacted>")
            .field(
                "session_token",
                &self.session_token.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

/// The region named by a Bedrock runtime host: `bedrock-runtime.<region>.amazonaws.com`
/// (also `bedrock-runtime-fips.` and `.amazonaws.com.cn`); anything else (a proxy, the
/// mock provider) signs for [`DEFAULT_REGION`].
pub fn region_from_host(host: &str) -> String {
    let host = host.to_ascii_lowercase();
    let rest = host
        .strip_prefix("bedrock-runtime.")
        .or_else(|| host.strip_prefix("bedrock-runtime-fips."));
    let region = rest.and_then(|r| {
        let (region, domain) = r.split_once('.')?;
        let domain = domain.split(':').next().unwrap_or(domain);
        let is_aws = domain == "amazonaws.com" || domain == "amazonaws.com.cn";
        let well_formed = !region.is_empty()
            && region
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        (is_aws && well_formed).then(|| region.to_string())
    });
    region.unwrap_or_else(|| DEFAULT_REGION.to_string())
}

/// The request path of a Bedrock runtime action on a model:
/// `/model/{model_id}/{action}` with the model id percent-encoded once as a single
/// path segment (`:` and the `/` of inference-profile ARNs included), e.g.
/// `model_path("anthropic.claude-3-5-sonnet-20240620-v1:0", "converse-stream")`.
/// Actions: `converse`, `converse-stream`, `invoke`, `invoke-with-response-stream`.
pub fn model_path(model_id: &str, action: &str) -> String {
    format!("/model/{}/{action}", encode_segment(model_id))
}

/// RFC 3986 percent-encoding of everything but the unreserved characters.
fn encode_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 8);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Signs a Bedrock runtime request and returns the headers to add to it:
/// `x-amz-date`, `authorization` and, with temporary credentials,
/// `x-amz-security-token`. Names are lowercase.
///
/// - `url_authority`: the `Host` header value that will be sent (`host` or `host:port`).
/// - `path_and_query`: exactly as sent on the wire (see [`model_path`]); it is
///   encoded once more for the canonical request, as Bedrock expects.
/// - `headers`: other headers to sign, with the values that will be sent (say
///   `content-type`); `host` is added from `url_authority` unless given.
///   `authorization`, `user-agent`, `transfer-encoding` and `x-amzn-trace-id` are
///   never signed (proxies may change them).
/// - `body`: the exact bytes sent; its SHA-256 is part of the signature.
///
/// No `x-amz-content-sha256` header: only S3 requires it, and the AWS SDK does not
/// send it to Bedrock (the body hash is signed all the same).
#[allow(clippy::too_many_arguments)] // one call site; the names document the parts
pub fn sign(
    creds: &AwsCredentials,
    region: &str,
    method: &str,
    url_authority: &str,
    path_and_query: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    time: SystemTime,
) -> Result<Vec<(String, String)>, String> {
    sign_for(
        SERVICE,
        creds,
        region,
        method,
        url_authority,
        path_and_query,
        headers,
        body,
        time,
    )
}

#[allow(clippy::too_many_arguments)]
fn sign_for(
    service: &str,
    creds: &AwsCredentials,
    region: &str,
    method: &str,
    url_authority: &str,
    path_and_query: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    time: SystemTime,
) -> Result<Vec<(String, String)>, String> {
    if !path_and_query.starts_with('/') {
        return Err(format!(
            "sigv4: the request path must start with '/': {path_and_query:?}"
        ));
    }
    if url_authority.is_empty() {
        return Err("sigv4: empty host".into());
    }
    let identity = Credentials::new(
        creds.access_key_id.clone(),
        creds.secret_access_key.clone(),
        creds.session_token.clone(),
        None,
        "sluice",
    )
    .into();
    let mut settings = SigningSettings::default();
    settings.percent_encoding_mode = PercentEncodingMode::Double;
    settings.payload_checksum_kind = PayloadChecksumKind::NoHeader;
    settings.signature_location = SignatureLocation::Headers;
    settings.uri_path_normalization_mode = UriPathNormalizationMode::Enabled;
    settings.session_token_mode = SessionTokenMode::Include;
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region(region)
        .name(service)
        .time(time)
        .settings(settings)
        .build()
        .map_err(|e| format!("sigv4: signing parameters: {e}"))?
        .into();

    let has_host = headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host"));
    let host = (!has_host).then_some(("host", url_authority));
    let all_headers = host.into_iter().chain(headers.iter().copied());
    let uri = format!("https://{url_authority}{path_and_query}");
    let request = SignableRequest::new(method, uri, all_headers, SignableBody::Bytes(body))
        .map_err(|e| format!("sigv4: cannot sign {method} {path_and_query}: {e}"))?;
    let (instructions, _signature) = http_request::sign(request, &params)
        .map_err(|e| format!("sigv4: cannot sign {method} {path_and_query}: {e}"))?
        .into_parts();
    let (out, _query) = instructions.into_parts();
    Ok(out
        .into_iter()
        .map(|h| (h.name().to_ascii_lowercase(), h.value().to_string()))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ring::{digest, hmac};
    use std::time::{Duration, UNIX_EPOCH};

    const AKID: &str = "AKIDEXAMPLE";
    const SECRET: &str = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY";

    fn creds(token: Option<&str>) -> AwsCredentials {
        AwsCredentials {
            access_key_id: AKID.into(),
            secret_access_key: SECRET.into(),
            session_token: token.map(str::to_string),
        }
    }

    fn at(unix: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(unix)
    }

    fn header<'a>(out: &'a [(String, String)], name: &str) -> Option<&'a str> {
        out.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    /// 2015-08-30T12:36:00Z, the time of AWS's published SigV4 test suite.
    const SUITE_TIME: u64 = 1_440_938_160;

    // Expected values from AWS's SigV4 test suite (aws-signing-test-suite/v4:
    // get-vanilla, post-vanilla, get-vanilla-with-session-token), service "service".
    #[test]
    fn published_vectors() {
        let cases: [(&str, Option<&str>, &str, &str); 3] = [
            (
                "GET",
                None,
                "host;x-amz-date",
                "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31",
            ),
            (
                "POST",
                None,
                "host;x-amz-date",
                "5da7c1a2acd57cee7505fc6676e4e544621c30862966e37dddb68e92efbe5d6b",
            ),
            (
                "GET",
                Some("6e86291e8372ff2a2260956d9b8aae1d763fbf315fa00fa31553b73ebf194267"),
                "host;x-amz-date;x-amz-security-token",
                "07ec1639c89043aa0e3e2de82b96708f198cceab042d4a97044c66dd9f74e7f8",
            ),
        ];
        for (method, token, signed, sig) in cases {
            let out = sign_for(
                "service",
                &creds(token),
                "us-east-1",
                method,
                "example.amazonaws.com",
                "/",
                &[],
                b"",
                at(SUITE_TIME),
            )
            .unwrap();
            assert_eq!(header(&out, "x-amz-date"), Some("20150830T123600Z"));
            let expected = format!(
                "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, \
                 SignedHeaders={signed}, Signature={sig}"
            );
            assert_eq!(header(&out, "authorization"), Some(expected.as_str()));
            assert_eq!(header(&out, "x-amz-security-token"), token);
            assert_eq!(header(&out, "x-amz-content-sha256"), None);
        }
    }

    fn hmac_sha256(key: &[u8], data: &str) -> Vec<u8> {
        let key = hmac::Key::new(hmac::HMAC_SHA256, key);
        hmac::sign(&key, data.as_bytes()).as_ref().to_vec()
    }

    fn sha256_hex(data: &[u8]) -> String {
        hex::encode(digest::digest(&digest::SHA256, data))
    }

    /// SigV4 by hand (ring's HMAC and SHA-256, nothing from `aws-sigv4`): the signature
    /// of `canonical_request` for date `date` / `stamp`.
    fn reference_signature(canonical_request: &str, stamp: &str, region: &str) -> String {
        let date = &stamp[..8];
        let scope = format!("{date}/{region}/bedrock/aws4_request");
        let to_sign = format!(
            "AWS4-HMAC-SHA256\n{stamp}\n{scope}\n{}",
            sha256_hex(canonical_request.as_bytes())
        );
        let k_date = hmac_sha256(format!("AWS4{SECRET}").as_bytes(), date);
        let k_region = hmac_sha256(&k_date, region);
        let k_service = hmac_sha256(&k_region, "bedrock");
        let k_signing = hmac_sha256(&k_service, "aws4_request");
        hex::encode(hmac_sha256(&k_signing, &to_sign))
    }

    /// 2024-01-02T03:04:05Z.
    const T: u64 = 1_704_164_645;
    const BODY: &[u8] = br#"{"messages":[{"role":"user","content":[{"text":"hi"}]}]}"#;

    #[test]
    fn bedrock_converse_with_colon_in_model_id() {
        let path = model_path("anthropic.claude-3-5-sonnet-20240620-v1:0", "converse");
        assert_eq!(
            path,
            "/model/anthropic.claude-3-5-sonnet-20240620-v1%3A0/converse"
        );
        let host = "bedrock-runtime.us-west-2.amazonaws.com";
        let out = sign(
            &creds(None),
            &region_from_host(host),
            "POST",
            host,
            &path,
            &[("content-type", "application/json")],
            BODY,
            at(T),
        )
        .unwrap();

        // The path as the canonical request must show it: encoded twice.
        let canonical = format!(
            "POST\n\
             /model/anthropic.claude-3-5-sonnet-20240620-v1%253A0/converse\n\
             \n\
             content-type:application/json\n\
             host:bedrock-runtime.us-west-2.amazonaws.com\n\
             x-amz-date:20240102T030405Z\n\
             \n\
             content-type;host;x-amz-date\n\
             {}",
            sha256_hex(BODY)
        );
        let sig = reference_signature(&canonical, "20240102T030405Z", "us-west-2");
        let expected = format!(
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20240102/us-west-2/bedrock/aws4_request, \
             SignedHeaders=content-type;host;x-amz-date, Signature={sig}"
        );
        assert_eq!(header(&out, "authorization"), Some(expected.as_str()));
        assert_eq!(header(&out, "x-amz-date"), Some("20240102T030405Z"));
        assert_eq!(out.len(), 2, "{out:?}");

        // Signing the singly-encoded path would give another signature.
        let single = canonical.replace("%253A", "%3A");
        assert_ne!(
            reference_signature(&single, "20240102T030405Z", "us-west-2"),
            sig
        );
    }

    #[test]
    fn bedrock_with_session_token_and_port() {
        let token = "FwoGZXIvYXdzEXAMPLETOKEN//+=";
        let path = model_path(
            "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.meta.llama3-2-1b-instruct-v1:0",
            "converse-stream",
        );
        assert_eq!(
            path,
            "/model/arn%3Aaws%3Abedrock%3Aus-east-1%3A123456789012%3Ainference-profile%2Fus.meta.llama3-2-1b-instruct-v1%3A0/converse-stream"
        );
        let out = sign(
            &creds(Some(token)),
            "us-east-1",
            "POST",
            "127.0.0.1:9000",
            &path,
            &[("Content-Type", "application/json")],
            BODY,
            at(T),
        )
        .unwrap();
        let canonical = format!(
            "POST\n{}\n\
             \n\
             content-type:application/json\n\
             host:127.0.0.1:9000\n\
             x-amz-date:20240102T030405Z\n\
             x-amz-security-token:{token}\n\
             \n\
             content-type;host;x-amz-date;x-amz-security-token\n\
             {}",
            path.replace('%', "%25"),
            sha256_hex(BODY)
        );
        let sig = reference_signature(&canonical, "20240102T030405Z", "us-east-1");
        let auth = header(&out, "authorization").unwrap();
        assert!(auth.ends_with(&format!(", Signature={sig}")), "{auth}");
        assert_eq!(header(&out, "x-amz-security-token"), Some(token));
    }

    #[test]
    fn signature_depends_on_body_and_time() {
        let host = "bedrock-runtime.us-east-1.amazonaws.com";
        let s = |body: &[u8], t: u64| {
            sign(
                &creds(None),
                "us-east-1",
                "POST",
                host,
                "/model/m/converse",
                &[],
                body,
                at(t),
            )
            .unwrap()
        };
        assert_ne!(s(b"a", T), s(b"b", T));
        assert_ne!(s(b"a", T), s(b"a", T + 1));
        assert_eq!(s(b"a", T), s(b"a", T));
    }

    #[test]
    fn bad_requests_are_errors() {
        let c = creds(None);
        let e = sign(&c, "us-east-1", "POST", "h", "model/x", &[], b"", at(T)).unwrap_err();
        assert!(e.contains("must start with '/'"), "{e}");
        assert!(sign(&c, "us-east-1", "POST", "", "/", &[], b"", at(T)).is_err());
        assert!(sign(&c, "us-east-1", "POST", "bad host", "/", &[], b"", at(T)).is_err());
    }

    #[test]
    fn regions() {
        assert_eq!(
            region_from_host("bedrock-runtime.eu-central-1.amazonaws.com"),
            "eu-central-1"
        );
        assert_eq!(
            region_from_host("bedrock-runtime-fips.us-gov-west-1.amazonaws.com"),
            "us-gov-west-1"
        );
        assert_eq!(
            region_from_host("bedrock-runtime.cn-north-1.amazonaws.com.cn"),
            "cn-north-1"
        );
        assert_eq!(
            region_from_host("bedrock-runtime.ap-south-1.amazonaws.com:443"),
            "ap-south-1"
        );
        assert_eq!(
            region_from_host("bedrock.us-west-2.amazonaws.com"),
            "us-east-1"
        );
        assert_eq!(
            region_from_host("bedrock-runtime.us-west-2.example.com"),
            "us-east-1"
        );
        assert_eq!(region_from_host("127.0.0.1"), "us-east-1");
    }

    #[test]
    fn credentials_from_vars_and_debug_hides_secrets() {
        let vars = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert_eq!(
            AwsCredentials::from_vars(vars(&[("AWS_ACCESS_KEY_ID", "A")])),
            None
        );
        assert_eq!(
            AwsCredentials::from_vars(vars(&[
                ("AWS_ACCESS_KEY_ID", "A"),
                ("AWS_SECRET_ACCESS_KEY", "")
            ])),
            None
        );
        let c = AwsCredentials::from_vars(vars(&[
            ("AWS_ACCESS_KEY_ID", "AKIA1"),
            ("AWS_SECRET_ACCESS_KEY", "s3cr3t"),
            ("AWS_SESSION_TOKEN", "t0k3n"),
        ]))
        .unwrap();
        assert_eq!(c.session_token.as_deref(), Some("t0k3n"));
        let shown = format!("{c:?}");
        assert!(shown.contains("AKIA1"), "{shown}");
        assert!(
            !shown.contains("s3cr3t") && !shown.contains("t0k3n"),
            "{shown}"
        );
    }
}
