//! Pulls: the gateway reads an org's traces from a source with a credential the
//! org hands over for that one pull (braintrust, langsmith, langfuse, posthog and
//! mastra through their public HTTP APIs, postgres through a real connection),
//! stores what it read as an export of the source's own records (JSONL) and
//! projects it like an upload, in the request: 201 with the counts.
//!
//! The credential is used for that pull and dropped: it is never written to the
//! database, a log line, an answer or the object store (error texts are scrubbed
//! of it before they go anywhere). One pull reads at most `config.limit` records
//! (1,000 by default, 10,000 at most), at most `[telemetry] max_upload_bytes` from
//! the source (counted as the bytes arrive, whatever the source says of their
//! length), at most `limit + 500` requests, pages of at most 4 MiB each, for at
//! most `[telemetry] pull_timeout_ms` in all; an org runs at most two pulls at
//! once, an instance eight. A source that would send more is cut off: what it
//! sent before is kept (the pull says it stopped at its bound), or, with nothing
//! kept, the pull is refused.

mod braintrust;
mod http;
mod langfuse;
mod langsmith;
mod mastra;
mod postgres;
mod posthog;

use super::answers::{check_kind, check_label, Refusal};
use super::ingests::{self, Ingest, NewIngest};
use super::model::SourceKind;
use super::worker::{project_bytes, Verdict};
use crate::state::AppState;
use crate::upstream::egress;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use sluice_filters::{ApiError, ErrorCode};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

/// The pull's body. No `Debug`: it holds the credential.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PullBody {
    transport_kind: String,
    source_kind: String,
    source_label: String,
    credential: String,
    #[serde(default)]
    config: Option<Value>,
}

const DEFAULT_LIMIT: usize = 1_000;
const MAX_LIMIT: usize = 10_000;
/// Requests a pull may make beyond one per record (pages, look-ups).
const SPARE_REQUESTS: u32 = 500;
/// Pulls one org may run at once on an instance, and the instance in all.
const PULLS_PER_ORG: usize = 2;
const PULLS_PER_INSTANCE: usize = 8;

/// The pulls running on this instance, by org.
fn running() -> &'static Mutex<HashMap<String, usize>> {
    static RUNNING: OnceLock<Mutex<HashMap<String, usize>>> = OnceLock::new();
    RUNNING.get_or_init(Default::default)
}

/// A running pull's place; given back when it ends, however it ends.
struct Slot(String);

impl Slot {
    fn take(org_id: &str) -> Result<Slot, Refusal> {
        let mut map = running().lock().unwrap_or_else(|p| p.into_inner());
        let total: usize = map.values().sum();
        let mine = map.get(org_id).copied().unwrap_or(0);
        if mine >= PULLS_PER_ORG || total >= PULLS_PER_INSTANCE {
            return Err(Refusal {
                error: ApiError::new(
                    ErrorCode::RateLimited,
                    if mine >= PULLS_PER_ORG {
                        format!("This organization already runs {PULLS_PER_ORG} pulls; retry when one ends.")
                    } else {
                        "Too many pulls are running; retry shortly.".to_string()
                    },
                ),
                retry_after: Some(5),
            });
        }
        *map.entry(org_id.to_string()).or_default() += 1;
        Ok(Slot(org_id.to_string()))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut map = running().lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = map.get_mut(&self.0) {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.0);
            }
        }
    }
}

