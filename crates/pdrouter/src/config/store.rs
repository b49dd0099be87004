//! The admission store shared by router replicas (`--admission-store` and its tuning): the
//! checked Redis URL, whose credentials are never shown, and the store settings.

use std::fmt;
use std::time::Duration;

pub use pdrouter_admission::Fallback;

use super::{AdmissionSettings, ConfigError, NO_COUNT_LIMIT, bad, range};

/// A checked admission-store URL. `Display` and `Debug` never show the user or password.
#[derive(Clone, PartialEq, Eq)]
pub struct StoreUrl {
    full: String,
    shown: String,
    password: Option<String>,
}

impl StoreUrl {
    /// Parses `redis://[user:pass@]host[:port][/db]`. The error never repeats the credentials.
    pub fn parse(raw: &str) -> Result<Self, String> {
        const WANT: &str = "must be redis://[user:pass@]host[:port][/db]";
        let Some(rest) = raw.strip_prefix("redis://") else {
            let scheme = raw.split("://").next().filter(|s| *s != raw);
            return Err(match scheme {
                Some("rediss") => {
                    format!("--admission-store: TLS (rediss://) is not supported; {WANT}")
                }
                _ => format!("--admission-store {WANT}"),
            });
        };
        let (userinfo, hostpart) = match rest.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, rest),
        };
        let (authority, db) = match hostpart.split_once('/') {
            Some((a, d)) => (a, Some(d)),
            None => (hostpart, None),
        };
        if let Some(db) = db
            && !db.is_empty()
            && db.parse::<u16>().is_err()
        {
            return Err(format!(
                "--admission-store: the database must be a number 0-65535; {WANT}"
            ));
        }
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            match v6.split_once(']') {
                Some((h, p)) => (h, p.strip_prefix(':')),
                None => {
                    return Err(format!(
                        "--admission-store: unclosed '[' in the host; {WANT}"
                    ));
                }
            }
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (authority, None),
            }
        };
        if host.is_empty()
            || host
                .chars()
                .any(|c| c.is_whitespace() || c == '?' || c == '#')
        {
            return Err(format!("--admission-store: no valid host; {WANT}"));
        }
        if let Some(p) = port
            && !matches!(p.parse::<u16>(), Ok(1..))
        {
            return Err(format!(
                "--admission-store: the port must be a number 1-65535; {WANT}"
            ));
        }
        let password = userinfo.and_then(|u| u.split_once(':').map(|(_, p)| p.to_string()));
        let shown = format!(
            "redis://{}{}{}",
            if userinfo.is_some() { "***@" } else { "" },
            authority,
            db.map(|d| format!("/{d}")).unwrap_or_default()
        );
        if redis::Client::open(raw).is_err() {
            return Err(format!(
                "--admission-store '{shown}' is not a usable Redis URL; {WANT}"
            ));
        }
        Ok(StoreUrl {
            full: raw.to_string(),
            shown,
            password: password.filter(|p| !p.is_empty()),
        })
    }

    /// The URL with its credentials, for the client only.
    pub(crate) fn secret(&self) -> &str {
        &self.full
    }

    /// `text` with any occurrence of the password replaced (for error messages of the client
    /// library, which should not contain it anyway).
    pub fn scrub(&self, text: &str) -> String {
        match &self.password {
            Some(p) => text.replace(p.as_str(), "***"),
            None => text.to_string(),
        }
    }
}

impl fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.shown)
    }
}

impl fmt::Debug for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "StoreUrl({})", self.shown)
    }
}

/// `--admission-store` and its tuning: the replicas of one group share each Prefill worker's
/// request limit (and token budget) through the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreSettings {
    /// The store (credentials hidden when shown).
    pub url: StoreUrl,
    /// `--admission-group`: replicas with the same group share limits.
    pub group: String,
    /// Time between a replica's exchanges with the store.
    pub interval: Duration,
    /// How long a replica's leases last in the store without renewal.
    pub lease_ttl: Duration,
    /// What a replica does once its leases could have expired.
    pub fallback: Fallback,
}

