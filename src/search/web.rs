//! The web search backends the gateway runs a service-run search through, behind
//! one trait: SearXNG's JSON API (`GET {url}/search?q=…&format=json`, the open,
//! self-hostable default) and the Brave Search API (`GET
//! {url}/res/v1/web/search?q=…&count=…` with `X-Subscription-Token`). Each reads
//! its vendor's real answer into ranked results; anything else (an error status, a
//! timeout, an answer that is not the vendor's JSON) is `Unavailable`, and the
//! turn is served without results.

use crate::upstream::{vendor, Failure, Target, Upstreams};
use async_trait::async_trait;
use serde::Deserialize;
use sluice_filters::ir::SearchResult;
use std::sync::Arc;
use std::time::Duration;

/// Brave's API base when the operator names none.
pub const BRAVE_DEFAULT_URL: &str = "https://api.search.brave.com";

/// Brave takes at most 400 characters and 50 words of query; SearXNG is given the
/// same.
const MAX_QUERY_CHARS: usize = 400;

/// Why a search gave no results to serve.
#[derive(Debug, PartialEq, Eq)]
pub struct Unavailable(pub String);

/// A web search vendor.
#[async_trait]
pub trait WebSearchBackend: Send + Sync {
    /// The backend's name in logs and metrics (`searxng`, `brave`).
    fn name(&self) -> &'static str;

    /// The ranked results for `query`, at most `count`, within `within`.
    async fn search(
        &self,
        up: &Upstreams,
        query: &str,
        count: usize,
        within: Duration,
    ) -> Result<Vec<SearchResult>, Unavailable>;
}

/// The backend `[search]` configures, if any (`none`: no backend; a URL that
/// cannot be read: none, with a warning).
pub fn backend(
    kind: &str,
    url: &str,
    key: Option<Arc<str>>,
    timeout: Duration,
) -> Option<Box<dyn WebSearchBackend>> {
    match kind {
        "searxng" => {
            let target = vendor::target("searxng", url, key, timeout);
            if target.is_none() {
                tracing::warn!("[search] url is not an http(s) URL: web searches will not run");
            }
            Some(Box::new(SearXng { target: target? }))
        }
        "brave" => {
            let url = if url.is_empty() {
                BRAVE_DEFAULT_URL
            } else {
                url
            };
            if key.is_none() {
                tracing::warn!(
                    "[search] backend brave has no key ([search] api_key_env names an unset variable): Brave will refuse the searches"
                );
            }
            let target = vendor::target("brave", url, key, timeout);
            if target.is_none() {
                tracing::warn!("[search] url is not an http(s) URL: web searches will not run");
            }
            Some(Box::new(Brave { target: target? }))
        }
        _ => None,
    }
}

/// `text` percent-encoded for a query string: unreserved characters as they
/// are, a space as `+`, every other byte `%XX`.
pub fn query_component(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 3 / 2);
    for b in text.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            b' ' => out.push('+'),
            _ => {
                const HEX: &[u8; 16] = b"0123456789ABCDEF";
                out.push('%');
                out.push(HEX[(b >> 4) as usize] as char);
                out.push(HEX[(b & 15) as usize] as char);
            }
        }
    }
    out
}

/// The query as a vendor takes it: whitespace folded, at most 400 characters.
fn trimmed(query: &str) -> String {
    let folded: Vec<&str> = query.split_whitespace().collect();
    folded.join(" ").chars().take(MAX_QUERY_CHARS).collect()
}

/// Calls a vendor and returns the body of its 2xx answer.
async fn fetch(
    up: &Upstreams,
    t: &Target,
    path: &str,
    within: Duration,
    vendor: &str,
) -> Result<Vec<u8>, Unavailable> {
    match up.vendor_get(t, path, within).await {
        Ok((status, body)) if (200..300).contains(&status) => Ok(body),
        Ok((status, _)) => Err(Unavailable(format!("{vendor} answered status {status}"))),
        Err(Failure::HeaderTimeout) => Err(Unavailable(format!("{vendor} timed out"))),
        Err(f) => Err(Unavailable(format!("{vendor} failed ({})", f.label()))),
    }
}

