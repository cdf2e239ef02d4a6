//! The `--summary-json` document, with accessors that fail clearly.

use std::path::Path;

/// The `--summary-json` document, with accessors that panic with a clear
/// message when a field is missing or has the wrong type.
#[derive(Debug, Clone)]
pub struct Summary(pub serde_json::Value);

impl Summary {
    pub fn read(path: &Path) -> Summary {
        let text = std::fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("reading summary {}: {e}", path.display()));
        let value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("summary {} is not JSON ({e}):\n{text}", path.display()));
        Summary(value)
    }

    #[track_caller]
    pub fn field(&self, key: &str) -> &serde_json::Value {
        self.0
            .get(key)
            .unwrap_or_else(|| panic!("summary has no field {key:?}: {}", self.0))
    }

    #[track_caller]
    pub fn u64(&self, key: &str) -> u64 {
        self.field(key)
            .as_u64()
            .unwrap_or_else(|| panic!("summary field {key:?} is not a u64: {}", self.0))
    }

    #[track_caller]
    pub fn f64(&self, key: &str) -> f64 {
        self.field(key)
            .as_f64()
            .unwrap_or_else(|| panic!("summary field {key:?} is not a number: {}", self.0))
    }

    #[track_caller]
    pub fn str(&self, key: &str) -> &str {
        self.field(key)
            .as_str()
            .unwrap_or_else(|| panic!("summary field {key:?} is not a string: {}", self.0))
    }

    #[track_caller]
    pub fn bool(&self, key: &str) -> bool {
        self.field(key)
            .as_bool()
            .unwrap_or_else(|| panic!("summary field {key:?} is not a bool: {}", self.0))
    }

    pub fn samples(&self) -> u64 {
        self.u64("samples")
    }

    pub fn event(&self) -> &str {
        self.str("event")
    }

    pub fn exit(&self) -> &str {
        self.str("exit")
    }

    pub fn program_id(&self) -> u32 {
        self.u64("program_id") as u32
    }

    #[track_caller]
    pub fn targets(&self) -> &Vec<serde_json::Value> {
        self.field("targets")
            .as_array()
            .unwrap_or_else(|| panic!("summary field \"targets\" is not an array: {}", self.0))
    }
}

/// A summary's `tags` (`[{"key": .., "value": ..}]`) as `key=value`, in order.
pub fn tag_pairs(tags: &serde_json::Value) -> Vec<String> {
    tags.as_array()
        .expect("tags are a list")
        .iter()
        .map(|t| {
            format!(
                "{}={}",
                t["key"].as_str().unwrap(),
                t["value"].as_str().unwrap()
            )
        })
        .collect()
}