/// Why a pull failed, before it is scrubbed and answered.
pub enum PullError {
    /// The source refused the credential, or it is malformed: 400 `credential`.
    Credential(String),
    /// The config is wrong (a missing project, table, a bad value): 400 naming it.
    Config(&'static str, String),
    /// The source could not be reached: 400 `config.base_url`.
    Unreachable(String),
    /// The source rate-limited the pull: 429, with its Retry-After.
    RateLimited(Option<u64>),
    /// The source answered with a failure of its own: 502.
    Source(String),
    /// The pull spent its bytes or its requests: what was read is kept, or with
    /// nothing read, the source's failure.
    Exhausted(&'static str),
    /// The pull ran past `[telemetry] pull_timeout_ms`: 504.
    Deadline(u64),
}

impl PullError {
    fn into_refusal(self, secrets: &[&str]) -> Refusal {
        let clean = |s: String| scrub(&s, secrets);
        let error = match self {
            PullError::Credential(m) => ApiError::invalid_parameter("credential", clean(m)),
            PullError::Config(p, m) => ApiError::invalid_parameter(p, clean(m)),
            PullError::Unreachable(m) => ApiError::invalid_parameter(
                "config.base_url",
                format!("the source could not be reached: {}", clean(m)),
            ),
            PullError::RateLimited(after) => {
                return Refusal {
                    error: ApiError::new(
                        ErrorCode::RateLimited,
                        match after {
                            Some(s) => format!(
                                "The source rate-limited the pull; retry after {s} seconds."
                            ),
                            None => "The source rate-limited the pull; retry later.".into(),
                        },
                    ),
                    retry_after: Some(after.unwrap_or(60)),
                }
            }
            PullError::Source(m) => ApiError::new(ErrorCode::ProviderInternal, clean(m)),
            PullError::Exhausted(what) => ApiError::new(
                ErrorCode::ProviderInternal,
                format!("the source sent no whole record within the pull's {what}"),
            ),
            PullError::Deadline(ms) => ApiError::new(
                ErrorCode::DeadlineExceeded,
                format!(
                    "the pull did not finish within {ms} ms ([telemetry] pull_timeout_ms); narrow it with config.since or config.limit"
                ),
            ),
        };
        Refusal::from(error)
    }
}

/// Replaces every secret in an error text, and the parts that are secrets alone:
/// a URL's password, each half of a `public:secret` pair.
pub fn scrub(text: &str, secrets: &[&str]) -> String {
    let mut out = text.to_string();
    let mut pieces: Vec<&str> = Vec::new();
    for s in secrets {
        pieces.push(s);
        if let Some((_, rest)) = s.split_once("://") {
            let authority = rest.split('/').next().unwrap_or("");
            let userinfo = authority.rsplit_once('@').map(|(u, _)| u);
            if let Some((_, password)) = userinfo.and_then(|u| u.split_once(':')) {
                pieces.push(password);
            }
        } else {
            pieces.extend(s.split(':').filter(|p| p.len() > 5));
        }
    }
    pieces.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for p in pieces {
        if !p.is_empty() {
            out = out.replace(p, "[redacted]");
        }
    }
    out
}

/// What a pull read: the source's records as JSONL, bounded.
pub struct Collected {
    pub jsonl: Vec<u8>,
    pub records: usize,
    pub limit: usize,
    pub max_bytes: usize,
    pub truncated: bool,
}

impl Collected {
    fn new(limit: usize, max_bytes: usize) -> Collected {
        Collected {
            jsonl: Vec::new(),
            records: 0,
            limit,
            max_bytes,
            truncated: false,
        }
    }

    /// Takes a record as the source sent it, made one line.
    pub fn push_raw(&mut self, record: &RawValue) -> bool {
        let mut line = record.get().as_bytes().to_vec();
        one_line(&mut line);
        self.push_line(&line)
    }

    /// Takes a record already written as one line of JSON; false once the bound
    /// is reached (the pull stops reading).
    pub fn push_line(&mut self, line: &[u8]) -> bool {
        if self.full() || self.jsonl.len() + line.len() + 1 > self.max_bytes {
            self.truncated = true;
            return false;
        }
        self.jsonl.extend_from_slice(line);
        self.jsonl.push(b'\n');
        self.records += 1;
        true
    }

    pub fn full(&self) -> bool {
        self.records >= self.limit || self.jsonl.len() >= self.max_bytes
    }
}

/// Makes valid JSON one line: its line breaks can only be whitespace between
/// tokens (a string holds them escaped), so they become spaces.
pub fn one_line(json: &mut [u8]) {
    for b in json {
        if *b == b'\n' || *b == b'\r' {
            *b = b' ';
        }
    }
}

/// What a pull may still spend of the source: bytes as they arrive, and requests.
pub struct Budget {
    bytes: AtomicU64,
    requests: AtomicU32,
}

impl Budget {
    pub fn new(bytes: u64, requests: u32) -> Budget {
        Budget {
            bytes: AtomicU64::new(bytes),
            requests: AtomicU32::new(requests),
        }
    }

    /// Counts `n` bytes read; past the budget the pull stops.
    pub fn take(&self, n: usize) -> Result<(), PullError> {
        let n = n as u64;
        self.bytes
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| {
                left.checked_sub(n)
            })
            .map(drop)
            .map_err(|_| PullError::Exhausted("bytes (max_upload_bytes)"))
    }

    /// Counts one request to the source; past the budget the pull stops.
    pub fn request(&self) -> Result<(), PullError> {
        self.requests
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| {
                left.checked_sub(1)
            })
            .map(drop)
            .map_err(|_| PullError::Exhausted("requests"))
    }
}

/// The ids a source's record may carry, read without building the record.
#[derive(Default, Deserialize)]
pub struct Named {
    pub id: Option<String>,
    #[serde(rename = "traceId")]
    pub trace_id: Option<String>,
}

impl Named {
    /// The ids of a raw record; none when it is not an object, or they are not
    /// strings.
    pub fn of(raw: &RawValue) -> Named {
        serde_json::from_str(raw.get()).unwrap_or_default()
    }
}

