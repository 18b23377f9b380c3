//! Model slugs. A slug is the dot form of a model's name (`claude-sonnet-4.5`); the
//! dashed wire id (`claude-sonnet-4-5`) and dated ids (`gpt-4o-2024-08-06`) are not
//! slugs. A request's model may carry the `:online` suffix (ask for web search) and
//! the `[1m]` suffix (the 1M-token context window); they are split off first.

/// A requested model name with its suffixes split off.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelRef<'a> {
    pub slug: &'a str,
    pub online: bool,
    pub long_context: bool,
}

/// Splits `:online` and `[1m]` (in either order) off a requested model name.
pub fn split_suffixes(model: &str) -> ModelRef<'_> {
    let mut slug = model;
    let mut online = false;
    let mut long_context = false;
    loop {
        if let Some(s) = slug.strip_suffix(":online") {
            if online {
                break;
            }
            online = true;
            slug = s;
        } else if let Some(s) = slug.strip_suffix("[1m]") {
            if long_context {
                break;
            }
            long_context = true;
            slug = s;
        } else {
            break;
        }
    }
    ModelRef {
        slug,
        online,
        long_context,
    }
}

/// Why a name is not a slug, or `None` if it is one.
pub fn slug_problem(slug: &str) -> Option<&'static str> {
    if slug.is_empty() || slug.len() > 128 {
        return Some("a slug has 1 to 128 characters");
    }
    if !slug
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'-' | b'_'))
    {
        return Some("a slug uses lowercase letters, digits, '.', '-' and '_' only");
    }
    if !slug.as_bytes()[0].is_ascii_alphanumeric()
        || !slug.as_bytes()[slug.len() - 1].is_ascii_alphanumeric()
    {
        return Some("a slug starts and ends with a letter or digit");
    }
    let parts: Vec<&str> = slug.split('-').collect();
    let numeric = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if parts.iter().any(|p| numeric(p) && p.len() >= 6) {
        return Some("a dated id is not a slug");
    }
    if parts.windows(2).any(|w| numeric(w[0]) && numeric(w[1])) {
        return Some("a dashed version is not a slug: use the dot form (4.5, not 4-5)");
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suffixes_split_in_either_order() {
        let r = split_suffixes("gpt-4.1:online");
        assert_eq!((r.slug, r.online, r.long_context), ("gpt-4.1", true, false));
        let r = split_suffixes("claude-sonnet-4.5[1m]");
        assert_eq!(
            (r.slug, r.online, r.long_context),
            ("claude-sonnet-4.5", false, true)
        );
        let r = split_suffixes("claude-sonnet-4.5[1m]:online");
        assert_eq!(
            (r.slug, r.online, r.long_context),
            ("claude-sonnet-4.5", true, true)
        );
        let r = split_suffixes("x:online:online");
        assert_eq!(r.slug, "x:online");
    }

    #[test]
    fn dot_forms_are_slugs() {
        for s in [
            "gpt-4.1-mini",
            "claude-sonnet-4.5",
            "llama-3.3-70b",
            "gemini-2.5-flash",
            "o3",
            "text-embedding-3-small",
            "mistral-large",
        ] {
            assert_eq!(slug_problem(s), None, "{s}");
        }
    }

    #[test]
    fn wire_and_dated_ids_are_not_slugs() {
        for s in [
            "claude-sonnet-4-5",
            "claude-sonnet-4-5-20250929",
            "gpt-4o-2024-08-06",
            "gpt-4.1-mini-2025-04-14",
            "anthropic.claude-3-haiku@20240307",
            "GPT-4.1",
            "",
            "-x",
            "meta-llama/llama-3.3-70b-instruct",
        ] {
            assert!(slug_problem(s).is_some(), "{s}");
        }
    }
}
