//! Tool search over a request's deferred tools: which of the tools it withheld
//! the model gets when it calls `tool_search`.
//!
//! Two ways to search, as the declaration asks:
//! - BM25 over each tool's name, description, parameter names and parameter
//!   descriptions. Words are split at punctuation and at snake_case and camelCase
//!   boundaries (`getWeatherForecast`, `get_weather_forecast` and `HTTPServer`
//!   give `get weather forecast`, `http server`), lowercased, common English
//!   function words left out; a name's words weigh more than a description's.
//! - A regular expression, matched case-insensitively against the same text with
//!   the `regex` crate: linear time in the text searched, and the compiled
//!   program and its lazy DFA are size-limited, so a hostile pattern costs a
//!   bounded amount of memory and never backtracks.
//!
//! The index is built once per request, from the deferred tools as the body gave
//! them (the parameter schemas are scanned, not parsed into values).

use foldhash::fast::FixedState;
use sluice_filters::ir::Tool;
use std::collections::HashMap;

/// BM25's term-frequency saturation and length normalisation.
const K1: f32 = 1.2;
const B: f32 = 0.75;

/// How much a word weighs by where it is found.
const NAME_WEIGHT: f32 = 3.0;
const PARAM_WEIGHT: f32 = 1.5;
const DESCRIPTION_WEIGHT: f32 = 1.0;
const PARAM_DESCRIPTION_WEIGHT: f32 = 0.5;

/// The longest regular expression accepted (Anthropic's own limit).
pub const MAX_PATTERN_CHARS: usize = 200;
/// Size limits of the compiled regular expression and of its lazy DFA's cache.
const REGEX_SIZE_LIMIT: usize = 1 << 20;
const REGEX_DFA_LIMIT: usize = 1 << 20;
/// Deepest nesting a schema is scanned to.
const MAX_DEPTH: usize = 64;

/// Words too common to tell tools apart.
const STOPWORDS: [&str; 24] = [
    "a", "an", "and", "are", "as", "at", "be", "by", "for", "from", "in", "is", "it", "of", "on",
    "or", "that", "the", "this", "to", "use", "used", "with", "you",
];

/// A BM25 index of deferred tools.
pub struct ToolIndex {
    terms: HashMap<Box<str>, u32, FixedState>,
    /// Per term: the tools it occurs in, with its weighted frequency there.
    postings: Vec<Vec<(u32, f32)>>,
    /// Per tool: its weighted length.
    lens: Vec<f32>,
    avg_len: f32,
}

impl ToolIndex {
    /// Indexes `tools` (their positions are the ids a search answers with).
    pub fn build(tools: &[Tool]) -> ToolIndex {
        let mut b = Builder {
            index: ToolIndex {
                terms: HashMap::with_capacity_and_hasher(tools.len() * 4, FixedState::default()),
                postings: Vec::with_capacity(tools.len() * 4),
                lens: Vec::with_capacity(tools.len()),
                avg_len: 0.0,
            },
            last_doc: Vec::with_capacity(tools.len() * 4),
            doc: 0,
            len: 0.0,
            buf: String::with_capacity(32),
        };
        for (doc, t) in tools.iter().enumerate() {
            b.doc = doc as u32;
            b.len = 0.0;
            b.text(&t.name, NAME_WEIGHT);
            if let Some(d) = &t.description {
                b.text(d, DESCRIPTION_WEIGHT);
            }
            scan_schema(t.parameters.get(), &mut |field, text| match field {
                Field::Name => b.text(text, PARAM_WEIGHT),
                Field::Description => b.text(text, PARAM_DESCRIPTION_WEIGHT),
            });
            b.index.lens.push(b.len);
        }
        let mut index = b.index;
        let total: f32 = index.lens.iter().sum();
        index.avg_len = if index.lens.is_empty() {
            1.0
        } else {
            (total / index.lens.len() as f32).max(1.0)
        };
        index
    }

    /// The number of tools indexed.
    pub fn len(&self) -> usize {
        self.lens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.lens.is_empty()
    }

