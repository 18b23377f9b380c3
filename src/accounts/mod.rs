//! Organizations and API keys: the durable records, the admin operations on them
//! (shared by the HTTP admin API and the `sluice admin` CLI), and the in-process
//! directory the hot path authenticates against without touching SQL. And the
//! people behind them: users and members, signup, sign-in by mailed link, web
//! sessions, and the mailer.

pub mod admin;
pub mod directory;
pub mod keys;
pub mod links;
pub mod mail;
pub mod orgs;
pub mod sessions;
pub mod signin;
pub mod signup;
pub mod users;

pub use directory::Directory;
pub use keys::KeyRecord;
pub use orgs::OrgRecord;

/// The one key authentication, for every listener: the key a request presents
/// (`presented_key`), live in the directory (read from the database on a miss).
/// `Ok(None)` when no key was presented at all; 401 `invalid_key` for one that is
/// not live or an `Authorization` header that names no key.
pub async fn authenticate(
    directory: &Directory,
    db: &crate::store::Db,
    headers: &http::HeaderMap,
    allow_x_api_key: bool,
) -> Result<Option<Caller>, ApiError> {
    let Some(presented) = presented_key(headers, allow_x_api_key) else {
        if headers.contains_key(http::header::AUTHORIZATION) {
            return Err(ApiError::invalid_key());
        }
        return Ok(None);
    };
    let (key, org) = directory
        .authenticate_or_fetch(db, presented)
        .await
        .ok_or_else(ApiError::invalid_key)?;
    Ok(Some(Caller {
        key,
        org,
        batch_line: None,
    }))
}

/// Who a request comes from: the key it presented and its org, and, for a line
/// of a batch this instance runs, the line (`<batch id>:<line>`) its usage event
/// names.
#[derive(Clone)]
pub struct Caller {
    pub key: std::sync::Arc<KeyRecord>,
    pub org: std::sync::Arc<OrgRecord>,
    pub batch_line: Option<Box<str>>,
}

use sluice_filters::ApiError;

/// The key a request presents: `Authorization: Bearer <key>`, or on the messages
/// route also `x-api-key: <key>`. No query parameter and no other header.
pub fn presented_key(headers: &http::HeaderMap, allow_x_api_key: bool) -> Option<&str> {
    if let Some(v) = headers.get(http::header::AUTHORIZATION) {
        let v = v.to_str().ok()?.trim();
        let (scheme, rest) = v.split_once(' ')?;
        return scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim());
    }
    if allow_x_api_key {
        return headers.get("x-api-key")?.to_str().ok().map(str::trim);
    }
    None
}
