//! Calling providers: connections opened by Pingora's `Connector` (rustls, HTTP/2)
//! and kept in our idle list, targets (where a rung lives and how it
//! authenticates), DNS with a short cache, and one call's life: connect, send, wait
//! for the header under a timeout (HTTP/1.1 answers read by `h1`), read body pieces,
//! and give the connection back only when the answer was whole.

pub mod account_check;
pub mod auth;
pub mod breaker;
pub mod egress;
mod h1;
mod head;
mod out_body;
mod pool;
pub mod prober;
mod target;
pub mod vendor;

pub use out_body::OutBody;
pub use target::Target;

use crate::catalog::RungSpec;
use crate::config::{Config, ProviderConfig};
use crate::deadline::within;
use auth::{google, sigv4};
use bytes::{Buf, Bytes};
use egress::parse_base;
use head::{Head, Val};
use pingora::connectors::http::Connector;
use pingora::prelude::HttpPeer;
use pingora::protocols::http::client::HttpSession;
use pool::IdlePool;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use target::{OwnCloud, PeerCache, Vertex};
use tokio::io::AsyncWriteExt;

/// The Anthropic messages API version we speak.
const ANTHROPIC_VERSION: &str = "2023-06-01";
/// Past this size a request body is not copied behind its head but written beside
/// it: the copy of a long chat history costs more than a second slice in one write.
const INLINE_BODY: usize = 16 * 1024;
const DNS_TTL: Duration = Duration::from_secs(60);
/// Hosts the DNS cache holds at most: org URLs name hosts too, so it is bounded.
const DNS_MAX: usize = 1024;
const POOL_IDLE: Duration = Duration::from_secs(60);

/// Resolved hosts, each for `DNS_TTL`. Keyed by host strings that org URLs
/// supply too: expired entries are pruned as it fills, and it never holds more than
/// `DNS_MAX` (the oldest goes first).
#[derive(Default)]
struct DnsCache(Mutex<HashMap<(String, u16), (Resolved, Instant)>>);

/// The first address a name resolved to, and whether all its addresses were public.
type Resolved = (SocketAddr, bool);

impl DnsCache {
    fn get(&self, host: &str, port: u16, now: Instant) -> Option<Resolved> {
        let m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let (addr, at) = m.get(&(host.to_string(), port))?;
        (now.saturating_duration_since(*at) < DNS_TTL).then_some(*addr)
    }

