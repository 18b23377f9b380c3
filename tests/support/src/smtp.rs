//! A real SMTP server for tests: it speaks the protocol a mail client speaks to a
//! relay (EHLO, MAIL FROM, RCPT TO, DATA with dot-stuffing, RSET, NOOP, QUIT) on
//! an ephemeral loopback port, keeps every mail it accepts, and lets a test wait
//! for the next mail to an address and read the link out of its text part.
//!
//! ```no_run
//! # async fn demo() {
//! let sink = sluice_mock::smtp::SmtpSink::start().await;
//! let url = sink.url(); // "smtp://127.0.0.1:PORT"
//! // ... a service sends to `url` ...
//! let mail = sink.next_to("alice@example.com").await;
//! let link = mail.single_link();
//! # }
//! ```

use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

/// One accepted mail.
#[derive(Clone, Debug)]
pub struct Mail {
    /// The envelope sender (MAIL FROM).
    pub from: String,
    /// The envelope recipients (RCPT TO).
    pub to: Vec<String>,
    /// The whole message as sent (headers, blank line, body), dot-unstuffed.
    pub data: String,
}

impl Mail {
    /// A header's value (the first of that name, unfolded).
    pub fn header(&self, name: &str) -> Option<String> {
        let head = self.data.split("\r\n\r\n").next()?;
        let mut found: Option<String> = None;
        for line in head.split("\r\n") {
            if line.starts_with([' ', '\t']) {
                if let Some(v) = found.as_mut() {
                    v.push(' ');
                    v.push_str(line.trim());
                }
                continue;
            }
            if found.is_some() {
                break;
            }
            if let Some((k, v)) = line.split_once(':') {
                if k.trim().eq_ignore_ascii_case(name) {
                    found = Some(v.trim().to_string());
                }
            }
        }
        found
    }

    /// The text part, decoded (7bit, 8bit or quoted-printable).
    pub fn text(&self) -> String {
        let body = self.data.split_once("\r\n\r\n").map_or("", |(_, b)| b);
        let qp = self
            .header("Content-Transfer-Encoding")
            .is_some_and(|v| v.eq_ignore_ascii_case("quoted-printable"));
        if qp {
            decode_quoted_printable(body)
        } else {
            body.to_string()
        }
    }

    /// Every http or https link in the text part.
    pub fn links(&self) -> Vec<String> {
        let text = self.text();
        let mut out = Vec::new();
        let mut rest = text.as_str();
        while let Some(i) = rest.find("http") {
            let tail = &rest[i..];
            if tail.starts_with("http://") || tail.starts_with("https://") {
                let end = tail
                    .find(|c: char| c.is_whitespace() || matches!(c, '<' | '>' | '"'))
                    .unwrap_or(tail.len());
                out.push(tail[..end].to_string());
                rest = &tail[end..];
            } else {
                rest = &tail[4..];
            }
        }
        out
    }

    /// The one link of the mail; panics unless there is exactly one.
    pub fn single_link(&self) -> String {
        let links = self.links();
        assert_eq!(links.len(), 1, "exactly one link in: {}", self.text());
        links[0].clone()
    }
}