    /// The best `k` tools for `query`, best first, leaving out those `skip`
    /// names (tools already loaded). Tools that share no word with the query are
    /// never answered.
    pub fn search(&self, query: &str, k: usize, skip: impl Fn(usize) -> bool) -> Vec<usize> {
        let n = self.lens.len() as f32;
        let mut scores = vec![0f32; self.lens.len()];
        let mut seen: Vec<u32> = Vec::new();
        let mut buf = String::with_capacity(32);
        tokens(query, &mut buf, |word| {
            let Some(&term) = self.terms.get(word) else {
                return;
            };
            // A word repeated in the query counts once.
            if seen.contains(&term) {
                return;
            }
            seen.push(term);
            let posting = &self.postings[term as usize];
            let df = posting.len() as f32;
            let idf = (1.0 + (n - df + 0.5) / (df + 0.5)).ln();
            for &(doc, tf) in posting {
                let norm = K1 * (1.0 - B + B * self.lens[doc as usize] / self.avg_len);
                scores[doc as usize] += idf * tf * (K1 + 1.0) / (tf + norm);
            }
        });
        let mut ranked: Vec<(usize, f32)> = scores
            .iter()
            .enumerate()
            .filter(|&(doc, &s)| s > 0.0 && !skip(doc))
            .map(|(doc, &s)| (doc, s))
            .collect();
        let by_score = |a: &(usize, f32), b: &(usize, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        if ranked.len() > k && k > 0 {
            ranked.select_nth_unstable_by(k - 1, by_score);
            ranked.truncate(k);
        }
        ranked.sort_by(by_score);
        ranked.truncate(k);
        ranked.into_iter().map(|(doc, _)| doc).collect()
    }
}

/// Builds an index tool by tool.
struct Builder {
    index: ToolIndex,
    /// Per term: the last tool it was seen in (its posting's last entry).
    last_doc: Vec<u32>,
    doc: u32,
    len: f32,
    buf: String,
}

impl Builder {
    fn text(&mut self, text: &str, weight: f32) {
        let mut buf = std::mem::take(&mut self.buf);
        tokens(text, &mut buf, |word| self.word(word, weight));
        self.buf = buf;
    }

    fn word(&mut self, word: &str, weight: f32) {
        let ix = &mut self.index;
        let term = match ix.terms.get(word) {
            Some(&t) => t,
            None => {
                let t = ix.postings.len() as u32;
                ix.terms.insert(word.into(), t);
                ix.postings.push(Vec::new());
                self.last_doc.push(u32::MAX);
                t
            }
        };
        let posting = &mut ix.postings[term as usize];
        if self.last_doc[term as usize] == self.doc {
            if let Some(last) = posting.last_mut() {
                last.1 += weight;
            }
        } else {
            self.last_doc[term as usize] = self.doc;
            posting.push((self.doc, weight));
        }
        self.len += weight;
    }
}

/// Calls `f` with each word of `text`, lowercased: split at anything that is not
/// a letter or digit, and inside a word at snake_case and camelCase boundaries
/// (`parseHTTPResponse` gives `parse`, `http`, `response`). Stopwords and
/// one-letter words are left out.
pub fn tokens(text: &str, buf: &mut String, mut f: impl FnMut(&str)) {
    let mut emit = |buf: &mut String| {
        if buf.len() > 1 && !STOPWORDS.contains(&buf.as_str()) {
            f(buf);
        }
        buf.clear();
    };
    buf.clear();
    let mut prev: Option<char> = None;
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if !c.is_alphanumeric() {
            emit(buf);
            prev = None;
            continue;
        }
        if let Some(p) = prev {
            let boundary = c.is_uppercase()
                && (p.is_lowercase()
                    || p.is_numeric()
                    || (p.is_uppercase() && chars.peek().is_some_and(|n| n.is_lowercase())));
            if boundary {
                emit(buf);
            }
        }
        if c.is_ascii() {
            buf.push(c.to_ascii_lowercase());
        } else {
            buf.extend(c.to_lowercase());
        }
        prev = Some(c);
    }
    emit(buf);
}

/// What a piece of schema text is.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Field {
    /// A parameter's name (a key of a `properties` object, at any depth).
    Name,
    /// A parameter's `description`.
    Description,
}

/// Scans a JSON Schema for parameter names and descriptions, without building
/// values. `schema` is valid JSON (it was parsed when the request was read); a
/// text that is not stops the scan where it stops making sense.
pub fn scan_schema(schema: &str, f: &mut impl FnMut(Field, &str)) {
    let mut s = Scan {
        b: schema.as_bytes(),
        text: schema,
        at: 0,
    };
    s.value(Ctx::Plain, 0, f);
}

/// Where a value sits in a schema.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Ctx {
    Plain,
    /// A `properties` object: its keys are parameter names.
    Properties,
    /// A parameter's own schema: its `description` describes the parameter.
    Parameter,
}

struct Scan<'a> {
    b: &'a [u8],
    text: &'a str,
    at: usize,
}

impl<'a> Scan<'a> {
    fn ws(&mut self) {
        while self.at < self.b.len() && self.b[self.at].is_ascii_whitespace() {
            self.at += 1;
        }
    }

