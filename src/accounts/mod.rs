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

use sluice_filters::{ApiError, ErrorCode};

/// USD as a JSON number to integer micro-USD (rounded to the nearest micro-dollar).
pub fn usd_to_micro(usd: f64) -> Result<i64, ApiError> {
    if !usd.is_finite() || usd.abs() > 1e12 {
        return Err(ApiError::new(
            ErrorCode::InvalidParameter,
            "amount out of range",
        ));
    }
    Ok((usd * 1_000_000.0).round() as i64)
}

/// Integer micro-USD to USD for display.
pub fn micro_to_usd(micro: i64) -> f64 {
    micro as f64 / 1_000_000.0
}

/// Parses an RFC 3339 UTC-or-offset timestamp (`2027-01-01T00:00:00Z`) to Unix ms.
pub fn parse_rfc3339_ms(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    let num = |r: std::ops::Range<usize>| s.get(r)?.parse::<i64>().ok();
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, se) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || se > 60 {
        return None;
    }
    let mut rest = &s[19..];
    let mut millis = 0i64;
    if let Some(frac) = rest.strip_prefix('.') {
        let n = frac.bytes().take_while(u8::is_ascii_digit).count();
        let digits = &frac[..n];
        millis = format!("{digits:0<3}").get(..3)?.parse().ok()?;
        rest = &frac[n..];
    }
    let offset_min = match rest {
        "Z" | "z" => 0,
        o if o.len() == 6 && matches!(o.as_bytes()[0], b'+' | b'-') && o.as_bytes()[3] == b':' => {
            let sign = if o.starts_with('-') { -1 } else { 1 };
            sign * (o[1..3].parse::<i64>().ok()? * 60 + o[4..6].parse::<i64>().ok()?)
        }
        _ => return None,
    };
    // Days from the civil date (Howard Hinnant's algorithm).
    let y2 = if mo <= 2 { y - 1 } else { y };
    let era = y2.div_euclid(400);
    let yoe = y2 - era * 400;
    let mp = (mo + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + h * 3600 + mi * 60 + se - offset_min * 60;
    Some(secs * 1000 + millis)
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339() {
        assert_eq!(parse_rfc3339_ms("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(
            parse_rfc3339_ms("2027-01-01T00:00:00Z"),
            Some(1_798_761_600_000)
        );
        assert_eq!(
            parse_rfc3339_ms("2027-01-01T01:00:00.5+01:00"),
            Some(1_798_761_600_500)
        );
        assert_eq!(parse_rfc3339_ms("2027-13-01T00:00:00Z"), None);
        assert_eq!(parse_rfc3339_ms("yesterday"), None);
    }

    #[test]
    fn money() {
        assert_eq!(usd_to_micro(1.5).unwrap(), 1_500_000);
        assert_eq!(usd_to_micro(0.0000014).unwrap(), 1);
        assert!(usd_to_micro(f64::NAN).is_err());
        assert_eq!(micro_to_usd(2_500_000), 2.5);
    }
}
