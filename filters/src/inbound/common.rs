//! Rules shared by the inbound formats.

use crate::error::{ApiError, ErrorCode};
use crate::ir::search::TOOL_SEARCH;
use crate::ir::{Request, SearchForm, ToolChoice, WebSearch};
use serde::Deserialize;
use serde_json::value::RawValue;

/// Fields refused on every route (SPEC "How request fields are handled").
pub const REFUSED_EVERYWHERE: [&str; 10] = [
    "audio",
    "modalities",
    "logit_bias",
    "seed",
    "functions",
    "function_call",
    "prediction",
    "prompt_cache_retention",
    "provider",
    "route",
];

/// The longest tool or structured-format description accepted, in characters.
pub const MAX_DESCRIPTION_CHARS: usize = 65_536;

/// The 400 for a field refused on every route, if `field` is one.
pub fn refused_everywhere(field: &str) -> Option<ApiError> {
    REFUSED_EVERYWHERE.contains(&field).then(|| {
        ApiError::new(
            ErrorCode::UnsupportedParameter,
            format!("The parameter `{field}` is not supported on any route."),
        )
        .param(field.to_string())
    })
}

/// Checks a tool or structured-format description against the cap.
pub fn check_description(param: String, text: &str) -> Result<(), ApiError> {
    let len = text.chars().count();
    if len > MAX_DESCRIPTION_CHARS {
        return Err(ApiError::new(
            ErrorCode::InvalidParameter,
            format!(
                "The description is {len} characters long; the limit is {MAX_DESCRIPTION_CHARS} characters."
            ),
        )
        .param(param));
    }
    Ok(())
}

/// A 400 `invalid_parameter` naming `param`.
pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> ApiError {
    ApiError::new(ErrorCode::InvalidParameter, message.into()).param(param.into())
}

/// A 400 `unsupported_parameter` naming `param`.
pub fn unsupported(param: impl Into<String>, message: impl Into<String>) -> ApiError {
    ApiError::new(ErrorCode::UnsupportedParameter, message.into()).param(param.into())
}

/// A 400 `invalid_request` (a malformed body that is still JSON).
pub fn malformed(message: impl Into<String>) -> ApiError {
    ApiError::new(ErrorCode::InvalidRequest, message.into())
}

/// The request's web search, asked for in `form` (a request may spell it twice:
/// the first spelling is kept, later ones add their options; a plugin always
/// makes it the plugin's).
pub fn want_web_search(r: &mut Request, form: SearchForm) -> &mut WebSearch {
    r.web_search
        .get_or_insert_with(|| Box::new(WebSearch::new(form)))
}

/// `plugins`: only `{id: "web"}` is served (its `max_results` and
/// `search_prompt` honoured); another id is 400 `unsupported_parameter`.
pub fn parse_plugins(v: &RawValue, r: &mut Request) -> Result<(), ApiError> {
    if v.get() == "null" {
        return Ok(());
    }
    #[derive(Deserialize)]
    struct Plugin {
        id: String,
        #[serde(default)]
        max_results: Option<serde_json::Value>,
        #[serde(default)]
        search_prompt: Option<serde_json::Value>,
    }
    let list: Vec<&RawValue> = serde_json::from_str(v.get()).map_err(|_| {
        invalid(
            "plugins",
            "`plugins` must be an array of objects with an `id`.",
        )
    })?;
    for (i, raw) in list.into_iter().enumerate() {
        let p: Plugin = serde_json::from_str(raw.get()).map_err(|_| {
            invalid(
                format!("plugins[{i}]"),
                "Each plugin must be an object with a string `id`.",
            )
        })?;
        if p.id != "web" {
            return Err(unsupported(
                "plugins",
                format!("Only the `web` plugin is served; `{}` is not.", p.id),
            ));
        }
        let max_results = match p.max_results {
            None | Some(serde_json::Value::Null) => None,
            Some(n) => Some(n.as_u64().filter(|n| (1..=20).contains(n)).ok_or_else(|| {
                invalid(
                    format!("plugins[{i}].max_results"),
                    "`max_results` must be an integer from 1 to 20.",
                )
            })? as u32),
        };
        let search_prompt = match p.search_prompt {
            None | Some(serde_json::Value::Null) => None,
            Some(serde_json::Value::String(s)) => Some(s),
            Some(_) => {
                return Err(invalid(
                    format!("plugins[{i}].search_prompt"),
                    "`search_prompt` must be a string.",
                ))
            }
        };
        let ws = want_web_search(r, SearchForm::Plugin);
        // The plugin is the gateway's spelling: no provider takes the body with it.
        ws.form = SearchForm::Plugin;
        if max_results.is_some() {
            ws.max_results = max_results;
        }
        if search_prompt.is_some() {
            ws.search_prompt = search_prompt;
        }
    }
    Ok(())
}

/// A tool's `defer_loading` member: absent, null or a boolean.
pub fn defer_loading(v: Option<&RawValue>, param: impl Into<String>) -> Result<bool, ApiError> {
    match v.map(RawValue::get) {
        None | Some("null") | Some("false") => Ok(false),
        Some("true") => Ok(true),
        Some(_) => Err(invalid(param, "`defer_loading` must be a boolean.")),
    }
}

/// Checks a request's tool search once its tools are read: deferred tools need a
/// tool search declaration, the declaration reserves the name `tool_search`, and
/// `tool_choice` may not name it (`auto` and `required` are how a model is let
/// search).
pub fn check_tool_search(r: &Request) -> Result<(), ApiError> {
    if !r.deferred.is_empty() && r.tool_search.is_none() {
        return Err(invalid(
            "tools",
            "Tools marked `defer_loading` need a tool search declaration among the tools.",
        ));
    }
    if r.tool_search.is_none() {
        return Ok(());
    }
    if let Some(i) = r
        .tools
        .iter()
        .chain(&r.deferred)
        .position(|t| t.name == TOOL_SEARCH)
    {
        return Err(invalid(
            "tools",
            format!("`{TOOL_SEARCH}` is the tool search's own name; tool {i} may not take it."),
        ));
    }
    if matches!(&r.tool_choice, Some(ToolChoice::Tool { name }) if name == TOOL_SEARCH) {
        return Err(unsupported(
            "tool_choice",
            "A tool_choice may not name `tool_search`; use `auto` or `required`.",
        ));
    }
    if r.tools.is_empty() && r.deferred.is_empty() {
        return Ok(());
    }
    if r.tools.len() + r.deferred.len() > MAX_TOOLS {
        return Err(invalid(
            "tools",
            format!("At most {MAX_TOOLS} tools are accepted in one request."),
        ));
    }
    Ok(())
}

/// The most tools (loaded and deferred together) one request may carry.
pub const MAX_TOOLS: usize = 20_000;