    fn put(&self, host: &str, port: u16, addr: Resolved, now: Instant) {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let key = (host.to_string(), port);
        if m.len() >= DNS_MAX && !m.contains_key(&key) {
            m.retain(|_, (_, at)| now.saturating_duration_since(*at) < DNS_TTL);
            if m.len() >= DNS_MAX {
                let oldest = m
                    .iter()
                    .min_by_key(|(_, (_, at))| *at)
                    .map(|(k, _)| k.clone());
                if let Some(k) = oldest {
                    m.remove(&k);
                }
            }
        }
        m.insert(key, (addr, now));
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

/// Why an attempt failed before the rung committed.
#[derive(Clone, Debug, PartialEq)]
pub enum Failure {
    Connect(String),
    HeaderTimeout,
    Status(u16),
    /// The rung accepted (headers arrived) then died before any output.
    DiedBeforeOutput,
    FirstTokenTimeout,
    ErrorEvent,
    BadAnswer,
    /// The request's own deadline passed while waiting on the rung.
    Deadline,
}

impl Failure {
    /// The short label of `x-gateway-attempts` and of metrics.
    pub fn label(&self) -> String {
        match self {
            Failure::Connect(_) => "connect".into(),
            Failure::HeaderTimeout => "header_timeout".into(),
            Failure::Status(s) => s.to_string(),
            Failure::DiedBeforeOutput => "died".into(),
            Failure::FirstTokenTimeout => "first_token_timeout".into(),
            Failure::ErrorEvent => "error_event".into(),
            Failure::BadAnswer => "bad_answer".into(),
            Failure::Deadline => "deadline".into(),
        }
    }

    /// The outcome class of metrics and traces (a fixed set).
    pub fn class(&self) -> &'static str {
        match self {
            Failure::Connect(_) => "connect",
            Failure::HeaderTimeout => "timeout_headers",
            Failure::FirstTokenTimeout => "timeout_first_token",
            Failure::Status(429) => "http_429",
            Failure::Status(s) if *s >= 500 => "http_5xx",
            Failure::Status(_) => "http_4xx",
            Failure::DiedBeforeOutput => "died",
            Failure::ErrorEvent => "error_event",
            Failure::BadAnswer => "bad_answer",
            Failure::Deadline => "deadline",
        }
    }

    /// Whether the failure says the rung is unwell, and so counts toward its
    /// breaker (shared by every org on a platform rung): 5xx, 408, 429, a refused
    /// credential (401/403), connect errors, deaths, and a streamed call's header
    /// timeout. The caller's own bad request (400, 404, 413, 422, ...) never does:
    /// one org could otherwise close a model for everyone. Nor does a timeout the
    /// request explains: a whole answer's header waits for all of its output (a
    /// long `max_tokens`), and a first token for all the thinking before it (a
    /// high reasoning effort); a stream's header comes at once whatever it asks.
    pub fn trips_breaker(&self, streamed: bool) -> bool {
        match self {
            Failure::Status(s) => *s >= 500 || matches!(s, 401 | 403 | 408 | 429),
            Failure::Deadline | Failure::FirstTokenTimeout => false,
            Failure::HeaderTimeout => streamed,
            _ => true,
        }
    }
}

pub struct Upstreams {
    /// Opens connections (and keeps HTTP/2 ones); idle HTTP/1.1 ones wait in `idle`.
    connector: Connector,
    idle: IdlePool,
    /// Targets built once per rung (provider, model id, base URL).
    targets: Mutex<HashMap<u64, Arc<Target>>>,
    dns: DnsCache,
    /// Platform credentials by provider, read from the environment at start.
    credentials: HashMap<String, Arc<str>>,
    providers: HashMap<String, ProviderConfig>,
    /// Bedrock: AWS keys from the standard variables; requests are SigV4-signed.
    aws: Option<sigv4::AwsCredentials>,
    /// Vertex: the service account and its cached access token.
    vertex: Option<Arc<Vertex>>,
    /// Org Vertex accounts with their token caches, by connection id and stamp.
    own_vertex: Mutex<HashMap<String, Arc<Vertex>>>,
    /// `[network] allow_private_upstreams`: org URLs may reach any address.
    allow_private: bool,
}

impl Upstreams {
    pub fn new(config: &Config) -> Upstreams {
        let credentials = config
            .providers
            .iter()
            .filter_map(|(name, p)| {
                let v = std::env::var(&p.api_key_env)
                    .ok()
                    .filter(|v| !v.is_empty())?;
                Some((name.clone(), Arc::<str>::from(v)))
            })
            .collect();
        let vertex = config
            .providers
            .get("vertex")
            .and_then(|p| std::env::var(&p.api_key_env).ok())
            .filter(|v| !v.is_empty())
            .and_then(|v| match google::ServiceAccount::load(&v) {
                Ok(account) => Some(Arc::new(Vertex {
                    account,
                    tokens: google::TokenCache::new(),
                    refresh: tokio::sync::Mutex::new(()),
                    org: false,
                })),
                Err(e) => {
                    tracing::warn!("vertex service account not usable: {e}");
                    None
                }
            });
        Upstreams {
            connector: Connector::new(None),
            idle: IdlePool::new(POOL_IDLE),
            targets: Mutex::new(HashMap::new()),
            dns: DnsCache::default(),
            credentials,
            providers: config.providers.clone().into_iter().collect(),
            aws: sigv4::AwsCredentials::from_env(),
            vertex,
            own_vertex: Mutex::new(HashMap::new()),
            allow_private: config.network.allow_private_upstreams,
        }
    }

    /// Where and how a platform rung is reached (built once, then shared).
    pub fn target(&self, rung: &RungSpec) -> Option<Arc<Target>> {
        use std::hash::BuildHasher;
        // Looked up on every request: a fast hash, and every hit is checked below.
        let key = foldhash::fast::FixedState::default().hash_one((
            &rung.provider,
            &rung.provider_model_id,
            &rung.base_url,
        ));
        let mut cache = self.targets.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(t) = cache.get(&key) {
            if t.provider == rung.provider
                && t.model_id == rung.provider_model_id
                && t.rung_base == rung.base_url
            {
                return Some(t.clone());
            }
        }
        let t = Arc::new(self.build_target(rung, None)?);
        cache.insert(key, t.clone());
        Some(t)
    }

