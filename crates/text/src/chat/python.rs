//! Values as Python writes them, for templates written against Jinja2:
//! `str()` (what `{{ x }}` and `|string` print: `None`, `True`, `1.0`,
//! `{'a': [1, 'b']}`) and transformers' `tojson` filter, which is
//! `json.dumps(x, ensure_ascii=False, indent=..., separators=...,
//! sort_keys=...)` rather than Jinja's HTML-safe JSON.

use std::fmt::Write;

use std::sync::Arc;

use minijinja::value::{Enumerator, Kwargs, Object, ObjectRepr, ValueKind};
use minijinja::{Error, ErrorKind, Value};

/// `str(value)` as Python prints it.
pub(super) fn str_of(value: &Value) -> String {
    let mut out = String::new();
    match value.kind() {
        ValueKind::Undefined => {}
        ValueKind::String => out.push_str(value.as_str().unwrap_or_default()),
        _ => write_repr(&mut out, value),
    }
    out
}

/// A Python tuple, for what Jinja2 gives as one (`dictsort`'s pairs,
/// `partition`): a sequence that prints in parentheses.
#[derive(Debug)]
pub(super) struct Tuple(Vec<Value>);

impl Tuple {
    pub(super) fn value(items: Vec<Value>) -> Value {
        Value::from_object(Tuple(items))
    }
}

impl Object for Tuple {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Seq
    }

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        self.0.get(key.as_usize()?).cloned()
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Seq(self.0.len())
    }
}

/// `repr(value)`: strings quoted, containers with their items' reprs.
fn write_repr(out: &mut String, value: &Value) {
    match value.kind() {
        ValueKind::Undefined => out.push_str("Undefined"),
        ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if value.is_true() { "True" } else { "False" }),
        ValueKind::Number => write_number(out, value, "inf", "nan"),
        ValueKind::String => write_str_repr(out, value.as_str().unwrap_or_default()),
        ValueKind::Seq if value.downcast_object_ref::<Tuple>().is_some() => {
            out.push('(');
            let items: Vec<Value> = value.try_iter().into_iter().flatten().collect();
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_repr(out, item);
            }
            if items.len() == 1 {
                out.push(',');
            }
            out.push(')');
        }
        ValueKind::Seq
            if value
                .as_object()
                .is_none_or(|o| matches!(o.repr(), ObjectRepr::Seq)) =>
        {
            out.push('[');
            for (i, item) in value.try_iter().into_iter().flatten().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_repr(out, &item);
            }
            out.push(']');
        }
        ValueKind::Map if is_plain_map(value) => {
            out.push('{');
            for (i, key) in value.try_iter().into_iter().flatten().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_repr(out, &key);
                out.push_str(": ");
                write_repr(out, &value.get_item(&key).unwrap_or_default());
            }
            out.push('}');
        }
        // Loops, namespaces, macros: Jinja2's own reprs differ anyway.
        _ => {
            let _ = write!(out, "{value}");
        }
    }
}

/// Whether `value` is a mapping of data (not a namespace or loop object).
fn is_plain_map(value: &Value) -> bool {
    value
        .as_object()
        .is_none_or(|o| matches!(o.repr(), ObjectRepr::Map))
}

/// A number as Python's `repr` writes it; `inf` and `nan` name the
/// non-finite values (`json.dumps` writes `Infinity` and `NaN`).
fn write_number(out: &mut String, value: &Value, inf: &str, nan: &str) {
    if value.is_integer() {
        let _ = write!(out, "{value}");
        return;
    }
    match f64::try_from(value.clone()) {
        Ok(f) => write_float(out, f, inf, nan),
        Err(_) => {
            let _ = write!(out, "{value}");
        }
    }
}

