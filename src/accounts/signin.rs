//! Signing in without passwords: `POST /login` mails a link to a member's address
//! (the same answer whether or not it has an account), a member invites another
//! address into the org, and following any mailed link proves the address and
//! opens a session in the org it names. The org's own address is verified when
//! it is the one proved.

use super::mail::{Mail, Mailer};
use super::signup::{count_attempt, link_url, Attempt};
use super::{links, orgs, users, Directory};
use crate::config::Config;
use crate::store::{now_ms, Db};
use sluice_filters::{ApiError, ErrorCode};

/// Sign-in mails one address gets per hour at most; more requests are answered
/// alike and mail nothing (no mailbox is flooded through us).
pub const SIGN_IN_MAILS_PER_HOUR: i64 = 5;

/// Sign-in requests one origin may make per hour, whatever the addresses.
pub const SIGN_IN_REQUESTS_PER_ORIGIN_PER_HOUR: u32 = 30;

/// Invitations one org may mail per hour, whatever the addresses: the operator's
/// mail domain is no relay for a member's list.
pub const INVITATIONS_PER_ORG_PER_HOUR: i64 = 20;

/// What `POST /login` did; the page says the same either way.
#[derive(Debug, PartialEq, Eq)]
pub enum LoginRequest {
    /// A link was mailed, or there was nothing to mail: the answers are alike.
    Answered,
    /// This origin asked too often.
    RateLimited,
}

/// `POST {web_url}/login`: mails a sign-in link when the address is a member's.
pub async fn request_link(
    db: &Db,
    mailer: &Mailer,
    config: &Config,
    origin: &str,
    raw_email: &str,
) -> Result<LoginRequest, ApiError> {
    let per_origin = SIGN_IN_REQUESTS_PER_ORIGIN_PER_HOUR;
    if !count_attempt(db, Attempt::Login, origin, per_origin).await? {
        return Ok(LoginRequest::RateLimited);
    }
    let email = users::normalize_email(raw_email)?;
    let Some(user) = users::by_email(db, &email).await? else {
        return Ok(LoginRequest::Answered);
    };
    let Some(org_id) = users::first_org(db, &user.id).await? else {
        return Ok(LoginRequest::Answered);
    };
    let hour_ago = now_ms() - 3600 * 1000;
    if links::issued_since(db, &user.id, links::Purpose::SignIn, hour_ago).await?
        >= SIGN_IN_MAILS_PER_HOUR
    {
        return Ok(LoginRequest::Answered);
    }
    let token = links::issue(db, links::Purpose::SignIn, &user.id, &org_id).await?;
    let mail = Mail {
        to: user.email.clone(),
        subject: "Your sluice sign-in link".into(),
        text: format!(
            "Follow this link to sign in to sluice:\n\n{}\n\n\
             The link works once, for 24 hours. If you did not ask to sign in,\n\
             ignore this mail: nobody can sign in without it.\n",
            link_url(config, &token)
        ),
    };
    // Handed over in the background: the answer takes as long whether or not
    // the address has an account (an SMTP round trip would tell them apart).
    let mailer = mailer.clone();
    tokio::spawn(async move {
        if let Err(e) = mailer.send(mail).await {
            tracing::error!(error = %format!("{e:#}"), "the sign-in mail was not sent");
        }
    });
    Ok(LoginRequest::Answered)
}

/// `POST {web_url}/api/session/members`: the address gets a mail whose link makes
/// it a member of the org and opens a session in it. Until the link is followed
/// the invitation is only that: the address is no member, its signup and sign-in
/// work as if it had never been invited, and it may ignore the mail. Inviting
/// again sends a fresh link.
pub async fn invite(
    db: &Db,
    mailer: &Mailer,
    config: &Config,
    org_id: &str,
    inviter: &users::User,
    raw_email: &str,
) -> Result<users::User, ApiError> {
    let email = users::normalize_email(raw_email)?;
    let hour_ago = now_ms() - 3600 * 1000;
    if links::issued_for_org_since(db, org_id, links::Purpose::Invite, hour_ago).await?
        >= INVITATIONS_PER_ORG_PER_HOUR
    {
        return Err(ApiError::new(
            ErrorCode::RateLimited,
            format!("This organization sent {INVITATIONS_PER_ORG_PER_HOUR} invitations in the last hour; try again later."),
        ));
    }
    // The address's record (no membership): the link names it.
    let user = users::ensure(db, &email).await?;
    if links::issued_since(db, &user.id, links::Purpose::Invite, hour_ago).await?
        >= SIGN_IN_MAILS_PER_HOUR
    {
        return Err(ApiError::new(
            ErrorCode::RateLimited,
            "This address was invited several times in the last hour; try again later.",
        ));
    }
    let org_name = orgs::get(db, org_id)
        .await?
        .map(|o| o.name)
        .unwrap_or_default();
    let token = links::issue(db, links::Purpose::Invite, &user.id, org_id).await?;
    let mail = Mail {
        to: user.email.clone(),
        subject: "You are invited to an organization on sluice".into(),
        text: format!(
            "{} invited you to the organization \"{}\" on sluice.\n\n\
             Follow this link to join it and sign in:\n\n{}\n\n\
             The link works once, for 24 hours.\n",
            ascii(&inviter.email),
            ascii(&org_name),
            link_url(config, &token)
        ),
    };
    mailer.send(mail).await.map_err(|e| {
        tracing::error!(error = %format!("{e:#}"), "the invitation was not sent");
        ApiError::new(
            ErrorCode::InternalError,
            "The invitation mail could not be sent; try inviting again later.",
        )
    })?;
    Ok(user)
}

