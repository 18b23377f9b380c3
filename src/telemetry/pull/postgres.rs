//! PostgreSQL: a real connection with the org's URL (`postgres://user:pass@host:
//! port/db`), reading `config.table`: each row one trace, its `id_column` (default
//! `id`) naming it and its `messages_column` (default `messages`, JSON or text)
//! holding chat-json; `since` reads rows whose `time_column` (default
//! `created_at`) is at or after it. The host is the org's: unless
//! `[network] allow_private_upstreams`, every address it resolves to must be
//! public, and the connection goes to the address that was checked.

use super::{Collected, PullError};
use crate::upstream::egress;
use serde_json::{json, Map, Value};
use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{ConnectOptions, Connection, Row};
use std::str::FromStr;
use std::time::Duration;

fn ident(
    config: &Map<String, Value>,
    key: &'static str,
    default: &str,
) -> Result<String, PullError> {
    let param = match key {
        "table" => "config.table",
        "id_column" => "config.id_column",
        "messages_column" => "config.messages_column",
        _ => "config.time_column",
    };
    let raw = match config.get(key) {
        None | Some(Value::Null) if !default.is_empty() => default.to_string(),
        Some(Value::String(s)) => s.clone(),
        _ => {
            return Err(PullError::Config(
                param,
                format!("{param} is required (a table or column name)"),
            ))
        }
    };
    let parts: Vec<&str> = raw.split('.').collect();
    let ok = parts.len() <= 2
        && parts.iter().all(|p| {
            !p.is_empty()
                && p.len() <= 63
                && p.chars()
                    .next()
                    .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        });
    if !ok {
        return Err(PullError::Config(
            param,
            format!("{param} must be a plain name like traces or public.traces"),
        ));
    }
    Ok(parts
        .iter()
        .map(|p| format!("\"{p}\""))
        .collect::<Vec<_>>()
        .join("."))
}

pub async fn pull(
    url: &str,
    config: &Map<String, Value>,
    allow_private: bool,
    out: &mut Collected,
) -> Result<(), PullError> {
    let bad_url = || {
        PullError::Credential(
            "the credential must be a postgres://user:pass@host:port/db URL".into(),
        )
    };
    if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
        return Err(bad_url());
    }
    let mut opts = PgConnectOptions::from_str(url).map_err(|_| bad_url())?;
    let table = ident(config, "table", "")?;
    let id_col = ident(config, "id_column", "id")?;
    let msg_col = ident(config, "messages_column", "messages")?;
    let time_col = ident(config, "time_column", "created_at")?;
    let since = match config.get("since") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(
            chrono::DateTime::parse_from_rfc3339(s)
                .map_err(|_| {
                    PullError::Config("config.since", "since must be an RFC 3339 time".into())
                })?
                .timestamp_millis(),
        ),
        Some(_) => {
            return Err(PullError::Config(
                "config.since",
                "since must be an RFC 3339 time".into(),
            ))
        }
    };
    let host = opts.get_host().to_string();
    if !allow_private {
        if host.starts_with('/') {
            return Err(PullError::Config(
                "credential",
                "a socket path is not a public address".into(),
            ));
        }
        let port = opts.get_port();
        let addrs: Vec<std::net::IpAddr> = match tokio::time::timeout(
            Duration::from_secs(5),
            tokio::net::lookup_host((host.as_str(), port)),
        )
        .await
        {
            Ok(Ok(found)) => found.map(|a| a.ip()).collect(),
            _ => {
                return Err(PullError::Unreachable(
                    "the database host does not resolve".into(),
                ))
            }
        };
        if addrs.is_empty() || addrs.iter().any(|ip| !egress::is_public(*ip)) {
            return Err(PullError::Config(
                "credential",
                "the database host is or resolves to a non-public address (see [network] allow_private_upstreams)".into(),
            ));
        }
        // Connect to the address that was checked: a DNS answer may change.
        opts = opts.host(&addrs[0].to_string());
    }
    opts = opts
        .options([("statement_timeout", "30000")])
        .application_name("sluice-telemetry-pull");
    let mut conn: PgConnection =
        match tokio::time::timeout(Duration::from_secs(10), opts.connect()).await {
            Err(_) => {
                return Err(PullError::Unreachable(
                    "connecting to the database timed out".into(),
                ))
            }
            Ok(Err(e)) => return Err(connect_error(&e)),
            Ok(Ok(c)) => c,
        };
    let mut sql =
        format!("SELECT ({id_col})::text AS id, ({msg_col})::text AS messages FROM {table}");
    if since.is_some() {
        sql.push_str(&format!(
            " WHERE {time_col} >= to_timestamp($1::double precision / 1000)"
        ));
    }
    sql.push_str(&format!(
        " ORDER BY {id_col} LIMIT {}",
        out.limit.min(100_000)
    ));
    let mut q = sqlx::query(&sql);
    if let Some(ms) = since {
        q = q.bind(ms as f64);
    }
    let rows = match q.fetch_all(&mut conn).await {
        Ok(r) => r,
        Err(e) => {
            let _ = conn.close().await;
            return Err(query_error(&e));
        }
    };
    let _ = conn.close().await;
    for r in rows {
        let id: Option<String> = r.try_get("id").ok();
        let raw: Option<String> = r.try_get("messages").ok().flatten();
        let Some(raw) = raw else { continue };
        let parsed: Value = serde_json::from_str(&raw).unwrap_or(Value::String(raw));
        let mut record = match parsed {
            Value::Object(m) => m,
            other => {
                let mut m = Map::new();
                m.insert("messages".into(), other);
                m
            }
        };
        if let Some(id) = id {
            record.insert("trace_id".into(), json!(id));
        }
        if !out.push(&Value::Object(record)) {
            break;
        }
    }
    Ok(())
}

fn connect_error(e: &sqlx::Error) -> PullError {
    if let sqlx::Error::Database(db) = e {
        let code = db.code().unwrap_or_default();
        if code.starts_with("28") {
            return PullError::Credential("the database refused the credential".into());
        }
        if code == "3D000" {
            return PullError::Credential("the database named in the URL does not exist".into());
        }
    }
    PullError::Unreachable("could not connect to the database".into())
}

fn query_error(e: &sqlx::Error) -> PullError {
    if let sqlx::Error::Database(db) = e {
        match db.code().unwrap_or_default().as_ref() {
            "42P01" => return PullError::Config("config.table", "the table does not exist".into()),
            "42703" => return PullError::Config(
                "config.messages_column",
                "a configured column does not exist (id_column, messages_column or time_column)"
                    .into(),
            ),
            "42501" => {
                return PullError::Credential("the credential may not read the table".into())
            }
            _ => {}
        }
    }
    PullError::Source("the database could not run the read".into())
}