/// Python's shortest round-trip `repr(float)`: fixed notation for decimal
/// exponents from -4 to 15 (`100.0`, `0.0001`), scientific otherwise
/// (`1e-05`, `1.5e+16`).
fn write_float(out: &mut String, f: f64, inf: &str, nan: &str) {
    if f.is_nan() {
        out.push_str(nan);
        return;
    }
    if f.is_sign_negative() {
        out.push('-');
    }
    if f.is_infinite() {
        out.push_str(inf);
        return;
    }
    if f == 0.0 {
        out.push_str("0.0");
        return;
    }
    // Rust's `{:e}` gives the same shortest round-trip digits as Python.
    let sci = format!("{:e}", f.abs());
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    if (-4..16).contains(&exp) {
        if exp < 0 {
            out.push_str("0.");
            out.extend(std::iter::repeat_n('0', (-exp - 1) as usize));
            out.push_str(&digits);
        } else {
            let int_len = exp as usize + 1;
            if digits.len() <= int_len {
                out.push_str(&digits);
                out.extend(std::iter::repeat_n('0', int_len - digits.len()));
                out.push_str(".0");
            } else {
                out.push_str(&digits[..int_len]);
                out.push('.');
                out.push_str(&digits[int_len..]);
            }
        }
    } else {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let _ = write!(out, "e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs());
    }
}

/// `repr(str)`: single quotes unless the text holds `'` and no `"`;
/// backslashes, the quote and control characters escaped.
fn write_str_repr(out: &mut String, s: &str) {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || (0x7f..0xa0).contains(&(c as u32)) => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

/// How `json.dumps` lays out its output.
struct JsonStyle {
    ensure_ascii: bool,
    /// Added once per nesting level after each newline; `None` is one line.
    indent: Option<String>,
    item_separator: String,
    key_separator: String,
    sort_keys: bool,
}

/// transformers' `tojson` filter: `tojson(x, ensure_ascii=False,
/// indent=None, separators=None, sort_keys=False)`, positionally or by name.
pub(super) fn tojson(
    value: Value,
    ensure_ascii: Option<Value>,
    indent: Option<Value>,
    separators: Option<Value>,
    kwargs: Kwargs,
) -> Result<String, Error> {
    let ensure_ascii = kwargs
        .get::<Option<Value>>("ensure_ascii")?
        .or(ensure_ascii);
    let indent = kwargs.get::<Option<Value>>("indent")?.or(indent);
    let separators = kwargs.get::<Option<Value>>("separators")?.or(separators);
    let sort_keys = kwargs.get::<Option<Value>>("sort_keys")?;
    kwargs.assert_all_used()?;

    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) if v.kind() == ValueKind::String => {
            Some(v.as_str().unwrap_or_default().to_string())
        }
        Some(v) => match v.as_i64() {
            Some(n) => Some(" ".repeat(usize::try_from(n).unwrap_or(0))),
            None => {
                return Err(bad_arg(format!(
                    "tojson: indent must be an integer or a string, not {v}"
                )));
            }
        },
    };
    let (item_separator, key_separator) = match separators {
        Some(seps) if !seps.is_none() => {
            let parts: Vec<Value> = seps
                .try_iter()
                .map_err(|_| bad_arg("tojson: separators must be a pair of strings".into()))?
                .collect();
            match parts.as_slice() {
                [item, key] if item.as_str().is_some() && key.as_str().is_some() => (
                    item.as_str().unwrap_or_default().to_string(),
                    key.as_str().unwrap_or_default().to_string(),
                ),
                _ => {
                    return Err(bad_arg(
                        "tojson: separators must be a pair of strings".into(),
                    ));
                }
            }
        }
        // Python's defaults: no space before a newline when indenting.
        _ if indent.is_some() => (",".to_string(), ": ".to_string()),
        _ => (", ".to_string(), ": ".to_string()),
    };
    let style = JsonStyle {
        ensure_ascii: ensure_ascii.is_some_and(|v| v.is_true()),
        indent,
        item_separator,
        key_separator,
        sort_keys: sort_keys.is_some_and(|v| v.is_true()),
    };
    let mut out = String::new();
    write_json(&mut out, &value, &style, 0)?;
    Ok(out)
}

fn bad_arg(message: String) -> Error {
    Error::new(ErrorKind::InvalidOperation, message)
}

fn not_serializable(value: &Value) -> Error {
    Error::new(
        ErrorKind::InvalidOperation,
        format!("Object of type {} is not JSON serializable", value.kind()),
    )
}

fn newline(out: &mut String, style: &JsonStyle, level: usize) {
    if let Some(indent) = &style.indent {
        out.push('\n');
        for _ in 0..level {
            out.push_str(indent);
        }
    }
}

