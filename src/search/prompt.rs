//! What the model is told: the results of a service-run web search (a
//! system-level message that asks it to cite by source), the `tool_search`
//! function that stands in for the deferred tools, and what a search round
//! answers it.

use sluice_filters::ir::search::TOOL_SEARCH;
use sluice_filters::ir::{SearchResult, Tool, ToolSearchKind};
use std::fmt::Write;

/// The longest snippet given to the model, in characters.
const MAX_SNIPPET_CHARS: usize = 600;
/// The longest tool description a search round quotes, in characters.
const MAX_DESCRIPTION_CHARS: usize = 200;

/// The system-level message that gives the model a search's results. `intro`
/// replaces the default opening (the web plugin's `search_prompt`).
pub fn web_results(results: &[SearchResult], intro: Option<&str>, today: &str) -> String {
    let mut out = String::with_capacity(256 + results.len() * 400);
    match intro {
        Some(intro) => out.push_str(intro.trim()),
        None if results.is_empty() => {
            let _ = write!(
                out,
                "A web search was run on {today} for the user's latest message and found nothing. Answer from what you know, and say that the search found nothing."
            );
            return out;
        }
        None => {
            let _ = write!(
                out,
                "A web search was run on {today} for the user's latest message. Use the results below where they help. Cite every source you use as a markdown link named by its domain, for example [example.com](https://example.com/page). Cite only these sources."
            );
        }
    }
    for (i, r) in results.iter().enumerate() {
        let _ = write!(out, "\n\n[{}] {}\nURL: {}", i + 1, r.title, r.url);
        if let Some(age) = &r.page_age {
            let _ = write!(out, "\nPublished: {age}");
        }
        if !r.snippet.is_empty() {
            out.push('\n');
            out.extend(r.snippet.chars().take(MAX_SNIPPET_CHARS));
        }
    }
    out
}

/// The `tool_search` function offered in place of `deferred` tools.
pub fn tool_search_function(kind: ToolSearchKind, deferred: usize) -> Tool {
    let (description, query) = match kind {
        ToolSearchKind::Bm25 => (
            format!(
                "Search a catalog of {deferred} more tools that are not loaded yet. Give keywords for the capability you need; the best matching tools are loaded and can be called on your next turn. Call this alone, before answering, when none of the loaded tools fits the task."
            ),
            "Keywords describing the tool you need, e.g. \"weather forecast city\".",
        ),
        ToolSearchKind::Regex => (
            format!(
                "Search a catalog of {deferred} more tools that are not loaded yet with a regular expression, matched case-insensitively against tool names, descriptions and parameter names. Matching tools are loaded and can be called on your next turn. Call this alone, before answering, when none of the loaded tools fits the task."
            ),
            "A regular expression (Rust syntax, at most 200 characters), e.g. \"weather|forecast\".",
        ),
    };
    let parameters = serde_json::json!({
        "type": "object",
        "properties": {"query": {"type": "string", "description": query}},
        "required": ["query"],
    });
    Tool {
        name: TOOL_SEARCH.to_string(),
        description: Some(description),
        parameters: serde_json::value::to_raw_value(&parameters).unwrap_or_else(|_| {
            serde_json::value::RawValue::from_string("{}".into()).expect("valid JSON")
        }),
        strict: None,
    }
}

/// What one search round answers the model.
pub fn round_result(query: &str, loaded: &[&Tool], problem: Option<&str>) -> String {
    if let Some(p) = problem {
        return format!(
            "The search could not run: {p}. Call tool_search again with a valid query."
        );
    }
    if loaded.is_empty() {
        return format!(
            "No more tools matched \"{query}\". Try other keywords, or answer with the tools already loaded."
        );
    }
    let mut out = format!(
        "Loaded {} tool{} for \"{query}\"; call {} now:",
        loaded.len(),
        if loaded.len() == 1 { "" } else { "s" },
        if loaded.len() == 1 { "it" } else { "them" },
    );
    for t in loaded {
        let _ = write!(out, "\n- {}", t.name);
        if let Some(d) = t.description.as_deref().filter(|d| !d.is_empty()) {
            out.push_str(": ");
            out.extend(d.chars().take(MAX_DESCRIPTION_CHARS));
        }
    }
    out
}

/// What a `tool_search` call past the last round becomes.
pub fn budget_spent(rounds: u32) -> String {
    format!(
        "(tool_search was not run: this request's search budget of {rounds} round{} ran out.)",
        if rounds == 1 { "" } else { "s" }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_are_numbered_with_their_urls_and_the_ask_to_cite() {
        let r = vec![SearchResult {
            title: "Rust".into(),
            url: "https://rust-lang.org/".into(),
            snippet: "x".repeat(700),
            page_age: Some("2 days ago".into()),
        }];
        let p = web_results(&r, None, "2026-01-02");
        assert!(p.contains("2026-01-02"));
        assert!(p.contains("markdown link"));
        assert!(p.contains("[1] Rust\nURL: https://rust-lang.org/\nPublished: 2 days ago\n"));
        assert!(!p.contains(&"x".repeat(601)));
        let custom = web_results(&r, Some("Use these: "), "d");
        assert!(custom.starts_with("Use these:\n\n[1] Rust"));
        assert!(web_results(&[], None, "d").contains("found nothing"));
    }

    #[test]
    fn the_tool_search_function_asks_for_a_query() {
        let t = tool_search_function(ToolSearchKind::Bm25, 42);
        assert_eq!(t.name, "tool_search");
        assert!(t.description.unwrap().contains("42 more tools"));
        let p: serde_json::Value = serde_json::from_str(t.parameters.get()).unwrap();
        assert_eq!(p["required"][0], "query");
        assert!(budget_spent(3).contains("3 rounds"));
    }
}
