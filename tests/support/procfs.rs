//! What the benchmarks read of a process from /proc, and the percentile they report.

/// Seconds of CPU (user + system) process `pid` has used.
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or_default();
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are fields 14 and 15 of stat(5); USER_HZ is 100 on Linux.
    (ticks(11) + ticks(12)) / 100.0
}

/// (VmRSS, VmHWM) of process `pid`, in KiB.
pub fn memory_kib(pid: u32) -> (f64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0.0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// The `p`th percentile (nearest rank) of `sorted`.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// How many TCP connections process `pid` has established to `port` (on any address), from
/// its open sockets (/proc/PID/fd) and the kernel's tables of them (/proc/PID/net/tcp, tcp6).
pub fn connections_to(pid: u32, port: u16) -> usize {
    let sockets: std::collections::HashSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .filter_map(|target| {
            let target = target.to_string_lossy().into_owned();
            Some(target.strip_prefix("socket:[")?.strip_suffix(']')?.to_string())
        })
        .collect();
    let port = format!("{port:04X}");
    ["tcp", "tcp6"]
        .iter()
        .flat_map(|table| {
            std::fs::read_to_string(format!("/proc/{pid}/net/{table}"))
                .unwrap_or_default()
                .lines()
                .skip(1)
                .map(String::from)
                .collect::<Vec<_>>()
        })
        .filter(|line| {
            // sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
            let fields: Vec<&str> = line.split_whitespace().collect();
            let remote_port = fields.get(2).and_then(|a| a.rsplit_once(':')).map(|(_, p)| p);
            fields.get(3) == Some(&"01")
                && remote_port == Some(port.as_str())
                && fields.get(9).is_some_and(|i| sockets.contains(*i))
        })
        .count()
}
