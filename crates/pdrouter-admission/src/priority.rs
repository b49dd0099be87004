//! Priority classes: which waiting request a freed slot goes to first.
//!
//! Four classes, `bulk < default < interactive < system`. A waiter of a higher class is served
//! before any waiter of a lower class that could use the same capacity; waiters of one class
//! are served in arrival order. A waiter that has waited its class's
//! [`starvation_after`](ClassSettings::starvation_after) is *promoted*: it goes ahead of every
//! waiter that is not promoted, and promoted waiters are served in arrival order, so no class
//! waits for ever behind a steady stream of higher ones.
//!
//! "Priority" is deliberately not called "class" in code: the controller already groups
//! waiters by [wait class](crate::Selector::wait_class) (the workers they may use), which is a
//! different thing.

use std::fmt;
use std::time::Duration;

/// A request's priority class, lowest first (so `Ord` is "more urgent is greater").
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Priority {
    /// Background and batch work.
    Bulk = 0,
    /// What a request without a priority gets.
    #[default]
    Default = 1,
    /// Latency-sensitive work.
    Interactive = 2,
    /// Control-plane traffic.
    System = 3,
}

impl Priority {
    /// Every class, lowest first.
    pub const ALL: [Priority; 4] = [
        Priority::Bulk,
        Priority::Default,
        Priority::Interactive,
        Priority::System,
    ];

    /// The class's name: `bulk`, `default`, `interactive` or `system` (also its metric label).
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Bulk => "bulk",
            Priority::Default => "default",
            Priority::Interactive => "interactive",
            Priority::System => "system",
        }
    }

    /// The class named exactly (lowercase, no surrounding space), as configuration files and
    /// flags spell it; `None` for anything else.
    pub fn from_name(name: &str) -> Option<Priority> {
        Priority::ALL.into_iter().find(|p| p.as_str() == name)
    }

    /// The class a request header asks for: the name in any ASCII case with surrounding
    /// whitespace ignored; `None` for anything else (the caller then uses `Default`).
    pub fn from_header(value: &str) -> Option<Priority> {
        let value = value.trim();
        Priority::ALL
            .into_iter()
            .find(|p| p.as_str().eq_ignore_ascii_case(value))
    }

    /// 0 for `Bulk` up to 3 for `System`.
    pub fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How one priority class waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClassSettings {
    /// Most requests of this class waiting at once; 0 = never wait.
    pub queue_size: usize,
    /// Longest a request of this class waits before `QueueTimeout`.
    pub queue_timeout: Duration,
    /// Age after which a waiting request of this class is promoted ahead of every request that
    /// is not (see the module docs); `None`: never.
    pub starvation_after: Option<Duration>,
}

/// The settings of the four classes, indexed by [`Priority::index`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PriorityClasses(pub [ClassSettings; 4]);

impl PriorityClasses {
    /// Every class alike, without promotion: what a controller without priority classes uses
    /// (every request is then `Default`, so only that class's settings matter).
    pub fn uniform(queue_size: usize, queue_timeout: Duration) -> Self {
        PriorityClasses(
            [ClassSettings {
                queue_size,
                queue_timeout,
                starvation_after: None,
            }; 4],
        )
    }

    /// One class's settings.
    pub fn get(&self, priority: Priority) -> &ClassSettings {
        &self.0[priority.index()]
    }

    /// Whether a request of `priority` that joined the queue at `since` is promoted at `now`.
    pub fn starved(
        &self,
        priority: Priority,
        since: tokio::time::Instant,
        now: tokio::time::Instant,
    ) -> bool {
        self.get(priority)
            .starvation_after
            .is_some_and(|after| now.saturating_duration_since(since) >= after)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_order() {
        assert!(Priority::Bulk < Priority::Default);
        assert!(Priority::Default < Priority::Interactive);
        assert!(Priority::Interactive < Priority::System);
        for p in Priority::ALL {
            assert_eq!(Priority::from_name(p.as_str()), Some(p));
            assert_eq!(Priority::ALL[p.index()], p);
        }
        assert_eq!(
            Priority::from_name("System"),
            None,
            "configuration is exact"
        );
        assert_eq!(Priority::from_name(" bulk"), None);
        assert_eq!(
            Priority::from_header(" InterActive\t"),
            Some(Priority::Interactive)
        );
        assert_eq!(Priority::from_header("BULK"), Some(Priority::Bulk));
        assert_eq!(Priority::from_header(""), None);
        assert_eq!(Priority::from_header("urgent"), None);
        assert_eq!(Priority::default(), Priority::Default);
    }
}