    /// Where and how a rung of the org's own is reached: a BYOK connection or an
    /// org deployment, authenticated with the org's secret (or nothing), never with
    /// a platform credential. Bedrock takes the account's keys
    /// (`config.access_key_id` + the secret), Vertex its service-account JSON.
    pub(crate) fn own_target(
        &self,
        rung: &RungSpec,
        rung_id: &str,
        account: Option<&crate::byok::Live>,
    ) -> Option<Arc<Target>> {
        let own_cloud = match rung.provider.as_str() {
            "bedrock" => {
                let a = account?;
                let key_id = a.conn.config.get("access_key_id")?.as_str()?;
                Some(OwnCloud::Aws(Arc::new(sigv4::AwsCredentials {
                    access_key_id: key_id.to_string(),
                    secret_access_key: a.secret.to_string(),
                    session_token: None,
                })))
            }
            "vertex" => Some(OwnCloud::Vertex(self.own_vertex(account?)?)),
            _ => None,
        };
        // The breaker and the Vertex path see the account's public name, not its secret.
        let credential: Option<Arc<str>> = match &own_cloud {
            Some(OwnCloud::Aws(c)) => Some(Arc::from(c.access_key_id.as_str())),
            Some(OwnCloud::Vertex(v)) => Some(Arc::from(v.account.project_id.as_str())),
            None => account.map(|a| a.secret.clone()),
        };
        // The operator's own endpoint of a provider with no public one (local,
        // hosted) is never an org's: the org must name its base URL.
        if rung.base_url.is_empty() && !crate::config::has_public_endpoint(&rung.provider) {
            return None;
        }
        let mut t = self.build_target(rung, Some(credential))?;
        t.org_url = !rung.base_url.is_empty();
        t.breaker_key = format!("{rung_id}|{}", t.breaker_key);
        t.set_rung_id(rung_id.to_string());
        t.own_cloud = own_cloud;
        Some(Arc::new(t))
    }

    /// Mints an access token for an org's Vertex account: the cheap real call that
    /// checks the service account.
    pub async fn check_own_vertex(&self, t: &Target) -> Result<(), Failure> {
        match &t.own_cloud {
            Some(OwnCloud::Vertex(v)) => Box::pin(self.vertex_token(v)).await.map(|_| ()),
            _ => Err(Failure::Connect("not a vertex account".into())),
        }
    }

    /// An org Vertex account, loaded once per version of its connection (the token
    /// cache lives with it). Only key JSON is accepted, never a path.
    fn own_vertex(&self, a: &crate::byok::Live) -> Option<Arc<Vertex>> {
        let key = format!("{}:{}", a.conn.id, a.conn.updated_at);
        let mut cache = self.own_vertex.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(v) = cache.get(&key) {
            return Some(v.clone());
        }
        let account = google::ServiceAccount::from_json(&a.secret).ok()?;
        let v = Arc::new(Vertex {
            account,
            tokens: google::TokenCache::new(),
            refresh: tokio::sync::Mutex::new(()),
            org: true,
        });
        cache.retain(|k, _| !k.starts_with(&format!("{}:", a.conn.id)));
        cache.insert(key, v.clone());
        Some(v)
    }