fn decode_quoted_printable(s: &str) -> String {
    let mut out = Vec::with_capacity(s.len());
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'=' {
            if b.get(i + 1) == Some(&b'\r') && b.get(i + 2) == Some(&b'\n') {
                i += 3;
                continue;
            }
            if let (Some(h), Some(l)) = (b.get(i + 1), b.get(i + 2)) {
                if let Ok(v) = u8::from_str_radix(&format!("{}{}", *h as char, *l as char), 16) {
                    out.push(v);
                    i += 3;
                    continue;
                }
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[derive(Default)]
struct Inbox {
    mails: Mutex<Vec<Mail>>,
    arrived: Notify,
}

/// The sink; it serves until dropped.
pub struct SmtpSink {
    port: u16,
    inbox: Arc<Inbox>,
    task: tokio::task::AbortHandle,
}

impl Drop for SmtpSink {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl SmtpSink {
    pub async fn start() -> SmtpSink {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind smtp sink");
        let port = listener.local_addr().expect("addr").port();
        let inbox = Arc::new(Inbox::default());
        let served = inbox.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let inbox = served.clone();
                tokio::spawn(async move {
                    let _ = session(stream, inbox).await;
                });
            }
        })
        .abort_handle();
        SmtpSink { port, inbox, task }
    }

    /// The URL for `[email] smtp_url`: plain SMTP, no TLS, no authentication.
    pub fn url(&self) -> String {
        format!("smtp://127.0.0.1:{}", self.port)
    }

    /// Every mail so far.
    pub fn mails(&self) -> Vec<Mail> {
        self.inbox.mails.lock().unwrap().clone()
    }

    /// Mails so far to an address.
    pub fn mails_to(&self, to: &str) -> Vec<Mail> {
        self.mails()
            .into_iter()
            .filter(|m| m.to.iter().any(|t| t.eq_ignore_ascii_case(to)))
            .collect()
    }

    /// Waits (up to 30 s) until the address has received more than `seen` mails
    /// and returns the newest.
    pub async fn wait_for(&self, to: &str, seen: usize) -> Mail {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let notified = self.inbox.arrived.notified();
            let mails = self.mails_to(to);
            if mails.len() > seen {
                return mails.last().cloned().unwrap();
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                panic!("no mail to {to} arrived (had {seen})");
            }
        }
    }

    /// The first mail to an address, waiting for it.
    pub async fn next_to(&self, to: &str) -> Mail {
        self.wait_for(to, 0).await
    }
}

fn angle(arg: &str) -> String {
    let a = arg.trim();
    let a = a.split_once(':').map_or(a, |(_, v)| v).trim();
    let a = a.split_whitespace().next().unwrap_or("");
    a.trim_start_matches('<').trim_end_matches('>').to_string()
}

async fn session(stream: TcpStream, inbox: Arc<Inbox>) -> std::io::Result<()> {
    let (read, mut write) = stream.into_split();
    let mut read = BufReader::new(read);
    write.write_all(b"220 sink.test ESMTP ready\r\n").await?;
    let (mut from, mut to) = (String::new(), Vec::<String>::new());
    let mut line = String::new();
    loop {
        line.clear();
        if read.read_line(&mut line).await? == 0 {
            return Ok(());
        }
        let cmd = line.trim_end();
        let verb = cmd
            .split_whitespace()
            .next()
            .unwrap_or("")
            .to_ascii_uppercase();
        match verb.as_str() {
            "EHLO" => {
                write
                    .write_all(
                        b"250-sink.test\r\n250-8BITMIME\r\n250-SMTPUTF8\r\n250 SIZE 10485760\r\n",
                    )
                    .await?
            }
            "HELO" => write.write_all(b"250 sink.test\r\n").await?,
            "MAIL" => {
                from = angle(&cmd[4..]);
                to.clear();
                write.write_all(b"250 OK\r\n").await?;
            }
            "RCPT" => {
                to.push(angle(&cmd[4..]));
                write.write_all(b"250 OK\r\n").await?;
            }
            "DATA" => {
                if to.is_empty() {
                    write.write_all(b"503 need RCPT first\r\n").await?;
                    continue;
                }
                write.write_all(b"354 end with <CRLF>.<CRLF>\r\n").await?;
                let mut data = String::new();
                loop {
                    line.clear();
                    if read.read_line(&mut line).await? == 0 {
                        return Ok(());
                    }
                    if line == ".\r\n" || line == ".\n" {
                        break;
                    }
                    // Dot-stuffing: a leading dot was doubled by the sender.
                    let l = line.strip_prefix('.').unwrap_or(&line);
                    data.push_str(l);
                }
                let mail = Mail {
                    from: from.clone(),
                    to: std::mem::take(&mut to),
                    data: data.trim_end_matches("\r\n").to_string(),
                };
                inbox.mails.lock().unwrap().push(mail);
                inbox.arrived.notify_waiters();
                write.write_all(b"250 OK queued\r\n").await?;
            }
            "RSET" => {
                to.clear();
                from.clear();
                write.write_all(b"250 OK\r\n").await?;
            }
            "NOOP" => write.write_all(b"250 OK\r\n").await?,
            "QUIT" => {
                write.write_all(b"221 bye\r\n").await?;
                return Ok(());
            }
            _ => write.write_all(b"502 command not implemented\r\n").await?,
        }
    }
}
