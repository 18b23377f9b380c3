//! The pulls' HTTP client (reqwest, already in the tree under `object_store`).
//! A source's base URL from the pull's config is the org's: it was checked when
//! the pull came in (`egress::check_org_url`), and its client resolves names only
//! to public addresses unless `[network] allow_private_upstreams` (a DNS answer
//! can change after the check). Redirects are not followed (a redirect could point
//! anywhere), and no proxy from the environment is used (a proxy would resolve the
//! name itself, past the guard). The operator's `[telemetry]` URLs are trusted,
//! like provider tables.
//!
//! An answer is read in pieces and counted as it arrives, against the page's cap
//! and the pull's [`Budget`]; it is kept as its bytes ([`Page`]) and its members
//! are read as they are needed: a page's records never become one tree.

use super::{Budget, PullError};
use crate::upstream::egress;
use bytes::{Bytes, BytesMut};
use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use serde::de::DeserializeOwned;
use serde_json::value::RawValue;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::Duration;

/// How long one request to a source may take (the pull as a whole has
/// `[telemetry] pull_timeout_ms`).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// A Retry-After at most this long is waited out once per request; a longer one
/// is the caller's 429.
const SHORT_RETRY: u64 = 2;
/// The largest answer one page may be. Sources page by 50 to 200 records; a page
/// this large is not one of theirs.
pub const MAX_PAGE_BYTES: usize = 4 * 1024 * 1024;

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
        b = b.dns_resolver(std::sync::Arc::new(PublicOnly)).no_proxy();
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

/// A source's JSON answer, as its bytes. Members are parsed one at a time, each
/// as what the caller needs: small ones into their types, record lists into
/// borrowed raw elements.
pub struct Page {
    bytes: Bytes,
}

impl Page {
    /// The page's top-level members; none when it is not an object.
    fn members(&self) -> BTreeMap<String, &RawValue> {
        serde_json::from_slice(&self.bytes).unwrap_or_default()
    }

    /// A member read as `T`; `None` when it is missing or of another shape.
    pub fn get<T: DeserializeOwned>(&self, key: &str) -> Option<T> {
        let members = self.members();
        serde_json::from_str(members.get(key)?.get()).ok()
    }

    /// The elements of an array member (or of the page itself, `key` empty), each
    /// still raw; empty when it is missing or not an array.
    pub fn items(&self, key: &str) -> Vec<&RawValue> {
        if key.is_empty() {
            return serde_json::from_slice(&self.bytes).unwrap_or_default();
        }
        let members = self.members();
        members
            .get(key)
            .and_then(|raw| serde_json::from_str(raw.get()).ok())
            .unwrap_or_default()
    }
}

/// Sends a request (built afresh for a retry) and reads a JSON answer. A 401/403
/// is the credential's fault, 404 the config's (a project that does not exist),
/// 429 the source's rate limit, a connect failure an unreachable source.
pub async fn send_json(
    budget: &Budget,
    make: impl Fn() -> reqwest::RequestBuilder,
    what: &str,
) -> Result<Page, PullError> {
    let mut waited = false;
    loop {
        budget.request()?;
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
        let bytes = read_capped(budget, resp, what).await?;
        if serde_json::from_slice::<&RawValue>(&bytes).is_err() {
            return Err(PullError::Source(format!("{what}: the answer is not JSON")));
        }
        return Ok(Page { bytes });
    }
}

/// Reads an answer's body piece by piece, refusing it once it passes the page cap
/// and stopping the pull once it passes what is left of the pull's bytes.
async fn read_capped(
    budget: &Budget,
    mut resp: reqwest::Response,
    what: &str,
) -> Result<Bytes, PullError> {
    let too_large =
        || PullError::Source(format!("{what}: a page larger than {MAX_PAGE_BYTES} bytes"));
    if resp
        .content_length()
        .is_some_and(|n| n > MAX_PAGE_BYTES as u64)
    {
        return Err(too_large());
    }
    let mut body = BytesMut::new();
    loop {
        let piece = match resp.chunk().await {
            Ok(Some(piece)) => piece,
            Ok(None) => return Ok(body.freeze()),
            Err(_) => {
                return Err(PullError::Unreachable(format!(
                    "{what}: the answer was cut off"
                )))
            }
        };
        budget.take(piece.len())?;
        if body.len() + piece.len() > MAX_PAGE_BYTES {
            return Err(too_large());
        }
        body.extend_from_slice(&piece);
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
        let budget = Budget::new(1 << 20, 10);
        let got = send_json(&budget, || client(true, false).get(&url), "probe").await;
        match got {
            Err(PullError::Config(param, _)) => assert_eq!(param, "config.base_url"),
            _ => panic!("the guarded client connected"),
        }
        // Nothing was accepted.
        let accepted = tokio::time::timeout(Duration::from_millis(200), listener.accept()).await;
        assert!(accepted.is_err());
    }

    /// A proxy named by the environment would resolve the org's host itself, past
    /// the guard: the guarded client never uses one.
    #[tokio::test]
    async fn a_guarded_client_ignores_proxy_variables() {
        // A "proxy" that records whether anything connected to it.
        let proxy = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let proxy_url = format!("http://{}", proxy.local_addr().unwrap());
        let guarded = {
            // The variables are read when a client is built: build one with them set.
            std::env::set_var("HTTPS_PROXY", &proxy_url);
            std::env::set_var("HTTP_PROXY", &proxy_url);
            let c = build(true);
            std::env::remove_var("HTTPS_PROXY");
            std::env::remove_var("HTTP_PROXY");
            c
        };
        // A name that does not resolve: without the proxy the request fails at once.
        let _ = guarded
            .get("http://sluice-no-such-host.invalid/")
            .timeout(Duration::from_secs(2))
            .send()
            .await;
        let accepted = tokio::time::timeout(Duration::from_millis(200), proxy.accept()).await;
        assert!(
            accepted.is_err(),
            "the guarded client went through the proxy"
        );
    }

    #[test]
    fn a_page_is_read_member_by_member() {
        let page = Page {
            bytes: Bytes::from_static(
                br#"{"data":[{"id":"a"},2,"x"],"meta":{"totalPages":3},"cursor":null}"#,
            ),
        };
        assert_eq!(page.items("data").len(), 3);
        assert!(page.items("meta").is_empty());
        #[derive(serde::Deserialize)]
        struct Meta {
            #[serde(rename = "totalPages")]
            total: u64,
        }
        assert_eq!(page.get::<Meta>("meta").map(|m| m.total), Some(3));
        assert_eq!(page.get::<String>("cursor"), None);
        let bare = Page {
            bytes: Bytes::from_static(b"[1,2]"),
        };
        assert_eq!(bare.items("").len(), 2);
        assert!(bare.items("data").is_empty());
    }
}
