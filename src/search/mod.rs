//! Web search and tool search: the two features where the gateway does more than
//! translate. It runs a web search itself, or loops the model through tool search
//! rounds, inside one client request.
//!
//! The request flow reaches this room through the hook seam ([`hook::Searching`]):
//! - [`Searcher::hold`] before the gates: the most the searches may add;
//! - [`Searcher::prepare`], between admission and planning: decides whether the
//!   provider's own search runs (every rung of the route declares it) or the
//!   gateway's; runs the one service-run web search (never again on fail-over)
//!   and puts its results before the model; withholds deferred tools and offers
//!   the `tool_search` function in their place.
//! - [`round`] (the loop part, [`Prepared`]), between two model calls of one request: runs the search a
//!   `tool_search` call asked for, loads what it found and writes the round into
//!   the conversation.
//!
//! What the features add to the request's account (the search fee on platform
//! lanes, the search count, earlier rounds' usage) is `billing::extra::Extra`,
//! kept by the flow's tally. A search never fails a request: without results the turn is
//! served and the drop disclosed.

pub mod hook;
pub mod prompt;
pub mod tools;
pub mod web;

use crate::billing::extra::Extra;
use crate::billing::gate::{self, WorstCase};
use crate::byok::RouteRung;
use crate::catalog::model::Price;
use crate::config::Config;
use crate::upstream::Upstreams;
use sluice_filters::inbound::Inbound;
use sluice_filters::ir::search::{TOOL_SEARCH, TOOL_SEARCH_NO_DEFERRED, WEB_SEARCH_UNAVAILABLE};
use sluice_filters::ir::watch::Watch;
use sluice_filters::ir::{
    Message, Part, Request, Response, Role, SearchForm, ServerSearch, Tool, ToolChoice,
    ToolSearchKind,
};
use sluice_filters::upstream::Wire;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tools::ToolIndex;
use web::WebSearchBackend;

/// About how many prompt tokens one search result adds (title, URL, snippet).
const RESULT_TOKENS: usize = 250;

/// The most results one search gives the model.
const MAX_RESULTS: usize = 20;

/// The gateway's side of web search and tool search, built once from
/// `[search]` and `[tool_search]`.
pub struct Searcher {
    backend: Option<Box<dyn WebSearchBackend>>,
    results: usize,
    timeout: Duration,
    fee_micro_usd: u64,
    max_rounds: u32,
    max_results: u32,
}

impl Searcher {
    pub fn new(config: &Config) -> Searcher {
        let s = &config.search;
        let key = (!s.api_key_env.is_empty())
            .then(|| std::env::var(&s.api_key_env).ok())
            .flatten()
            .filter(|k| !k.is_empty())
            .map(Arc::<str>::from);
        let timeout = Duration::from_millis(s.timeout_ms.max(1));
        Searcher {
            backend: web::backend(&s.backend, &s.url, key, timeout),
            results: (s.results as usize).clamp(1, MAX_RESULTS),
            timeout,
            fee_micro_usd: (s.fee_usd.max(0.0) * 1_000_000.0).round() as u64,
            max_rounds: config.tool_search.max_rounds,
            max_results: config.tool_search.max_results.max(1),
        }
    }

    /// The most the request can cost with its searches: every model call a tool
    /// search may make (each at the request's own worst case, plus the deferred
    /// tools it may load), and a web search's fee and results.
    pub fn hold(&self, worst: WorstCase, req: &Request, price: &Price) -> WorstCase {
        let mut w = worst;
        let mut calls = 1i64;
        if req.tool_search.is_some() && !req.deferred.is_empty() {
            calls += i64::from(self.max_rounds);
            let bytes: usize = req
                .deferred
                .iter()
                .map(|t| {
                    t.name.len()
                        + t.description.as_ref().map_or(0, String::len)
                        + t.parameters.get().len()
                })
                .sum();
            let rounds = self.max_rounds as usize;
            let loaded = gate::worst_case(price, bytes.saturating_mul(rounds), 0);
            w.micro_usd = w.micro_usd.saturating_mul(calls) + loaded.micro_usd;
            w.tokens = w.tokens.saturating_mul(calls) + loaded.tokens;
        }
        if req.web_search.is_some() && self.backend.is_some() {
            let n = req
                .web_search
                .as_ref()
                .and_then(|ws| ws.max_results)
                .map_or(self.results, |n| n as usize);
            let results = gate::worst_case(price, n * RESULT_TOKENS * 4 * calls as usize, 0);
            w.micro_usd += results.micro_usd + self.fee_micro_usd as i64;
            w.tokens += results.tokens;
        }
        w
    }