/// The pull's source: its base URL (org-supplied or the operator's), scope and
/// budget.
pub struct Source<'a> {
    pub base: String,
    pub org_supplied: bool,
    pub allow_private: bool,
    pub config: &'a Map<String, Value>,
    pub budget: Budget,
}

impl Source<'_> {
    pub fn client(&self) -> &'static reqwest::Client {
        http::client(self.org_supplied, self.allow_private)
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base.trim_end_matches('/'))
    }

    pub fn str(&self, key: &str) -> Option<&str> {
        self.config
            .get(key)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
    }

    /// `config.since` as an RFC 3339 time, checked (it may reach a query text).
    pub fn since(&self) -> Result<Option<String>, PullError> {
        match self.config.get("since") {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => chrono::DateTime::parse_from_rfc3339(s)
                .map(|t| {
                    Some(
                        t.to_utc()
                            .to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
                    )
                })
                .map_err(|_| {
                    PullError::Config("config.since", "since must be an RFC 3339 time".into())
                }),
            Some(_) => Err(PullError::Config(
                "config.since",
                "since must be an RFC 3339 time".into(),
            )),
        }
    }
}

fn config_map(config: Option<Value>) -> Result<Map<String, Value>, Refusal> {
    match config {
        None | Some(Value::Null) => Ok(Map::new()),
        Some(Value::Object(m)) => Ok(m),
        Some(_) => Err(ApiError::invalid_parameter("config", "config must be an object").into()),
    }
}

fn limit_of(config: &Map<String, Value>) -> Result<usize, Refusal> {
    match config.get("limit") {
        None | Some(Value::Null) => Ok(DEFAULT_LIMIT),
        Some(v) => match v.as_u64() {
            Some(n) if n >= 1 && n as usize <= MAX_LIMIT => Ok(n as usize),
            _ => Err(ApiError::invalid_parameter(
                "config.limit",
                format!("limit must be an integer from 1 to {MAX_LIMIT}"),
            )
            .into()),
        },
    }
}

/// Runs one pull for the org; the ingest as it ended, and whether the pull stopped
/// at its bound.
pub async fn run(
    state: &AppState,
    org_id: &str,
    body: PullBody,
) -> Result<(Ingest, bool), Refusal> {
    let PullBody {
        transport_kind,
        source_kind,
        source_label,
        credential,
        config,
    } = body;
    let kind = check_kind(&source_kind)?;
    check_label(&source_label)?;
    let config = config_map(config)?;
    let limit = limit_of(&config)?;
    let wanted = match transport_kind.as_str() {
        "postgres" => SourceKind::ChatJson,
        t => SourceKind::parse(t)
            .filter(|k| matches!(k, SourceKind::Braintrust | SourceKind::Langsmith | SourceKind::Langfuse | SourceKind::Posthog | SourceKind::Mastra))
            .ok_or_else(|| {
                Refusal::from(ApiError::invalid_parameter(
                    "transport_kind",
                    "transport_kind must be one of braintrust, langsmith, langfuse, posthog, mastra, postgres",
                ))
            })?,
    };
    if kind != wanted {
        return Err(ApiError::invalid_parameter(
            "source_kind",
            format!(
                "a {transport_kind} pull reads {} records; source_kind must be {}",
                wanted.as_str(),
                wanted.as_str()
            ),
        )
        .into());
    }
    if credential.trim().is_empty() && transport_kind != "mastra" {
        return Err(ApiError::invalid_parameter("credential", "credential is required").into());
    }
    let _slot = Slot::take(org_id)?;
    let t = &state.config.telemetry;
    let allow_private = state.config.network.allow_private_upstreams;
    // What the org's storage quota leaves bounds the pull as max_upload_bytes does.
    let quota = state.config.limits.org_storage_bytes;
    let max_bytes = crate::store::quota::room(&state.db, org_id, quota, t.max_upload_bytes).await?;
    let mut out = Collected::new(limit, max_bytes as usize);
    let budget = Budget::new(max_bytes, limit as u32 + SPARE_REQUESTS);
    let secrets: Vec<&str> = vec![credential.as_str()];
    let source = if transport_kind == "postgres" {
        None
    } else {
        Some(source_of(state, &transport_kind, &config, budget).await?)
    };
    let pulling = async {
        match &source {
            None => {
                let bound = postgres::Bound {
                    bytes: max_bytes,
                    allow_private,
                };
                postgres::pull(&credential, &config, bound, &mut out).await
            }
            Some(src) => match transport_kind.as_str() {
                "braintrust" => braintrust::pull(src, &credential, &mut out).await,
                "langsmith" => langsmith::pull(src, &credential, &mut out).await,
                "langfuse" => langfuse::pull(src, &credential, &mut out).await,
                "posthog" => posthog::pull(src, &credential, &mut out).await,
                _ => mastra::pull(src, &credential, &mut out).await,
            },
        }
    };
    let timeout = Duration::from_millis(t.pull_timeout_ms);
    let finished = tokio::time::timeout(timeout, pulling).await;
    let pulled = match finished {
        Ok(Err(PullError::Exhausted(_))) if out.records > 0 => {
            out.truncated = true;
            Ok(())
        }
        Ok(done) => done,
        Err(_) => Err(PullError::Deadline(t.pull_timeout_ms)),
    };
    if let Err(e) = pulled {
        let r = e.into_refusal(&secrets);
        tracing::info!(transport = %transport_kind, code = %r.error.code, "telemetry pull refused");
        return Err(r);
    }
    drop(secrets);
    drop(credential);
    store_and_project(state, org_id, &transport_kind, kind, &source_label, out).await
}

