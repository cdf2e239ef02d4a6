//! The service rules file (`--service-rules FILE`): which service a process belongs to, by
//! its name, executable or cgroup, where the default (systemd unit, container, executable
//! name) is not what a team calls it.
//!
//! ```toml
//! [[rule]]
//! service = "checkout"
//! executable = "^/opt/shop/bin/"      # regular expressions, all given ones must match
//! comm = "^checkout-"
//!
//! [[rule]]
//! service = "payments"
//! cgroup = "/payments\\.slice/"
//! ```
//!
//! Rules are tried in order; the first whose patterns all match names the process. Patterns
//! are Rust regular expressions (linear-time matching, so a process's name cannot make a
//! match slow).

use std::path::Path;

use serde::Deserialize;

use crate::error::{Error, Result};

/// Largest rules file read: rules are a few lines each.
const MAX_RULES_FILE_BYTES: u64 = 1 << 20;
/// Most rules in a file.
const MAX_RULES: usize = 1000;
/// Largest compiled pattern (the regex crate's own bound on a pattern's program).
const MAX_PATTERN_BYTES: usize = 1 << 20;
/// Longest service name a rule may give (it becomes a pprof label value).
pub const MAX_SERVICE_NAME: usize = 128;

/// What a process shows that rules match against.
#[derive(Clone, Copy, Debug)]
pub struct ProcessFacts<'a> {
    /// Its name (`comm`).
    pub comm: &'a str,
    /// Its executable's path, empty when unknown (kernel threads).
    pub executable: &'a str,
    /// Its cgroup v2 path, empty when unknown.
    pub cgroup: &'a str,
}

/// One rule: a service name and the patterns a process must match to get it.
#[derive(Debug)]
struct Rule {
    service: String,
    comm: Option<regex::Regex>,
    executable: Option<regex::Regex>,
    cgroup: Option<regex::Regex>,
}

/// The rules of a file, in order; empty when no file was given.
#[derive(Debug, Default)]
pub struct ServiceRules {
    rules: Vec<Rule>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RulesFile {
    #[serde(default)]
    rule: Vec<RuleText>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleText {
    service: String,
    comm: Option<String>,
    executable: Option<String>,
    cgroup: Option<String>,
}

impl ServiceRules {
    /// Reads and checks the rules of `path`: a bad file is a usage error naming the rule.
    pub fn load(path: &Path) -> Result<ServiceRules> {
        use std::io::Read;
        let bad = |reason: String| Error::InvalidTarget {
            spec: path.display().to_string(),
            reason,
        };
        let file = std::fs::File::open(path).map_err(|e| bad(format!("cannot read: {e}")))?;
        let mut text = String::new();
        file.take(MAX_RULES_FILE_BYTES + 1)
            .read_to_string(&mut text)
            .map_err(|e| bad(format!("cannot read: {e}")))?;
        if text.len() as u64 > MAX_RULES_FILE_BYTES {
            return Err(bad(format!("larger than {MAX_RULES_FILE_BYTES} bytes")));
        }
        ServiceRules::parse(&text).map_err(bad)
    }

    /// Parses rules from TOML text.
    pub fn parse(text: &str) -> std::result::Result<ServiceRules, String> {
        let file: RulesFile = toml::from_str(text).map_err(|e| e.to_string())?;
        if file.rule.len() > MAX_RULES {
            return Err(format!("more than {MAX_RULES} rules"));
        }
        let mut rules = Vec::with_capacity(file.rule.len());
        for (i, r) in file.rule.into_iter().enumerate() {
            let n = i + 1;
            if r.service.is_empty()
                || r.service.len() > MAX_SERVICE_NAME
                || r.service.chars().any(char::is_control)
            {
                return Err(format!(
                    "rule {n}: service must be 1 to {MAX_SERVICE_NAME} printable characters"
                ));
            }
            if r.comm.is_none() && r.executable.is_none() && r.cgroup.is_none() {
                return Err(format!(
                    "rule {n} ({}): give at least one of comm, executable, cgroup",
                    r.service
                ));
            }
            let compile = |what: &str, p: Option<String>| -> std::result::Result<_, String> {
                p.map(|p| {
                    regex::RegexBuilder::new(&p)
                        .size_limit(MAX_PATTERN_BYTES)
                        .build()
                        .map_err(|e| format!("rule {n}: {what} pattern: {e}"))
                })
                .transpose()
            };
            rules.push(Rule {
                comm: compile("comm", r.comm)?,
                executable: compile("executable", r.executable)?,
                cgroup: compile("cgroup", r.cgroup)?,
                service: r.service,
            });
        }
        Ok(ServiceRules { rules })
    }

    /// The service the first matching rule names, if any.
    pub fn service(&self, facts: ProcessFacts<'_>) -> Option<&str> {
        let matches =
            |re: &Option<regex::Regex>, s: &str| re.as_ref().is_none_or(|r| r.is_match(s));
        self.rules
            .iter()
            .find(|r| {
                matches(&r.comm, facts.comm)
                    && matches(&r.executable, facts.executable)
                    && matches(&r.cgroup, facts.cgroup)
            })
            .map(|r| r.service.as_str())
    }

    /// How many rules there are.
    pub fn len(&self) -> usize {
        self.rules.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts<'a>(comm: &'a str, executable: &'a str, cgroup: &'a str) -> ProcessFacts<'a> {
        ProcessFacts {
            comm,
            executable,
            cgroup,
        }
    }

    #[test]
    fn first_rule_whose_patterns_all_match_names_the_service() {
        let rules = ServiceRules::parse(
            r#"
[[rule]]
service = "checkout"
executable = "^/opt/shop/bin/"
comm = "^checkout"

[[rule]]
service = "shop"
executable = "^/opt/shop/"

[[rule]]
service = "payments"
cgroup = "/payments\\.slice/"
"#,
        )
        .unwrap();
        assert_eq!(rules.len(), 3);
        let f = facts("checkout-1", "/opt/shop/bin/checkout", "/");
        assert_eq!(rules.service(f), Some("checkout"));
        let f = facts("cart", "/opt/shop/bin/cart", "/");
        assert_eq!(rules.service(f), Some("shop"));
        let f = facts(
            "java",
            "/usr/bin/java",
            "/system.slice/payments.slice/x.service",
        );
        assert_eq!(rules.service(f), Some("payments"));
        assert_eq!(rules.service(facts("sh", "/bin/sh", "/")), None);
    }

    #[test]
    fn bad_rules_are_refused_with_the_rule_named() {
        for (text, said) in [
            (
                "[[rule]]\nservice = \"a\"\n",
                "rule 1 (a): give at least one",
            ),
            (
                "[[rule]]\nservice = \"\"\ncomm = \"x\"\n",
                "rule 1: service",
            ),
            (
                "[[rule]]\nservice = \"a\"\ncomm = \"(\"\n",
                "rule 1: comm pattern",
            ),
            ("[[rule]]\nservice = \"a\"\nname = \"x\"\n", "unknown field"),
        ] {
            let err = ServiceRules::parse(text).unwrap_err();
            assert!(err.contains(said), "{text:?}: {err}");
        }
        assert!(ServiceRules::parse("").unwrap().is_empty());
    }
}