    /// Readies an orchestrated request for planning: native searches stay in the
    /// request for the rungs to render; otherwise the gateway's web search runs now
    /// (once, within `[search] timeout_ms` and the request's deadline) and its
    /// results join the instructions, and deferred tools are withheld behind the
    /// `tool_search` function.
    pub(crate) async fn prepare(
        &self,
        up: &Upstreams,
        req: &mut Request,
        inbound: Inbound,
        rungs: &[RouteRung],
        deadline: Instant,
    ) -> Prepared {
        let mut plan = Plan {
            canonical: false,
            disclosed: Vec::new(),
            search: None,
            latency: None,
            fee_micro_usd: self.fee_micro_usd,
            tools: None,
        };
        // A rung that speaks the client's own format forwards the client's body:
        // only a search in that format's own spelling, served natively, may go
        // that way.
        let all_native_format = rungs.iter().all(|r| {
            Wire::of_rung(&r.spec.provider, &r.spec.provider_model_id, inbound)
                .is_some_and(|w| w.is_native(&r.spec.provider, inbound))
        });
        if let Some(ws) = req.web_search.as_deref() {
            let native = rungs.iter().all(|r| {
                has_cap(r, "web_search")
                    && Wire::of_rung(&r.spec.provider, &r.spec.provider_model_id, inbound)
                        .is_some_and(Wire::searches_natively)
            });
            let own_spelling = matches!(
                (ws.form, inbound),
                (SearchForm::ChatOptions, Inbound::Chat)
                    | (SearchForm::ResponsesTool, Inbound::Responses)
                    | (SearchForm::MessagesTool, Inbound::Messages)
            );
            if !(native && own_spelling && all_native_format) {
                plan.canonical = true;
            }
            if !native {
                self.web_search(up, req, deadline, &mut plan).await;
            }
        }
        if req.tool_search.is_some() {
            plan.canonical |= self.tool_search(req, inbound, rungs, all_native_format, &mut plan);
        }
        Prepared(Some(Box::new(plan)))
    }

    /// Runs the one service-run search and gives its results to the model.
    async fn web_search(
        &self,
        up: &Upstreams,
        req: &mut Request,
        deadline: Instant,
        plan: &mut Plan,
    ) {
        let Some(ws) = req.web_search.take() else {
            return;
        };
        let query = req.last_user_text();
        let (Some(backend), Some(query)) = (&self.backend, query) else {
            plan.disclosed.push(WEB_SEARCH_UNAVAILABLE.into());
            return;
        };
        let count = ws
            .max_results
            .map_or(self.results, |n| n as usize)
            .clamp(1, MAX_RESULTS);
        let started = Instant::now();
        let within = self
            .timeout
            .min(deadline.saturating_duration_since(started));
        let found = backend.search(up, &query, count, within).await;
        plan.latency = Some(started.elapsed());
        match found {
            Ok(results) => {
                let today = crate::time::day_string(crate::store::now_ms() / 86_400_000);
                req.system.push(prompt::web_results(
                    &results,
                    ws.search_prompt.as_deref(),
                    &today,
                ));
                plan.search = Some(Arc::new(ServerSearch {
                    id: crate::store::new_id("srch"),
                    query,
                    results,
                }));
            }
            Err(web::Unavailable(why)) => {
                // The query is the user's text: never logged.
                tracing::warn!(backend = backend.name(), "web search unavailable: {why}");
                plan.disclosed.push(WEB_SEARCH_UNAVAILABLE.into());
            }
        }
    }