/// The HTTP source a pull reads: the org's base URL (checked) or the operator's.
async fn source_of<'a>(
    state: &AppState,
    transport_kind: &str,
    config: &'a Map<String, Value>,
    budget: Budget,
) -> Result<Source<'a>, Refusal> {
    let t = &state.config.telemetry;
    let allow_private = state.config.network.allow_private_upstreams;
    let default = match transport_kind {
        "braintrust" => &t.braintrust_url,
        "langsmith" => &t.langsmith_url,
        "langfuse" => &t.langfuse_url,
        "posthog" => &t.posthog_url,
        _ => &t.mastra_url,
    };
    let org_base = config
        .get("base_url")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty());
    let base = match org_base {
        Some(b) => {
            egress::check_org_url(b, allow_private)
                .await
                .map_err(|why| {
                    Refusal::from(ApiError::invalid_parameter(
                        "config.base_url",
                        format!("config.base_url {why}"),
                    ))
                })?;
            b.to_string()
        }
        None if default.is_empty() => {
            return Err(ApiError::invalid_parameter(
                "config.base_url",
                format!("a {transport_kind} pull needs config.base_url (no default is configured)"),
            )
            .into())
        }
        None => default.clone(),
    };
    Ok(Source {
        base,
        org_supplied: org_base.is_some(),
        allow_private,
        config,
        budget,
    })
}

async fn store_and_project(
    state: &AppState,
    org_id: &str,
    transport: &str,
    kind: SourceKind,
    label: &str,
    out: Collected,
) -> Result<(Ingest, bool), Refusal> {
    let ingest = ingests::create(
        &state.db,
        NewIngest {
            org_id,
            origin: "pull",
            transport_kind: Some(transport),
            source_kind: kind.as_str(),
            source_label: label,
            status: "pulling",
            expires_at: crate::store::now_ms(),
        },
    )
    .await?;
    let truncated = out.truncated;
    let bytes = out.jsonl;
    let stored = state
        .objects
        .put_bytes(&ingest.object_key, bytes::Bytes::from(bytes.clone()))
        .await
        .map_err(|e| {
            tracing::error!(error = %e, "object store refused a pull's export");
            Refusal::from(ApiError::internal())
        })?;
    let traces = if out.records == 0 {
        Ok(Vec::new())
    } else {
        project_bytes(kind, bytes).await
    };
    match traces {
        Ok(traces) => {
            ingests::complete(
                &state.db,
                &ingest,
                None,
                stored.size as i64,
                &stored.sha256,
                &traces,
            )
            .await?;
        }
        Err(Verdict::Refused(reason)) | Err(Verdict::Retry(reason)) => {
            ingests::fail(&state.db, &ingest.id, None, &reason).await?;
        }
    }
    let done = ingests::get(&state.db, &ingest.id).await?.unwrap_or(ingest);
    Ok((done, truncated))
}

#[cfg(test)]
mod tests {
    use super::scrub;

    #[test]
    fn error_texts_are_scrubbed_of_the_credential_and_its_parts() {
        let t = scrub(
            "failed for postgres://bob:hunter2secret@db.example:5432/app and pk-lf-1:sk-lf-2",
            &[
                "postgres://bob:hunter2secret@db.example:5432/app",
                "pk-lf-1:sk-lf-2",
            ],
        );
        for s in ["hunter2secret", "pk-lf-1", "sk-lf-2", "bob:"] {
            assert!(!t.contains(s), "{t}");
        }
        let t = scrub(
            "could not reach db.example for sk-lf-secret-2",
            &["pk-lf-public-1:sk-lf-secret-2"],
        );
        assert_eq!(t, "could not reach db.example for [redacted]");
        let t = scrub("login as bob failed", &["postgres://bob:pw-long-1@h/db"]);
        assert_eq!(t, "login as bob failed");
        let t = scrub(
            "password pw-long-1 refused",
            &["postgres://bob:pw-long-1@h/db"],
        );
        assert_eq!(t, "password [redacted] refused");
    }
}