    /// `own`: the org's credential (`Some(None)`: none at all); `None`: the
    /// platform's.
    fn build_target(&self, rung: &RungSpec, own: Option<Option<Arc<str>>>) -> Option<Target> {
        let p = self.providers.get(&rung.provider)?;
        let public;
        let base = match (rung.base_url.is_empty(), own.is_some()) {
            (false, _) => &rung.base_url,
            // An org's rung that names no endpoint goes to the provider's public
            // one, never the operator's, which may add the platform's credential
            // (L11 of the 2026-12-01 security review); unless private upstreams
            // are allowed, where orgs may reach the operator's network anyway.
            (true, true) if !self.allow_private => {
                public = crate::config::public_base_url(&rung.provider);
                &public
            }
            (true, _) => &p.base_url,
        };
        let (tls, host, port, prefix) = parse_base(base)?;
        // Bedrock and Vertex have no static credential: the rung is reachable when
        // their keys loaded; the breaker tells accounts apart by key id / account.
        let credential = match (rung.provider.as_str(), own) {
            (_, Some(own)) => own,
            ("bedrock", None) => Some(Arc::<str>::from(self.aws.as_ref()?.access_key_id.as_str())),
            ("vertex", None) => Some(Arc::<str>::from(
                self.vertex.as_ref()?.account.project_id.as_str(),
            )),
            (_, None) => self.credentials.get(&rung.provider).cloned(),
        };
        let region = match rung.provider.as_str() {
            "bedrock" => sigv4::region_from_host(&host),
            "vertex" => google::region_from_host(&host),
            _ => String::new(),
        };
        let cred_tag = credential.as_deref().map_or(String::new(), |c| {
            use sha2::Digest;
            hex::encode(&sha2::Sha256::digest(c.as_bytes())[..6])
        });
        let mut t = Target {
            rung_id: String::new(),
            rung_json: Vec::new(),
            chat_path: Target::build_chat_path(&rung.provider, &prefix, &rung.provider_model_id),
            provider: rung.provider.clone(),
            model_id: rung.provider_model_id.clone(),
            rung_base: rung.base_url.clone(),
            breaker_key: format!(
                "{}|{}|{}|{}",
                rung.provider, rung.provider_model_id, base, cred_tag
            ),
            authority: Target::authority(tls, &host, port),
            peer: PeerCache::default(),
            org_url: false,
            tls,
            ip: host.parse().ok(),
            host,
            port,
            prefix,
            credential,
            connect_timeout: Duration::from_millis(p.connect_timeout_ms),
            header_timeout: Duration::from_millis(p.header_timeout_ms),
            first_token_timeout: Duration::from_millis(p.first_token_timeout_ms),
            stream_idle_timeout: Duration::from_millis(p.stream_idle_timeout_ms),
            region,
            own_cloud: None,
        };
        t.set_rung_id(rung.id());
        Some(t)
    }

    /// Where a target connects: its address, or the first its name resolves to.
    /// For an org URL (unless private upstreams are allowed) every address must be
    /// public, and the URL https: a row written while the flag was on, or a name
    /// whose DNS answer changed since it was written, is refused here.
    async fn address(&self, t: &Target) -> Result<SocketAddr, Failure> {
        let guard = t.org_url && !self.allow_private;
        if guard && !t.tls {
            return Err(Failure::Connect(egress::REFUSED.into()));
        }
        let (addr, public) = match t.ip {
            Some(ip) => (SocketAddr::new(ip, t.port), egress::is_public(ip)),
            None => self.resolve(&t.host, t.port).await?,
        };
        if guard && !public {
            return Err(Failure::Connect(egress::REFUSED.into()));
        }
        Ok(addr)
    }

    /// The first address `host` resolves to, and whether every address it resolves
    /// to is public.
    async fn resolve(&self, host: &str, port: u16) -> Result<(SocketAddr, bool), Failure> {
        if let Ok(ip) = host.parse::<std::net::IpAddr>() {
            return Ok((SocketAddr::new(ip, port), egress::is_public(ip)));
        }
        if let Some(found) = self.dns.get(host, port, Instant::now()) {
            return Ok(found);
        }
        let all: Vec<SocketAddr> = tokio::net::lookup_host((host, port))
            .await
            .map_err(|e| Failure::Connect(format!("dns: {e}")))?
            .collect();
        let addr = *all
            .first()
            .ok_or_else(|| Failure::Connect("dns: no address".into()))?;
        let public = all.iter().all(|a| egress::is_public(a.ip()));
        self.dns.put(host, port, (addr, public), Instant::now());
        Ok((addr, public))
    }

