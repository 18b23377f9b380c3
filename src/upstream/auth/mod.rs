//! Provider authentication that takes more than a static header: AWS SigV4 for
//! Bedrock ([`sigv4`]) and Google OAuth access tokens for Vertex AI ([`google`]).
//! Plain functions, no I/O (but reading a key file), so the hard parts are unit
//! tested here and the upstream call only moves bytes.
//!
//! # Bedrock (SigV4)
//!
//! At start: `let creds = sigv4::AwsCredentials::from_env()` (`None`: no platform
//! Bedrock) and `let region = sigv4::region_from_host(host)` per target. Per attempt,
//! once the body is rendered, sign it and add the headers:
//!
//! ```ignore
//! let path = sigv4::model_path(&target.model_id, "converse-stream"); // ':' -> %3A
//! let signed = sigv4::sign(
//!     &creds, &region, "POST", &authority, &path,
//!     &[("content-type", "application/json")], &body, std::time::SystemTime::now(),
//! )?; // Err(String): log it, count the attempt as failed
//! for (name, value) in signed {
//!     req.insert_header(name, value)?; // x-amz-date, authorization[, x-amz-security-token]
//! }
//! ```
//!
//! `authority` must be the `Host` header that is sent, `path` the path as sent and
//! `body` the exact bytes sent, and every header passed in `headers` must go out with
//! the same value (they are signed). The signature is good for 15 minutes, so sign per
//! attempt, never per target. No bearer header goes with it.
//!
//! # Vertex AI (service-account OAuth)
//!
//! At start: `google::ServiceAccount::from_env()?` (`GOOGLE_APPLICATION_CREDENTIALS`:
//! a key file path, or the JSON itself) or `ServiceAccount::load(value)`, and one
//! `google::TokenCache` per service account. Per request (`now` = Unix seconds):
//!
//! ```ignore
//! let token = match cache.get(now) {
//!     Some(t) => t,
//!     None => {
//!         // Serialize refreshes (an async mutex) and call cache.get(now) again
//!         // once inside, so a burst makes one token request, not one each.
//!         let body = google::token_request_body(&google::assertion(&sa, now)?);
//!         // POST body to sa.token_uri, content-type application/x-www-form-urlencoded
//!         let (token, expires_in) = google::parse_token_response(&answer)?;
//!         cache.put(token.clone(), expires_in, now);
//!         token
//!     }
//! };
//! // authorization: Bearer {token}; on a 401 from Vertex, cache.clear().
//! let region = google::region_from_host(host); // "global" for aiplatform.googleapis.com
//! let path = google::vertex_path(&sa.project_id, &region, "anthropic", model, "streamRawPredict");
//! ```
//!
//! Secrets (secret keys, session tokens, private keys, access tokens) never appear
//! in `Debug` output or in error strings, so both may be logged.

pub mod google;
pub mod sigv4;
