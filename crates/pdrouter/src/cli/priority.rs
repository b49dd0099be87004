//! Priority-class flags: whether the wait queue is ordered by class, the default cap, the YAML
//! file of per-class and per-tenant settings, and where the tenant comes from.

use clap::Args;
use pdrouter_admission::Priority;

use crate::config::ConfigError;
use crate::config::priority::{
    DEFAULT_TENANT_HEADER, PrioritySettings, class_flag, load, tenant_header,
};

/// `launch` flags under "Priority classes".
#[derive(Debug, Args)]
pub struct PriorityArgs {
    /// Order the wait queue by priority class (bulk < default < interactive < system, from
    /// X-SMG-Priority): Prefill admission's queue when a Prefill limit is set, else the global
    /// limiter's. Needs one of them.
    #[arg(long, help_heading = "Priority classes")]
    pub priority_scheduler_enabled: bool,
    /// Highest class a request may have unless its tenant is listed in
    /// --priority-scheduler-config: bulk, default, interactive or system [default: default].
    #[arg(long, value_name = "CLASS", help_heading = "Priority classes")]
    pub priority_scheduler_default_max_class: Option<String>,
    /// YAML file with per-class queue size, queue timeout and starvation age
    /// (`classes`) and per-tenant maximum classes (`tenant_policies`).
    #[arg(long, value_name = "FILE", help_heading = "Priority classes")]
    pub priority_scheduler_config: Option<std::path::PathBuf>,
    /// Read each request's tenant from --tenant-header-name (for per-tenant maximum classes);
    /// only when something in front of the router sets that header.
    #[arg(long, help_heading = "Priority classes")]
    pub trust_tenant_header: bool,
    /// The header naming the tenant, read with --trust-tenant-header [default: x-smg-tenant-id].
    #[arg(long, value_name = "HEADER", help_heading = "Priority classes")]
    pub tenant_header_name: Option<String>,
}

impl PriorityArgs {
    /// The priority settings, `None` without `--priority-scheduler-enabled` (the other flags
    /// then need it). The tenant header is read only when trusted. (That the classes need a
    /// queue to order is a rule across groups, in `rules`.)
    pub(super) fn resolve(&self) -> Result<Option<PrioritySettings>, ConfigError> {
        let given = [
            (
                "--priority-scheduler-default-max-class",
                self.priority_scheduler_default_max_class.is_some(),
            ),
            (
                "--priority-scheduler-config",
                self.priority_scheduler_config.is_some(),
            ),
            ("--trust-tenant-header", self.trust_tenant_header),
            ("--tenant-header-name", self.tenant_header_name.is_some()),
        ];
        if !self.priority_scheduler_enabled {
            return match given.iter().find(|(_, g)| *g) {
                Some((flag, _)) => Err(ConfigError(format!(
                    "{flag} needs --priority-scheduler-enabled"
                ))),
                None => Ok(None),
            };
        }
        let max = match &self.priority_scheduler_default_max_class {
            Some(v) => class_flag("--priority-scheduler-default-max-class", v)?,
            None => Priority::Default,
        };
        let mut settings = PrioritySettings::new(max);
        if let Some(path) = &self.priority_scheduler_config {
            load(path, &mut settings)?;
        }
        if self.trust_tenant_header {
            let name = self
                .tenant_header_name
                .as_deref()
                .unwrap_or(DEFAULT_TENANT_HEADER);
            settings.tenant_header = Some(tenant_header(name)?);
        } else if self.tenant_header_name.is_some() {
            return Err(ConfigError(
                "--tenant-header-name needs --trust-tenant-header (without it no tenant is read)"
                    .into(),
            ));
        } else if !settings.tenants.is_empty() {
            return Err(ConfigError(
                "--priority-scheduler-config lists tenant_policies, which need \
                 --trust-tenant-header (tenants come from the tenant header only)"
                    .into(),
            ));
        }
        Ok(Some(settings))
    }
}