    /// A Vertex access token: the cached one, or a fresh one from the account's
    /// token endpoint (one refresh at a time).
    async fn vertex_token(&self, v: &Vertex) -> Result<String, Failure> {
        let now = crate::store::now_ms() / 1000;
        if let Some(t) = v.tokens.get(now as u64) {
            return Ok(t);
        }
        let _one = v.refresh.lock().await;
        if let Some(t) = v.tokens.get(now as u64) {
            return Ok(t);
        }
        let assertion = google::assertion(&v.account, now as u64)
            .map_err(|e| Failure::Connect(format!("vertex token: {e}")))?;
        let form = google::token_request_body(&assertion);
        let (tls, host, port, path) = parse_base(&v.account.token_uri)
            .ok_or_else(|| Failure::Connect("vertex token: bad token_uri".into()))?;
        let token_target = Target {
            authority: Target::authority(tls, &host, port),
            peer: PeerCache::default(),
            org_url: v.org,
            rung_id: String::new(),
            rung_json: Vec::new(),
            chat_path: String::new(),
            provider: "oauth".into(),
            model_id: String::new(),
            tls,
            ip: host.parse().ok(),
            host,
            port,
            prefix: String::new(),
            credential: None,
            connect_timeout: Duration::from_secs(5),
            header_timeout: Duration::from_secs(10),
            first_token_timeout: Duration::from_secs(10),
            stream_idle_timeout: Duration::from_secs(10),
            rung_base: String::new(),
            breaker_key: String::new(),
            region: String::new(),
            own_cloud: None,
        };
        let path = if path.is_empty() {
            "/".to_string()
        } else {
            path
        };
        let mut call = Box::pin(self.send(
            "POST",
            &token_target,
            &path,
            Bytes::from(form).into(),
            false,
            "application/x-www-form-urlencoded",
            (&[], None),
        ))
        .await?;
        let mut buf = Vec::new();
        while let Ok(Ok(Some(b))) = within(Duration::from_secs(10), call.read()).await {
            buf.extend_from_slice(&b);
            if buf.len() > 64 * 1024 {
                break;
            }
        }
        let status = call.status();
        call.finish().await;
        if status != 200 {
            return Err(Failure::Connect(format!("vertex token: status {status}")));
        }
        let (token, expires_in) = google::parse_token_response(&buf)
            .map_err(|e| Failure::Connect(format!("vertex token: {e}")))?;
        v.tokens.put(token.clone(), expires_in, now as u64);
        Ok(token)
    }

