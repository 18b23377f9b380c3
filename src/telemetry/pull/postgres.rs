//! PostgreSQL: a real connection with the org's URL (`postgres://user:pass@host:
//! port/db`), reading `config.table`: each row one trace, its `id_column` (default
//! `id`) naming it and its `messages_column` (default `messages`, JSON or text)
//! holding chat-json; `since` reads rows whose `time_column` (default
//! `created_at`) is at or after it.
//!
//! The host is the org's:
//! - unless `[network] allow_private_upstreams`, every address it resolves to
//!   must be public; the connection goes to the address that was checked;
//! - the URL is read here, not by sqlx: its host, port, user, password, database
//!   and `sslmode`, nothing else. A socket directory (`host=/…`), `hostaddr`, a
//!   service name or any other parameter is refused, and nothing comes from the
//!   process environment (`PGPASSWORD`, `PGSERVICE`, `.pgpass`): a URL without a
//!   password sends an empty one. Private upstreams allowed or not: the gateway's
//!   own socket and environment are never an org's;
//! - the connection runs through a loopback relay that counts what the server
//!   sends, and ends it past `max_upload_bytes` (sqlx reads a row whole, whatever
//!   length the server announces for it). `sslmode=verify-full` cannot hold: the
//!   name sqlx checks is the relay's.
//!
//! Rows are read one at a time; a row whose messages are longer than a page
//! (4 MiB) is skipped, and the pull says it stopped at its bound.

use super::{Collected, PullError};
use crate::upstream::egress;
use futures_util::TryStreamExt;
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use sqlx::postgres::{PgConnectOptions, PgConnection, PgSslMode};
use sqlx::{ConnectOptions, Connection, Row};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

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

/// What bounds a postgres pull besides its record count.
pub struct Bound {
    pub bytes: u64,
    pub allow_private: bool,
}

/// The largest messages value a row may hold.
const MAX_ROW_BYTES: usize = super::http::MAX_PAGE_BYTES;

/// Process variables that would reach the org's server and that no setting here
/// can clear: a pull is refused while they are set.
const ENVIRONMENT: [&str; 3] = ["PGSSLCERT", "PGSSLKEY", "PGOPTIONS"];

fn bad_url() -> PullError {
    PullError::Credential("the credential must be a postgres://user:pass@host:port/db URL".into())
}

/// The parts of a pull's URL that a connection uses; everything else refused.
#[derive(Debug)]
struct Parts {
    host: String,
    port: u16,
    user: String,
    password: String,
    database: String,
    ssl_mode: PgSslMode,
}

fn parts(url: &str) -> Result<Parts, PullError> {
    let u = reqwest::Url::parse(url).map_err(|_| bad_url())?;
    let decode = |s: &str| {
        percent_encoding_decode(s).ok_or_else(|| {
            PullError::Credential("the credential's URL is not valid UTF-8 once decoded".into())
        })
    };
    let host = u.host_str().unwrap_or_default();
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() || host.contains('%') || host.starts_with('/') {
        return Err(PullError::Credential(
            "the credential must name a database host (a socket path is not one)".into(),
        ));
    }
    let user = decode(u.username())?;
    if user.is_empty() {
        return Err(PullError::Credential(
            "the credential must name a user (postgres://user:pass@host/db)".into(),
        ));
    }
    let password = decode(u.password().unwrap_or_default())?;
    let database = decode(u.path().trim_start_matches('/'))?;
    let mut ssl_mode = PgSslMode::Prefer;
    for (k, v) in u.query_pairs() {
        match &*k {
            "sslmode" | "ssl-mode" => {
                ssl_mode = v.parse().map_err(|_| {
                    PullError::Credential(
                        "the credential's sslmode is not one PostgreSQL knows".into(),
                    )
                })?
            }
            other => {
                let shown: String = other
                    .chars()
                    .filter(char::is_ascii_alphanumeric)
                    .take(32)
                    .collect();
                return Err(PullError::Credential(format!(
                    "the credential may not set {shown:?}: a pull connects to the URL's host, port, user, password and database (and sslmode) only"
                )));
            }
        }
    }
    Ok(Parts {
        host: host.to_string(),
        port: u.port().unwrap_or(5432),
        database: if database.is_empty() {
            user.clone()
        } else {
            database
        },
        user,
        password,
        ssl_mode,
    })
}

fn percent_encoding_decode(s: &str) -> Option<String> {
    form_urlencoded::parse(format!("x={}", s.replace('+', "%2B")).as_bytes())
        .next()
        .map(|(_, v)| v.into_owned())
}

