//! Where a rung lives and how it authenticates: its host, paths per wire, timeouts,
//! credential (never printed) and breaker key, built once per rung and shared.

use super::auth::{google, sigv4};
use pingora::prelude::HttpPeer;
use pingora::upstreams::peer::Peer;
use sluice_filters::upstream::{bedrock, gemini, Wire};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The version of Azure OpenAI's data-plane API we speak.
const AZURE_API_VERSION: &str = "2024-10-21";

/// How a rung is reached. Debug leaves the credential out.
#[derive(Clone)]
pub struct Target {
    /// `<provider>:<provider_model_id>`.
    pub rung_id: String,
    /// `rung_id` as a JSON string: the `provider` member spliced into answers.
    pub rung_json: Vec<u8>,
    /// Where chat completions are posted.
    pub(super) chat_path: String,
    pub provider: String,
    pub model_id: String,
    pub(super) tls: bool,
    pub(super) host: String,
    /// `host` when it is an IP address, parsed once.
    pub(super) ip: Option<std::net::IpAddr>,
    pub(super) port: u16,
    /// Path prefix of the base URL, without a trailing slash.
    pub(super) prefix: String,
    pub(super) credential: Option<Arc<str>>,
    pub connect_timeout: Duration,
    pub header_timeout: Duration,
    pub first_token_timeout: Duration,
    /// Longest silence between chunks of a committed stream.
    pub stream_idle_timeout: Duration,
    /// The rung's own base URL as the catalog gives it (empty: the provider's).
    pub(super) rung_base: String,
    /// Keys the circuit breaker: the rung's provider, model id, base URL and
    /// credential (never the host alone).
    pub breaker_key: String,
    /// Bedrock and Vertex: the cloud region the base URL names.
    pub(super) region: String,
    /// An org's own cloud account (BYOK on Bedrock or Vertex), in place of the
    /// platform's.
    pub(super) own_cloud: Option<OwnCloud>,
    /// `host[:port]` for the Host header and signing.
    pub(super) authority: String,
    pub(super) peer: PeerCache,
    /// The address comes from an org (a deployment's or connection's base URL, a
    /// Vertex token_uri): every connection checks where it really goes.
    pub(super) org_url: bool,
}

/// The peer for the last address the host resolved to, built once: a peer owns
/// its name and options, and its reuse hash walks them.
#[derive(Clone, Default)]
pub(super) struct PeerCache(Arc<Mutex<Option<CachedPeer>>>);

/// A resolved address, its peer and the peer's pool key.
pub(super) type CachedPeer = (SocketAddr, Arc<HttpPeer>, u64);

impl std::fmt::Debug for PeerCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PeerCache")
    }
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("rung_id", &self.rung_id)
            .field("provider", &self.provider)
            .field("model_id", &self.model_id)
            .field("authority", &self.authority)
            .field("prefix", &self.prefix)
            .field(
                "credential",
                &self.credential.as_ref().map(|_| "<redacted>"),
            )
            .field("own_cloud", &self.own_cloud)
            .finish_non_exhaustive()
    }
}

/// An org's own Bedrock keys or Vertex service account.
#[derive(Clone)]
pub(super) enum OwnCloud {
    Aws(Arc<sigv4::AwsCredentials>),
    Vertex(Arc<Vertex>),
}

impl std::fmt::Debug for OwnCloud {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            OwnCloud::Aws(_) => "OwnCloud::Aws(..)",
            OwnCloud::Vertex(_) => "OwnCloud::Vertex(..)",
        })
    }
}

