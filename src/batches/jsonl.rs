//! A batch input file's lines, checked as OpenAI checks them (sans-IO): each line a
//! JSON object `{custom_id, method: "POST", url, body}`, the custom_ids unique, every
//! url the batch's endpoint, at most [`MAX_LINES`] lines. Blank lines are skipped.
//! The first problem found ends the check; it becomes the batch's `errors.data[0]`.

use serde::Deserialize;
use serde_json::value::RawValue;
use std::collections::HashSet;

/// The most lines one batch may hold.
pub(crate) const MAX_LINES: usize = 50_000;

/// The endpoints a batch may serve.
pub(crate) const ENDPOINTS: [&str; 3] = ["/v1/chat/completions", "/v1/responses", "/v1/embeddings"];

/// One checked line: what the runner sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Line {
    pub(crate) custom_id: String,
    /// The `body` member as written (a JSON object).
    pub(crate) body: String,
}

/// Why a file is refused, as one `errors.data[]` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LineError {
    pub(crate) code: &'static str,
    pub(crate) message: String,
    pub(crate) param: Option<&'static str>,
    /// 1-based; `None` for the file as a whole.
    pub(crate) line: Option<usize>,
}

impl LineError {
    pub(crate) fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "code": self.code,
            "message": self.message,
            "param": self.param,
            "line": self.line,
        })
    }
}

#[derive(Deserialize)]
struct Raw<'a> {
    #[serde(borrow)]
    custom_id: Option<&'a RawValue>,
    #[serde(borrow)]
    method: Option<&'a RawValue>,
    #[serde(borrow)]
    url: Option<&'a RawValue>,
    #[serde(borrow)]
    body: Option<&'a RawValue>,
}

/// Checks lines one at a time, remembering the custom_ids seen.
pub(crate) struct Checker {
    endpoint: String,
    seen: HashSet<String>,
    /// Lines read so far (blank ones included), for messages.
    line_no: usize,
}

impl Checker {
    pub(crate) fn new(endpoint: &str) -> Checker {
        Checker {
            endpoint: endpoint.to_string(),
            seen: HashSet::new(),
            line_no: 0,
        }
    }

    /// How many lines were accepted.
    #[cfg(test)]
    fn accepted(&self) -> usize {
        self.seen.len()
    }

    /// Checks the next line of the file; `Ok(None)` for a blank line.
    pub(crate) fn line(&mut self, raw: &[u8]) -> Result<Option<Line>, LineError> {
        self.line_no += 1;
        let at = Some(self.line_no);
        let err = |code, message: String, param| LineError {
            code,
            message,
            param,
            line: at,
        };
        let raw = raw.strip_suffix(b"\r").unwrap_or(raw);
        if raw.iter().all(|b| b.is_ascii_whitespace()) {
            return Ok(None);
        }
        let text = std::str::from_utf8(raw)
            .map_err(|_| err("invalid_json_line", "The line is not UTF-8.".into(), None))?;
        let parsed: Raw<'_> = serde_json::from_str(text).map_err(|e| {
            err(
                "invalid_json_line",
                format!("The line is not a JSON object: {e}."),
                None,
            )
        })?;
        let custom_id = parsed
            .custom_id
            .and_then(|v| serde_json::from_str::<String>(v.get()).ok())
            .filter(|c| !c.is_empty())
            .ok_or_else(|| {
                err(
                    "missing_required_parameter",
                    "Each line needs custom_id, a non-empty string.".into(),
                    Some("custom_id"),
                )
            })?;
        let method = parsed
            .method
            .and_then(|v| serde_json::from_str::<String>(v.get()).ok());
        if method.as_deref() != Some("POST") {
            return Err(err(
                "invalid_method",
                "Each line's method must be \"POST\".".into(),
                Some("method"),
            ));
        }
        let url = parsed
            .url
            .and_then(|v| serde_json::from_str::<String>(v.get()).ok());
        if url.as_deref() != Some(self.endpoint.as_str()) {
            return Err(err(
                "mismatched_endpoint",
                format!(
                    "Each line's url must be the batch's endpoint, {}; one url per file.",
                    self.endpoint
                ),
                Some("url"),
            ));
        }
        let body = parsed
            .body
            .filter(|b| b.get().trim_start().starts_with('{'))
            .ok_or_else(|| {
                err(
                    "invalid_request",
                    "Each line needs body, a JSON object.".into(),
                    Some("body"),
                )
            })?;
        #[derive(Deserialize)]
        struct Streams {
            stream: Option<bool>,
        }
        if let Ok(Streams { stream: Some(true) }) = serde_json::from_str(body.get()) {
            return Err(err(
                "invalid_request",
                "Batch lines cannot stream; drop body.stream.".into(),
                Some("body.stream"),
            ));
        }
        if self.seen.len() >= MAX_LINES {
            return Err(err(
                "too_many_requests",
                format!("A batch holds at most {MAX_LINES} lines."),
                None,
            ));
        }
        if !self.seen.insert(custom_id.clone()) {
            return Err(err(
                "duplicate_custom_id",
                format!("custom_id {custom_id:?} appears on more than one line."),
                Some("custom_id"),
            ));
        }
        Ok(Some(Line {
            custom_id,
            body: body.get().to_string(),
        }))
    }

    /// The file ended: an empty one is refused.
    pub(crate) fn end(&self) -> Result<(), LineError> {
        if self.seen.is_empty() {
            return Err(LineError {
                code: "empty_file",
                message: "The input file has no lines.".into(),
                param: None,
                line: None,
            });
        }
        Ok(())
    }
}