/// A loopback relay to `target`: sqlx connects to its port, and what the server
/// sends is counted. Past `budget` bytes the relay ends both connections (the
/// flag says so). It serves one connection, and ends with it.
async fn relay(target: SocketAddr, budget: u64) -> Result<(u16, Arc<AtomicBool>), PullError> {
    let unreachable = || PullError::Unreachable("could not connect to the database".into());
    let upstream = match tokio::time::timeout(CONNECT, TcpStream::connect(target)).await {
        Ok(Ok(s)) => s,
        Err(_) => {
            return Err(PullError::Unreachable(
                "connecting to the database timed out".into(),
            ))
        }
        Ok(Err(_)) => return Err(unreachable()),
    };
    let listener = TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0))
        .await
        .map_err(|_| unreachable())?;
    let port = listener.local_addr().map_err(|_| unreachable())?.port();
    let over = Arc::new(AtomicBool::new(false));
    let flag = over.clone();
    tokio::spawn(async move {
        let Ok(Ok((client, _))) = tokio::time::timeout(CONNECT, listener.accept()).await else {
            return;
        };
        drop(listener);
        let (mut client_r, mut client_w) = client.into_split();
        let (mut server_r, mut server_w) = upstream.into_split();
        let up = tokio::io::copy(&mut client_r, &mut server_w);
        let down = async {
            let mut left = budget;
            let mut buf = vec![0u8; 16 * 1024];
            loop {
                let n = server_r.read(&mut buf).await?;
                if n == 0 {
                    return client_w.shutdown().await;
                }
                match left.checked_sub(n as u64) {
                    Some(rest) => left = rest,
                    None => {
                        flag.store(true, Ordering::Relaxed);
                        return Ok(());
                    }
                }
                client_w.write_all(&buf[..n]).await?;
            }
        };
        tokio::select! {
            _ = up => {}
            _ = down => {}
        }
    });
    Ok((port, over))
}

/// How long a connection (and its relay's accept) may take.
const CONNECT: Duration = Duration::from_secs(10);

/// Options for the org's server: checked, pinned to the checked address through
/// the relay, with nothing taken from the environment.
async fn guarded(
    url: &str,
    bound: &Bound,
) -> Result<(PgConnectOptions, Arc<AtomicBool>), PullError> {
    let p = parts(url)?;
    if let Some(var) = ENVIRONMENT.iter().find(|v| std::env::var_os(v).is_some()) {
        return Err(PullError::Config(
            "credential",
            format!("this gateway's environment sets {var}, which a connection would carry to the org's server; its operator must unset it (or allow private upstreams)"),
        ));
    }
    let addrs: Vec<std::net::IpAddr> = match tokio::time::timeout(
        Duration::from_secs(5),
        tokio::net::lookup_host((p.host.as_str(), p.port)),
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
    if addrs.is_empty() || (!bound.allow_private && addrs.iter().any(|ip| !egress::is_public(*ip)))
    {
        return Err(PullError::Config(
            "credential",
            "the database host is or resolves to a non-public address (see [network] allow_private_upstreams)".into(),
        ));
    }
    // Connect to the address that was checked: a DNS answer may change.
    let (port, over) = relay(SocketAddr::new(addrs[0], p.port), bound.bytes).await?;
    let opts = PgConnectOptions::new_without_pgpass()
        .host("127.0.0.1")
        .port(port)
        .username(&p.user)
        .password(&p.password)
        .database(&p.database)
        .ssl_mode(p.ssl_mode);
    Ok((opts, over))
}

pub async fn pull(
    url: &str,
    config: &Map<String, Value>,
    bound: Bound,
    out: &mut Collected,
) -> Result<(), PullError> {
    if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
        return Err(bad_url());
    }
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
    let (opts, over) = guarded(url, &bound).await?;
    let opts = opts
        .options([("statement_timeout", "30000")])
        .application_name("sluice-telemetry-pull");
    let mut conn: PgConnection = match tokio::time::timeout(CONNECT, opts.connect()).await {
        Err(_) => {
            return Err(PullError::Unreachable(
                "connecting to the database timed out".into(),
            ))
        }
        Ok(Err(e)) => return Err(connect_error(&e)),
        Ok(Ok(c)) => c,
    };
    let mut inner = format!("SELECT ({id_col})::text AS id, ({msg_col})::text AS m FROM {table}");
    if since.is_some() {
        inner.push_str(&format!(
            " WHERE {time_col} >= to_timestamp($1::double precision / 1000)"
        ));
    }
    inner.push_str(&format!(
        " ORDER BY {id_col} LIMIT {}",
        out.limit.min(100_000)
    ));
    let sql = format!(
        "SELECT id, CASE WHEN octet_length(m) <= {MAX_ROW_BYTES} THEN m END AS messages, \
         octet_length(m) > {MAX_ROW_BYTES} AS over FROM ({inner}) AS pulled"
    );
    let mut q = sqlx::query(&sql);
    if let Some(ms) = since {
        q = q.bind(ms as f64);
    }
    let read = {
        let mut rows = q.fetch(&mut conn);
        loop {
            match rows.try_next().await {
                Ok(Some(r)) => {
                    if r.try_get::<Option<bool>, _>("over").ok().flatten() == Some(true) {
                        out.truncated = true;
                        continue;
                    }
                    let id: Option<String> = r.try_get("id").ok().flatten();
                    let Some(raw) = r.try_get::<Option<String>, _>("messages").ok().flatten()
                    else {
                        continue;
                    };
                    if !out.push_line(&record_line(id.as_deref(), &raw)) {
                        break Ok(());
                    }
                }
                Ok(None) => break Ok(()),
                Err(e) => break Err(e),
            }
        }
    };
    let _ = conn.close().await;
    match read {
        Ok(()) => Ok(()),
        Err(_) if over.load(Ordering::Relaxed) => {
            Err(PullError::Exhausted("bytes (max_upload_bytes)"))
        }
        Err(e) => Err(query_error(&e)),
    }
}

