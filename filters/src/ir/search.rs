//! Web search and tool search in canonical form: what a request asks for (in any
//! of its five spellings), what a search found, the `url_citation` annotations an
//! answer carries, and the two stream helpers the gateway puts around an answer it
//! orchestrates: [`Cited`] (a service-run search shown and cited in the client's
//! format) and [`Watch`] (a `tool_search` call held back from the client, or
//! turned into text once the search budget is spent).

use super::request::Part;
use super::response::{Collector, Response};
use super::stream::{Event, FinishReason, StreamEncoder, Tail};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use std::sync::Arc;

/// The function name the model calls to search the deferred tools.
pub const TOOL_SEARCH: &str = "tool_search";

/// The disclosure of a web search that could not run (no backend, a vendor
/// error, a timeout, an unreadable answer): the turn is served without results.
pub const WEB_SEARCH_UNAVAILABLE: &str = "web_search->dropped(search_unavailable)";

/// The disclosure of a tool search declaration with nothing to search.
pub const TOOL_SEARCH_NO_DEFERRED: &str = "tool_search->dropped(no_deferred_tools)";

/// How a request asked for web search; each spelling is one maker's own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SearchForm {
    /// Chat `web_search_options` (OpenAI's search models).
    ChatOptions,
    /// `plugins: [{id: "web"}]`.
    Plugin,
    /// The `:online` suffix on the slug.
    Online,
    /// The responses `web_search` tool (or its preview alias).
    ResponsesTool,
    /// A messages server tool whose type begins `web_search_`.
    MessagesTool,
}

/// A request's web search.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WebSearch {
    pub form: SearchForm,
    /// The client's own entry (the `web_search_options` object, the responses
    /// tool, the messages server tool), sent as is to a rung of that maker when
    /// its own search runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw: Option<Box<RawValue>>,
    /// How many results the model is given (the plugin's `max_results`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_results: Option<u32>,
    /// The text that introduces the results (the plugin's `search_prompt`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub search_prompt: Option<String>,
    /// OpenAI's `search_context_size` (low, medium, high).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_size: Option<String>,
}

impl WebSearch {
    pub fn new(form: SearchForm) -> Self {
        WebSearch {
            form,
            raw: None,
            max_results: None,
            search_prompt: None,
            context_size: None,
        }
    }
}

impl PartialEq for WebSearch {
    fn eq(&self, o: &Self) -> bool {
        self.form == o.form
            && self.raw.as_ref().map(|r| r.get()) == o.raw.as_ref().map(|r| r.get())
            && self.max_results == o.max_results
            && self.search_prompt == o.search_prompt
            && self.context_size == o.context_size
    }
}

/// How the deferred tools are searched.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolSearchKind {
    /// Ranked by BM25 over names, descriptions and parameter names.
    Bm25,
    /// Matched by a regular expression (a size-limited, linear-time engine).
    Regex,
}

/// A request's tool search declaration. The deferred tools themselves are
/// `Request::deferred`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolSearch {
    pub kind: ToolSearchKind,
    /// How many tools one search loads (chat `max_results`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_results: Option<u32>,
}

/// One web search result.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SearchResult {
    pub title: String,
    pub url: String,
    pub snippet: String,
    /// How old the page is, as the vendor says it (`"2 days ago"`, a date).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page_age: Option<String>,
}

/// A search run on the server side: by the gateway (a service-run search) or by
/// the provider (its native search). Shown as messages `server_tool_use` and
/// `web_search_tool_result` blocks and as a responses `web_search_call` item.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerSearch {
    /// `srvtoolu_…` / `ws_…` as the provider named it, or the gateway's own.
    pub id: String,
    pub query: String,
    pub results: Vec<SearchResult>,
}

/// A `url_citation` annotation: the span `start_index..end_index` of the
/// answer's text (in characters) cites `url`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UrlCitation {
    pub url: String,
    pub title: String,
    /// The cited source's text (the result's snippet, or the provider's quote).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    pub start_index: u32,
    pub end_index: u32,
}

// ---------------------------------------------------------------------------
// Citations of a service-run search

