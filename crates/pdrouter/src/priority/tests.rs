use std::path::Path;
use std::time::Duration;

use http::HeaderName;

use super::*;

fn headers(pairs: &[(&str, &[u8])]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.append(
            HeaderName::from_bytes(k.as_bytes()).unwrap(),
            http::HeaderValue::from_bytes(v).unwrap(),
        );
    }
    h
}

const FILE: &str = "
# per-class tuning
classes:
  interactive:
    queue_size: 8
    queue_timeout_secs: 30
    starvation_threshold_secs: 2
    reserved: 0
    can_preempt: false
  bulk:
    queue_size: 0
tenant_policies:
  \"header:acme\":
    max_class: interactive
  \"header:ops\":
    max_class: system
";

fn loaded() -> PrioritySettings {
    let mut s = PrioritySettings::new(Priority::Default);
    parse(FILE, &mut s).unwrap();
    s.tenant_header = Some(tenant_header(DEFAULT_TENANT_HEADER).unwrap());
    s
}

#[test]
fn the_file_overrides_classes_and_lists_tenants() {
    let s = loaded();
    let c = s.classes(100, Duration::from_secs(60));
    let i = c.get(Priority::Interactive);
    assert_eq!(i.queue_size, 8);
    assert_eq!(i.queue_timeout, Duration::from_secs(30));
    assert_eq!(i.starvation_after, Some(Duration::from_secs(2)));
    let b = c.get(Priority::Bulk);
    assert_eq!(
        (b.queue_size, b.queue_timeout),
        (0, Duration::from_secs(60))
    );
    assert_eq!(
        b.starvation_after,
        Some(Duration::from_secs(120)),
        "built-in"
    );
    let d = c.get(Priority::Default);
    assert_eq!(
        (d.queue_size, d.queue_timeout),
        (100, Duration::from_secs(60)),
        "the flags"
    );
    assert_eq!(s.tenants.get("acme"), Some(&Priority::Interactive));
    assert_eq!(s.tenants.get("ops"), Some(&Priority::System));
}

#[test]
fn empty_and_comment_only_files_are_all_defaults() {
    for text in ["", "  \n", "# nothing here\n", "{}"] {
        let mut s = PrioritySettings::new(Priority::Bulk);
        parse(text, &mut s).unwrap();
        assert_eq!(s, PrioritySettings::new(Priority::Bulk), "{text:?}");
    }
}

#[test]
fn bad_files_name_what_is_wrong() {
    let cases = [
        ("classes: [1, 2", "not a valid priority scheduler file"),
        (
            "classes:\n  urgent:\n    queue_size: 1\n",
            "'urgent' is not a priority class",
        ),
        (
            "classes:\n  Bulk:\n    queue_size: 1\n",
            "'Bulk' is not a priority class",
        ),
        (
            "classes:\n  bulk:\n    queue_sise: 1\n",
            "unknown field `queue_sise`",
        ),
        ("clases: {}\n", "unknown field `clases`"),
        (
            "classes:\n  bulk:\n    queue_timeout_secs: 0\n",
            "queue_timeout_secs must be 1-86400",
        ),
        (
            "classes:\n  bulk:\n    starvation_threshold_secs: 0\n",
            "starvation_threshold_secs must be 1-86400",
        ),
        (
            "classes:\n  bulk:\n    queue_size: -1\n",
            "not a valid priority scheduler file",
        ),
        (
            "classes:\n  bulk:\n    queue_size: 1000001\n",
            "queue_size must be 0-1000000",
        ),
        (
            "classes:\n  system:\n    reserved: 4\n",
            "does not hold slots back",
        ),
        (
            "classes:\n  system:\n    can_preempt: true\n",
            "never cancels an admitted request",
        ),
        (
            "tenant_policies:\n  \"header:a\":\n    max_class: vip\n",
            "max_class 'vip' is not a priority class",
        ),
        (
            "tenant_policies:\n  \"auth:a\":\n    max_class: bulk\n",
            "'auth:a' is not a tenant pdrouter can identify",
        ),
        (
            "tenant_policies:\n  \"header:\":\n    max_class: bulk\n",
            "is not a tenant pdrouter can identify",
        ),
    ];
    for (text, want) in cases {
        let mut s = PrioritySettings::new(Priority::Default);
        let err = parse(text, &mut s).unwrap_err();
        assert!(err.contains(want), "{text:?}: {err}");
    }
}

#[test]
fn load_names_the_file() {
    let mut s = PrioritySettings::new(Priority::Default);
    let err = load(Path::new("/nonexistent/prio.yaml"), &mut s).unwrap_err();
    assert!(
        err.0
            .starts_with("--priority-scheduler-config /nonexistent/prio.yaml: cannot read")
    );
}

#[test]
fn the_header_picks_a_class_leniently() {
    let s = PrioritySettings::new(Priority::System);
    let class = |v: &[u8]| s.resolve(&headers(&[(PRIORITY_HEADER, v)]));
    assert_eq!(class(b"interactive").priority, Priority::Interactive);
    assert_eq!(class(b"  BuLk ").priority, Priority::Bulk);
    assert_eq!(class(b"system").priority, Priority::System);
    for unknown in [&b"urgent"[..], b"", b"\xff\xfe", b"inter active"] {
        let r = class(unknown);
        assert_eq!(r.priority, Priority::Default, "{unknown:?}");
        assert!(r.unknown_value);
    }
    let none = s.resolve(&HeaderMap::new());
    assert_eq!(none.priority, Priority::Default);
    assert!(!none.unknown_value);
    assert_eq!(none.tenant, "anonymous");
}

#[test]
fn the_tenant_caps_the_class_and_never_raises_it() {
    let s = loaded();
    let r = |prio: &[u8], tenant: Option<&[u8]>| {
        let mut pairs = vec![(PRIORITY_HEADER, prio)];
        if let Some(t) = tenant {
            pairs.push((DEFAULT_TENANT_HEADER, t));
        }
        s.resolve(&headers(&pairs))
    };
    let acme = r(b"system", Some(b"acme"));
    assert_eq!(
        (acme.requested, acme.priority, acme.tenant),
        (Priority::System, Priority::Interactive, "acme")
    );
    assert_eq!(
        r(b"bulk", Some(b" acme ")).priority,
        Priority::Bulk,
        "never raised"
    );
    assert_eq!(r(b"system", Some(b"ops")).priority, Priority::System);
    let stranger = r(b"interactive", Some(b"mallory"));
    assert_eq!(
        (stranger.priority, stranger.tenant),
        (Priority::Default, "other")
    );
    let anonymous = r(b"system", None);
    assert_eq!(
        (anonymous.priority, anonymous.tenant),
        (Priority::Default, "anonymous")
    );
    // Without --trust-tenant-header the header is not read.
    let untrusted = PrioritySettings {
        tenant_header: None,
        ..s.clone()
    };
    let h = headers(&[
        (PRIORITY_HEADER, b"system"),
        (DEFAULT_TENANT_HEADER, b"ops"),
    ]);
    assert_eq!(untrusted.resolve(&h).priority, Priority::Default);
}

#[test]
fn class_flags_and_header_names_are_checked() {
    assert_eq!(
        class_flag("--x", "Interactive").unwrap(),
        Priority::Interactive
    );
    let err = class_flag("--priority-scheduler-default-max-class", "vip").unwrap_err();
    assert!(err.0.contains("'vip' is not a priority class"), "{}", err.0);
    assert!(tenant_header("x-team").is_ok());
    assert!(
        tenant_header("bad header")
            .unwrap_err()
            .0
            .contains("not a valid HTTP header name")
    );
}
