//! Citations of a search the gateway ran: which results an answer's text cites
//! and where ([`cite`]), a whole answer with the search shown and cited
//! ([`cited_response`]), and the stream encoder that does the same as the answer
//! streams ([`Cited`]).

use super::request::Part;
use super::response::Response;
use super::search::{SearchResult, ServerSearch, UrlCitation};
use super::stream::{Event, StreamEncoder, Tail};
use std::sync::Arc;

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
}