    /// A string at the cursor: its text (unescaped only when it has escapes).
    fn string(&mut self) -> Option<std::borrow::Cow<'a, str>> {
        let start = self.at;
        self.at += 1;
        let mut escaped = false;
        while self.at < self.b.len() {
            match self.b[self.at] {
                b'\\' => {
                    escaped = true;
                    self.at += 2;
                }
                b'"' => {
                    self.at += 1;
                    let raw = &self.text[start..self.at];
                    return Some(if escaped {
                        std::borrow::Cow::Owned(serde_json::from_str(raw).ok()?)
                    } else {
                        std::borrow::Cow::Borrowed(&raw[1..raw.len() - 1])
                    });
                }
                _ => self.at += 1,
            }
        }
        None
    }

    fn value(&mut self, ctx: Ctx, depth: usize, f: &mut impl FnMut(Field, &str)) -> Option<()> {
        self.ws();
        match *self.b.get(self.at)? {
            b'{' if depth < MAX_DEPTH => self.object(ctx, depth + 1, f),
            b'[' if depth < MAX_DEPTH => {
                self.at += 1;
                loop {
                    self.ws();
                    if *self.b.get(self.at)? == b']' {
                        self.at += 1;
                        return Some(());
                    }
                    self.value(Ctx::Plain, depth + 1, f)?;
                    self.ws();
                    if *self.b.get(self.at)? == b',' {
                        self.at += 1;
                    }
                }
            }
            b'"' => self.string().map(|_| ()),
            b'{' | b'[' => None,
            _ => {
                // A number, true, false or null.
                while self.at < self.b.len() && !matches!(self.b[self.at], b',' | b'}' | b']') {
                    self.at += 1;
                }
                Some(())
            }
        }
    }

    fn object(&mut self, ctx: Ctx, depth: usize, f: &mut impl FnMut(Field, &str)) -> Option<()> {
        self.at += 1;
        loop {
            self.ws();
            match *self.b.get(self.at)? {
                b'}' => {
                    self.at += 1;
                    return Some(());
                }
                b',' => {
                    self.at += 1;
                    continue;
                }
                b'"' => {}
                _ => return None,
            }
            let key = self.string()?;
            self.ws();
            if *self.b.get(self.at)? != b':' {
                return None;
            }
            self.at += 1;
            self.ws();
            match ctx {
                Ctx::Properties => {
                    f(Field::Name, &key);
                    self.value(Ctx::Parameter, depth, f)?;
                }
                _ if key == "properties" => self.value(Ctx::Properties, depth, f)?,
                Ctx::Parameter if key == "description" && self.b.get(self.at) == Some(&b'"') => {
                    let d = self.string()?;
                    f(Field::Description, &d);
                }
                _ => self.value(Ctx::Plain, depth, f)?,
            }
        }
    }
}

/// A compiled tool search pattern: case-insensitive, size-limited.
pub fn compile(pattern: &str) -> Result<regex::Regex, String> {
    if pattern.chars().count() > MAX_PATTERN_CHARS {
        return Err(format!(
            "the pattern is longer than {MAX_PATTERN_CHARS} characters"
        ));
    }
    regex::RegexBuilder::new(pattern)
        .case_insensitive(true)
        .size_limit(REGEX_SIZE_LIMIT)
        .dfa_size_limit(REGEX_DFA_LIMIT)
        .nest_limit(32)
        .build()
        .map_err(|e| match e {
            regex::Error::CompiledTooBig(_) => "the pattern is too large".to_string(),
            e => {
                // The crate's message spans lines; its last line says what is wrong.
                let text = e.to_string();
                text.lines()
                    .last()
                    .unwrap_or("invalid pattern")
                    .trim()
                    .to_string()
            }
        })
}