/// SearXNG's JSON API.
pub struct SearXng {
    target: Arc<Target>,
}

#[async_trait]
impl WebSearchBackend for SearXng {
    fn name(&self) -> &'static str {
        "searxng"
    }

    async fn search(
        &self,
        up: &Upstreams,
        query: &str,
        count: usize,
        within: Duration,
    ) -> Result<Vec<SearchResult>, Unavailable> {
        let path = self.target.under_base(&format!(
            "/search?q={}&format=json",
            query_component(&trimmed(query))
        ));
        let body = fetch(up, &self.target, &path, within, "searxng").await?;
        parse_searxng(&body, count)
    }
}

/// Reads a SearXNG answer: `{"query", "results": [{"url", "title", "content",
/// "publishedDate"?, ...}], ...}`, already ranked.
pub fn parse_searxng(body: &[u8], count: usize) -> Result<Vec<SearchResult>, Unavailable> {
    #[derive(Deserialize)]
    struct Answer {
        results: Vec<Hit>,
    }
    #[derive(Deserialize)]
    struct Hit {
        #[serde(default)]
        url: Option<String>,
        #[serde(default)]
        title: Option<String>,
        #[serde(default)]
        content: Option<String>,
        #[serde(default, rename = "publishedDate")]
        published: Option<String>,
    }
    let a: Answer = serde_json::from_slice(body)
        .map_err(|e| Unavailable(format!("searxng answer unreadable: {e}")))?;
    Ok(a.results
        .into_iter()
        .filter_map(|h| {
            let url = h.url.filter(|u| u.starts_with("http"))?;
            Some(SearchResult {
                title: h.title.unwrap_or_else(|| url.clone()),
                url,
                snippet: h.content.unwrap_or_default(),
                page_age: h.published.filter(|p| !p.is_empty()),
            })
        })
        .take(count)
        .collect())
}

/// The Brave Search API.
pub struct Brave {
    target: Arc<Target>,
}

#[async_trait]
impl WebSearchBackend for Brave {
    fn name(&self) -> &'static str {
        "brave"
    }

    async fn search(
        &self,
        up: &Upstreams,
        query: &str,
        count: usize,
        within: Duration,
    ) -> Result<Vec<SearchResult>, Unavailable> {
        let path = self.target.under_base(&format!(
            "/res/v1/web/search?q={}&count={}",
            query_component(&trimmed(query)),
            count.clamp(1, 20)
        ));
        let body = fetch(up, &self.target, &path, within, "brave").await?;
        parse_brave(&body, count)
    }
}

/// Reads a Brave web search answer: `{"type": "search", "query": {...}, "web":
/// {"type": "search", "results": [{"title", "url", "description", "age"?,
/// "page_age"?, ...}]}, ...}`. Descriptions mark the query's words with `<strong>`:
/// the tags are taken out. An answer without `web` found nothing.
pub fn parse_brave(body: &[u8], count: usize) -> Result<Vec<SearchResult>, Unavailable> {
    #[derive(Deserialize)]
    struct Answer {
        #[serde(rename = "type")]
        kind: String,
        #[serde(default)]
        web: Option<Web>,
    }
    #[derive(Deserialize)]
    struct Web {
        #[serde(default)]
        results: Vec<Hit>,
    }
    #[derive(Deserialize)]
    struct Hit {
        #[serde(default)]
        url: Option<String>,
        #[serde(default)]
        title: Option<String>,
        #[serde(default)]
        description: Option<String>,
        #[serde(default)]
        age: Option<String>,
        #[serde(default)]
        page_age: Option<String>,
    }
    let a: Answer = serde_json::from_slice(body)
        .map_err(|e| Unavailable(format!("brave answer unreadable: {e}")))?;
    if a.kind != "search" {
        return Err(Unavailable(format!("brave answered a `{}`", a.kind)));
    }
    Ok(a.web
        .map(|w| w.results)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|h| {
            let url = h.url.filter(|u| u.starts_with("http"))?;
            Some(SearchResult {
                title: h
                    .title
                    .map(|t| without_tags(&t))
                    .unwrap_or_else(|| url.clone()),
                url,
                snippet: h.description.map(|d| without_tags(&d)).unwrap_or_default(),
                page_age: h.age.or(h.page_age),
            })
        })
        .take(count)
        .collect())
}

