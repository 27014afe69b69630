//! `tools` and `tool_choice` on `generate`, in OpenAI's shapes: the
//! functions a model may call, and whether it must.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A function the model may call (`{"type": "function", "function": {...}}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Tool {
    /// `function`, the only kind there is.
    #[serde(rename = "type")]
    pub kind: String,
    /// The function.
    pub function: FunctionDef,
}

impl Tool {
    /// A function tool.
    pub fn function(name: impl Into<String>, parameters: serde_json::Value) -> Self {
        Tool {
            kind: "function".into(),
            function: FunctionDef {
                name: name.into(),
                description: None,
                parameters: Some(parameters),
                strict: None,
            },
        }
    }
}

/// A function's name, what it does and the JSON schema of its arguments.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionDef {
    /// The name the model calls it by: 1 to 64 of `a-z A-Z 0-9 _ -`.
    pub name: String,
    /// What it does, for the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// JSON schema of the arguments (a map); absent: no arguments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<serde_json::Value>,
    /// Accepted as OpenAI defines it; a forced call's arguments always
    /// follow the schema, strict or not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
}

/// Whether the model calls a tool: on the wire `"auto"`, `"none"`,
/// `"required"` or `{"type": "function", "function": {"name": ...}}`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ToolChoice {
    /// The model decides (the default when `tools` is given).
    #[default]
    Auto,
    /// No call: the tools are still shown to the model.
    None,
    /// At least one call, and nothing else.
    Required,
    /// Exactly this function.
    Function(String),
}

#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum ToolChoiceWire {
    Mode(String),
    Named {
        #[serde(rename = "type", default)]
        kind: Option<String>,
        function: NamedFunction,
    },
}

#[derive(Serialize, Deserialize)]
struct NamedFunction {
    name: String,
}

impl Serialize for ToolChoice {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let wire = match self {
            ToolChoice::Auto => ToolChoiceWire::Mode("auto".into()),
            ToolChoice::None => ToolChoiceWire::Mode("none".into()),
            ToolChoice::Required => ToolChoiceWire::Mode("required".into()),
            ToolChoice::Function(name) => ToolChoiceWire::Named {
                kind: Some("function".into()),
                function: NamedFunction { name: name.clone() },
            },
        };
        wire.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for ToolChoice {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        match ToolChoiceWire::deserialize(deserializer).map_err(|_| {
            D::Error::custom(
                "tool_choice must be \"auto\", \"none\", \"required\" or \
                 {\"type\": \"function\", \"function\": {\"name\": ...}}",
            )
        })? {
            ToolChoiceWire::Mode(mode) => match mode.as_str() {
                "auto" => Ok(ToolChoice::Auto),
                "none" => Ok(ToolChoice::None),
                "required" => Ok(ToolChoice::Required),
                other => Err(D::Error::custom(format!(
                    "tool_choice {other:?} is not one of \"auto\", \"none\", \"required\""
                ))),
            },
            ToolChoiceWire::Named { kind, function } => {
                if kind.as_deref().is_some_and(|k| k != "function") {
                    return Err(D::Error::custom(
                        "a named tool_choice must have \"type\": \"function\"",
                    ));
                }
                Ok(ToolChoice::Function(function.name))
            }
        }
    }
}

impl ToolChoice {
    /// Whether the output must be tool calls.
    pub fn forces_a_call(&self) -> bool {
        matches!(self, ToolChoice::Required | ToolChoice::Function(_))
    }
}

/// Whether `name` is a function name OpenAI accepts.
pub fn valid_function_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_choice_reads_every_openai_form() {
        for (json, expected) in [
            (serde_json::json!("auto"), ToolChoice::Auto),
            (serde_json::json!("none"), ToolChoice::None),
            (serde_json::json!("required"), ToolChoice::Required),
            (
                serde_json::json!({"type": "function", "function": {"name": "f"}}),
                ToolChoice::Function("f".into()),
            ),
        ] {
            let choice: ToolChoice = serde_json::from_value(json.clone()).unwrap();
            assert_eq!(choice, expected);
            assert_eq!(serde_json::to_value(&choice).unwrap(), json);
        }
        for bad in [
            serde_json::json!("always"),
            serde_json::json!(1),
            serde_json::json!({"type": "code", "function": {"name": "f"}}),
            serde_json::json!({"type": "function"}),
        ] {
            assert!(
                serde_json::from_value::<ToolChoice>(bad.clone()).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn function_names_follow_openai() {
        assert!(valid_function_name("get_weather-2"));
        assert!(!valid_function_name(""));
        assert!(!valid_function_name("a b"));
        assert!(!valid_function_name(&"x".repeat(65)));
    }
}
