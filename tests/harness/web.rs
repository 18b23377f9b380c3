//! The web app from a test's side: a `sluice` whose mail goes to a real SMTP sink
//! in the test process, a browser-like client that keeps no cookies of its own
//! and follows no redirects (the test sees every `Set-Cookie` and `Location`), and
//! members signed up and signed in the way a person does it.

use super::{repo_path, Backend, Opts, Sluice};
use reqwest::header::{HeaderMap, COOKIE, LOCATION, SET_COOKIE};
use serde_json::{json, Value};
use sluice_mock::smtp::SmtpSink;
use sluice_mock::Mock;

/// What links in mails start with (`server.public_web_url` in these tests).
pub const PUBLIC_WEB: &str = "http://sluice.test";

/// A signed-in member.
#[derive(Clone, Debug)]
pub struct Member {
    pub email: String,
    pub cookie: String,
    pub csrf: String,
    pub org_id: String,
    pub user_id: String,
    /// The key the signup answered with (members who signed up).
    pub api_key: Option<String>,
}

pub struct Web {
    pub s: Sluice,
    pub sink: SmtpSink,
    pub mock: Mock,
    pub http: reqwest::Client,
}

/// A test's options: the BYOK catalog served by the mock, mail to the sink, 5 USD
/// at signup, signups counted generously (the rate-limit tests lower it).
pub fn web_opts(mock: &Mock, sink: &SmtpSink) -> Opts {
    let base = mock.base_url();
    Opts::default()
        .catalog(repo_path("tests/fixtures/byok.toml"))
        .env("SLUICE_PROVIDERS__OPENAI__BASE_URL", format!("{base}/v1"))
        .env("SLUICE_PROVIDERS__MISTRAL__BASE_URL", format!("{base}/v1"))
        .env("OPENAI_API_KEY", "sk-platform-openai")
        .env("MISTRAL_API_KEY", "sk-platform-mistral")
        .env("SLUICE_NETWORK__ALLOW_PRIVATE_UPSTREAMS", "true")
        .env("SLUICE_EMAIL__SMTP_URL", sink.url())
        .env("SLUICE_EMAIL__FROM", "sluice <no-reply@sluice.test>")
        .env("SLUICE_SERVER__PUBLIC_WEB_URL", PUBLIC_WEB)
        .env("SLUICE_SIGNUP__CREDITS_USD", "5")
        .env("SLUICE_SIGNUP__PER_ORIGIN_PER_HOUR", "100")
}

/// A client as a browser without a cookie jar: no redirects followed.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

/// The `sluice_session` value a response sets, if any.
pub fn set_session(headers: &HeaderMap) -> Option<String> {
    headers.get_all(SET_COOKIE).iter().find_map(|v| {
        let v = v.to_str().ok()?;
        let rest = v.strip_prefix("sluice_session=")?;
        let value = rest.split(';').next()?.to_string();
        (!value.is_empty()).then_some(value)
    })
}

/// The whole `Set-Cookie` line of the session cookie.
pub fn session_cookie_line(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(SET_COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|v| v.starts_with("sluice_session="))
        .map(str::to_string)
}

impl Web {
    pub async fn start(b: &Backend, more: impl FnOnce(Opts) -> Opts) -> Web {
        let mock = Mock::start().await;
        let sink = SmtpSink::start().await;
        let s = Sluice::start(b, more(web_opts(&mock, &sink))).await;
        Web {
            s,
            sink,
            mock,
            http: client(),
        }
    }

