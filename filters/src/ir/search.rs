//! Web search and tool search in canonical form: what a request asks for (in any
//! of its five spellings), what a search found, and the `url_citation`
//! annotations an answer carries. The stream helpers around an answer the gateway
//! orchestrates are `cite` (a service-run search shown and cited) and `watch`
//! (`tool_search` calls held back from the client).

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

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