impl Target {
    /// `text` with this rung's credential blanked out: a provider's error message
    /// may echo what it was sent, and it reaches the client.
    /// The host the rung is reached at (for traces).
    pub fn host(&self) -> &str {
        &self.host
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn redact(&self, text: &str) -> String {
        match self.credential.as_deref().filter(|c| c.len() >= 8) {
            Some(c) => text.replace(c, "[redacted]"),
            None => text.to_string(),
        }
    }

    /// A path under the rung's base URL.
    pub fn under_base(&self, suffix: &str) -> String {
        format!("{}{suffix}", self.prefix)
    }

    /// Names the rung, and keeps its JSON form (spliced into every answer) with it.
    pub(super) fn set_rung_id(&mut self, id: String) {
        self.rung_json = serde_json::to_vec(&id).unwrap_or_default();
        self.rung_id = id;
    }

    /// The request path of the chat-completions endpoint.
    pub fn chat_path(&self) -> &str {
        &self.chat_path
    }

    /// The chat-completions path under the base URL, built once per target.
    pub(super) fn build_chat_path(provider: &str, prefix: &str, model_id: &str) -> String {
        if provider == "azure" {
            format!(
                "{prefix}/openai/deployments/{model_id}/chat/completions?api-version={AZURE_API_VERSION}"
            )
        } else {
            format!("{prefix}/chat/completions")
        }
    }

    /// The request path of this rung's endpoint for `wire`.
    pub fn path(&self, wire: Wire, stream: bool) -> String {
        match wire {
            Wire::OpenAiChat => self.chat_path().to_string(),
            Wire::OpenAiResponses => format!("{}/responses", self.prefix),
            Wire::Anthropic if self.provider == "vertex" => self.vertex_path("anthropic", stream),
            Wire::Gemini if self.provider == "vertex" => self.vertex_path("google", stream),
            Wire::Anthropic => format!("{}/v1/messages", self.prefix),
            Wire::Gemini => format!("{}{}", self.prefix, gemini::path(&self.model_id, stream)),
            Wire::Bedrock => format!("{}{}", self.prefix, bedrock::path(&self.model_id, stream)),
        }
    }

    /// The OpenAI-compatible embeddings endpoint (Azure: the deployment's).
    pub fn embeddings_path(&self) -> String {
        if self.provider == "azure" {
            format!(
                "{}/openai/deployments/{}/embeddings?api-version={AZURE_API_VERSION}",
                self.prefix, self.model_id
            )
        } else {
            format!("{}/embeddings", self.prefix)
        }
    }

    /// Bedrock's `invoke` endpoint of the rung's model (embeddings).
    pub fn bedrock_invoke_path(&self) -> String {
        format!(
            "{}{}",
            self.prefix,
            sigv4::model_path(&self.model_id, "invoke")
        )
    }

    /// Gemini's batch embeddings endpoint.
    pub fn gemini_embed_path(&self) -> String {
        format!(
            "{}/v1beta/models/{}:batchEmbedContents",
            self.prefix, self.model_id
        )
    }

    /// Vertex AI's embeddings endpoint (`predict` on the publisher model).
    pub fn vertex_embed_path(&self) -> String {
        let project = self.credential.as_deref().unwrap_or_default();
        format!(
            "{}{}",
            self.prefix,
            google::vertex_path(project, &self.region, "google", &self.model_id, "predict")
        )
    }

    /// A Vertex AI publisher model endpoint; the project comes from the service
    /// account.
    pub(super) fn vertex_path(&self, publisher: &str, stream: bool) -> String {
        let method = match (publisher, stream) {
            ("anthropic", true) => "streamRawPredict",
            ("anthropic", false) => "rawPredict",
            (_, true) => "streamGenerateContent?alt=sse",
            (_, false) => "generateContent",
        };
        let project = self.credential.as_deref().unwrap_or_default();
        format!(
            "{}{}",
            self.prefix,
            google::vertex_path(project, &self.region, publisher, &self.model_id, method)
        )
    }

    pub(super) fn authority(tls: bool, host: &str, port: u16) -> String {
        let default_port = if tls { 443 } else { 80 };
        if port == default_port {
            host.to_string()
        } else {
            format!("{host}:{port}")
        }
    }

    /// The peer at `addr` and its pool key.
    pub(super) fn peer(&self, addr: SocketAddr) -> (Arc<HttpPeer>, u64) {
        let mut cached = self.peer.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((a, peer, key)) = cached.as_ref() {
            if *a == addr {
                return (peer.clone(), *key);
            }
        }
        let mut peer = HttpPeer::new(addr, self.tls, self.host.clone());
        peer.options.connection_timeout = Some(self.connect_timeout);
        peer.options.total_connection_timeout = Some(self.connect_timeout);
        let key = peer.reuse_hash();
        let peer = Arc::new(peer);
        *cached = Some((addr, peer.clone(), key));
        (peer, key)
    }
}

/// A Vertex AI service account and its access token.
pub(super) struct Vertex {
    pub(super) account: google::ServiceAccount,
    pub(super) tokens: google::TokenCache,
    /// Serializes refreshes: a burst of requests makes one token request.
    pub(super) refresh: tokio::sync::Mutex<()>,
    /// An org's account: its token_uri is an org URL.
    pub(super) org: bool,
}