/// Normalizes a URL for comparison: scheme, `www.` and a trailing slash or
/// fragment do not make another source.
fn same_source(a: &str, b: &str) -> bool {
    fn norm(u: &str) -> &str {
        let u = u
            .strip_prefix("https://")
            .or_else(|| u.strip_prefix("http://"))
            .unwrap_or(u);
        let u = u.strip_prefix("www.").unwrap_or(u);
        let u = u.split('#').next().unwrap_or(u);
        u.trim_end_matches('/')
    }
    norm(a).eq_ignore_ascii_case(norm(b))
}

/// A citation of `r` over the character span `start..end`.
fn citation(r: &SearchResult, start: usize, end: usize) -> UrlCitation {
    UrlCitation {
        url: r.url.clone(),
        title: r.title.clone(),
        content: (!r.snippet.is_empty()).then(|| r.snippet.clone()),
        start_index: start as u32,
        end_index: end as u32,
    }
}

/// The sources `text` cites among `results`, where it cites them: a markdown link
/// to a result's URL (`[example.com](https://example.com/a)`, what the search
/// prompt asks for), or a bracketed result number (`[2]`, `[1, 3]`). Spans are in
/// characters, as clients index strings. A link to a page the search did not find
/// is not a citation of the search.
pub fn cite(text: &str, results: &[SearchResult]) -> Vec<UrlCitation> {
    let mut out = Vec::new();
    if results.is_empty() {
        return out;
    }
    let bytes = text.as_bytes();
    // Characters before `seen`, counted once as the scan moves on.
    let (mut seen, mut chars) = (0usize, 0usize);
    let mut char_at = |byte: usize| {
        chars += text[seen..byte].chars().count();
        seen = byte;
        chars
    };
    let mut i = 0;
    while let Some(off) = memchr::memchr(b'[', &bytes[i..]) {
        let open = i + off;
        i = open + 1;
        // The label: up to 300 bytes, one line, no nested bracket.
        let Some(close) = bytes[open + 1..]
            .iter()
            .take(300)
            .position(|&b| matches!(b, b']' | b'[' | b'\n'))
            .map(|p| open + 1 + p)
            .filter(|&c| bytes[c] == b']')
        else {
            continue;
        };
        let label = &text[open + 1..close];
        if bytes.get(close + 1) == Some(&b'(') {
            let rest = &text[close + 2..];
            let Some(end) = rest.find(|c: char| c == ')' || c.is_whitespace()) else {
                continue;
            };
            if rest.as_bytes()[end] != b')' {
                continue;
            }
            let url = &rest[..end];
            let after = close + 2 + end + 1;
            if let Some(r) = results.iter().find(|r| same_source(&r.url, url)) {
                let start = char_at(open);
                let stop = char_at(after);
                out.push(citation(r, start, stop));
            }
            i = after;
            continue;
        }
        let numbers: Vec<usize> = label
            .split(',')
            .map(|n| n.trim().parse::<usize>().ok())
            .collect::<Option<Vec<_>>>()
            .unwrap_or_default();
        if !numbers.is_empty() && numbers.iter().all(|&n| n >= 1 && n <= results.len()) {
            let start = char_at(open);
            let stop = char_at(close + 1);
            for n in numbers {
                out.push(citation(&results[n - 1], start, stop));
            }
        }
        i = close + 1;
    }
    out
}