fn write_json(
    out: &mut String,
    value: &Value,
    style: &JsonStyle,
    level: usize,
) -> Result<(), Error> {
    match value.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => write_number(out, value, "Infinity", "NaN"),
        ValueKind::String => {
            write_json_str(out, value.as_str().unwrap_or_default(), style.ensure_ascii)
        }
        // Jinja2's `map`, `select` and the like give generators, which
        // `json.dumps` refuses; minijinja's lazy iterables stand for them.
        ValueKind::Iterable => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "Object of type generator is not JSON serializable",
            ));
        }
        ValueKind::Seq => {
            let items: Vec<Value> = value.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.item_separator);
                }
                newline(out, style, level + 1);
                write_json(out, item, style, level + 1)?;
            }
            newline(out, style, level);
            out.push(']');
        }
        ValueKind::Map if is_plain_map(value) => {
            let mut keys: Vec<(String, Value)> = Vec::new();
            for key in value.try_iter()? {
                let name = match key.kind() {
                    ValueKind::String => key.as_str().unwrap_or_default().to_string(),
                    ValueKind::Number | ValueKind::Bool | ValueKind::None => {
                        let mut s = String::new();
                        write_json(&mut s, &key, style, 0)?;
                        s
                    }
                    _ => {
                        return Err(bad_arg(format!(
                            "keys must be str, int, float, bool or None, not {}",
                            key.kind()
                        )));
                    }
                };
                keys.push((name, key));
            }
            if style.sort_keys {
                keys.sort_by(|a, b| a.0.cmp(&b.0));
            }
            if keys.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, (name, key)) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.item_separator);
                }
                newline(out, style, level + 1);
                write_json_str(out, name, style.ensure_ascii);
                out.push_str(&style.key_separator);
                write_json(out, &value.get_item(key)?, style, level + 1)?;
            }
            newline(out, style, level);
            out.push('}');
        }
        _ => return Err(not_serializable(value)),
    }
    Ok(())
}

/// A JSON string as `json.dumps` writes it (lowercase `\u` escapes; with
/// `ensure_ascii` every character outside printable ASCII escaped, as
/// UTF-16 surrogate pairs above U+FFFF).
fn write_json_str(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ensure_ascii && !(' '..='~').contains(&c)) => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Python string methods that minijinja-contrib's pycompat lacks; `None`
/// when `method` is not one of them.
pub(super) fn str_method(s: &str, method: &str, args: &[Value]) -> Result<Option<Value>, Error> {
    use minijinja::value::from_args;
    let value = match method {
        "rsplit" => {
            let (sep, maxsplit): (Option<Value>, Option<i64>) = from_args(args)?;
            let sep = sep.filter(|v| !v.is_none());
            let maxsplit = maxsplit.filter(|n| *n >= 0).map(|n| n as usize);
            let parts = match (&sep, sep.as_ref().and_then(|v| v.as_str())) {
                (Some(_), Some("")) => return Err(bad_arg("empty separator".into())),
                (Some(_), Some(sep)) => rsplit_on(s, sep, maxsplit),
                (Some(v), None) => {
                    return Err(bad_arg(format!("must be str or None, not {}", v.kind())));
                }
                (None, _) => rsplit_whitespace(s, maxsplit),
            };
            Value::from(parts)
        }
        "removeprefix" => {
            let (prefix,): (&str,) = from_args(args)?;
            Value::from(s.strip_prefix(prefix).unwrap_or(s))
        }
        "removesuffix" => {
            let (suffix,): (&str,) = from_args(args)?;
            Value::from(s.strip_suffix(suffix).unwrap_or(s))
        }
        "partition" | "rpartition" => {
            let (sep,): (&str,) = from_args(args)?;
            if sep.is_empty() {
                return Err(bad_arg("empty separator".into()));
            }
            let found = if method == "partition" {
                s.find(sep)
            } else {
                s.rfind(sep)
            };
            let (head, mid, tail) = match found {
                Some(i) => (&s[..i], sep, &s[i + sep.len()..]),
                None if method == "partition" => (s, "", ""),
                None => ("", "", s),
            };
            Tuple::value([head, mid, tail].into_iter().map(Value::from).collect())
        }
        "ljust" | "rjust" | "center" => {
            let (width, fill): (usize, Option<&str>) = from_args(args)?;
            let mut fill_chars = fill.unwrap_or(" ").chars();
            let (Some(fill), None) = (fill_chars.next(), fill_chars.next()) else {
                return Err(bad_arg(
                    "the fill character must be exactly one character long".into(),
                ));
            };
            Value::from(justify(s, width, fill, method))
        }
        "zfill" => {
            let (width,): (usize,) = from_args(args)?;
            let len = s.chars().count();
            let (sign, digits) = match s.strip_prefix(['+', '-']) {
                Some(rest) => (&s[..1], rest),
                None => ("", s),
            };
            let zeros = width.saturating_sub(len);
            Value::from(format!("{sign}{}{digits}", "0".repeat(zeros)))
        }
        _ => return Ok(None),
    };
    Ok(Some(value))
}

/// `s.rsplit(sep, maxsplit)` with a separator.
fn rsplit_on(s: &str, sep: &str, maxsplit: Option<usize>) -> Vec<String> {
    let mut parts: Vec<String> = match maxsplit {
        Some(n) => s.rsplitn(n + 1, sep).map(str::to_string).collect(),
        None => s.rsplit(sep).map(str::to_string).collect(),
    };
    parts.reverse();
    parts
}

