//! The client-facing edge beyond routing: which headers carry a request id, which browser
//! origins may call the router (CORS), the server certificate (TLS), and the control-plane
//! keys that guard the admin routes.
//!
//! The settings are parsed and checked once at startup, in `crate::config::edge` (re-exported
//! here), so a bad value fails the command line (exit 2) with one line naming the flag; at run
//! time the edge only compares bytes. Control-plane keys never appear in `Debug` output or
//! logs: only their id, name and role.

use http::HeaderValue;

pub use crate::config::edge::{
    ControlPlaneKey, Cors, DEFAULT_REQUEST_ID_HEADERS, EdgeConfig, MAX_LIST_LEN, Role, ServerTls,
    control_plane_keys, cors, request_id_headers, server_tls,
};

impl Cors {
    /// The `Access-Control-Allow-Origin` value for a request from `origin`, if allowed.
    pub fn allow(&self, origin: &HeaderValue) -> Option<HeaderValue> {
        match self {
            Self::Any => Some(HeaderValue::from_static("*")),
            Self::Origins(list) => list
                .iter()
                .any(|o| o.as_bytes().eq_ignore_ascii_case(origin.as_bytes()))
                .then(|| origin.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn allowed_origins_are_echoed_in_any_case_and_others_get_nothing() {
        let c = cors(&strings(&["https://a.example", "http://localhost:3000/"]))
            .unwrap()
            .unwrap();
        let allowed = c.allow(&HeaderValue::from_static("http://localhost:3000"));
        assert_eq!(allowed.unwrap(), "http://localhost:3000");
        let upper = c.allow(&HeaderValue::from_static("HTTPS://A.EXAMPLE"));
        assert_eq!(upper.unwrap(), "HTTPS://A.EXAMPLE");
        assert!(
            c.allow(&HeaderValue::from_static("https://b.example"))
                .is_none()
        );
        let any = Cors::Any.allow(&HeaderValue::from_static("https://b.example"));
        assert_eq!(any.unwrap(), "*");
    }

    /// Config checks keys without the proxy; both must agree on what a usable key is.
    #[test]
    fn the_key_check_of_config_is_the_proxys() {
        use crate::config::edge::bearer_usable;
        for key in [
            "k",
            "with spaces",
            "a:b:c",
            "",
            "bad\u{7}key",
            "tab\tkey",
            "é",
            "x\ny",
        ] {
            assert_eq!(
                bearer_usable(key),
                crate::proxy::forward::bearer(key).is_some(),
                "{key:?}"
            );
        }
    }
}