    /// Serves a tool search declaration; true when the rungs must take the
    /// canonical path.
    fn tool_search(
        &self,
        req: &mut Request,
        inbound: Inbound,
        rungs: &[RouteRung],
        all_native_format: bool,
        plan: &mut Plan,
    ) -> bool {
        if req.deferred.is_empty() {
            req.tool_search = None;
            plan.disclosed.push(TOOL_SEARCH_NO_DEFERRED.into());
            return true;
        }
        let native = rungs.iter().all(|r| {
            has_cap(r, "tool_search")
                && Wire::of_rung(&r.spec.provider, &r.spec.provider_model_id, inbound)
                    .is_some_and(|w| w.tool_search_natively(&r.spec.provider))
        });
        if native {
            // The chat declaration is the gateway's own spelling: rendered anew.
            return !(all_native_format && inbound != Inbound::Chat);
        }
        let Some(ts) = req.tool_search.take() else {
            return true;
        };
        let mut deferred = std::mem::take(&mut req.deferred);
        // A tool the caller forces is loaded from the start.
        if let Some(ToolChoice::Tool { name }) = &req.tool_choice {
            if let Some(i) = deferred.iter().position(|t| &t.name == name) {
                req.tools.push(deferred.remove(i));
            }
        }
        req.tools
            .push(prompt::tool_search_function(ts.kind, deferred.len()));
        let index = match ts.kind {
            ToolSearchKind::Bm25 => Some(ToolIndex::build(&deferred)),
            ToolSearchKind::Regex => None,
        };
        plan.tools = Some(ToolRounds {
            kind: ts.kind,
            loaded: vec![false; deferred.len()],
            deferred,
            index,
            max_results: ts.max_results.unwrap_or(self.max_results).max(1) as usize,
            rounds_left: self.max_rounds,
            max_rounds: self.max_rounds,
        });
        true
    }
}

fn has_cap(r: &RouteRung, cap: &str) -> bool {
    r.spec.caps.iter().any(|c| c == cap)
}

/// What the gateway decided for one orchestrated request (none for the rest: the
/// common request carries one empty pointer).
#[derive(Default)]
pub struct Prepared(Option<Box<Plan>>);

struct Plan {
    /// Every rung takes the canonical path: the gateway rewrites the request (the
    /// search results, the tools) or the answer (citations).
    canonical: bool,
    /// Request-level drops, disclosed with each rung's own.
    disclosed: Vec<String>,
    /// The service-run search, when it found something to serve.
    search: Option<Arc<ServerSearch>>,
    /// How long the search vendor took.
    latency: Option<Duration>,
    fee_micro_usd: u64,
    /// The service-run tool search.
    tools: Option<ToolRounds>,
}

impl Prepared {
    /// Every rung takes the canonical path (no native fast path or relay).
    pub fn canonical(&self) -> bool {
        self.0.as_ref().is_some_and(|p| p.canonical)
    }

    /// The request-level drops (`web_search->dropped(search_unavailable)`,
    /// `tool_search->dropped(no_deferred_tools)`).
    pub fn disclosed(&self) -> &[String] {
        self.0.as_ref().map_or(&[], |p| &p.disclosed)
    }

    /// The service-run search, shown and cited in the answer.
    pub fn search(&self) -> Option<Arc<ServerSearch>> {
        self.0.as_ref().and_then(|p| p.search.clone())
    }

    /// The gateway serves the request's tool search: model calls loop through
    /// search rounds.
    pub fn rounds(&self) -> bool {
        self.0.as_ref().is_some_and(|p| p.tools.is_some())
    }

    /// The watch for the next model call's `tool_search` calls: held while rounds
    /// are left, turned into text once the budget is spent.
    pub fn watch(&self) -> Option<Watch> {
        let t = self.0.as_ref()?.tools.as_ref()?;
        Some(if t.rounds_left > 0 {
            Watch::live()
        } else {
            Watch::spent(prompt::budget_spent(t.max_rounds))
        })
    }

    /// What the request's account starts with: the search, its fee (platform
    /// lanes only, and not on a free allowance: `fee_applies`) and latency.
    pub fn spent(&self, fee_applies: bool) -> Option<Box<Extra>> {
        let p = self.0.as_ref()?;
        let searched = p.search.is_some();
        let m = crate::metrics::global();
        if searched {
            m.search_rounds.with_label_values(&["web"]).inc();
        }
        for d in &p.disclosed {
            let kind = if d.starts_with("web_search") {
                "web"
            } else {
                "tool"
            };
            m.search_drops.with_label_values(&[kind]).inc();
        }
        Some(Box::new(Extra {
            web_searches: u64::from(searched),
            fee_micro_usd: if searched && fee_applies {
                p.fee_micro_usd
            } else {
                0
            },
            search_us: p.latency.map(|d| d.as_micros() as u64),
            ..Extra::default()
        }))
    }
}

impl crate::hooks::LoopPart for Prepared {
    fn canonical(&self) -> bool {
        Prepared::canonical(self)
    }
    fn disclosed(&self) -> &[String] {
        Prepared::disclosed(self)
    }
    fn search(&self) -> Option<Arc<ServerSearch>> {
        Prepared::search(self)
    }
    fn rounds(&self) -> bool {
        Prepared::rounds(self)
    }
    fn watch(&self) -> Option<Watch> {
        Prepared::watch(self)
    }
    fn round(&mut self, req: &mut Request, turn: Response) {
        round(self, req, turn)
    }
}