/// `html` without its tags, and with the entities Brave writes decoded.
fn without_tags(html: &str) -> String {
    let mut out = String::with_capacity(html.len());
    let mut in_tag = false;
    for c in html.chars() {
        match c {
            '<' => in_tag = true,
            '>' if in_tag => in_tag = false,
            c if !in_tag => out.push(c),
            _ => {}
        }
    }
    out.replace("&#x27;", "'")
        .replace("&#39;", "'")
        .replace("&quot;", "\"")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_are_encoded_for_a_url() {
        assert_eq!(
            query_component("rust 1.80 & co/é"),
            "rust+1.80+%26+co%2F%C3%A9"
        );
        assert_eq!(trimmed("  a \n b  "), "a b");
        assert_eq!(trimmed(&"x".repeat(500)).len(), 400);
    }

    #[test]
    fn searxng_answers_are_read() {
        let body = br#"{"query":"rust","number_of_results":0,"results":[
            {"url":"https://www.rust-lang.org/","title":"Rust Programming Language","content":"A language empowering everyone","engine":"duckduckgo","parsed_url":["https","www.rust-lang.org","/","","",""],"template":"default.html","engines":["duckduckgo"],"positions":[1],"score":1.0,"category":"general"},
            {"url":"https://en.wikipedia.org/wiki/Rust","title":"Rust - Wikipedia","content":"","publishedDate":"2024-01-02T00:00:00","engine":"wikipedia","score":0.5,"category":"general"},
            {"url":"javascript:alert(1)","title":"x"},
            {"url":"https://third.test/","title":"Third"}
        ],"answers":[],"corrections":[],"infoboxes":[],"suggestions":["rust language"],"unresponsive_engines":[]}"#;
        let r = parse_searxng(body, 2).unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].url, "https://www.rust-lang.org/");
        assert_eq!(r[0].snippet, "A language empowering everyone");
        assert_eq!(r[1].page_age.as_deref(), Some("2024-01-02T00:00:00"));
        assert!(parse_searxng(b"<html>", 5).is_err());
        assert!(parse_searxng(br#"{"error":"x"}"#, 5).is_err());
    }

    #[test]
    fn brave_answers_are_read() {
        let body = br#"{"type":"search","query":{"original":"rust","more_results_available":true},
          "mixed":{"type":"mixed","main":[{"type":"web","index":0,"all":false}]},
          "web":{"type":"search","family_friendly":true,"results":[
            {"type":"search_result","title":"Rust <strong>Programming</strong> Language","url":"https://www.rust-lang.org/","is_source_local":false,"description":"A language empowering <strong>everyone</strong> &amp; fast.","page_age":"2024-05-01T00:00:00","profile":{"name":"Rust"},"language":"en","family_friendly":true,"age":"May 1, 2024"},
            {"type":"search_result","title":"Second","url":"https://second.test/","description":"two"}
          ]}}"#;
        let r = parse_brave(body, 5).unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].title, "Rust Programming Language");
        assert_eq!(r[0].snippet, "A language empowering everyone & fast.");
        assert_eq!(r[0].page_age.as_deref(), Some("May 1, 2024"));
        assert!(
            parse_brave(br#"{"type":"search","query":{"original":"x"}}"#, 5)
                .unwrap()
                .is_empty()
        );
        assert!(parse_brave(br#"{"type":"ErrorResponse","error":{"code":"x"}}"#, 5).is_err());
    }
}