/// `s.rsplit(None, maxsplit)`: runs of whitespace separate, ends trimmed,
/// the leftover head kept whole (less its trailing whitespace).
fn rsplit_whitespace(s: &str, maxsplit: Option<usize>) -> Vec<String> {
    let mut parts = Vec::new();
    let mut rest = s.trim_end();
    while !rest.is_empty() {
        if maxsplit.is_some_and(|n| parts.len() == n) {
            parts.push(rest.to_string());
            break;
        }
        match rest.rfind(char::is_whitespace) {
            Some(i) => {
                let ws_len = rest[i..].chars().next().map_or(1, char::len_utf8);
                parts.push(rest[i + ws_len..].to_string());
                rest = rest[..i].trim_end();
            }
            None => {
                parts.push(rest.to_string());
                rest = "";
            }
        }
    }
    parts.reverse();
    parts
}

/// Jinja2's `round(value, precision=0, method='common')`: Python's
/// `round` (half to even, on the exact binary value), or `ceil`/`floor`.
pub(super) fn round(
    value: Value,
    precision: Option<i32>,
    method: Option<String>,
    kwargs: Kwargs,
) -> Result<Value, Error> {
    let precision = kwargs
        .get::<Option<i32>>("precision")?
        .or(precision)
        .unwrap_or(0);
    let method = kwargs.get::<Option<String>>("method")?.or(method);
    kwargs.assert_all_used()?;
    let method = method.as_deref().unwrap_or("common");
    if value.is_integer() && method == "common" {
        return Ok(value);
    }
    let x = f64::try_from(value.clone())
        .map_err(|_| bad_arg(format!("cannot round value ({})", value.kind())))?;
    let scale = 10f64.powi(precision);
    let rounded = match method {
        "common" if precision >= 0 => {
            // Rust's fixed-precision formatting rounds the exact binary
            // value half to even, as Python's `round` does.
            let text = format!("{x:.*}", precision as usize);
            text.parse::<f64>().unwrap_or(x)
        }
        "common" => (x * scale).round_ties_even() / scale,
        "ceil" => (x * scale).ceil() / scale,
        "floor" => (x * scale).floor() / scale,
        _ => return Err(bad_arg("method must be common, ceil or floor".into())),
    };
    Ok(Value::from(rounded))
}

/// Python's `s.ljust`, `s.rjust` or `s.center(width, fill)` (`how`).
pub(super) fn justify(s: &str, width: usize, fill: char, how: &str) -> String {
    let pad = width.saturating_sub(s.chars().count());
    let left = match how {
        "ljust" => 0,
        "rjust" => pad,
        // CPython's rule for where an odd padding character goes.
        _ => pad / 2 + (pad & width & 1),
    };
    let mut out = String::with_capacity(s.len() + pad);
    out.extend(std::iter::repeat_n(fill, left));
    out.push_str(s);
    out.extend(std::iter::repeat_n(fill, pad - left));
    out
}

/// Jinja2's `wordcount`: runs of word characters (`\w+`).
pub(super) fn wordcount(s: &str) -> usize {
    let mut count = 0;
    let mut in_word = false;
    for c in s.chars() {
        let word = c.is_alphanumeric() || c == '_';
        if word && !in_word {
            count += 1;
        }
        in_word = word;
    }
    count
}

#[cfg(test)]
mod tests {
    use super::*;

    fn float(f: f64) -> String {
        let mut s = String::new();
        write_float(&mut s, f, "inf", "nan");
        s
    }

    #[test]
    fn floats_print_as_python_repr() {
        for (f, py) in [
            (1.0, "1.0"),
            (100.0, "100.0"),
            (0.1, "0.1"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1.5e-7, "1.5e-07"),
            (123456.789, "123456.789"),
            (1e15, "1000000000000000.0"),
            (1e16, "1e+16"),
            (1.5e16, "1.5e+16"),
            (-2.5, "-2.5"),
            (-0.0, "-0.0"),
            (f64::INFINITY, "inf"),
        ] {
            assert_eq!(float(f), py, "{f}");
        }
    }

    #[test]
    fn values_print_as_python_str() {
        let v = Value::from_serialize(serde_json::json!({
            "a": [1, 2.0, null, true, "it's"],
            "b": "say \"hi\"\n"
        }));
        assert_eq!(
            str_of(&v),
            r#"{'a': [1, 2.0, None, True, "it's"], 'b': 'say "hi"\n'}"#
        );
        assert_eq!(str_of(&Value::from(())), "None");
        assert_eq!(str_of(&Value::from(false)), "False");
        assert_eq!(str_of(&Value::UNDEFINED), "");
        assert_eq!(str_of(&Value::from("plain")), "plain");
    }
}