    /// Sends a POST and waits for the response header.
    pub async fn post(
        &self,
        t: &Target,
        path: &str,
        body: OutBody,
        stream: bool,
        extra: &[(&'static str, String)],
    ) -> Result<Call<'_>, Failure> {
        self.post_traced(t, path, body, stream, extra, None).await
    }

    /// As [`Upstreams::post`], with the request's W3C `traceparent` (providers
    /// that trace join the request's trace; the others ignore it).
    pub async fn post_traced(
        &self,
        t: &Target,
        path: &str,
        body: OutBody,
        stream: bool,
        extra: &[(&'static str, String)],
        traceparent: Option<&str>,
    ) -> Result<Call<'_>, Failure> {
        // Boxed here, once: the connect-and-send state machine is about 10 KB, and
        // every async layer above that held it inline would grow by a copy of it
        // (and be memmoved whole each time it is boxed or polled into place).
        // In a statement of its own: a temporary of the awaiting statement (the
        // unboxed future) would stay in this future's state until the await ends.
        let send = Box::pin(self.send(
            "POST",
            t,
            path,
            body,
            stream,
            "application/json",
            (extra, traceparent),
        ));
        send.await
    }

    /// Sends a GET and reads the whole answer (at most 1 MB): status and body.
    pub async fn get(&self, t: &Target, path: &str) -> Result<(u16, Vec<u8>), Failure> {
        let mut call = self
            .send(
                "GET",
                t,
                path,
                OutBody::default(),
                false,
                "application/json",
                (&[], None),
            )
            .await?;
        let status = call.status();
        let mut body = Vec::new();
        loop {
            match within(t.header_timeout, call.read()).await {
                Ok(Ok(Some(b))) if body.len() + b.len() <= 1 << 20 => body.extend_from_slice(&b),
                Ok(Ok(None)) => break,
                _ => return Err(Failure::BadAnswer),
            }
        }
        call.finish().await;
        Ok((status, body))
    }

    #[allow(clippy::too_many_arguments)]
    async fn send(
        &self,
        method: &'static str,
        t: &Target,
        path: &str,
        body: OutBody,
        stream: bool,
        content_type: &'static str,
        (extra, traceparent): (&[(&'static str, String)], Option<&str>),
    ) -> Result<Call<'_>, Failure> {
        let addr = self.address(t).await?;
        let authority = t.authority.as_str();
        let mut head = Head::new(method, path);
        head.field("Host", Val::Str(authority));
        head.field("Content-Type", Val::Str(content_type));
        head.field("Content-Length", Val::Len(body.len()));
        head.field("User-Agent", Val::Str("sluice/0.1"));
        if stream {
            head.field("Accept", Val::Str("text/event-stream"));
        }
        let signed;
        let token;
        match t.provider.as_str() {
            "bedrock" => {
                let creds = match &t.own_cloud {
                    Some(OwnCloud::Aws(c)) => c.as_ref(),
                    _ => self
                        .aws
                        .as_ref()
                        .ok_or_else(|| Failure::Connect("no aws keys".into()))?,
                };
                signed = sigv4::sign(
                    creds,
                    &t.region,
                    method,
                    authority,
                    path,
                    &[("content-type", "application/json")],
                    &body.to_bytes(),
                    std::time::SystemTime::now(),
                )
                .map_err(|e| Failure::Connect(format!("sigv4: {e}")))?;
                for (name, value) in &signed {
                    head.field(name, Val::Str(value));
                }
            }
            "vertex" => {
                let v = match &t.own_cloud {
                    Some(OwnCloud::Vertex(v)) => v.clone(),
                    _ => self
                        .vertex
                        .clone()
                        .ok_or_else(|| Failure::Connect("no vertex account".into()))?,
                };
                let minted = Box::pin(self.vertex_token(&v));
                token = minted.await?;
                head.field("Authorization", Val::Bearer(&token));
            }
            _ => {}
        }
        if let Some(c) = t
            .credential
            .as_ref()
            .filter(|_| !matches!(t.provider.as_str(), "bedrock" | "vertex"))
        {
            match t.provider.as_str() {
                "azure" => head.field("api-key", Val::Str(c)),
                // Brave Search (a web search vendor, `upstream::vendor`).
                "brave" => head.field("X-Subscription-Token", Val::Str(c)),
                "anthropic" => head.field("x-api-key", Val::Str(c)),
                "google" => head.field("x-goog-api-key", Val::Str(c)),
                _ => head.field("Authorization", Val::Bearer(c)),
            }
        }
        // A messages client's own version, when it named one, goes instead.
        if t.provider == "anthropic" && !extra.iter().any(|(n, _)| *n == "anthropic-version") {
            head.field("anthropic-version", Val::Str(ANTHROPIC_VERSION));
        }
        if method == "GET" {
            head.field("Accept", Val::Str("application/json"));
        }
        for (name, value) in extra {
            head.field(name, Val::Str(value.as_str()));
        }
        if let Some(tp) = traceparent {
            head.field("traceparent", Val::Str(tp));
        }
        // The connection last: none is held while a token is minted.
        let (peer, reuse_key) = t.peer(addr);
        let conn = match self.idle.take(reuse_key) {
            Some(stream) => Conn::H1(stream),
            None => {
                // Boxed: opening a connection (a TLS handshake, say) is the rare
                // path, and inline its state would be part of every call's.
                let connect = Box::pin(self.connector.get_http_session(&*peer));
                match connect
                    .await
                    .map_err(|e| Failure::Connect(e.etype().as_str().to_string()))?
                    .0
                {
                    HttpSession::H1(h1) => Conn::H1(h1.into_inner()),
                    other => Conn::Other(Box::new(other)),
                }
            }
        };
        // Writing may block on a stalled peer: it counts against the header wait.
        let started = Instant::now();
        let session = match conn {
            // HTTP/1.1: header and body leave in one write. Pingora's client flushes
            // the header on its own, which costs a second send per request. A
            // small body is copied behind the head; a large one is not copied but
            // sent beside it (one vectored write).
            Conn::H1(mut stream) => {
                let inline = body.len() <= INLINE_BODY;
                let wire = head
                    .to_h1(if inline { body.parts() } else { &[] })
                    .ok_or_else(|| Failure::Connect("bad request header".into()))?;
                let sent = async {
                    if inline {
                        stream.write_all(&wire).await?;
                    } else {
                        stream
                            .write_all_buf(&mut (&wire[..]).chain(body.reader()))
                            .await?;
                    }
                    stream.flush().await
                };
                match within(t.header_timeout, sent).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => return Err(Failure::Connect(e.kind().to_string())),
                    Err(_) => return Err(Failure::HeaderTimeout),
                }
                let left = t.header_timeout.saturating_sub(started.elapsed());
                Session::H1(header_within(left, h1::Response::read_head(stream)).await?)
            }
            Conn::Other(mut other) => {
                let req = head
                    .to_request_header()
                    .ok_or_else(|| Failure::Connect("bad request header".into()))?;
                // Boxed, as HTTP/2 is the rare path here.
                let sent = Box::pin(async {
                    other.write_request_header(Box::new(req)).await?;
                    other.write_request_body(body.to_bytes(), true).await?;
                    other.finish_request_body().await
                });
                match within(t.header_timeout, sent).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => return Err(Failure::Connect(e.etype().as_str().to_string())),
                    Err(_) => return Err(Failure::HeaderTimeout),
                }
                let left = t.header_timeout.saturating_sub(started.elapsed());
                header_within(left, Box::pin(other.read_response_header())).await?;
                Session::Other(other)
            }
        };
        Ok(Call {
            upstreams: self,
            session: Some(session),
            peer,
            reuse_key,
        })
    }
}

/// Waits for an answer's header in what is left of the header timeout: a peer that
/// closes or breaks the framing died before output.
async fn header_within<T>(
    left: Duration,
    head: impl std::future::Future<Output = pingora::Result<T>>,
) -> Result<T, Failure> {
    match within(left, head).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(_)) => Err(Failure::DiedBeforeOutput),
        Err(_) => Err(Failure::HeaderTimeout),
    }
}

/// A connection about to carry a request: a bare HTTP/1.1 stream (from the idle
/// pool or just opened) or a session of another protocol.
enum Conn {
    H1(pingora::protocols::Stream),
    Other(Box<HttpSession>),
}

/// An exchange whose answer is being read: HTTP/1.1 by our own reader, anything
/// else by Pingora's session.
enum Session {
    H1(h1::Response<pingora::protocols::Stream>),
    Other(Box<HttpSession>),
}

/// One upstream exchange after its header arrived.
pub struct Call<'a> {
    upstreams: &'a Upstreams,
    session: Option<Session>,
    peer: Arc<HttpPeer>,
    reuse_key: u64,
}

