//! Durations (`100ms`, `15s`, `2m`, `1h`) and memory sizes (`32Mi`, `1Gi`,
//! `512Ki`, `1000000`) as written in the manifest.
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// Splits `" 32Mi "` into `(32, "Mi")`; `None` without leading digits.
fn number_and_unit(s: &str) -> Option<(u64, &str)> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    Some((num.parse().ok()?, unit))
}

/// A duration written as an integer with a unit: `ms`, `s`, `m` or `h`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct HumanDuration(pub Duration);

impl FromStr for HumanDuration {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (n, unit) = number_and_unit(s).ok_or_else(|| {
            format!("invalid duration {s:?}: expected a whole number with a unit, like 100ms, 15s, 2m or 1h")
        })?;
        let too_large = || format!("invalid duration {s:?}: too large");
        let d = match unit {
            "ms" => Duration::from_millis(n),
            "s" => Duration::from_secs(n),
            "m" => Duration::from_secs(n.checked_mul(60).ok_or_else(too_large)?),
            "h" => Duration::from_secs(n.checked_mul(3600).ok_or_else(too_large)?),
            "" => {
                return Err(format!(
                    "invalid duration {s:?}: missing unit (ms, s, m or h)"
                ));
            }
            _ => {
                return Err(format!(
                    "invalid duration {s:?}: unknown unit {unit:?} (use ms, s, m or h)"
                ));
            }
        };
        Ok(HumanDuration(d))
    }
}

impl fmt::Display for HumanDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.0.as_millis();
        if ms.is_multiple_of(1000) {
            write!(f, "{}s", ms / 1000)
        } else {
            write!(f, "{ms}ms")
        }
    }
}

/// A size in bytes, written as a Kubernetes quantity: a whole number with an
/// optional binary (`Ki`, `Mi`, `Gi`) or decimal (`k`, `M`, `G`) suffix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ByteSize(pub u64);

impl FromStr for ByteSize {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (n, unit) = number_and_unit(s).ok_or_else(|| {
            format!("invalid size {s:?}: expected a whole number with an optional unit, like 32Mi")
        })?;
        let mult: u64 = match unit {
            "" => 1,
            "k" => 1_000,
            "M" => 1_000_000,
            "G" => 1_000_000_000,
            "Ki" => 1 << 10,
            "Mi" => 1 << 20,
            "Gi" => 1 << 30,
            _ => {
                return Err(format!(
                    "invalid size {s:?}: unknown unit {unit:?} (use Ki, Mi, Gi, k, M or G)"
                ));
            }
        };
        n.checked_mul(mult)
            .map(ByteSize)
            .ok_or_else(|| format!("invalid size {s:?}: too large"))
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            n if n >= 1 << 20 && n % (1 << 20) == 0 => write!(f, "{}Mi", n >> 20),
            n if n >= 1 << 10 && n % (1 << 10) == 0 => write!(f, "{}Ki", n >> 10),
            n => write!(f, "{n}"),
        }
    }
}

macro_rules! serde_via_str {
    ($t:ty) => {
        impl<'de> serde::Deserialize<'de> for $t {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                // Accept plain YAML integers too (`memory: 1048576`).
                #[derive(serde::Deserialize)]
                #[serde(untagged)]
                enum Raw {
                    S(String),
                    N(u64),
                }
                let s = match Raw::deserialize(d)? {
                    Raw::S(s) => s,
                    Raw::N(n) => n.to_string(),
                };
                s.parse().map_err(serde::de::Error::custom)
            }
        }
        impl serde::Serialize for $t {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }
    };
}
serde_via_str!(HumanDuration);
serde_via_str!(ByteSize);

impl schemars::JsonSchema for HumanDuration {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Duration".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "A whole number with a unit: ms, s, m or h (100ms, 15s, 2m, 1h).",
            "type": "string",
            "pattern": "^\\s*[0-9]+(ms|s|m|h)\\s*$"
        })
    }
}

