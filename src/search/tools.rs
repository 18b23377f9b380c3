//! Tool search over a request's deferred tools: which of the tools it withheld
//! the model gets when it calls `tool_search`.
//!
//! Two ways to search, as the declaration asks:
//! - BM25 over each tool's name, description and parameter names. Words are split
//!   at punctuation and at snake_case and camelCase boundaries
//!   (`getWeatherForecast`, `get_weather_forecast` and `HTTPServer` give `get
//!   weather forecast`, `http server`), lowercased, common English function words
//!   left out; a name's words weigh more than a description's.
//! - A regular expression, matched case-insensitively against the same text with
//!   the `regex` crate: linear time in the text searched, and the compiled
//!   program and its lazy DFA are size-limited, so a hostile pattern costs a
//!   bounded amount of memory and never backtracks.
//!
//! The index is built once per request, from the deferred tools as the body gave
//! them (the parameter schemas are scanned, not parsed into values).

use sluice_filters::ir::Tool;
use std::collections::HashMap;

/// BM25's term-frequency saturation and length normalisation.
const K1: f32 = 1.2;
const B: f32 = 0.75;

/// How much a word weighs by where it is found.
const NAME_WEIGHT: f32 = 3.0;
const PARAM_WEIGHT: f32 = 1.5;
const DESCRIPTION_WEIGHT: f32 = 1.0;

/// The longest regular expression accepted (Anthropic's own limit).
pub const MAX_PATTERN_CHARS: usize = 200;
/// Size limits of the compiled regular expression and of its lazy DFA's cache.
const REGEX_SIZE_LIMIT: usize = 1 << 20;
const REGEX_DFA_LIMIT: usize = 1 << 20;
/// Deepest nesting a schema is scanned to.
const MAX_DEPTH: usize = 64;

/// A word's key in the index: a 64-bit hash of its lowercase bytes, folded in as
/// the text is scanned (no word is copied, stored or compared). Two words sharing
/// a key (odds about 1 in 10^10 for a catalog's vocabulary) would only share their
/// postings.
const MUL: u64 = 0x517c_c1b7_2722_0a95;

const fn fold(h: u64, byte: u8) -> u64 {
    (h.rotate_left(5) ^ byte as u64).wrapping_mul(MUL)
}

/// The key of a word of `len` bytes whose bytes were folded into `h`.
const fn finish(h: u64, len: usize) -> u64 {
    let h = h ^ len as u64;
    let h = (h ^ (h >> 33)).wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^ (h >> 33)
}

/// The key of a lowercase word.
pub const fn word_key(word: &str) -> u64 {
    let b = word.as_bytes();
    let mut h = 0;
    let mut i = 0;
    while i < b.len() {
        h = fold(h, b[i]);
        i += 1;
    }
    finish(h, b.len())
}

/// Words too common to tell tools apart (one-letter words are left out too), by
/// key; none is longer than four bytes.
const STOPWORDS: [u64; 23] = {
    const WORDS: [&str; 23] = [
        "an", "and", "are", "as", "at", "be", "by", "for", "from", "in", "is", "it", "of", "on",
        "or", "that", "the", "this", "to", "use", "used", "with", "you",
    ];
    let mut keys = [0; 23];
    let mut i = 0;
    while i < 23 {
        keys[i] = word_key(WORDS[i]);
        i += 1;
    }
    keys
};

/// Hands on the key of a word of `len` bytes, unless it is too short or a
/// stopword.
#[inline]
fn emit(h: u64, len: usize, f: &mut impl FnMut(u64)) {
    if len < 2 {
        return;
    }
    let key = finish(h, len);
    if len <= 4 && STOPWORDS.contains(&key) {
        return;
    }
    f(key);
}

/// The index's map hasher: its keys are hashes already.
#[derive(Clone, Copy, Default)]
struct Prehashed(u64);

