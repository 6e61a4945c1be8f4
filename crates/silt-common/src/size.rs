//! Human byte sizes: `4096`, `64KiB`, `1MiB`, `10GiB`, `1.5G` (K/M/G/T are binary here,
//! as in most storage tools' configuration).

use crate::{Error, Result};

pub fn parse_size(text: &str) -> Result<u64> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    if num.is_empty() {
        return Err(Error::invalid(format!(
            "invalid size {text:?}: expected e.g. 1MiB"
        )));
    }
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        other => {
            return Err(Error::invalid(format!(
                "invalid size {text:?}: unknown unit {other:?} (use B, KiB, MiB, GiB, TiB)"
            )))
        }
    };
    let value: f64 = num
        .parse()
        .map_err(|_| Error::invalid(format!("invalid size {text:?}")))?;
    let bytes = value * mult as f64;
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
        return Err(Error::invalid(format!(
            "invalid size {text:?}: out of range"
        )));
    }
    Ok(bytes as u64)
}

/// Formats with a binary unit, e.g. `1.50 GiB`.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_rejects() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("1MiB").unwrap(), 1 << 20);
        assert_eq!(parse_size("1.5G").unwrap(), 3 << 29);
        assert_eq!(parse_size(" 64 KiB ").unwrap(), 64 << 10);
        assert!(parse_size("").is_err());
        assert!(parse_size("MiB").is_err());
        assert!(parse_size("12 parsecs").is_err());
        assert_eq!(format_size(1536), "1.50 KiB");
        assert_eq!(format_size(10), "10 B");
    }
}