impl schemars::JsonSchema for ByteSize {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Size".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "Bytes: a whole number with an optional unit, Ki, Mi, Gi (binary) or k, M, G (decimal), like 32Mi.",
            "anyOf": [
                {"type": "string", "pattern": "^\\s*[0-9]+(Ki|Mi|Gi|k|M|G)?\\s*$"},
                {"type": "integer", "minimum": 0}
            ]
        })
    }
}

/// A duration in Go's `time.ParseDuration` syntax, as Kubernetes tools
/// write them in annotations (Reloader's `pause-period`): a sequence of
/// decimal numbers with units `ns`, `us` (or `µs`), `ms`, `s`, `m`, `h`,
/// like `300ms`, `1.5h` or `2h45m`; `0` alone. Negative durations are
/// refused (a pause cannot be negative). Hand-written: the crates at hand
/// (humantime) take a different grammar (`2h 45min`, no decimals), and
/// the grammar is a dozen lines.
pub fn parse_go_duration(s: &str) -> Result<Duration, String> {
    let bad = |why: &str| format!("invalid duration {s:?}: {why}");
    let t = s.trim();
    if t == "0" {
        return Ok(Duration::ZERO);
    }
    if t.is_empty() {
        return Err(bad("empty"));
    }
    if t.starts_with('-') {
        return Err(bad("negative"));
    }
    let mut rest = t.strip_prefix('+').unwrap_or(t);
    let mut total = 0f64;
    while !rest.is_empty() {
        let n = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| bad("missing unit (ns, us, ms, s, m or h)"))?;
        let (num, tail) = rest.split_at(n);
        let value: f64 = num.parse().map_err(|_| bad("expected a number"))?;
        let u = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, next) = tail.split_at(u);
        let scale = match unit {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad(&format!("unknown unit {unit:?}"))),
        };
        total += value * scale;
        rest = next;
    }
    Duration::try_from_secs_f64(total).map_err(|_| bad("too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(
            "100ms".parse::<HumanDuration>().unwrap().0,
            Duration::from_millis(100)
        );
        assert_eq!(
            "2m".parse::<HumanDuration>().unwrap().0,
            Duration::from_secs(120)
        );
        assert!(
            "15".parse::<HumanDuration>()
                .unwrap_err()
                .contains("missing unit")
        );
        assert!(
            "1.5s"
                .parse::<HumanDuration>()
                .unwrap_err()
                .contains("unknown unit")
        );
        assert!("abc".parse::<HumanDuration>().is_err());
        // 10^16 h does not fit in u64 seconds: an error, not an overflow.
        assert_eq!(
            "10000000000000000h".parse::<HumanDuration>().unwrap_err(),
            "invalid duration \"10000000000000000h\": too large"
        );
    }

    #[test]
    fn sizes() {
        assert_eq!("32Mi".parse::<ByteSize>().unwrap().0, 32 << 20);
        assert_eq!("1000".parse::<ByteSize>().unwrap().0, 1000);
        assert_eq!("2k".parse::<ByteSize>().unwrap().0, 2000);
        assert!(
            "32MB"
                .parse::<ByteSize>()
                .unwrap_err()
                .contains("unknown unit")
        );
        assert_eq!(ByteSize(32 << 20).to_string(), "32Mi");
    }

    #[test]
    fn go_durations_parse_as_go_does() {
        let ok = |s: &str| parse_go_duration(s).unwrap();
        assert_eq!(ok("300ms"), Duration::from_millis(300));
        assert_eq!(ok("1.5h"), Duration::from_secs(5400));
        assert_eq!(ok("2h45m"), Duration::from_secs(9900));
        assert_eq!(ok("1m30s"), Duration::from_secs(90));
        assert_eq!(ok("10us"), Duration::from_micros(10));
        assert_eq!(ok("0"), Duration::ZERO);
        assert_eq!(ok(" 5m "), Duration::from_secs(300));
        for bad in ["", "5", "5x", "-5m", "m", "1h30", "1.2.3s"] {
            assert!(parse_go_duration(bad).is_err(), "{bad:?}");
        }
        assert!(
            parse_go_duration("5d")
                .unwrap_err()
                .contains("unknown unit \"d\"")
        );
    }
}