/// A whole answer with a service-run search shown and cited: the search leads
/// its searches, and the sources its text cites are its citations.
pub fn cited_response(resp: &Response, search: &ServerSearch) -> Response {
    let mut r = resp.clone();
    r.searches.insert(0, search.clone());
    let text: String = r
        .parts
        .iter()
        .filter_map(|p| match p {
            Part::Text { text } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    r.citations.extend(cite(&text, &search.results));
    r
}

/// A stream encoder that shows a service-run search in the client's format: the
/// search goes out with the answer's first event, and the sources the answer
/// cites go out as citations before it ends.
pub struct Cited {
    inner: Box<dyn StreamEncoder>,
    search: Arc<ServerSearch>,
    shown: bool,
    text: String,
}

impl Cited {
    pub fn new(inner: Box<dyn StreamEncoder>, search: Arc<ServerSearch>) -> Self {
        Cited {
            inner,
            search,
            shown: false,
            text: String::new(),
        }
    }

    fn show(&mut self, out: &mut Vec<u8>) {
        if !self.shown {
            self.shown = true;
            let ev = Event::ServerSearch(Box::new((*self.search).clone()));
            self.inner.event(&ev, out);
        }
    }
}

impl StreamEncoder for Cited {
    fn event(&mut self, ev: &Event, out: &mut Vec<u8>) {
        match ev {
            // The answer's id and model come first, then the search.
            Event::Start { .. } => {
                self.inner.event(ev, out);
                self.show(out);
                return;
            }
            Event::Text { text } => self.text.push_str(text),
            _ => {}
        }
        self.show(out);
        self.inner.event(ev, out);
    }

    fn end(&mut self, tail: &Tail, out: &mut Vec<u8>) {
        self.show(out);
        for c in cite(&self.text, &self.search.results) {
            self.inner.event(&Event::Citation(Box::new(c)), out);
        }
        self.inner.end(tail, out);
    }
}

// ---------------------------------------------------------------------------
// Tool search calls in an answer

/// Watches one model call of a request whose tool search the gateway serves:
/// `tool_search` calls are taken out of what reaches the client, so the gateway
/// can run the search and call the model again. Once the search budget is spent
/// (or a real tool call already went to the client), a `tool_search` call becomes
/// text saying so instead: the caller never sees a call of a tool it does not
/// have.
pub struct Watch {
    /// Text written in place of a call that cannot be served; `None` while
    /// rounds are left.
    spent: Option<String>,
    /// Everything the call said, for the search round.
    turn: Collector,
    /// Indexes of `tool_search` calls held back.
    held: Vec<u32>,
    /// Indexes of `tool_search` calls turned into text.
    voided: Vec<u32>,
    /// A call of a real tool went to the client.
    real_call: bool,
}

impl Watch {
    /// A watch while search rounds are left.
    pub fn live() -> Self {
        Watch::new(None)
    }

    /// A watch on the last call: a `tool_search` call becomes `note`.
    pub fn spent(note: String) -> Self {
        Watch::new(Some(note))
    }

    fn new(spent: Option<String>) -> Self {
        Watch {
            spent,
            turn: Collector::default(),
            held: Vec::new(),
            voided: Vec::new(),
            real_call: false,
        }
    }

    /// Filters one batch of decoded events in place.
    pub fn filter(&mut self, events: &mut Vec<Event>) {
        if events.is_empty() {
            return;
        }
        let mut kept = Vec::with_capacity(events.len());
        for ev in events.drain(..) {
            self.turn.push(&ev);
            match &ev {
                Event::ToolCallStart { index, name, .. } if name == TOOL_SEARCH => {
                    match (&self.spent, self.real_call) {
                        (None, false) => self.held.push(*index),
                        (note, _) => {
                            self.voided.push(*index);
                            let text = note.clone().unwrap_or_else(|| {
                                "(tool_search can only be called before any other tool.)"
                                    .to_string()
                            });
                            kept.push(Event::Text { text });
                        }
                    }
                }
                Event::ToolCallStart { .. } => {
                    self.real_call = true;
                    kept.push(ev);
                }
                Event::ToolCallArgs { index, .. }
                    if self.held.contains(index) || self.voided.contains(index) => {}
                Event::Finish {
                    reason: FinishReason::ToolCalls,
                    ..
                } if !self.real_call => {
                    // The turn ended to call tool_search: a round follows (held),
                    // or the turn ends as text (voided).
                    if self.held.is_empty() {
                        kept.push(Event::Finish {
                            reason: FinishReason::Stop,
                            raw: None,
                            stop_sequence: None,
                        });
                    }
                }
                _ => kept.push(ev),
            }
        }
        *events = kept;
    }

    /// A `tool_search` call was held back: a search round follows this call.
    pub fn round(&self) -> bool {
        !self.held.is_empty()
    }

    /// The call ended (its finish was seen): its `tool_search` calls are whole.
    pub fn finished(&self) -> bool {
        self.turn.response().finish.is_some()
    }

    /// What the call said, whole (its `tool_search` calls included).
    pub fn turn(self) -> Response {
        self.turn.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn results() -> Vec<SearchResult> {
        vec![
            SearchResult {
                title: "Rust".into(),
                url: "https://www.rust-lang.org/".into(),
                snippet: "A language".into(),
                page_age: None,
            },
            SearchResult {
                title: "Crates".into(),
                url: "https://crates.io/crates/regex".into(),
                snippet: String::new(),
                page_age: None,
            },
        ]
    }

    #[test]
    fn markdown_links_to_results_are_citations_in_characters() {
        let text = "Héllo [rust-lang.org](https://rust-lang.org) and [x](https://elsewhere.test/) \
                    and [crates.io](https://crates.io/crates/regex).";
        let c = cite(text, &results());
        assert_eq!(c.len(), 2);
        assert_eq!(c[0].url, "https://www.rust-lang.org/");
        assert_eq!(c[0].title, "Rust");
        assert_eq!(c[0].content.as_deref(), Some("A language"));
        let chars: Vec<char> = text.chars().collect();
        let span = |c: &UrlCitation| {
            chars[c.start_index as usize..c.end_index as usize]
                .iter()
                .collect::<String>()
        };
        assert_eq!(span(&c[0]), "[rust-lang.org](https://rust-lang.org)");
        assert_eq!(span(&c[1]), "[crates.io](https://crates.io/crates/regex)");
        assert_eq!(c[1].content, None);
    }

    #[test]
    fn numbered_references_cite_results_by_position() {
        let c = cite("See [2] and [1, 2]; not [3] nor [a].", &results());
        let urls: Vec<&str> = c.iter().map(|c| c.url.as_str()).collect();
        assert_eq!(
            urls,
            [
                "https://crates.io/crates/regex",
                "https://www.rust-lang.org/",
                "https://crates.io/crates/regex"
            ]
        );
        assert_eq!((c[0].start_index, c[0].end_index), (4, 7));
        assert!(cite("no results here [1]", &[]).is_empty());
        // Unclosed and multi-line brackets are not references.
        assert!(cite("[1 and\n] [2", &results()).is_empty());
    }

    #[test]
    fn the_watch_holds_tool_search_calls_and_voids_them_once_spent() {
        let call = |name: &str| Event::ToolCallStart {
            index: 0,
            id: "c0".into(),
            name: name.into(),
        };
        let args = Event::ToolCallArgs {
            index: 0,
            arguments: r#"{"query":"weather"}"#.into(),
        };
        let finish = Event::Finish {
            reason: FinishReason::ToolCalls,
            raw: None,
            stop_sequence: None,
        };
        let mut w = Watch::live();
        let mut evs = vec![call(TOOL_SEARCH), args.clone(), finish.clone()];
        w.filter(&mut evs);
        assert!(evs.is_empty(), "{evs:?}");
        assert!(w.round());
        let turn = w.turn();
        assert!(matches!(&turn.parts[0], Part::ToolCall { name, .. } if name == TOOL_SEARCH));

        let mut w = Watch::spent("budget spent".into());
        let mut evs = vec![call(TOOL_SEARCH), args.clone(), finish.clone()];
        w.filter(&mut evs);
        assert!(!w.round());
        assert_eq!(
            evs,
            vec![
                Event::Text {
                    text: "budget spent".into()
                },
                Event::Finish {
                    reason: FinishReason::Stop,
                    raw: None,
                    stop_sequence: None
                }
            ]
        );

        // A real call passes; a later tool_search call in the same turn is voided.
        let mut w = Watch::live();
        let mut evs = vec![call("get_weather"), finish.clone()];
        w.filter(&mut evs);
        assert_eq!(evs.len(), 2);
        let mut evs = vec![Event::ToolCallStart {
            index: 1,
            id: "c1".into(),
            name: TOOL_SEARCH.into(),
        }];
        w.filter(&mut evs);
        assert!(!w.round());
        assert!(matches!(&evs[0], Event::Text { .. }));
    }
}