/// Mails a fresh verification link for the org's address to the member who holds
/// it; false when the org's address is verified already or is not theirs.
pub async fn resend_verification(
    db: &Db,
    mailer: &Mailer,
    config: &Config,
    org_id: &str,
    user: &users::User,
) -> Result<bool, ApiError> {
    let Some(org) = orgs::get(db, org_id).await? else {
        return Ok(false);
    };
    if org.email_verified || org.email.as_deref() != Some(user.email.as_str()) {
        return Ok(false);
    }
    let hour_ago = now_ms() - 3600 * 1000;
    if links::issued_since(db, &user.id, links::Purpose::Verify, hour_ago).await?
        >= SIGN_IN_MAILS_PER_HOUR
    {
        return Err(ApiError::new(
            ErrorCode::RateLimited,
            "Several verification mails went out in the last hour; check your inbox, or try again later.",
        ));
    }
    let token = links::issue(db, links::Purpose::Verify, &user.id, org_id).await?;
    let mail = Mail {
        to: user.email.clone(),
        subject: "Verify your email for sluice".into(),
        text: format!(
            "Follow this link to verify your address and sign in:\n\n{}\n\n\
             The link works once, for 24 hours.\n",
            link_url(config, &token)
        ),
    };
    mailer.send(mail).await.map_err(|e| {
        tracing::error!(error = %format!("{e:#}"), "the verification mail was not sent");
        ApiError::new(
            ErrorCode::InternalError,
            "The mail could not be sent; try again later.",
        )
    })?;
    Ok(true)
}

/// A followed link: who signs in, and where.
#[derive(Debug)]
pub struct SignedIn {
    pub user_id: String,
    pub org_id: String,
    pub purpose: links::Purpose,
    /// Keys revoked because the org's address was first proved by a link its
    /// signup did not mail.
    pub revoked_keys: usize,
}

/// Follows a mailed link: `None` when it is unknown, used or expired, or its
/// member has left the org. The address is proved: the user's, and the org's when
/// it is the same address.
///
/// Instant signup hands out a key before anyone proved the address, so whoever
/// signed up need not own it. The verification link that signup mailed vouches
/// for that key: the person who follows it asked for it (the mail says to ignore
/// it otherwise). Any other first proof of the org's address (a sign-in link, by
/// someone told at signup that the account exists) revokes every key minted
/// before it: the org's credits are the prover's from then on, never the key of
/// whoever signed up with their address. The overview says so.
pub async fn follow(db: &Db, dir: &Directory, token: &str) -> Result<Option<SignedIn>, ApiError> {
    let Some(f) = links::follow(db, token).await? else {
        return Ok(None);
    };
    // An invitation is accepted by following its link: the membership starts now.
    if f.purpose == links::Purpose::Invite && orgs::org_exists(db, &f.org_id).await? {
        users::add_member(db, &f.org_id, &f.user_id, users::Role::Member, None).await?;
    }
    if !users::is_member(db, &f.org_id, &f.user_id).await? {
        return Ok(None);
    }
    let Some(user) = users::get(db, &f.user_id).await? else {
        return Ok(None);
    };
    users::mark_signed_in(db, &user.id).await?;
    let mut revoked_keys = 0;
    if let Some(org) = orgs::get(db, &f.org_id).await? {
        if !org.email_verified && org.email.as_deref() == Some(user.email.as_str()) {
            // Revoked before the org is verified: no moment in which such a key
            // draws credits.
            if f.purpose != links::Purpose::Verify {
                let revoked = super::keys::revoke_all_of_org(db, &org.id).await?;
                revoked_keys = revoked.len();
                for k in revoked {
                    dir.put_key(k);
                }
            }
            let fresh = orgs::verify(db, &org.id, Some(true), None, None).await?;
            dir.put_org(fresh);
        }
    }
    Ok(Some(SignedIn {
        user_id: f.user_id,
        org_id: f.org_id,
        purpose: f.purpose,
        revoked_keys,
    }))
}

/// Text as plain ASCII for a mail (names are people's input).
fn ascii(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_graphic() || c == ' ' {
                c
            } else {
                '?'
            }
        })
        .take(200)
        .collect()
}
