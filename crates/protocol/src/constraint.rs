//! `constraint` on `generate`: the output must match a JSON schema, be a
//! JSON object, match a regex, or parse under a Lark grammar. The worker
//! compiles it with llguidance and masks every step's logits with it.

use serde::{Deserialize, Serialize};

use crate::DecodeError;

/// The wire shape of `constraint`: a map with exactly one of its keys.
/// Build one with [`Constraint::json_schema`], [`Constraint::json_object`],
/// [`Constraint::regex`] or [`Constraint::lark`]; read it with
/// [`Constraint::kind`], which also checks it.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Constraint {
    /// A JSON schema (a map) the output must validate against.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub json_schema: Option<serde_json::Value>,
    /// `true`: the output is any JSON object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub json_object: Option<bool>,
    /// A regular expression the whole output must match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regex: Option<String>,
    /// A Lark grammar (llguidance's dialect) the output must parse under.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lark: Option<String>,
    /// Read only to refuse it by name: GBNF is not supported.
    #[serde(default, skip_serializing)]
    gbnf: Option<serde::de::IgnoredAny>,
}

/// `schema` with every object schema that lists `properties` and says
/// nothing of other keys made closed (`additionalProperties: false`), as
/// strict structured outputs read a schema: otherwise a grammar lets a
/// small model add keys until it runs out of tokens. An object schema
/// without `properties` (any map) is left open, and so are the members of
/// an `allOf`, whose properties are spread over several members (the
/// schemas inside them are closed).
pub fn closed_objects(schema: &mut serde_json::Value) {
    close(schema, true);
}

fn close(schema: &mut serde_json::Value, this_level: bool) {
    use serde_json::Value;
    let Value::Object(map) = schema else {
        return;
    };
    if this_level
        && map.get("properties").is_some_and(Value::is_object)
        && !map.contains_key("additionalProperties")
        && !map.contains_key("unevaluatedProperties")
        && !map.contains_key("patternProperties")
    {
        map.insert("additionalProperties".into(), Value::Bool(false));
    }
    for (key, value) in map.iter_mut() {
        match key.as_str() {
            "properties" | "patternProperties" | "$defs" | "definitions" | "dependentSchemas" => {
                if let Value::Object(members) = value {
                    members.values_mut().for_each(|s| close(s, true));
                }
            }
            "items"
            | "additionalProperties"
            | "not"
            | "if"
            | "then"
            | "else"
            | "contains"
            | "additionalItems"
            | "unevaluatedItems"
            | "unevaluatedProperties" => match value {
                Value::Array(list) => list.iter_mut().for_each(|s| close(s, true)),
                other => close(other, true),
            },
            "anyOf" | "oneOf" | "prefixItems" => {
                if let Value::Array(list) = value {
                    list.iter_mut().for_each(|s| close(s, true));
                }
            }
            "allOf" => {
                if let Value::Array(list) = value {
                    list.iter_mut().for_each(|s| close(s, false));
                }
            }
            _ => {}
        }
    }
}

