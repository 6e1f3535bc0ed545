//! The one wall clock every store and record uses: milliseconds since the Unix epoch.

/// Milliseconds since the Unix epoch; 0 if the clock is before 1970, `i64::MAX` past year
/// 292 million.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn now_is_after_2026_and_moves_forward() {
        let first = now_ms();
        assert!(first > 1_767_225_600_000, "{first}");
        std::thread::sleep(std::time::Duration::from_millis(2));
        assert!(now_ms() > first);
    }
}
