//! Priority-class settings: the `--priority-scheduler-*` flags' values and the YAML file
//! (`--priority-scheduler-config`), every part of it checked at startup so a bad file exits 2
//! with one line naming what is wrong. How a request's class is found from its headers is
//! `crate::priority`'s.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::Duration;

use http::HeaderName;
use pdrouter_admission::{ClassSettings, Priority, PriorityClasses};
use serde::Deserialize;

use super::ConfigError;

/// Default `--tenant-header-name`.
pub const DEFAULT_TENANT_HEADER: &str = "x-smg-tenant-id";
/// Built-in starvation age per class (bulk, default, interactive, system), in seconds.
pub const STARVATION_SECS: [u64; 4] = [120, 30, 5, 5];
/// Most waiters one class's queue may be given in the file.
pub const MAX_CLASS_QUEUE_SIZE: u64 = 1_000_000;
/// Longest timeout or starvation age the file may give, in seconds (one day).
pub const MAX_CLASS_SECS: u64 = 86_400;

/// What the file says about one class; `None` keeps the default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClassOverride {
    /// `queue_size`.
    pub queue_size: Option<usize>,
    /// `queue_timeout_secs`.
    pub queue_timeout: Option<Duration>,
    /// `starvation_threshold_secs`.
    pub starvation_after: Option<Duration>,
}

/// Validated priority settings (present with `--priority-scheduler-enabled`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrioritySettings {
    /// Per-class overrides from the file, indexed by [`Priority::index`].
    pub classes: [ClassOverride; 4],
    /// `--priority-scheduler-default-max-class`: the cap of tenants not listed (and of
    /// requests without a tenant).
    pub default_max_class: Priority,
    /// Listed tenants (the header value, without the file's `header:` prefix) → maximum class.
    pub tenants: HashMap<String, Priority>,
    /// The tenant header, with `--trust-tenant-header`; `None`: tenants are not read.
    pub tenant_header: Option<HeaderName>,
}

impl PrioritySettings {
    /// Settings without a file: built-in starvation ages, no tenants.
    pub fn new(default_max_class: Priority) -> Self {
        PrioritySettings {
            classes: [ClassOverride::default(); 4],
            default_max_class,
            tenants: HashMap::new(),
            tenant_header: None,
        }
    }

    /// The class settings for a queue whose own flags give `queue_size` and `queue_timeout`.
    pub fn classes(&self, queue_size: usize, queue_timeout: Duration) -> PriorityClasses {
        PriorityClasses(std::array::from_fn(|i| {
            let o = self.classes[i];
            ClassSettings {
                queue_size: o.queue_size.unwrap_or(queue_size),
                queue_timeout: o.queue_timeout.unwrap_or(queue_timeout),
                starvation_after: Some(
                    o.starvation_after
                        .unwrap_or(Duration::from_secs(STARVATION_SECS[i])),
                ),
            }
        }))
    }
}

/// The class named by a flag value: a class name in any ASCII case.
pub fn class_flag(flag: &str, value: &str) -> Result<Priority, ConfigError> {
    Priority::from_header(value).ok_or_else(|| {
        ConfigError(format!(
            "{flag} '{value}' is not a priority class; use one of bulk, default, interactive, \
             system"
        ))
    })
}

/// The header `--tenant-header-name` names.
pub fn tenant_header(name: &str) -> Result<HeaderName, ConfigError> {
    HeaderName::from_bytes(name.trim().as_bytes()).map_err(|_| {
        ConfigError(format!(
            "--tenant-header-name '{name}' is not a valid HTTP header name"
        ))
    })
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    classes: BTreeMap<String, ClassFile>,
    #[serde(default)]
    tenant_policies: BTreeMap<String, TenantFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ClassFile {
    queue_size: Option<u64>,
    queue_timeout_secs: Option<u64>,
    starvation_threshold_secs: Option<u64>,
    reserved: Option<u64>,
    can_preempt: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TenantFile {
    max_class: String,
}

/// Reads `--priority-scheduler-config` into `settings`.
pub fn load(path: &Path, settings: &mut PrioritySettings) -> Result<(), ConfigError> {
    let shown = path.display();
    let text = std::fs::read_to_string(path).map_err(|e| {
        ConfigError(format!(
            "--priority-scheduler-config {shown}: cannot read it: {e}"
        ))
    })?;
    parse(&text, settings)
        .map_err(|e| ConfigError(format!("--priority-scheduler-config {shown}: {e}")))
}

/// Parses the file's text into `settings` (errors without the path).
pub fn parse(text: &str, settings: &mut PrioritySettings) -> Result<(), String> {
    // An empty file (or one holding only comments) is "all defaults".
    let file: File = if text.trim().is_empty() {
        File::default()
    } else {
        serde_norway::from_str::<Option<File>>(text)
            .map_err(|e| format!("not a valid priority scheduler file: {e}"))?
            .unwrap_or_default()
    };
    for (name, class) in &file.classes {
        let p = Priority::from_name(name).ok_or_else(|| {
            format!("classes: '{name}' is not a priority class; use bulk, default, interactive or system")
        })?;
        let o = &mut settings.classes[p.index()];
        if let Some(q) = class.queue_size {
            if q > MAX_CLASS_QUEUE_SIZE {
                return Err(format!(
                    "classes.{name}.queue_size must be 0-{MAX_CLASS_QUEUE_SIZE}, got {q}"
                ));
            }
            o.queue_size = Some(q as usize);
        }
        o.queue_timeout = secs(name, "queue_timeout_secs", class.queue_timeout_secs)?;
        o.starvation_after = secs(
            name,
            "starvation_threshold_secs",
            class.starvation_threshold_secs,
        )?;
        if class.reserved.is_some_and(|r| r != 0) {
            return Err(format!(
                "classes.{name}.reserved: pdrouter does not hold slots back per class (a freed \
                 slot goes to the highest waiting class instead); remove it or set 0"
            ));
        }
        if class.can_preempt == Some(true) {
            return Err(format!(
                "classes.{name}.can_preempt: pdrouter never cancels an admitted request to make \
                 room; remove it or set false"
            ));
        }
    }
    for (key, tenant) in &file.tenant_policies {
        let max = Priority::from_name(&tenant.max_class).ok_or_else(|| {
            format!(
                "tenant_policies.{key}.max_class '{}' is not a priority class; use bulk, \
                 default, interactive or system",
                tenant.max_class
            )
        })?;
        let id = key
            .strip_prefix("header:")
            .map(str::trim)
            .unwrap_or_default();
        if id.is_empty() {
            return Err(format!(
                "tenant_policies: '{key}' is not a tenant pdrouter can identify; tenants come \
                 from the tenant header only, written 'header:<value>'"
            ));
        }
        settings.tenants.insert(id.to_string(), max);
    }
    Ok(())
}

fn secs(class: &str, field: &str, value: Option<u64>) -> Result<Option<Duration>, String> {
    match value {
        None => Ok(None),
        Some(s) if (1..=MAX_CLASS_SECS).contains(&s) => Ok(Some(Duration::from_secs(s))),
        Some(s) => Err(format!(
            "classes.{class}.{field} must be 1-{MAX_CLASS_SECS}, got {s}"
        )),
    }
}