/// What a valid [`Constraint`] asks for.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ConstraintKind<'a> {
    /// Validate against this JSON schema (a map).
    JsonSchema(&'a serde_json::Value),
    /// Any JSON object.
    JsonObject,
    /// Match this regex, whole.
    Regex(&'a str),
    /// Parse under this Lark grammar.
    Lark(&'a str),
}

/// The keys of `constraint`, for error messages.
const KEYS: &str = "\"json_schema\", \"json_object\", \"regex\" or \"lark\"";

impl Constraint {
    /// A JSON schema constraint.
    pub fn json_schema(schema: serde_json::Value) -> Self {
        Constraint {
            json_schema: Some(schema),
            ..Constraint::default()
        }
    }

    /// Any JSON object.
    pub fn json_object() -> Self {
        Constraint {
            json_object: Some(true),
            ..Constraint::default()
        }
    }

    /// A regex the whole output must match.
    pub fn regex(regex: impl Into<String>) -> Self {
        Constraint {
            regex: Some(regex.into()),
            ..Constraint::default()
        }
    }

    /// A Lark grammar.
    pub fn lark(grammar: impl Into<String>) -> Self {
        Constraint {
            lark: Some(grammar.into()),
            ..Constraint::default()
        }
    }

    /// Checks that exactly one key is set, with a value of its type, and
    /// says which. Whether the schema, regex or grammar compiles is the
    /// worker's to say (it owns the compiler).
    pub fn kind(&self) -> Result<ConstraintKind<'_>, DecodeError> {
        let invalid = |detail: String| DecodeError::Invalid {
            field: "constraint",
            detail,
        };
        if self.gbnf.is_some() {
            return Err(invalid(
                "GBNF is not supported; use lark (a Lark grammar as llguidance reads it), \
                 regex, json_schema or json_object"
                    .into(),
            ));
        }
        let set = [
            self.json_schema.is_some(),
            self.json_object.is_some(),
            self.regex.is_some(),
            self.lark.is_some(),
        ];
        if set.iter().filter(|set| **set).count() != 1 {
            return Err(invalid(format!("give exactly one of {KEYS}")));
        }
        if let Some(schema) = &self.json_schema {
            if !schema.is_object() {
                return Err(invalid(
                    "\"json_schema\" must be a map (a JSON schema object)".into(),
                ));
            }
            return Ok(ConstraintKind::JsonSchema(schema));
        }
        if let Some(object) = self.json_object {
            if !object {
                return Err(invalid(
                    "\"json_object\" must be true; leave \"constraint\" out for no constraint"
                        .into(),
                ));
            }
            return Ok(ConstraintKind::JsonObject);
        }
        if let Some(regex) = &self.regex {
            return Ok(ConstraintKind::Regex(regex));
        }
        match &self.lark {
            Some(lark) if lark.trim().is_empty() => {
                Err(invalid("\"lark\" must not be empty".into()))
            }
            Some(lark) => Ok(ConstraintKind::Lark(lark)),
            None => Err(invalid(format!("give exactly one of {KEYS}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(value: serde_json::Value) -> Constraint {
        let bytes = rmp_serde::to_vec_named(&value).expect("encode");
        rmp_serde::from_slice(&bytes).expect("decode")
    }

    #[test]
    fn object_schemas_with_properties_are_closed() {
        use serde_json::json;
        // A pydantic model with a nested one, a list of them, a union.
        let mut schema = json!({
            "type": "object", "title": "User",
            "properties": {
                "name": {"type": "string"},
                "address": {"$ref": "#/$defs/Address"},
                "tags": {"type": "array", "items": {"type": "object", "properties": {"k": {}}}},
                "any": {"type": "object"},
                "either": {"anyOf": [{"properties": {"a": {}}}, {"type": "null"}]},
                "open": {"properties": {"b": {}}, "additionalProperties": true},
                "both": {"allOf": [{"properties": {"c": {"properties": {"d": {}}}}}]},
            },
            "$defs": {"Address": {"type": "object", "properties": {"city": {"type": "string"}}}},
        });
        closed_objects(&mut schema);
        assert_eq!(schema["additionalProperties"], false);
        assert_eq!(schema["$defs"]["Address"]["additionalProperties"], false);
        let p = &schema["properties"];
        assert_eq!(p["tags"]["items"]["additionalProperties"], false);
        assert_eq!(p["either"]["anyOf"][0]["additionalProperties"], false);
        assert!(
            p["any"].get("additionalProperties").is_none(),
            "a bare map stays open"
        );
        assert_eq!(
            p["open"]["additionalProperties"], true,
            "what the schema says stays"
        );
        assert!(p["name"].get("additionalProperties").is_none());
        let member = &p["both"]["allOf"][0];
        assert!(
            member.get("additionalProperties").is_none(),
            "allOf members stay open"
        );
        assert_eq!(member["properties"]["c"]["additionalProperties"], false);
    }

    #[test]
    fn one_key_of_its_type() {
        let schema = serde_json::json!({"type": "object"});
        assert_eq!(
            Constraint::json_schema(schema.clone()).kind(),
            Ok(ConstraintKind::JsonSchema(&schema))
        );
        assert_eq!(
            decode(serde_json::json!({"json_object": true})).kind(),
            Ok(ConstraintKind::JsonObject)
        );
        assert_eq!(
            decode(serde_json::json!({"regex": "[0-9]+"})).kind(),
            Ok(ConstraintKind::Regex("[0-9]+"))
        );
        // nil is the same as absent.
        assert_eq!(
            decode(serde_json::json!({"lark": "start: \"a\"", "regex": null})).kind(),
            Ok(ConstraintKind::Lark("start: \"a\""))
        );
    }

    #[test]
    fn refusals_name_the_problem() {
        let message = |value| decode(value).kind().unwrap_err().to_string();
        assert!(message(serde_json::json!({})).contains("exactly one"));
        assert!(
            message(serde_json::json!({"regex": "a", "lark": "start: \"a\""}))
                .contains("exactly one")
        );
        assert!(
            message(serde_json::json!({"gbnf": "root ::= \"a\""}))
                .contains("GBNF is not supported; use lark")
        );
        assert!(message(serde_json::json!({"json_object": false})).contains("must be true"));
        assert!(message(serde_json::json!({"json_schema": "object"})).contains("must be a map"));
        assert!(message(serde_json::json!({"lark": " "})).contains("must not be empty"));
    }

    #[test]
    fn absent_keys_are_not_written() {
        let bytes = rmp_serde::to_vec_named(&Constraint::regex("a")).expect("encode");
        let back: serde_json::Value = rmp_serde::from_slice(&bytes).expect("decode");
        assert_eq!(back, serde_json::json!({"regex": "a"}));
    }
}