/// The service-run tool search of one request.
struct ToolRounds {
    kind: ToolSearchKind,
    deferred: Vec<Tool>,
    /// Which deferred tools a round loaded.
    loaded: Vec<bool>,
    index: Option<ToolIndex>,
    max_results: usize,
    rounds_left: u32,
    max_rounds: u32,
}

impl ToolRounds {
    /// The deferred tools `query` finds (not loaded yet), or why it cannot run.
    fn find(&self, query: &str) -> Result<Vec<usize>, String> {
        if query.trim().is_empty() {
            return Err("the query is empty".into());
        }
        let skip = |i: usize| self.loaded[i];
        match (self.kind, &self.index) {
            (ToolSearchKind::Bm25, Some(index)) => Ok(index.search(query, self.max_results, skip)),
            _ => {
                let re = tools::compile(query)?;
                Ok(tools::regex_search(
                    &self.deferred,
                    &re,
                    self.max_results,
                    skip,
                ))
            }
        }
    }
}

/// The query of a `tool_search` call's arguments (`{"query": …}`; a pattern or
/// a bare string are taken too).
fn query_of(arguments: &str) -> String {
    match serde_json::from_str::<serde_json::Value>(arguments) {
        Ok(serde_json::Value::Object(o)) => ["query", "pattern", "regex", "q", "keywords"]
            .iter()
            .find_map(|k| o.get(*k).and_then(|v| v.as_str()))
            .unwrap_or_default()
            .to_string(),
        Ok(serde_json::Value::String(s)) => s,
        _ => arguments.to_string(),
    }
}