impl Call<'_> {
    pub fn status(&self) -> u16 {
        match &self.session {
            Some(Session::H1(r)) => r.status(),
            Some(Session::Other(s)) => s.response_header().map_or(0, |h| h.status.as_u16()),
            None => 0,
        }
    }

    /// The next body piece; `Ok(None)` at a clean end.
    pub async fn read(&mut self) -> pingora::Result<Option<Bytes>> {
        match self.session.as_mut() {
            Some(Session::H1(r)) => r.read().await,
            Some(Session::Other(s)) => s.read_response_body().await,
            None => Ok(None),
        }
    }

    /// Gives the connection back to the pool if the answer was read whole;
    /// otherwise it is closed.
    pub async fn finish(mut self) {
        match self.session.take() {
            Some(Session::H1(r)) => {
                if let Some(stream) = r.reusable() {
                    self.upstreams.idle.put(self.reuse_key, stream);
                }
            }
            Some(Session::Other(mut s)) => {
                if !s.response_done() {
                    return;
                }
                // Boxed: Pingora's release future is several KB, and inline it
                // would enlarge (and be copied with) every attempt's state.
                let release = Box::pin(self.upstreams.connector.release_http_session(
                    *s,
                    &*self.peer,
                    Some(POOL_IDLE),
                ));
                release.await
            }
            None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_rungs_own_failures_trip_the_breaker() {
        for streamed in [true, false] {
            for s in [500, 502, 503, 529, 408, 429, 401, 403] {
                assert!(Failure::Status(s).trips_breaker(streamed), "{s}");
            }
            for s in [400, 404, 409, 413, 422] {
                assert!(!Failure::Status(s).trips_breaker(streamed), "{s}");
            }
            assert!(Failure::Connect("refused".into()).trips_breaker(streamed));
            assert!(Failure::DiedBeforeOutput.trips_breaker(streamed));
            assert!(!Failure::Deadline.trips_breaker(streamed));
            // The request's own length or thinking explains these (M8 of the
            // 2026-12-01 security review).
            assert!(!Failure::FirstTokenTimeout.trips_breaker(streamed));
        }
        assert!(Failure::HeaderTimeout.trips_breaker(true));
        assert!(!Failure::HeaderTimeout.trips_breaker(false));
    }

    #[test]
    fn the_dns_cache_is_bounded_and_pruned() {
        let cache = DnsCache::default();
        let addr: Resolved = ("203.0.113.7:443".parse().unwrap(), true);
        let t0 = Instant::now();
        for i in 0..DNS_MAX * 3 {
            cache.put(&format!("h{i}.example"), 443, addr, t0);
        }
        assert_eq!(cache.len(), DNS_MAX, "never past the bound");
        assert_eq!(
            cache.get(&format!("h{}.example", DNS_MAX * 3 - 1), 443, t0),
            Some(addr)
        );
        // Once they expired, the next insert sweeps them all out.
        let later = t0 + DNS_TTL + Duration::from_secs(1);
        assert_eq!(cache.get("h0.example", 443, later), None);
        cache.put("fresh.example", 443, addr, later);
        assert_eq!(cache.len(), 1);
    }

    #[test]
    fn debug_leaves_the_credential_out() {
        let mut config = Config::default();
        config.providers.insert(
            "openai".into(),
            crate::config::ProviderConfig {
                base_url: "https://api.openai.com/v1".into(),
                ..Default::default()
            },
        );
        let rung = RungSpec {
            provider: "openai".into(),
            provider_model_id: "gpt-4.1-mini".into(),
            base_url: String::new(),
            zdr: false,
            caps: Vec::new(),
        };
        let t = Upstreams::new(&config)
            .build_target(&rung, Some(Some(Arc::from("sk-very-secret-123"))))
            .unwrap();
        let shown = format!("{t:?}");
        assert!(!shown.contains("sk-very-secret-123"), "{shown}");
        assert!(
            shown.contains("gpt-4.1-mini") && shown.contains("<redacted>"),
            "{shown}"
        );
    }

    /// L11 of the 2026-12-01 security review: an org's rung that names no endpoint
    /// goes to the provider's public one, not the operator's configured one (an
    /// internal proxy, say, that adds the platform's key); the platform's rungs
    /// keep the operator's.
    #[test]
    fn an_org_rung_without_a_base_url_never_takes_the_operators() {
        let mut config = Config::default();
        config.providers.insert(
            "openai".into(),
            crate::config::ProviderConfig {
                base_url: "http://key-adding-proxy.internal:8000/v1".into(),
                ..Default::default()
            },
        );
        let rung = RungSpec {
            provider: "openai".into(),
            provider_model_id: "gpt-4.1-mini".into(),
            base_url: String::new(),
            zdr: false,
            caps: Vec::new(),
        };
        let up = Upstreams::new(&config);
        let own = up
            .build_target(&rung, Some(Some(Arc::from("sk-org"))))
            .unwrap();
        assert_eq!(own.host(), "api.openai.com");
        let platform = up.build_target(&rung, None).unwrap();
        assert_eq!(platform.host(), "key-adding-proxy.internal");
        // Private upstreams allowed: the operator trusts orgs with its network.
        config.network.allow_private_upstreams = true;
        let own = Upstreams::new(&config)
            .build_target(&rung, Some(Some(Arc::from("sk-org"))))
            .unwrap();
        assert_eq!(own.host(), "key-adding-proxy.internal");
    }

    #[test]
    fn base_urls() {
        assert_eq!(
            parse_base("https://api.openai.com/v1"),
            Some((true, "api.openai.com".into(), 443, "/v1".into()))
        );
        assert_eq!(
            parse_base("http://127.0.0.1:9000"),
            Some((false, "127.0.0.1".into(), 9000, "".into()))
        );
        assert_eq!(
            parse_base("http://localhost:11434/v1/"),
            Some((false, "localhost".into(), 11434, "/v1".into()))
        );
        assert_eq!(parse_base("ftp://x"), None);
    }
}