/// The first `k` tools `re` matches (a match in the name first, then in the
/// description or a parameter), in the order the request gave them, leaving out
/// those `skip` names.
pub fn regex_search(
    tools: &[Tool],
    re: &regex::Regex,
    k: usize,
    skip: impl Fn(usize) -> bool,
) -> Vec<usize> {
    let mut by_name = Vec::new();
    let mut by_text = Vec::new();
    for (i, t) in tools.iter().enumerate() {
        if skip(i) || by_name.len() >= k {
            continue;
        }
        if re.is_match(&t.name) {
            by_name.push(i);
            continue;
        }
        if by_name.len() + by_text.len() >= k {
            continue;
        }
        let mut hit = t.description.as_deref().is_some_and(|d| re.is_match(d));
        if !hit {
            scan_schema(t.parameters.get(), &mut |_, text| hit |= re.is_match(text));
        }
        if hit {
            by_text.push(i);
        }
    }
    by_name.extend(by_text);
    by_name.truncate(k);
    by_name
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::value::RawValue;

    fn tool(name: &str, description: &str, parameters: &str) -> Tool {
        Tool {
            name: name.into(),
            description: Some(description.into()),
            parameters: RawValue::from_string(parameters.into()).unwrap(),
            strict: None,
        }
    }

    fn words(text: &str) -> Vec<String> {
        let mut out = Vec::new();
        tokens(text, &mut String::new(), |w| out.push(w.to_string()));
        out
    }

    #[test]
    fn words_split_at_snake_and_camel_case() {
        assert_eq!(
            words("get_weather_forecast"),
            ["get", "weather", "forecast"]
        );
        assert_eq!(words("getWeatherForecast"), ["get", "weather", "forecast"]);
        assert_eq!(words("parseHTTPResponse"), ["parse", "http", "response"]);
        assert_eq!(
            words("HTTPServer v2 sendSMS2FA"),
            ["http", "server", "v2", "send", "sms2", "fa"]
        );
        assert_eq!(
            words("Use the tool for a Café-Crème"),
            ["tool", "café", "crème"]
        );
    }

    #[test]
    fn schemas_give_parameter_names_and_descriptions_at_any_depth() {
        let mut got = Vec::new();
        scan_schema(
            r#"{"type":"object","description":"not a parameter","properties":{"city":{"type":"string","description":"The city name"},"when":{"type":"object","properties":{"startDate":{"type":"string"}}},"unit":{"enum":["c","f"]}},"required":["city"]}"#,
            &mut |f, t| got.push((f == Field::Name, t.to_string())),
        );
        assert_eq!(
            got,
            [
                (true, "city".into()),
                (false, "The city name".into()),
                (true, "when".into()),
                (true, "startDate".into()),
                (true, "unit".into()),
            ]
        );
        // Escaped keys are read unescaped.
        let mut got = Vec::new();
        scan_schema(r#"{"properties":{"a\u0062c":{}}}"#, &mut |_, t| {
            got.push(t.to_string())
        });
        assert_eq!(got, ["abc"]);
    }

    fn catalog() -> Vec<Tool> {
        vec![
            tool(
                "send_email",
                "Send an email message to a recipient",
                r#"{"properties":{"to":{},"subject":{},"body":{}}}"#,
            ),
            tool(
                "getWeatherForecast",
                "Forecast for the coming days",
                r#"{"properties":{"city":{"description":"City to forecast"}}}"#,
            ),
            tool(
                "get_current_weather",
                "The weather right now in a city",
                r#"{"properties":{"city":{}}}"#,
            ),
            tool(
                "create_calendar_event",
                "Put an event on the calendar",
                r#"{"properties":{"title":{},"start_time":{}}}"#,
            ),
            tool(
                "list_files",
                "List the files of a folder",
                r#"{"properties":{"path":{}}}"#,
            ),
        ]
    }

    #[test]
    fn bm25_ranks_names_and_parameters() {
        let tools = catalog();
        let index = ToolIndex::build(&tools);
        assert_eq!(index.len(), 5);
        let names = |docs: Vec<usize>| {
            docs.into_iter()
                .map(|d| tools[d].name.clone())
                .collect::<Vec<_>>()
        };
        let weather = names(index.search("weather", 5, |_| false));
        assert_eq!(weather.len(), 2);
        assert!(weather.contains(&"getWeatherForecast".to_string()));
        assert_eq!(
            names(index.search("forecast", 1, |_| false)),
            ["getWeatherForecast"]
        );
        assert_eq!(
            names(index.search("subject of an email", 5, |_| false)),
            ["send_email"]
        );
        assert_eq!(
            names(index.search("startTime calendar", 5, |_| false)),
            ["create_calendar_event"]
        );
        // Loaded tools are left out; nothing shared answers nothing.
        assert!(index.search("forecast", 5, |d| d == 1).is_empty());
        assert!(index.search("zebra", 5, |_| false).is_empty());
        assert!(index.search("the a of", 5, |_| false).is_empty());
    }

    #[test]
    fn regular_expressions_are_bounded_and_match_names_first() {
        let tools = catalog();
        let re = compile("weather|calendar").unwrap();
        let found: Vec<&str> = regex_search(&tools, &re, 5, |_| false)
            .into_iter()
            .map(|i| tools[i].name.as_str())
            .collect();
        assert_eq!(
            found,
            [
                "getWeatherForecast",
                "get_current_weather",
                "create_calendar_event"
            ]
        );
        // Case-insensitive, and parameter text counts.
        let re = compile("START_TIME").unwrap();
        assert_eq!(regex_search(&tools, &re, 5, |_| false), [3]);
        assert!(compile("(unclosed").is_err());
        assert!(compile(&"a".repeat(201)).is_err());
        // A pattern whose program would be huge is refused, not compiled.
        assert!(compile("\\w{1000}\\w{1000}\\w{1000}").is_err());
    }
}
