//! The test process's memory and handles, read from /proc/self, for tests
//! that check repeated work leaks nothing.

/// Resident memory, open descriptors and memory mappings of this process.
#[derive(Clone, Copy, Debug)]
pub struct Process {
    pub rss_kb: u64,
    /// Peak resident memory (`VmHWM`).
    pub hwm_kb: u64,
    pub fds: usize,
    pub maps: usize,
}

pub fn process() -> Process {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb = |key: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or_else(|| panic!("no {key} in /proc/self/status"))
    };
    Process {
        rss_kb: kb("VmRSS:"),
        hwm_kb: kb("VmHWM:"),
        fds: std::fs::read_dir("/proc/self/fd").unwrap().count(),
        maps: std::fs::read_to_string("/proc/self/maps")
            .unwrap()
            .lines()
            .count(),
    }
}

/// `end` holds no more descriptors, at most a few more mappings (malloc
/// arenas come and go) and at most `rss_slack_mb` more resident memory
/// than `warm`, taken after warm-up.
pub fn assert_flat(what: &str, warm: Process, end: Process, rss_slack_mb: u64) {
    eprintln!("{what}: after warm-up {warm:?}, at the end {end:?}");
    assert!(
        end.fds <= warm.fds,
        "{what}: descriptors grew: {warm:?} -> {end:?}"
    );
    assert!(
        end.maps <= warm.maps + 16,
        "{what}: mappings grew: {warm:?} -> {end:?}"
    );
    assert!(
        end.rss_kb <= warm.rss_kb + rss_slack_mb * 1024,
        "{what}: resident memory grew by more than {rss_slack_mb} MiB: {warm:?} -> {end:?}"
    );
}
