//! `--admission-store redis://[user:pass@]host[:port][/db]`: checked once at startup, shown
//! everywhere (logs, `Debug`, errors) without its credentials.

use std::fmt;

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