/// Default `--admission-group`.
pub const DEFAULT_ADMISSION_GROUP: &str = "default";
/// Default `--admission-store-interval-ms`.
pub const DEFAULT_STORE_INTERVAL_MS: u64 = 200;
/// Default `--admission-store-lease-ttl-ms`.
pub const DEFAULT_STORE_LEASE_TTL_MS: u64 = 3_000;

/// Admission-store flags as given, before validation.
#[derive(Debug, Clone, Default)]
pub struct RawStore {
    /// `--admission-store`.
    pub url: Option<String>,
    /// `--admission-group`.
    pub group: Option<String>,
    /// `--admission-store-interval-ms`.
    pub interval_ms: Option<i64>,
    /// `--admission-store-lease-ttl-ms`.
    pub lease_ttl_ms: Option<i64>,
    /// `--admission-store-fallback`.
    pub fallback: Option<String>,
}

impl RawStore {
    /// The store settings, or `None` without `--admission-store` (its other flags are then
    /// refused). The store shares the request limit, so admission must have one.
    pub fn resolve(
        self,
        admission: Option<&AdmissionSettings>,
    ) -> Result<Option<StoreSettings>, ConfigError> {
        let Some(raw_url) = self.url else {
            if self.group.is_some()
                || self.interval_ms.is_some()
                || self.lease_ttl_ms.is_some()
                || self.fallback.is_some()
            {
                return Err(bad("--admission-group, --admission-store-interval-ms, \
                     --admission-store-lease-ttl-ms and --admission-store-fallback need \
                     --admission-store"));
            }
            return Ok(None);
        };
        let url = StoreUrl::parse(&raw_url).map_err(bad)?;
        // Both would set each worker's limit: the store from the group's shares of a fixed N,
        // auto from this replica's own observations.
        if admission.is_some_and(|a| a.auto.is_some()) {
            return Err(bad(
                "--admission-store shares fixed Prefill limits between replicas; give \
                 --prefill-max-inflight-requests-per-worker and \
                 --prefill-max-inflight-tokens-per-worker numbers, not auto",
            ));
        }
        if admission.is_none_or(|a| a.max_inflight_per_worker == NO_COUNT_LIMIT) {
            return Err(bad(
                "--admission-store shares --prefill-max-inflight-requests-per-worker between \
                 replicas; give a positive one",
            ));
        }
        let group = admission_group(self.group)?;
        // In range, so the conversions below are exact.
        let interval = match self.interval_ms {
            None => DEFAULT_STORE_INTERVAL_MS,
            Some(v) => range::ADMISSION_STORE_INTERVAL_MS.check(v)? as u64,
        };
        let ttl = match self.lease_ttl_ms {
            None => DEFAULT_STORE_LEASE_TTL_MS,
            Some(v) => range::ADMISSION_STORE_LEASE_TTL_MS.check(v)? as u64,
        };
        if ttl < 3 * interval {
            return Err(bad(format!(
                "--admission-store-lease-ttl-ms {ttl} must be at least 3 times \
                 --admission-store-interval-ms {interval}, so a lease is renewed several times \
                 before it expires"
            )));
        }
        let fallback = match self.fallback.as_deref() {
            None | Some("hold") => Fallback::Hold,
            Some("local") => Fallback::Local,
            Some(other) => {
                return Err(bad(format!(
                    "--admission-store-fallback '{other}' must be hold or local"
                )));
            }
        };
        Ok(Some(StoreSettings {
            url,
            group,
            interval: Duration::from_millis(interval),
            lease_ttl: Duration::from_millis(ttl),
            fallback,
        }))
    }
}

