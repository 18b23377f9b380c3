//! Money as the service keeps it: integer micro-USD, from and to the USD numbers
//! of JSON.

use sluice_filters::{ApiError, ErrorCode};

/// USD as a JSON number to integer micro-USD (rounded to the nearest micro-dollar).
pub(crate) fn usd_to_micro(usd: f64) -> Result<i64, ApiError> {
    if !usd.is_finite() || usd.abs() > 1e12 {
        return Err(ApiError::new(
            ErrorCode::InvalidParameter,
            "amount out of range",
        ));
    }
    Ok((usd * 1_000_000.0).round() as i64)
}

/// Integer micro-USD to USD for display.
pub(crate) fn micro_to_usd(micro: i64) -> f64 {
    micro as f64 / 1_000_000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn money() {
        assert_eq!(usd_to_micro(1.5).unwrap(), 1_500_000);
        assert_eq!(usd_to_micro(0.0000014).unwrap(), 1);
        assert!(usd_to_micro(f64::NAN).is_err());
        assert_eq!(micro_to_usd(2_500_000), 2.5);
    }
}