/// One search round, after a model call that asked for it: each `tool_search`
/// call is answered (the tools it found are loaded into the request), and the
/// call and its answers join the conversation for the next model call. Calls of
/// real tools in the same turn are left out: their results are not the
/// gateway's to give.
pub fn round(prep: &mut Prepared, req: &mut Request, turn: Response) {
    let Some(t) = prep.0.as_deref_mut().and_then(|p| p.tools.as_mut()) else {
        return;
    };
    t.rounds_left = t.rounds_left.saturating_sub(1);
    crate::metrics::global()
        .search_rounds
        .with_label_values(&["tool"])
        .inc();
    let mut said = Vec::with_capacity(turn.parts.len());
    let mut answers = Vec::new();
    let mut newly = Vec::new();
    for p in turn.parts {
        match &p {
            Part::ToolCall {
                id,
                name,
                arguments,
            } if name == TOOL_SEARCH => {
                let query = query_of(arguments);
                let text = match t.find(&query) {
                    Ok(found) => {
                        for &i in &found {
                            t.loaded[i] = true;
                        }
                        let tools: Vec<&Tool> = found.iter().map(|&i| &t.deferred[i]).collect();
                        newly.extend(found.iter().copied());
                        prompt::round_result(&query, &tools, None)
                    }
                    Err(why) => prompt::round_result(&query, &[], Some(&why)),
                };
                answers.push(Part::ToolResult {
                    call_id: id.clone(),
                    content: vec![Part::text(text)],
                    is_error: false,
                });
                said.push(p);
            }
            Part::ToolCall { .. } => {}
            _ => said.push(p),
        }
    }
    req.messages.push(Message {
        role: Role::Assistant,
        parts: said,
    });
    req.messages.push(Message {
        role: Role::Tool,
        parts: answers,
    });
    req.tools
        .extend(newly.into_iter().map(|i| t.deferred[i].clone()));
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::value::RawValue;
    use sluice_filters::usage::Usage;

    fn tool(name: &str, description: &str) -> Tool {
        Tool {
            name: name.into(),
            description: Some(description.into()),
            parameters: RawValue::from_string(r#"{"type":"object"}"#.into()).unwrap(),
            strict: None,
        }
    }

    fn rounds(kind: ToolSearchKind, rounds_left: u32) -> Prepared {
        let deferred = vec![
            tool("get_weather", "Current weather for a city"),
            tool("send_email", "Send an email"),
            tool("getForecast", "Weather forecast for the week"),
        ];
        Prepared(Some(Box::new(Plan {
            canonical: true,
            disclosed: Vec::new(),
            search: None,
            latency: None,
            fee_micro_usd: 7000,
            tools: Some(ToolRounds {
                kind,
                loaded: vec![false; 3],
                index: (kind == ToolSearchKind::Bm25).then(|| ToolIndex::build(&deferred)),
                deferred,
                max_results: 5,
                rounds_left,
                max_rounds: 3,
            }),
        })))
    }

    fn search_turn(arguments: &str) -> Response {
        Response {
            parts: vec![
                Part::text("Let me look."),
                Part::ToolCall {
                    id: "call_1".into(),
                    name: TOOL_SEARCH.into(),
                    arguments: arguments.into(),
                },
                Part::ToolCall {
                    id: "call_2".into(),
                    name: "real_tool".into(),
                    arguments: "{}".into(),
                },
            ],
            ..Response::default()
        }
    }

    #[test]
    fn a_round_loads_what_it_finds_and_writes_the_round_into_the_conversation() {
        let mut prep = rounds(ToolSearchKind::Bm25, 3);
        let mut req = Request::default();
        round(&mut prep, &mut req, search_turn(r#"{"query":"weather"}"#));
        let names: Vec<&str> = req.tools.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names.len(), 2);
        assert!(names.contains(&"get_weather") && names.contains(&"getForecast"));
        assert_eq!(req.messages.len(), 2);
        assert_eq!(req.messages[0].role, Role::Assistant);
        // The real call is not the gateway's to answer: it is left out.
        assert_eq!(req.messages[0].parts.len(), 2);
        let Part::ToolResult {
            call_id, content, ..
        } = &req.messages[1].parts[0]
        else {
            panic!("{:?}", req.messages[1]);
        };
        assert_eq!(call_id, "call_1");
        assert!(matches!(&content[0], Part::Text { text } if text.contains("get_weather")));
        // Found again, a loaded tool is not loaded twice.
        round(&mut prep, &mut req, search_turn(r#"{"query":"weather"}"#));
        assert_eq!(req.tools.len(), 2);
        assert!(prep.watch().is_some());
    }

    #[test]
    fn regex_rounds_report_bad_patterns_to_the_model() {
        let mut prep = rounds(ToolSearchKind::Regex, 1);
        let mut req = Request::default();
        round(&mut prep, &mut req, search_turn(r#"{"query":"(unclosed"}"#));
        assert!(req.tools.is_empty());
        let Part::ToolResult { content, .. } = &req.messages[1].parts[0] else {
            panic!();
        };
        assert!(matches!(&content[0], Part::Text { text } if text.contains("could not run")));
        // The budget is spent: the next call's tool_search becomes text.
        let mut watch = prep.watch().unwrap();
        let mut evs = vec![sluice_filters::ir::Event::ToolCallStart {
            index: 0,
            id: "c".into(),
            name: TOOL_SEARCH.into(),
        }];
        watch.filter(&mut evs);
        assert!(!watch.round());
        assert!(
            matches!(&evs[0], sluice_filters::ir::Event::Text { text } if text.contains("budget"))
        );
    }

    #[test]
    fn the_account_adds_rounds_searches_and_the_fee_on_platform_only() {
        let mut s = Prepared(None);
        assert!(s.spent(true).is_none());
        s = rounds(ToolSearchKind::Bm25, 3);
        if let Some(p) = s.0.as_mut() {
            p.search = Some(Arc::new(ServerSearch::default()));
        }
        let mut spent = s.spent(true).unwrap();
        let round_usage = Usage {
            input_tokens: 100,
            output_tokens: 10,
            ..Usage::default()
        };
        spent.bank(&round_usage, 300, 300, 110, false);
        let mut u = Usage {
            input_tokens: 50,
            output_tokens: 5,
            cost_micro_usd: Some(100),
            ..Usage::default()
        };
        spent.add_to(&mut u, true);
        assert_eq!(
            (u.input_tokens, u.output_tokens, u.web_search_requests),
            (150, 15, 1)
        );
        assert_eq!(u.cost_micro_usd, Some(100 + 300 + 7000));
        let mut byok = Usage {
            cost_micro_usd: Some(0),
            ..Usage::default()
        };
        spent.add_to(&mut byok, false);
        assert_eq!(byok.cost_micro_usd, Some(300));
        assert_eq!(s.spent(false).unwrap().fee_micro_usd, 0);
        assert_eq!(query_of(r#"{"pattern":"a|b"}"#), "a|b");
        assert_eq!(query_of("plain words"), "plain words");
    }
}