/// `--admission-group` (default [`DEFAULT_ADMISSION_GROUP`]): the group names the store's keys
/// and channel, so it is kept to characters that need no quoting there.
fn admission_group(group: Option<String>) -> Result<String, ConfigError> {
    let group = group.unwrap_or_else(|| DEFAULT_ADMISSION_GROUP.to_string());
    if group.is_empty()
        || group.len() > 64
        || !group
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        return Err(bad(format!(
            "--admission-group '{group}' must be 1-64 letters, digits, '-', '_' or '.'"
        )));
    }
    Ok(group)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Mode, RawAdmission};

    #[test]
    fn credentials_never_show() {
        let u = StoreUrl::parse("redis://admin:hunter2@10.0.0.5:6380/2").unwrap();
        for text in [
            u.to_string(),
            format!("{u:?}"),
            u.scrub("auth hunter2 failed"),
        ] {
            assert!(!text.contains("hunter2"), "{text}");
            assert!(!text.contains("admin"), "{text}");
        }
        assert_eq!(u.to_string(), "redis://***@10.0.0.5:6380/2");
        let bad = StoreUrl::parse("redis://admin:hunter2@host:99999").unwrap_err();
        assert!(!bad.contains("hunter2"), "{bad}");
    }

    #[test]
    fn accepted_and_refused_forms() {
        for ok in [
            "redis://127.0.0.1:6379",
            "redis://localhost",
            "redis://:pw@host:1/0",
            "redis://[::1]:6379/3",
        ] {
            StoreUrl::parse(ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
        for bad in [
            "http://host:1",
            "rediss://host:1",
            "redis://",
            "redis://host:0",
            "redis://host:x",
            "redis://host:1/db",
            "host:6379",
        ] {
            let e = StoreUrl::parse(bad).unwrap_err();
            assert!(e.starts_with("--admission-store"), "{bad}: {e}");
        }
    }

    #[test]
    fn the_admission_store_needs_a_request_limit_and_checks_its_flags() {
        let limits = RawAdmission {
            max_inflight: 4,
            ..RawAdmission::default()
        }
        .resolve(Mode::PdHttp)
        .unwrap();
        let store = |f: fn(&mut RawStore)| {
            let mut r = RawStore {
                url: Some("redis://u:pw@127.0.0.1:6379/1".into()),
                ..RawStore::default()
            };
            f(&mut r);
            r
        };
        let ok = store(|_| {}).resolve(limits.as_ref()).unwrap().unwrap();
        assert_eq!(ok.group, DEFAULT_ADMISSION_GROUP);
        assert_eq!(ok.interval, Duration::from_millis(200));
        assert_eq!(ok.lease_ttl, Duration::from_secs(3));
        assert_eq!(ok.fallback, Fallback::Hold);
        assert!(!format!("{ok:?}").contains("pw"));
        let err = |r: RawStore, a: Option<&AdmissionSettings>| r.resolve(a).unwrap_err().0;
        assert!(err(store(|_| {}), None).contains("--prefill-max-inflight-requests-per-worker"));
        let tokens_only = AdmissionSettings {
            max_inflight_per_worker: NO_COUNT_LIMIT,
            ..limits.unwrap()
        };
        assert!(err(store(|_| {}), Some(&tokens_only)).contains("positive"));
        let l = limits.as_ref();
        assert!(err(store(|r| r.group = Some("a b".into())), l).contains("--admission-group"));
        assert!(err(store(|r| r.fallback = Some("drop".into())), l).contains("hold or local"));
        let e = err(
            store(|r| {
                r.interval_ms = Some(1000);
                r.lease_ttl_ms = Some(2000);
            }),
            l,
        );
        assert!(e.contains("at least 3 times"), "{e}");
        let e = err(
            RawStore {
                fallback: Some("local".into()),
                ..RawStore::default()
            },
            l,
        );
        assert!(e.contains("need --admission-store"), "{e}");
        assert_eq!(RawStore::default().resolve(l).unwrap(), None);
    }
}
