//! SMG flags that pdrouter deliberately does not take. Each is refused before clap parses,
//! with what to do instead, rather than clap's generic "unexpected argument".

const MESH: &str = "pdrouter has no router mesh; run one router, or several replicas \
    behind a load balancer: replicas share their Prefill admission limits through a Redis \
    admission store with --admission-store redis://HOST:PORT (README: Flags pdrouter does not \
    take)";

/// SMG flags that pdrouter deliberately does not take, each with what to do instead. Given
/// one, pdrouter exits 2 with that line rather than clap's generic "unexpected argument".
pub const UNSUPPORTED_FLAGS: &[(&str, &str)] = &[
    ("--enable-mesh", MESH),
    ("--mesh-server-name", MESH),
    ("--mesh-host", MESH),
    ("--mesh-advertise-host", MESH),
    ("--mesh-port", MESH),
    ("--mesh-peer-urls", MESH),
    ("--router-selector", MESH),
    (
        "--priority-scheduler-tenant-metric-top-n",
        "pdrouter labels scheduler metrics with the tenants listed in \
         --priority-scheduler-config and puts every other tenant under 'other', so the number \
         of series is bounded by the file (README: Priority classes)",
    ),
    (
        "--enable-igw",
        "pdrouter has no separate multi-model gateway mode: it always sends a request to the \
         workers serving the model it names, so register the workers of every model with \
         --worker-urls or the /workers API (README: Flags pdrouter does not take)",
    ),
];

/// The refusal line for the first unsupported flag in `args` (as `--flag` or `--flag=...`).
pub(super) fn unsupported_flag(args: &[std::ffi::OsString]) -> Option<String> {
    args.iter().skip(1).find_map(|a| {
        let a = a.to_str()?;
        let name = a.split_once('=').map_or(a, |(n, _)| n);
        UNSUPPORTED_FLAGS
            .iter()
            .find(|(flag, _)| *flag == name)
            .map(|(flag, instead)| format!("{flag} is not supported: {instead}"))
    })
}
