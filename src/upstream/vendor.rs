//! Services the gateway calls for a request besides model providers: a web
//! search vendor (SearXNG, Brave Search). They are reached through the same
//! client as providers (pooled connections, rustls, the DNS cache), from a base
//! URL the operator configures (trusted, like a provider table's).

use super::egress::parse_base;
use super::target::{PeerCache, Target};
use super::{Failure, Upstreams};
use std::sync::Arc;
use std::time::Duration;

/// Where a vendor lives and how it authenticates. `name` picks the credential
/// header (`brave`: `X-Subscription-Token`; others: a bearer token, if any).
/// `timeout` bounds connecting, sending and each read.
pub fn target(
    name: &str,
    base_url: &str,
    credential: Option<Arc<str>>,
    timeout: Duration,
) -> Option<Arc<Target>> {
    let (tls, host, port, prefix) = parse_base(base_url)?;
    Some(Arc::new(Target {
        rung_id: name.to_string(),
        rung_json: Vec::new(),
        chat_path: String::new(),
        provider: name.to_string(),
        model_id: String::new(),
        authority: Target::authority(tls, &host, port),
        peer: PeerCache::default(),
        org_url: false,
        tls,
        ip: host.parse().ok(),
        host,
        port,
        prefix,
        credential,
        connect_timeout: timeout,
        header_timeout: timeout,
        first_token_timeout: timeout,
        stream_idle_timeout: timeout,
        rung_base: base_url.to_string(),
        breaker_key: name.to_string(),
        region: String::new(),
        own_cloud: None,
    }))
}

impl Upstreams {
    /// A GET to a vendor, the whole answer (at most 1 MB) read within `within`:
    /// its status and body.
    pub async fn vendor_get(
        &self,
        t: &Target,
        path: &str,
        within: Duration,
    ) -> Result<(u16, Vec<u8>), Failure> {
        match crate::deadline::within(within, Box::pin(self.get(t, path))).await {
            Ok(answer) => answer,
            Err(_) => Err(Failure::HeaderTimeout),
        }
    }
}