/// One row as a chat-json record: its messages value (JSON, or text kept as a
/// string) with `trace_id` the row's id. An object gets `trace_id` as its last
/// member (the one a reader keeps); anything else is `{messages, trace_id}`.
fn record_line(id: Option<&str>, raw: &str) -> Vec<u8> {
    let id_member = id.map(|id| format!("\"trace_id\":{}", Value::from(id)));
    let trimmed = raw.trim();
    let mut line = if serde_json::from_str::<&RawValue>(trimmed).is_ok() {
        match (trimmed.strip_suffix('}'), trimmed.starts_with('{')) {
            (Some(open), true) => {
                let open = open.trim_end();
                let mut l = open.to_string();
                if let Some(m) = &id_member {
                    if open != "{" {
                        l.push(',');
                    }
                    l.push_str(m);
                }
                l.push('}');
                l
            }
            _ => wrap(trimmed, &id_member),
        }
    } else {
        wrap(&Value::from(raw).to_string(), &id_member)
    }
    .into_bytes();
    super::one_line(&mut line);
    line
}

fn wrap(messages: &str, id_member: &Option<String>) -> String {
    match id_member {
        Some(m) => format!("{{\"messages\":{messages},{m}}}"),
        None => format!("{{\"messages\":{messages}}}"),
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_credential_names_its_host_and_nothing_else() {
        let p = parts("postgres://bob:p%40ss@db.example.com:6543/app?sslmode=require")
            .unwrap_or_else(|_| panic!("parsed"));
        assert_eq!(
            (
                p.host.as_str(),
                p.port,
                p.user.as_str(),
                p.password.as_str(),
                p.database.as_str()
            ),
            ("db.example.com", 6543, "bob", "p@ss", "app")
        );
        assert!(matches!(p.ssl_mode, PgSslMode::Require));
        // No password: an empty one, never the environment's.
        let p = parts("postgresql://bob@[2001:db8::1]/").unwrap_or_else(|_| panic!("parsed"));
        assert_eq!(
            (p.host.as_str(), p.password.as_str(), p.database.as_str()),
            ("2001:db8::1", "", "bob")
        );
        for refused in [
            "postgres://bob@8.8.8.8/db?host=/var/run/postgresql",
            "postgres://bob@8.8.8.8/db?hostaddr=127.0.0.1",
            "postgres://bob@8.8.8.8/db?service=main",
            "postgres://bob@8.8.8.8/db?passfile=/root/.pgpass",
            "postgres://bob@8.8.8.8/db?sslkey=/etc/ssl/key.pem",
            "postgres://bob@8.8.8.8/db?options=-c%20role%3Dadmin",
            "postgres://bob@8.8.8.8/db?port=5433",
            "postgres://bob@%2Ftmp/db",
            "postgres:///db?host=/tmp",
            "postgres://8.8.8.8/db",
        ] {
            match parts(refused) {
                Err(PullError::Credential(_)) => {}
                Ok(p) => panic!("{refused} accepted as {p:?}"),
                Err(_) => panic!("{refused}: refused for another reason"),
            }
        }
    }

    #[test]
    fn a_row_becomes_one_record_line_with_its_id() {
        let v = |id: Option<&str>, raw: &str| -> Value {
            let line = record_line(id, raw);
            assert!(!line.contains(&b'\n'));
            serde_json::from_slice(&line).unwrap()
        };
        assert_eq!(
            v(
                Some("7"),
                "{\"messages\": [\n {\"role\": \"user\"}], \"trace_id\": \"theirs\"}"
            )["trace_id"],
            "7"
        );
        assert_eq!(v(Some("7"), "{}"), serde_json::json!({"trace_id": "7"}));
        assert_eq!(v(None, "[1]"), serde_json::json!({"messages": [1]}));
        assert_eq!(
            v(Some("x"), "not json"),
            serde_json::json!({"messages": "not json", "trace_id": "x"})
        );
    }
}
