//! The pulls' HTTP client (reqwest, already in the tree under `object_store`).
//! A source's base URL from the pull's config is the org's: it was checked when
//! the pull came in (`egress::check_org_url`), and its client resolves names only
//! to public addresses unless `[network] allow_private_upstreams` (a DNS answer
//! can change after the check). Redirects are not followed (a redirect could point
//! anywhere). The operator's `[telemetry]` URLs are trusted, like provider tables.

use super::PullError;
use crate::upstream::egress;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use serde_json::Value;
use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::Duration;

/// How long one request to a source may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// A Retry-After at most this long is waited out once per request; a longer one
/// is the caller's 429.
const SHORT_RETRY: u64 = 2;
/// The largest answer one page may be.
const MAX_PAGE_BYTES: usize = 32 * 1024 * 1024;

struct PublicOnly;

impl Resolve for PublicOnly {
    fn resolve(&self, name: Name) -> Resolving {
        Box::pin(async move {
            let found: Vec<SocketAddr> =
                tokio::net::lookup_host((name.as_str(), 0)).await?.collect();
            if found.iter().any(|a| !egress::is_public(a.ip())) {
                return Err(egress::REFUSED.into());
            }
            Ok(Box::new(found.into_iter()) as Addrs)
        })
    }
}

fn build(guarded: bool) -> reqwest::Client {
    let mut b = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(Duration::from_secs(10))
        .timeout(REQUEST_TIMEOUT)
        .user_agent("sluice-telemetry-pull");
    if guarded {
        b = b.dns_resolver(std::sync::Arc::new(PublicOnly));
    }
    b.build().expect("the HTTP client builds")
}

/// The client for a base URL: guarded when the org supplied it and private
/// addresses are not allowed.
pub fn client(org_supplied: bool, allow_private: bool) -> &'static reqwest::Client {
    static GUARDED: OnceLock<reqwest::Client> = OnceLock::new();
    static OPEN: OnceLock<reqwest::Client> = OnceLock::new();
    if org_supplied && !allow_private {
        GUARDED.get_or_init(|| build(true))
    } else {
        OPEN.get_or_init(|| build(false))
    }
}

/// Sends a request (built afresh for a retry) and reads a JSON answer. A 401/403
/// is the credential's fault, 404 the config's (a project that does not exist),
/// 429 the source's rate limit, a connect failure an unreachable source.
pub async fn send_json(
    make: impl Fn() -> reqwest::RequestBuilder,
    what: &str,
) -> Result<Value, PullError> {
    let mut waited = false;
    loop {
        let resp = match make().send().await {
            Ok(r) => r,
            Err(e) => {
                let why = if e.is_timeout() {
                    "timed out"
                } else if e.is_connect() {
                    "could not connect"
                } else {
                    "request failed"
                };
                let refused = std::error::Error::source(&e)
                    .map(|s| format!("{s:?}"))
                    .is_some_and(|s| s.contains(egress::REFUSED));
                return Err(if refused {
                    PullError::Config(
                        "config.base_url",
                        "the source's address is not a public one (see [network] allow_private_upstreams)".into(),
                    )
                } else {
                    PullError::Unreachable(format!("{what}: {why}"))
                });
            }
        };
        let status = resp.status().as_u16();
        if status == 429 {
            let after = resp
                .headers()
                .get(reqwest::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok());
            if !waited && after.is_some_and(|s| s <= SHORT_RETRY) {
                waited = true;
                tokio::time::sleep(Duration::from_secs(after.unwrap_or(1))).await;
                continue;
            }
            return Err(PullError::RateLimited(after));
        }
        if status == 401 || status == 403 {
            return Err(PullError::Credential(format!(
                "the source refused the credential ({status})"
            )));
        }
        if status == 404 {
            return Err(PullError::Config(
                "config",
                format!("{what}: the source has no such resource (404); check the project"),
            ));
        }
        if !(200..300).contains(&status) {
            return Err(PullError::Source(format!(
                "{what}: the source answered {status}"
            )));
        }
        if resp
            .content_length()
            .is_some_and(|n| n as usize > MAX_PAGE_BYTES)
        {
            return Err(PullError::Source(format!(
                "{what}: a page larger than {MAX_PAGE_BYTES} bytes"
            )));
        }
        let bytes = resp
            .bytes()
            .await
            .map_err(|_| PullError::Unreachable(format!("{what}: the answer was cut off")))?;
        if bytes.len() > MAX_PAGE_BYTES {
            return Err(PullError::Source(format!(
                "{what}: a page larger than {MAX_PAGE_BYTES} bytes"
            )));
        }
        return serde_json::from_slice(&bytes)
            .map_err(|_| PullError::Source(format!("{what}: the answer is not JSON")));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::str::FromStr;

    /// The connect-time guard: a name that resolves to a private address (as a
    /// rebound DNS answer would, after the URL passed its check) is not connected to.
    #[tokio::test]
    async fn the_guarded_resolver_refuses_names_of_private_addresses() {
        let r = PublicOnly
            .resolve(Name::from_str("localhost").unwrap())
            .await;
        let e = r.err().expect("localhost is refused");
        assert!(e.to_string().contains(egress::REFUSED), "{e}");
    }

    #[tokio::test]
    async fn a_guarded_client_never_reaches_loopback() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let url = format!("http://localhost:{port}/");
        let got = send_json(|| client(true, false).get(&url), "probe").await;
        match got {
            Err(PullError::Config(param, _)) => assert_eq!(param, "config.base_url"),
            _ => panic!("the guarded client connected"),
        }
        // Nothing was accepted.
        let accepted = tokio::time::timeout(Duration::from_millis(200), listener.accept()).await;
        assert!(accepted.is_err());
    }
}
