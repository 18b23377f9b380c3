//! A prompt's tokens counted by the gateway, for an answer whose provider
//! reported none (a cut, a stream without usage): with the maker's own tokenizer
//! where the gateway holds it (OpenAI's `o200k_base` and `cl100k_base`, through
//! tiktoken-rs), by the documented approximation
//! (`Request::estimated_prompt_tokens`) for every other maker.
//!
//! An encoding's tables take about 270 ms of one core to build and about 51 MB
//! once built, so they are built the first time an estimate needs them, and a
//! count runs on a blocking thread: a gateway worker never waits on it.

use sluice_filters::ir::Request;

/// OpenAI's encodings the gateway counts with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encoding {
    O200k,
    Cl100k,
}

/// At most this much of a prompt's text is tokenized (about 40 ms of one core);
/// the rest is counted at the ratio of tokens to characters of what was.
const COUNTED_BYTES: usize = 256 * 1024;

impl Encoding {
    /// The encoding of the model a provider serves as `model_id` (`gpt-4o`,
    /// `openai/gpt-4.1-mini`, `gpt-4o-2024-08-06`, `ft:gpt-4o-mini:org::id`),
    /// as tiktoken maps model names; none for a maker whose tokenizer the
    /// gateway does not hold, nor for the legacy completion models' encodings.
    pub fn of(model_id: &str) -> Option<Encoding> {
        use tiktoken_rs::tokenizer::{get_tokenizer, Tokenizer};
        let id = model_id.rsplit('/').next().unwrap_or(model_id);
        match get_tokenizer(&id.to_ascii_lowercase())? {
            // gpt-oss's harmony encoding is o200k with more special tokens: the
            // same count for a prompt's ordinary text.
            Tokenizer::O200kBase | Tokenizer::O200kHarmony => Some(Encoding::O200k),
            Tokenizer::Cl100kBase => Some(Encoding::Cl100k),
            _ => None,
        }
    }

    /// The tokens of `text`, special tokens read as ordinary text (a prompt's
    /// `<|endoftext|>` is text to the provider too).
    pub fn count(self, text: &str) -> usize {
        let bpe = match self {
            Encoding::O200k => tiktoken_rs::o200k_base_singleton(),
            Encoding::Cl100k => tiktoken_rs::cl100k_base_singleton(),
        };
        bpe.encode_ordinary(text).len()
    }
}

/// `req`'s prompt tokens as the maker of `model_id` (the serving rung's model)
/// counts them, with the framing `Request::prompt_text` adds; by the
/// approximation when the gateway holds no tokenizer of that maker's.
pub async fn prompt_tokens(req: &Request, model_id: &str) -> u64 {
    let Some(enc) = Encoding::of(model_id) else {
        return req.estimated_prompt_tokens();
    };
    // The text to tokenize, copied (the count runs on another thread), up to
    // COUNTED_BYTES; what is past it only has its characters counted.
    let mut pieces: Vec<String> = Vec::new();
    let (mut taken, mut rest_chars) = (0usize, 0usize);
    let fixed = req.prompt_text(|t| {
        let room = COUNTED_BYTES - taken;
        let cut = t.floor_char_boundary(room.min(t.len()));
        if cut > 0 {
            pieces.push(t[..cut].to_owned());
            taken += cut;
        }
        rest_chars += t[cut..].chars().count();
    });
    let counted = tokio::task::spawn_blocking(move || {
        let tokens: usize = pieces.iter().map(|p| enc.count(p)).sum();
        let chars: usize = pieces.iter().map(|p| p.chars().count()).sum();
        (tokens, chars)
    })
    .await;
    let Ok((tokens, chars)) = counted else {
        return req.estimated_prompt_tokens();
    };
    // Past the counted part, tokens per character as the counted part had them.
    let rest = (rest_chars as u128 * tokens as u128).div_ceil(chars.max(1) as u128) as u64;
    (tokens as u64).saturating_add(rest).saturating_add(fixed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openai_models_map_to_their_encodings_and_others_to_none() {
        for id in [
            "gpt-4o",
            "gpt-4o-2024-08-06",
            "openai/gpt-4.1-mini",
            "gpt-5",
            "o3-mini",
            "ft:gpt-4o-mini:org::abc",
            "gpt-oss-120b",
        ] {
            assert_eq!(Encoding::of(id), Some(Encoding::O200k), "{id}");
        }
        for id in ["gpt-4", "gpt-3.5-turbo-0125", "text-embedding-3-small"] {
            assert_eq!(Encoding::of(id), Some(Encoding::Cl100k), "{id}");
        }
        for id in [
            "claude-sonnet-4-5",
            "gemini-2.5-pro",
            "llama-3.1-70b",
            "davinci",
        ] {
            assert_eq!(Encoding::of(id), None, "{id}");
        }
    }

    #[test]
    fn counts_are_openais() {
        // OpenAI's cookbook example: "tiktoken is great!" is six tokens in both.
        assert_eq!(Encoding::Cl100k.count("tiktoken is great!"), 6);
        assert_eq!(Encoding::O200k.count("tiktoken is great!"), 6);
        // Special tokens in a prompt are text.
        assert!(Encoding::O200k.count("<|endoftext|>") > 1);
    }
}
