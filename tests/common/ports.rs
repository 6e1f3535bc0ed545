//! Loopback TCP ports for the daemons a test or a benchmark starts. Every port a daemon is told
//! to listen on comes from here: reserved below the kernel's ephemeral range and never handed
//! out twice in one process, so no other test, client or port-0 bind can take it before the
//! daemon binds it. Shared by the integration suite (`tests/suite/harness/`) and the benchmarks
//! (`benches/*.rs`), which include this file with `#[path]`: a benchmark cannot use the test
//! crate's modules. It only picks ports; it binds nothing it keeps.

/// A loopback TCP port reserved for one daemon of this test process: see [`reserve_ports`].
pub fn free_port() -> u16 {
    reserve_ports(1)[0]
}

/// `n` loopback TCP ports for the daemons a test starts, each handed out once per test
/// process and free when handed out.
///
/// Ports come from below the kernel's ephemeral range (`ip_local_port_range`), so no
/// outgoing connection and no port-0 bind of any process (another test's client, a daemon
/// binding port 0) can take one between this check and the daemon's own bind; a port once
/// handed out is never handed out again here, so two tests of one process never share one.
/// Each process starts at an offset of its pid, so that concurrent test processes (the suite
/// and a benchmark, say) rarely try the same ports; one that is taken is skipped.
pub fn reserve_ports(n: usize) -> Vec<u16> {
    use std::sync::Mutex;
    static NEXT: Mutex<Option<u16>> = Mutex::new(None);
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let (low, high) = (10_000u16, ephemeral_low.max(12_000));
    let span = u32::from(high - low);
    let mut next = NEXT.lock().unwrap_or_else(|e| e.into_inner());
    let mut port = next.unwrap_or_else(|| low + (std::process::id() * 16 % span) as u16);
    let mut ports = Vec::with_capacity(n);
    let mut tried = 0;
    while ports.len() < n {
        assert!(
            tried < span,
            "no free loopback port below {high} for the test daemons"
        );
        tried += 1;
        let candidate = port;
        port = if port + 1 >= high { low } else { port + 1 };
        if std::net::TcpListener::bind(("127.0.0.1", candidate)).is_ok() {
            ports.push(candidate);
        }
    }
    *next = Some(port);
    ports
}
