//! Dates as the service writes and reads them (UTC), through `chrono`.

/// Parses an RFC 3339 timestamp (`2027-01-01T00:00:00Z`, or with an offset) to
/// Unix ms.
pub(crate) fn parse_rfc3339_ms(s: &str) -> Option<i64> {
    chrono::DateTime::parse_from_rfc3339(s)
        .ok()
        .map(|t| t.timestamp_millis())
}

/// Days since the Unix epoch as `YYYY-MM-DD` (UTC).
pub(crate) fn day_string(days: i64) -> String {
    chrono::DateTime::from_timestamp(days.saturating_mul(86_400), 0)
        .map(|t| t.format("%Y-%m-%d").to_string())
        .unwrap_or_default()
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
    fn days() {
        assert_eq!(day_string(0), "1970-01-01");
        assert_eq!(day_string(19_723), "2024-01-01");
        assert_eq!(day_string(20_414), "2025-11-22");
        assert_eq!(day_string(11_016), "2000-02-29");
        assert_eq!(day_string(-1), "1969-12-31");
    }
}