/// Splits bytes into lines as they arrive (a line may span pieces).
#[derive(Default)]
pub(crate) struct Splitter {
    partial: Vec<u8>,
}

impl Splitter {
    /// Feeds a piece; calls `each` with every whole line in it. A line longer than
    /// `cap` is an error.
    pub(crate) fn feed<E>(
        &mut self,
        piece: &[u8],
        cap: usize,
        mut each: impl FnMut(&[u8]) -> Result<(), E>,
        too_long: impl Fn() -> E,
    ) -> Result<(), E> {
        let mut rest = piece;
        while let Some(i) = memchr(b'\n', rest) {
            if self.partial.is_empty() {
                each(&rest[..i])?;
            } else {
                self.partial.extend_from_slice(&rest[..i]);
                let line = std::mem::take(&mut self.partial);
                each(&line)?;
            }
            rest = &rest[i + 1..];
        }
        self.partial.extend_from_slice(rest);
        if self.partial.len() > cap {
            return Err(too_long());
        }
        Ok(())
    }

    /// The last line, when the file does not end with a newline.
    pub(crate) fn finish(self) -> Vec<u8> {
        self.partial
    }
}

fn memchr(b: u8, s: &[u8]) -> Option<usize> {
    s.iter().position(|&c| c == b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(id: &str, url: &str) -> String {
        format!(
            r#"{{"custom_id":"{id}","method":"POST","url":"{url}","body":{{"model":"m","messages":[]}}}}"#
        )
    }

    #[test]
    fn checks_lines_as_openai_does() {
        let mut c = Checker::new("/v1/chat/completions");
        let ok = c
            .line(line("a", "/v1/chat/completions").as_bytes())
            .unwrap()
            .unwrap();
        assert_eq!(ok.custom_id, "a");
        assert_eq!(ok.body, r#"{"model":"m","messages":[]}"#);
        assert_eq!(c.line(b"  \r").unwrap(), None);
        let dup = c
            .line(line("a", "/v1/chat/completions").as_bytes())
            .unwrap_err();
        assert_eq!((dup.code, dup.line), ("duplicate_custom_id", Some(3)));
        let url = c.line(line("b", "/v1/embeddings").as_bytes()).unwrap_err();
        assert_eq!((url.code, url.param), ("mismatched_endpoint", Some("url")));
        let bad = c.line(b"{not json").unwrap_err();
        assert_eq!(bad.code, "invalid_json_line");
        let get = c
            .line(br#"{"custom_id":"c","method":"GET","url":"/v1/chat/completions","body":{}}"#)
            .unwrap_err();
        assert_eq!(get.code, "invalid_method");
        let nobody = c
            .line(br#"{"custom_id":"c","method":"POST","url":"/v1/chat/completions","body":3}"#)
            .unwrap_err();
        assert_eq!(nobody.param, Some("body"));
        let stream = c
            .line(br#"{"custom_id":"c","method":"POST","url":"/v1/chat/completions","body":{"stream":true}}"#)
            .unwrap_err();
        assert_eq!(stream.param, Some("body.stream"));
        assert_eq!(c.accepted(), 1);
        assert!(c.end().is_ok());
        assert_eq!(
            Checker::new("/v1/embeddings").end().unwrap_err().code,
            "empty_file"
        );
    }

    #[test]
    fn splits_lines_across_pieces() {
        let mut s = Splitter::default();
        let mut got = Vec::new();
        for piece in [&b"ab"[..], b"c\nd", b"e\n\nf"] {
            s.feed(
                piece,
                10,
                |l| {
                    got.push(String::from_utf8(l.to_vec()).unwrap());
                    Ok::<(), ()>(())
                },
                || (),
            )
            .unwrap();
        }
        assert_eq!(got, ["abc", "de", ""]);
        assert_eq!(s.finish(), b"f");
        let mut s = Splitter::default();
        assert!(s.feed(b"0123456789ab", 10, |_| Ok(()), || ()).is_err());
    }
}
