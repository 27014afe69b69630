//! How long a model loaded on demand stays loaded, with Ollama's meaning.

use std::{fmt, time::Duration};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// How long a model stays loaded after a request for it ends, before the
/// router unloads it (scale to zero). On the wire it is a number of seconds
/// (a negative number keeps it loaded) or a duration string as Ollama takes
/// it: `"5m"`, `"1h30m"`, `"45s"`, `"500ms"`, `"-1"`. `0` unloads the model
/// as soon as nothing else runs on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KeepAlive {
    /// Never unload for idleness.
    Forever,
    /// Unload after this long idle.
    For(Duration),
}

/// Ollama's default: five minutes.
pub const DEFAULT_KEEP_ALIVE: KeepAlive = KeepAlive::For(Duration::from_secs(300));

/// A `keep_alive` that is neither a number of seconds nor a duration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "keep_alive {0:?} is not a duration: give seconds (a number; negative keeps the model \
     loaded) or a string such as \"5m\", \"1h30m\", \"45s\", \"500ms\" or \"-1\""
)]
pub struct ParseKeepAliveError(pub String);

impl KeepAlive {
    /// From a number of seconds: negative is forever.
    pub fn from_seconds(seconds: f64) -> Result<Self, ParseKeepAliveError> {
        if !seconds.is_finite() {
            return Err(ParseKeepAliveError(seconds.to_string()));
        }
        if seconds < 0.0 {
            return Ok(KeepAlive::Forever);
        }
        // Beyond ~30 years a timer is forever in all but name.
        Ok(Duration::try_from_secs_f64(seconds)
            .ok()
            .filter(|d| d.as_secs() < 1 << 30)
            .map_or(KeepAlive::Forever, KeepAlive::For))
    }

    /// The duration, `None` for forever.
    pub fn duration(self) -> Option<Duration> {
        match self {
            KeepAlive::Forever => None,
            KeepAlive::For(duration) => Some(duration),
        }
    }

    fn seconds(self) -> f64 {
        self.duration().map_or(-1.0, |d| d.as_secs_f64())
    }
}

impl std::str::FromStr for KeepAlive {
    type Err = ParseKeepAliveError;

    /// A number of seconds, or Go-style units (`h`, `m`, `s`, `ms`) in a
    /// row, optionally signed: `"1h30m"`, `"-1m"`, `"2.5s"`.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let error = || ParseKeepAliveError(text.to_string());
        let trimmed = text.trim();
        if let Ok(seconds) = trimmed.parse::<f64>() {
            return KeepAlive::from_seconds(seconds);
        }
        let (negative, mut rest) = match trimmed.strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (false, trimmed.strip_prefix('+').unwrap_or(trimmed)),
        };
        if rest.is_empty() {
            return Err(error());
        }
        let mut seconds = 0.0;
        while !rest.is_empty() {
            let digits = rest
                .find(|c: char| !(c.is_ascii_digit() || c == '.'))
                .ok_or_else(error)?;
            let value: f64 = rest[..digits].parse().map_err(|_| error())?;
            rest = &rest[digits..];
            let unit_len = rest
                .find(|c: char| c.is_ascii_digit() || c == '.')
                .unwrap_or(rest.len());
            let scale = match &rest[..unit_len] {
                "h" => 3600.0,
                "m" => 60.0,
                "s" => 1.0,
                "ms" => 0.001,
                _ => return Err(error()),
            };
            rest = &rest[unit_len..];
            seconds += value * scale;
        }
        KeepAlive::from_seconds(if negative { -seconds } else { seconds })
    }
}

impl fmt::Display for KeepAlive {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeepAlive::Forever => f.write_str("forever"),
            KeepAlive::For(d) => write!(f, "{} s", d.as_secs_f64()),
        }
    }
}

impl Serialize for KeepAlive {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let seconds = self.seconds();
        if seconds.fract() == 0.0 {
            serializer.serialize_i64(seconds as i64)
        } else {
            serializer.serialize_f64(seconds)
        }
    }
}

impl<'de> Deserialize<'de> for KeepAlive {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Wire {
            Integer(i64),
            Float(f64),
            Text(String),
        }
        let parsed = match Wire::deserialize(deserializer)? {
            Wire::Integer(seconds) => KeepAlive::from_seconds(seconds as f64),
            Wire::Float(seconds) => KeepAlive::from_seconds(seconds),
            Wire::Text(text) => text.parse(),
        };
        parsed.map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_as_ollama_takes_them() {
        let secs = |s: u64| KeepAlive::For(Duration::from_secs(s));
        assert_eq!("5m".parse(), Ok(secs(300)));
        assert_eq!("1h30m".parse(), Ok(secs(5400)));
        assert_eq!("45s".parse(), Ok(secs(45)));
        assert_eq!("0".parse(), Ok(secs(0)));
        assert_eq!(
            "500ms".parse(),
            Ok(KeepAlive::For(Duration::from_millis(500)))
        );
        assert_eq!(
            "2.5s".parse(),
            Ok(KeepAlive::For(Duration::from_millis(2500)))
        );
        assert_eq!("-1".parse(), Ok(KeepAlive::Forever));
        assert_eq!("-1m".parse(), Ok(KeepAlive::Forever));
        assert_eq!("1e12".parse(), Ok(KeepAlive::Forever));
        for bad in [
            "",
            "-",
            "5 minutes",
            "m",
            "5x",
            "1h-3m",
            "NaN",
            "inf",
            "1..2s",
        ] {
            let error = bad.parse::<KeepAlive>().unwrap_err();
            assert!(error.to_string().contains("\"5m\""), "{bad:?}: {error}");
        }
    }

    #[test]
    fn numbers_and_strings_decode_and_numbers_encode() {
        let decode = |value: serde_json::Value| serde_json::from_value::<KeepAlive>(value);
        assert_eq!(
            decode(serde_json::json!(30)).unwrap(),
            KeepAlive::For(Duration::from_secs(30))
        );
        assert_eq!(decode(serde_json::json!(-1)).unwrap(), KeepAlive::Forever);
        assert_eq!(
            decode(serde_json::json!(0.25)).unwrap(),
            KeepAlive::For(Duration::from_millis(250))
        );
        assert_eq!(
            decode(serde_json::json!("10m")).unwrap(),
            KeepAlive::For(Duration::from_secs(600))
        );
        assert!(decode(serde_json::json!("soon")).is_err());
        assert!(decode(serde_json::json!([1])).is_err());
        let encode = |k: KeepAlive| serde_json::to_value(k).unwrap();
        assert_eq!(encode(KeepAlive::Forever), serde_json::json!(-1));
        assert_eq!(encode(DEFAULT_KEEP_ALIVE), serde_json::json!(300));
        assert_eq!(
            encode(KeepAlive::For(Duration::from_millis(1500))),
            serde_json::json!(1.5)
        );
    }
}