    /// A path on this instance's web listener.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.s.web)
    }

    /// A mailed link, pointed at this instance (it names `PUBLIC_WEB`).
    pub fn local(&self, link: &str) -> String {
        let path = link
            .strip_prefix(PUBLIC_WEB)
            .unwrap_or_else(|| panic!("{link} is not under {PUBLIC_WEB}"));
        self.url(path)
    }

    /// `POST /api/signup/instant`.
    pub async fn signup(&self, email: &str) -> (u16, Value) {
        self.signup_via(None, email).await
    }

    /// `POST /api/signup/instant` as a client behind an edge sends it: with
    /// `x-forwarded-for` as the edge leaves it (`None`: no such header).
    pub async fn signup_via(&self, forwarded_for: Option<&str>, email: &str) -> (u16, Value) {
        let mut req = self
            .http
            .post(self.url("/api/signup/instant"))
            .json(&json!({ "email": email }));
        if let Some(v) = forwarded_for {
            req = req.header("x-forwarded-for", v);
        }
        let r = req.send().await.unwrap();
        let st = r.status().as_u16();
        (st, r.json().await.unwrap_or(Value::Null))
    }

    /// GETs a link with an optional cookie; answers the status, the new session
    /// cookie (if one was set) and the headers.
    pub async fn follow(
        &self,
        link: &str,
        cookie: Option<&str>,
    ) -> (u16, Option<String>, HeaderMap) {
        let mut req = self.http.get(self.local(link));
        if let Some(c) = cookie {
            req = req.header(COOKIE, format!("sluice_session={c}"));
        }
        let r = req.send().await.unwrap();
        let headers = r.headers().clone();
        (r.status().as_u16(), set_session(&headers), headers)
    }

    /// `GET /api/session` with a cookie.
    pub async fn session(&self, cookie: &str) -> (u16, Value) {
        self.call_raw(
            Some(cookie),
            None,
            reqwest::Method::GET,
            "/api/session",
            None,
        )
        .await
    }

    /// The member a cookie signs in.
    pub async fn member(&self, cookie: &str, api_key: Option<String>) -> Member {
        let (st, v) = self.session(cookie).await;
        assert_eq!(st, 200, "{v}");
        Member {
            email: v["email"].as_str().unwrap().to_string(),
            cookie: cookie.to_string(),
            csrf: v["csrf_token"].as_str().unwrap().to_string(),
            org_id: v["org_id"].as_str().unwrap().to_string(),
            user_id: v["user_id"].as_str().unwrap().to_string(),
            api_key,
        }
    }

    /// Follows the newest mail to `email` (after `seen` earlier ones) into a session.
    pub async fn sign_in_by_mail(&self, email: &str, seen: usize) -> String {
        let mail = self.sink.wait_for(email, seen).await;
        let (st, cookie, headers) = self.follow(&mail.single_link(), None).await;
        assert_eq!(st, 303, "{headers:?}");
        cookie.expect("a session cookie")
    }

    /// Signs up, follows the verification mail, and reads the session.
    pub async fn sign_up_and_in(&self, email: &str) -> Member {
        let (st, v) = self.signup(email).await;
        assert_eq!(st, 200, "{v}");
        let cookie = self.sign_in_by_mail(email, 0).await;
        let key = v["api_key"].as_str().map(str::to_string);
        self.member(&cookie, key).await
    }

    /// A session API call with the member's cookie and CSRF token.
    pub async fn call(
        &self,
        m: &Member,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        self.call_raw(Some(&m.cookie), Some(&m.csrf), method, path, body)
            .await
    }

    pub async fn call_raw(
        &self,
        cookie: Option<&str>,
        csrf: Option<&str>,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut req = self.http.request(method, self.url(path));
        if let Some(c) = cookie {
            req = req.header(COOKIE, format!("sluice_session={c}"));
        }
        if let Some(t) = csrf {
            req = req.header("x-csrf-token", t);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        let r = req.send().await.unwrap();
        let st = r.status().as_u16();
        let text = r.text().await.unwrap_or_default();
        (st, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    /// A page as the member sees it: status, HTML, headers.
    pub async fn page(&self, m: Option<&Member>, path: &str) -> (u16, String, HeaderMap) {
        let mut req = self.http.get(self.url(path));
        if let Some(m) = m {
            req = req.header(COOKIE, format!("sluice_session={}", m.cookie));
        }
        let r = req.send().await.unwrap();
        let headers = r.headers().clone();
        (r.status().as_u16(), r.text().await.unwrap(), headers)
    }

    /// A form post of the member; `with_csrf` adds the session's token.
    pub async fn form(
        &self,
        m: &Member,
        path: &str,
        fields: &[(&str, &str)],
        with_csrf: bool,
    ) -> (u16, String, HeaderMap) {
        let mut pairs: Vec<(&str, &str)> = fields.to_vec();
        if with_csrf {
            pairs.push(("csrf", m.csrf.as_str()));
        }
        let r = self
            .http
            .post(self.url(path))
            .header(COOKIE, format!("sluice_session={}", m.cookie))
            .form(&pairs)
            .send()
            .await
            .unwrap();
        let headers = r.headers().clone();
        (r.status().as_u16(), r.text().await.unwrap(), headers)
    }

    /// Where a redirect points.
    pub fn location(headers: &HeaderMap) -> String {
        headers
            .get(LOCATION)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    }

    /// A chat call on the gateway.
    pub async fn chat(&self, key: &str, model: &str) -> (u16, Value) {
        self.s
            .post(
                "/v1/chat/completions",
                Some(key),
                &json!({"model": model, "max_tokens": 20,
                        "messages": [{"role": "user", "content": "hi"}]}),
            )
            .await
    }
}
