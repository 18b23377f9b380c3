//! Sending mail: through `[email] smtp_url` (SMTP with lettre: `smtp://host:port`
//! in the clear, `smtp://…?tls=required` with STARTTLS, `smtps://user:pass@host:port`
//! with implicit TLS), or, with no SMTP server configured, as `.eml` files in
//! `data/outbox/` that a developer opens by hand. Every mail is plain ASCII text
//! with exactly one link, so it reads the same in every client.

use crate::config::EmailConfig;
use anyhow::Context as _;
use lettre::message::header::{ContentTransferEncoding, ContentType};
use lettre::message::Body;
use lettre::message::Mailbox;
use lettre::{AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};
use std::path::PathBuf;
use std::time::Duration;

/// The folder of the `.eml` outbox, under the working directory.
pub const OUTBOX: &str = "data/outbox";

/// How long one mail may take to hand over.
const SEND_TIMEOUT: Duration = Duration::from_secs(20);

/// One mail to send.
pub struct Mail {
    pub to: String,
    pub subject: String,
    pub text: String,
}

#[derive(Clone)]
enum Transport {
    Smtp(AsyncSmtpTransport<Tokio1Executor>),
    Outbox(PathBuf),
}

/// Cheap to clone: a mail handed over in the background takes its own.
#[derive(Clone)]
pub struct Mailer {
    from: Mailbox,
    transport: Transport,
}

impl Mailer {
    /// The mailer `[email]` describes; a bad `from` or `smtp_url` refuses to start.
    pub fn from_config(c: &EmailConfig) -> anyhow::Result<Mailer> {
        let from: Mailbox = c
            .from
            .parse()
            .with_context(|| format!("email.from = {:?} is not a mailbox", c.from))?;
        let transport = if c.smtp_url.is_empty() {
            Transport::Outbox(PathBuf::from(OUTBOX))
        } else {
            let t = AsyncSmtpTransport::<Tokio1Executor>::from_url(&c.smtp_url)
                // The URL may hold a password: never echo it.
                .map_err(|e| anyhow::anyhow!("email.smtp_url is not an SMTP URL: {e}"))?
                .timeout(Some(SEND_TIMEOUT))
                .build();
            Transport::Smtp(t)
        };
        Ok(Mailer { from, transport })
    }

    /// Hands one mail over (to the SMTP server, or into the outbox).
    pub async fn send(&self, mail: Mail) -> anyhow::Result<()> {
        let to: Mailbox = mail.to.parse().context("the recipient is not an address")?;
        let message = Message::builder()
            .from(self.from.clone())
            .to(to)
            .subject(mail.subject)
            .header(ContentType::TEXT_PLAIN)
            .body(seven_bit(&mail.text))
            .context("building the mail")?;
        match &self.transport {
            Transport::Smtp(t) => {
                tokio::time::timeout(SEND_TIMEOUT, t.send(message))
                    .await
                    .context("the SMTP server took too long")?
                    .context("the SMTP server refused the mail")?;
            }
            Transport::Outbox(dir) => {
                tokio::fs::create_dir_all(dir)
                    .await
                    .with_context(|| format!("creating {}", dir.display()))?;
                // Its mails hold live sign-in links: the service's user alone
                // reads them.
                private(dir, 0o700).await;
                let name = crate::store::new_ordered_id("mail");
                let tmp = dir.join(format!(".{name}.tmp"));
                let path = dir.join(format!("{name}.eml"));
                // Written whole, then renamed: a reader never sees half a mail.
                tokio::fs::write(&tmp, message.formatted()).await?;
                private(&tmp, 0o600).await;
                tokio::fs::rename(&tmp, &path).await?;
                tracing::info!(path = %path.display(), "mail written to the outbox (no [email] smtp_url)");
            }
        }
        Ok(())
    }
}

/// Sets a path's permission bits (Unix); a failure is logged, the mail still goes.
async fn private(path: &std::path::Path, mode: u32) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        if let Err(e) =
            tokio::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).await
        {
            tracing::warn!(path = %path.display(), error = %e, "could not make the outbox private");
        }
    }
    #[cfg(not(unix))]
    let _ = (path, mode);
}

/// The text as a 7bit body: ASCII (anything else becomes `?`), CRLF line ends. A
/// link's line is longer than the 76 characters past which lettre would pick
/// quoted-printable, whose soft line breaks would cut the link for a reader that
/// does not decode them; 7bit allows lines of up to 998 characters.
fn seven_bit(text: &str) -> Body {
    let mut out = String::with_capacity(text.len() + 16);
    for line in text.lines() {
        let clean: String = line
            .chars()
            .map(|c| {
                if c.is_ascii() && !c.is_ascii_control() {
                    c
                } else {
                    '?'
                }
            })
            .take(990)
            .collect();
        out.push_str(&clean);
        out.push_str("\r\n");
    }
    Body::dangerous_pre_encoded(out.into_bytes(), ContentTransferEncoding::SevenBit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_link_stays_on_one_line_in_seven_bit() {
        let link = format!("https://app.example.com/link/{}", "a".repeat(64));
        let body = seven_bit(&format!("Hello\n\n{link}\n\u{2014} x"));
        assert_eq!(body.encoding(), ContentTransferEncoding::SevenBit);
        let text = String::from_utf8(body.into_vec()).unwrap();
        assert!(text.contains(&format!("\r\n{link}\r\n")), "{text}");
        assert!(text.ends_with("? x\r\n"));
    }
}