impl std::hash::Hasher for Prehashed {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only u64 keys are hashed; any other input is folded in plainly.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

type Terms = HashMap<u64, u32, std::hash::BuildHasherDefault<Prehashed>>;

/// A BM25 index of deferred tools, its postings in one array (term by term, each
/// term's tools in order).
pub struct ToolIndex {
    terms: Terms,
    /// Term `t`'s postings are `postings[offsets[t]..offsets[t + 1]]`.
    offsets: Vec<u32>,
    /// A tool a term occurs in, with the term's weighted frequency there.
    postings: Vec<(u32, f32)>,
    /// Per tool: its weighted length.
    lens: Vec<f32>,
    avg_len: f32,
}

impl ToolIndex {
    /// Indexes `tools` (their positions are the ids a search answers with).
    pub fn build(tools: &[Tool]) -> ToolIndex {
        let mut b = Builder {
            terms: Terms::with_capacity_and_hasher(tools.len() * 2, Default::default()),
            entries: Vec::with_capacity(tools.len() * 16),
            seen: Vec::with_capacity(tools.len() * 2),
            doc: 0,
            len: 0.0,
        };
        let mut lens = Vec::with_capacity(tools.len());
        for (doc, t) in tools.iter().enumerate() {
            b.doc = doc as u32;
            b.len = 0.0;
            b.text(&t.name, NAME_WEIGHT);
            if let Some(d) = &t.description {
                b.text(d, DESCRIPTION_WEIGHT);
            }
            scan_schema(t.parameters.get(), &mut |name| b.text(name, PARAM_WEIGHT));
            lens.push(b.len);
        }
        // A counting sort of the entries by term: each term's tools stay in order.
        let n_terms = b.terms.len();
        let mut offsets = vec![0u32; n_terms + 1];
        for &(term, _, _) in &b.entries {
            offsets[term as usize + 1] += 1;
        }
        for t in 0..n_terms {
            offsets[t + 1] += offsets[t];
        }
        let mut at: Vec<u32> = offsets[..n_terms].to_vec();
        let mut postings = vec![(0u32, 0f32); b.entries.len()];
        for &(term, doc, tf) in &b.entries {
            let slot = &mut at[term as usize];
            postings[*slot as usize] = (doc, tf);
            *slot += 1;
        }
        let total: f32 = lens.iter().sum();
        let avg_len = if lens.is_empty() {
            1.0
        } else {
            (total / lens.len() as f32).max(1.0)
        };
        ToolIndex {
            terms: b.terms,
            offsets,
            postings,
            lens,
            avg_len,
        }
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
        words(query, |key| {
            let Some(&term) = self.terms.get(&key) else {
                return;
            };
            // A word repeated in the query counts once.
            if seen.contains(&term) {
                return;
            }
            seen.push(term);
            let t = term as usize;
            let posting = &self.postings[self.offsets[t] as usize..self.offsets[t + 1] as usize];
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

/// Builds an index tool by tool into one list of (term, tool, frequency) entries.
struct Builder {
    terms: Terms,
    entries: Vec<(u32, u32, f32)>,
    /// Per term: the last tool it occurred in and its entry there (a repeat in the
    /// same tool adds to that entry).
    seen: Vec<(u32, u32)>,
    doc: u32,
    len: f32,
}

impl Builder {
    fn text(&mut self, text: &str, weight: f32) {
        words(text, |key| self.word(key, weight));
    }

    fn word(&mut self, key: u64, weight: f32) {
        let next = self.terms.len() as u32;
        let term = *self.terms.entry(key).or_insert(next);
        if term == next {
            self.seen.push((u32::MAX, 0));
        }
        self.len += weight;
        let seen = &mut self.seen[term as usize];
        if seen.0 == self.doc {
            if let Some(e) = self.entries.get_mut(seen.1 as usize) {
                e.2 += weight;
            }
        } else {
            *seen = (self.doc, self.entries.len() as u32);
            self.entries.push((term, self.doc, weight));
        }
    }
}

/// Calls `f` with the key of each word of `text`, lowercased: split at anything
/// that is not a letter or digit, and inside a word at snake_case and camelCase
/// boundaries (`parseHTTPResponse` gives `parse`, `http`, `response`). Stopwords
/// and one-letter words are left out.
pub fn words(text: &str, mut f: impl FnMut(u64)) {
    if text.is_ascii() {
        ascii_words(text.as_bytes(), &mut f);
        return;
    }
    let (mut h, mut len) = (0u64, 0usize);
    let mut prev: Option<char> = None;
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if !c.is_alphanumeric() {
            emit(h, len, &mut f);
            (h, len, prev) = (0, 0, None);
            continue;
        }
        if let Some(p) = prev {
            let boundary = c.is_uppercase()
                && (p.is_lowercase()
                    || p.is_numeric()
                    || (p.is_uppercase() && chars.peek().is_some_and(|n| n.is_lowercase())));
            if boundary {
                emit(h, len, &mut f);
                (h, len) = (0, 0);
            }
        }
        for lower in c.to_lowercase() {
            let mut utf8 = [0u8; 4];
            for &byte in lower.encode_utf8(&mut utf8).as_bytes() {
                h = fold(h, byte);
                len += 1;
            }
        }
        prev = Some(c);
    }
    emit(h, len, &mut f);
}

/// What an ASCII byte is to the tokenizer.
const SEP: u8 = 0;
const LOWER: u8 = 1;
const UPPER: u8 = 2;
const DIGIT: u8 = 3;

static CLASS: [u8; 256] = {
    let mut t = [SEP; 256];
    let mut c = 0;
    while c < 256 {
        t[c] = match c as u8 {
            b'a'..=b'z' => LOWER,
            b'A'..=b'Z' => UPPER,
            b'0'..=b'9' => DIGIT,
            _ => SEP,
        };
        c += 1;
    }
    t
};

/// [`words`] of an ASCII text, byte by byte.
fn ascii_words(b: &[u8], f: &mut impl FnMut(u64)) {
    let n = b.len();
    let mut i = 0;
    while i < n {
        while i < n && CLASS[b[i] as usize] == SEP {
            i += 1;
        }
        let (mut start, mut h, mut prev) = (i, 0u64, SEP);
        while i < n {
            let c = b[i];
            let class = CLASS[c as usize];
            match class {
                SEP => break,
                UPPER => {
                    let split = match prev {
                        LOWER | DIGIT => true,
                        UPPER => i + 1 < n && CLASS[b[i + 1] as usize] == LOWER,
                        _ => false,
                    };
                    if split {
                        emit(h, i - start, f);
                        (start, h) = (i, 0);
                    }
                    h = fold(h, c | 0x20);
                }
                _ => h = fold(h, c),
            }
            prev = class;
            i += 1;
            // Most bytes: a run of lowercase letters.
            if prev == LOWER {
                while i < n && b[i].is_ascii_lowercase() {
                    h = fold(h, b[i]);
                    i += 1;
                }
            }
        }
        emit(h, i - start, f);
    }
}

/// Scans a JSON Schema for its parameter names (the keys of a `properties`
/// object, at any depth), without building values. `schema` is valid JSON (it
/// was parsed when the request was read); a text that is not stops the scan
/// where it stops making sense.
pub fn scan_schema(schema: &str, f: &mut impl FnMut(&str)) {
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

    /// Moves past the string at the cursor; whether it holds escapes. Eight
    /// bytes are looked at a time for a quote or a backslash.
    fn skip_string(&mut self) -> Option<bool> {
        const ONES: u64 = 0x0101_0101_0101_0101;
        const HIGHS: u64 = 0x8080_8080_8080_8080;
        let has = |v: u64, c: u8| {
            let x = v ^ (ONES * u64::from(c));
            x.wrapping_sub(ONES) & !x & HIGHS
        };
        let b = self.b;
        let mut i = self.at + 1;
        let mut escaped = false;
        loop {
            let hit = match b.get(i..i + 8) {
                Some(w) => {
                    let v = u64::from_le_bytes(w.try_into().ok()?);
                    let m = has(v, b'"') | has(v, b'\\');
                    if m == 0 {
                        i += 8;
                        continue;
                    }
                    // The lowest flagged byte is always a true match.
                    i + (m.trailing_zeros() / 8) as usize
                }
                None => i + b.get(i..)?.iter().position(|&c| c == b'"' || c == b'\\')?,
            };
            if b[hit] == b'\\' {
                escaped = true;
                i = hit + 2;
                continue;
            }
            self.at = hit + 1;
            return Some(escaped);
        }
    }

    fn value(&mut self, ctx: Ctx, depth: usize, f: &mut impl FnMut(&str)) -> Option<()> {
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
            b'"' => self.skip_string().map(|_| ()),
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

    fn object(&mut self, ctx: Ctx, depth: usize, f: &mut impl FnMut(&str)) -> Option<()> {
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
            let start = self.at;
            let escaped = self.skip_string()?;
            let raw = &self.text[start + 1..self.at - 1];
            self.ws();
            if *self.b.get(self.at)? != b':' {
                return None;
            }
            self.at += 1;
            self.ws();
            match ctx {
                Ctx::Properties => {
                    if escaped {
                        let key: String =
                            serde_json::from_str(&self.text[start..start + raw.len() + 2]).ok()?;
                        f(&key);
                    } else {
                        f(raw);
                    }
                    self.value(Ctx::Plain, depth, f)?;
                }
                _ if raw == "properties" => self.value(Ctx::Properties, depth, f)?,
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
            scan_schema(t.parameters.get(), &mut |name| hit |= re.is_match(name));
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

    /// The keys of `text`'s words, and those of the words expected.
    fn keys(text: &str, want: &[&str]) -> (Vec<u64>, Vec<u64>) {
        let mut out = Vec::new();
        words(text, |k| out.push(k));
        (out, want.iter().map(|w| word_key(w)).collect())
    }

    #[test]
    fn words_split_at_snake_and_camel_case() {
        for (text, want) in [
            ("get_weather_forecast", &["get", "weather", "forecast"][..]),
            ("getWeatherForecast", &["get", "weather", "forecast"]),
            ("parseHTTPResponse", &["parse", "http", "response"]),
            (
                "HTTPServer v2 sendSMS2FA",
                &["http", "server", "v2", "send", "sms2", "fa"],
            ),
            ("Use the tool for a Café-Crème", &["tool", "café", "crème"]),
            ("CAFÉ crème", &["café", "crème"]),
        ] {
            let (got, want) = keys(text, want);
            assert_eq!(got, want, "{text}");
        }
    }

    #[test]
    fn schemas_give_parameter_names_at_any_depth() {
        let mut got = Vec::new();
        scan_schema(
            r#"{"type":"object","description":"not a parameter","properties":{"city":{"type":"string","description":"The city name"},"when":{"type":"object","properties":{"startDate":{"type":"string"}}},"unit":{"enum":["c","f"]},"properties":{"type":"string"}},"required":["city"]}"#,
            &mut |t| got.push(t.to_string()),
        );
        assert_eq!(got, ["city", "when", "startDate", "unit", "properties"]);
        // Escaped keys are read unescaped.
        let mut got = Vec::new();
        scan_schema(r#"{"properties":{"a\u0062c":{}}}"#, &mut |t| {
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
