//! The live connections of a public TCP listener (agentd's HTTP, gatewayd's executor
//! WebSocket), by client address: whether a new connection may come in, and which connection
//! to drop to make room for it.
//!
//! Owns three rules, applied at every accept:
//!
//! - **Per address.** One client address holds at most `max_per_address` connections.
//! - **A share kept for authenticated requests.** Connections that have not shown a verified
//!   credential (they are sending request headers, idling between requests, or serving an
//!   anonymous request) hold at most `max_connections - reserved_for_authenticated` slots, so a
//!   flood of anonymous connections can never take the slots that authenticated requests
//!   (a running chat turn, an upload, a connected laptop) are using or need.
//! - **Evict the idle, never the working.** When a limit is reached, the connection that has
//!   been *waiting* longest (for its request headers, or for the rest of an anonymous body) on
//!   the address holding the most waiting connections is closed to make room. A slow-loris
//!   client is always waiting, so it is what gets evicted; a legitimate client sends its
//!   headers at once and is past that phase within a millisecond, and a client on its own
//!   address is the last one ever picked.
//!
//! Must never evict a connection that is serving an authenticated request or running a
//! handler, and never let one address or the anonymous share exceed its bound. The table
//! is a std mutex held only for a few map operations, never across an `.await`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// The bounds of one listener's connection table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Connections held at once, in every phase.
    pub max_connections: usize,
    /// Connections held at once from one client address.
    pub max_per_address: usize,
    /// Slots only connections with an authenticated request in flight may use.
    pub reserved_for_authenticated: usize,
}

impl ConnectionLimits {
    /// `max_connections` and `max_per_address`, with a quarter of the connections kept for
    /// authenticated requests (at least one slot each way when there are two or more).
    pub fn with_reserved_quarter(max_connections: usize, max_per_address: usize) -> Self {
        let max_connections = max_connections.max(1);
        let reserved = (max_connections / 4).min(max_connections.saturating_sub(1));
        ConnectionLimits {
            max_connections,
            max_per_address: max_per_address.max(1),
            reserved_for_authenticated: reserved,
        }
    }

    /// The slots connections without an authenticated request may hold.
    fn anonymous_share(&self) -> usize {
        self.max_connections
            .saturating_sub(self.reserved_for_authenticated)
            .max(1)
    }
}

/// What a connection is doing, which decides whether it may be evicted and which share it
/// counts against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Waiting for (or receiving) a request's headers, including idle keep-alive time.
    /// Evictable; counts against the anonymous share.
    Waiting,
    /// Receiving the body of a request without a verified credential. Evictable; anonymous.
    ReadingAnonymousBody,
    /// Its request is being screened or handled without a verified credential. Not
    /// evictable; anonymous.
    Busy,
    /// Serving a request with a verified credential (reading its body, running its handler,
    /// streaming its answer, or a connected laptop's session). Not evictable; counts against
    /// the whole limit only.
    Authenticated,
}

impl Phase {
    fn evictable(self) -> bool {
        matches!(self, Phase::Waiting | Phase::ReadingAnonymousBody)
    }
}

/// Why a connection was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// Its address holds `max_per_address` connections and none of them is waiting.
    #[error("this address holds its maximum number of connections; retry later")]
    AddressFull,
    /// Every slot it could use is working (none is waiting).
    #[error("the server holds its maximum number of connections; retry later")]
    Full,
}

impl Refusal {
    /// The envelope code of the refusal.
    pub fn code(self) -> &'static str {
        match self {
            Refusal::AddressFull => "too_many_connections",
            Refusal::Full => "busy",
        }
    }
}

#[derive(Debug)]
struct Entry {
    address: IpAddr,
    phase: Phase,
    /// When it last became evictable (a sequence number: smaller waited longer).
    waiting_since: u64,
    /// Cancelled to evict it; the connection's task closes the socket.
    evict: CancellationToken,
}

#[derive(Debug, Default)]
struct AddressConnections {
    /// Every live connection of the address.
    live: usize,
    /// The evictable ones: waiting_since → connection id.
    waiting: BTreeMap<u64, u64>,
}

#[derive(Debug, Default)]
struct TableState {
    entries: HashMap<u64, Entry>,
    addresses: HashMap<IpAddr, AddressConnections>,
    /// Addresses with waiting connections, by how many: the last is the heaviest.
    by_waiting: BTreeSet<(usize, IpAddr)>,
    /// Connections not in [`Phase::Authenticated`].
    anonymous: usize,
    next_id: u64,
    next_seq: u64,
    evicted_total: u64,
}

impl TableState {
    fn seq(&mut self) -> u64 {
        self.next_seq += 1;
        self.next_seq
    }

    fn set_waiting_count(&mut self, address: IpAddr, before: usize, after: usize) {
        if before > 0 {
            self.by_waiting.remove(&(before, address));
        }
        if after > 0 {
            self.by_waiting.insert((after, address));
        }
    }

    fn add_waiting(&mut self, address: IpAddr, since: u64, id: u64) {
        let slot = self.addresses.entry(address).or_default();
        let before = slot.waiting.len();
        slot.waiting.insert(since, id);
        let after = slot.waiting.len();
        self.set_waiting_count(address, before, after);
    }

    fn remove_waiting(&mut self, address: IpAddr, since: u64) {
        let Some(slot) = self.addresses.get_mut(&address) else {
            return;
        };
        let before = slot.waiting.len();
        slot.waiting.remove(&since);
        let after = slot.waiting.len();
        self.set_waiting_count(address, before, after);
    }

    /// Removes a connection from every index; returns its entry.
    fn remove(&mut self, id: u64) -> Option<Entry> {
        let entry = self.entries.remove(&id)?;
        if entry.phase.evictable() {
            self.remove_waiting(entry.address, entry.waiting_since);
        }
        if entry.phase != Phase::Authenticated {
            self.anonymous -= 1;
        }
        if let Some(slot) = self.addresses.get_mut(&entry.address) {
            slot.live -= 1;
            if slot.live == 0 {
                self.addresses.remove(&entry.address);
            }
        }
        Some(entry)
    }

    /// Evicts the longest-waiting connection of `address`, or (None) of the address with the
    /// most waiting connections. False if nothing is waiting there.
    fn evict_one(&mut self, address: Option<IpAddr>) -> bool {
        let victim_address = match address {
            Some(address) => address,
            None => match self.by_waiting.last() {
                Some((_, address)) => *address,
                None => return false,
            },
        };
        let Some(id) = self
            .addresses
            .get(&victim_address)
            .and_then(|slot| slot.waiting.values().next().copied())
        else {
            return false;
        };
        if let Some(entry) = self.remove(id) {
            entry.evict.cancel();
            self.evicted_total += 1;
        }
        true
    }

    fn set_phase(&mut self, id: u64, phase: Phase) {
        let seq = self.seq();
        let Some(entry) = self.entries.get_mut(&id) else {
            return; // evicted meanwhile
        };
        let (address, before, since) = (entry.address, entry.phase, entry.waiting_since);
        if before == phase {
            return;
        }
        entry.phase = phase;
        if phase.evictable() {
            entry.waiting_since = seq;
        }
        if before.evictable() {
            self.remove_waiting(address, since);
        }
        if phase.evictable() {
            self.add_waiting(address, seq, id);
        }
        match (
            before == Phase::Authenticated,
            phase == Phase::Authenticated,
        ) {
            (false, true) => self.anonymous -= 1,
            (true, false) => self.anonymous += 1,
            _ => {}
        }
    }
}

struct TableInner {
    limits: ConnectionLimits,
    state: Mutex<TableState>,
    /// Signalled whenever a slot frees, a connection starts waiting (becomes evictable) or
    /// one authenticates (leaving the anonymous share).
    room: Notify,
}

/// The live connections of one listener. Cheap to clone.
#[derive(Clone)]
pub struct ConnectionTable {
    inner: Arc<TableInner>,
}

impl std::fmt::Debug for ConnectionTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectionTable")
            .field("limits", &self.inner.limits)
            .finish_non_exhaustive()
    }
}

/// How full a table is (for logs and tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableCounts {
    pub live: usize,
    pub anonymous: usize,
    pub waiting: usize,
    pub evicted_total: u64,
}

impl ConnectionTable {
    pub fn new(limits: ConnectionLimits) -> ConnectionTable {
        ConnectionTable {
            inner: Arc::new(TableInner {
                limits,
                state: Mutex::new(TableState::default()),
                room: Notify::new(),
            }),
        }
    }

    pub fn limits(&self) -> ConnectionLimits {
        self.inner.limits
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, TableState> {
        // No code path panics while holding the lock; the maps stay consistent if one did.
        self.inner
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Admits a new connection from `address` in [`Phase::Waiting`], evicting a waiting
    /// connection when a limit is reached (of the same address for the per-address limit;
    /// else of the address with the most waiting connections).
    pub fn admit(&self, address: IpAddr) -> Result<ConnectionSlot, Refusal> {
        let limits = self.inner.limits;
        let mut state = self.lock();
        let on_address = state.addresses.get(&address).map_or(0, |a| a.live);
        if on_address >= limits.max_per_address && !state.evict_one(Some(address)) {
            return Err(Refusal::AddressFull);
        }
        while state.entries.len() >= limits.max_connections
            || state.anonymous >= limits.anonymous_share()
        {
            if !state.evict_one(None) {
                return Err(Refusal::Full);
            }
        }
        state.next_id += 1;
        let id = state.next_id;
        let seq = state.seq();
        let evict = CancellationToken::new();
        state.entries.insert(
            id,
            Entry {
                address,
                phase: Phase::Waiting,
                waiting_since: seq,
                evict: evict.clone(),
            },
        );
        state.anonymous += 1;
        state.addresses.entry(address).or_default().live += 1;
        state.add_waiting(address, seq, id);
        Ok(ConnectionSlot {
            table: self.clone(),
            id,
            evict,
        })
    }

    /// Whether a new anonymous connection could be admitted now (a slot is free or one can
    /// be evicted), ignoring the per-address rule.
    pub fn has_room(&self) -> bool {
        let limits = self.inner.limits;
        let state = self.lock();
        let free = state.entries.len() < limits.max_connections
            && state.anonymous < limits.anonymous_share();
        free || !state.by_waiting.is_empty()
    }

    /// Returns once [`ConnectionTable::has_room`] holds.
    pub async fn room(&self) {
        loop {
            let notified = self.inner.room.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            if self.has_room() {
                return;
            }
            notified.await;
        }
    }

    /// Evicts every connection that is only waiting (at shutdown: a connection halfway
    /// through its headers would otherwise hold the shutdown until its header timeout).
    pub fn evict_waiting(&self) {
        let mut state = self.lock();
        while state.evict_one(None) {}
    }

    pub fn counts(&self) -> TableCounts {
        let state = self.lock();
        TableCounts {
            live: state.entries.len(),
            anonymous: state.anonymous,
            waiting: state.by_waiting.iter().map(|(n, _)| n).sum(),
            evicted_total: state.evicted_total,
        }
    }
}

/// One admitted connection. Dropping it frees the slot.
#[derive(Debug)]
pub struct ConnectionSlot {
    table: ConnectionTable,
    id: u64,
    evict: CancellationToken,
}

impl ConnectionSlot {
    /// Moves the connection to `phase`. A no-op once it was evicted.
    pub fn set_phase(&self, phase: Phase) {
        self.table.lock().set_phase(self.id, phase);
        // Waiting makes it evictable; authenticated frees an anonymous slot.
        if phase.evictable() || phase == Phase::Authenticated {
            self.table.inner.room.notify_waiters();
        }
    }

    /// Cancelled when the table evicts this connection: close it then.
    pub fn evicted(&self) -> &CancellationToken {
        &self.evict
    }
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.table.lock().remove(self.id);
        self.table.inner.room.notify_waiters();
    }
}

/// Raises the soft `RLIMIT_NOFILE` towards `wanted` (never above the hard limit) and returns
/// the soft limit now in force. Failing to raise it (a seccomp filter, say) is not an error:
/// the caller sizes its limits to what it got.
pub fn raise_open_file_limit(wanted: u64) -> u64 {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    let current = limit.current.unwrap_or(u64::MAX);
    if current >= wanted {
        return current;
    }
    let target = match limit.maximum {
        Some(maximum) => wanted.min(maximum),
        None => wanted,
    };
    let raised = rustix::process::Rlimit {
        current: Some(target),
        maximum: limit.maximum,
    };
    match setrlimit(Resource::Nofile, raised) {
        Ok(()) => target,
        Err(_) => current,
    }
}

/// Open files every daemon needs besides its public connections (stores, sockets, logs,
/// its own Unix-socket clients), kept out of the connection limit.
pub const FILES_BESIDES_CONNECTIONS: u64 = 256;

/// `limits` with `max_connections` lowered, if needed, so that `max_connections +
/// other_files` fits the open-file limit (raised first as far as it goes): a listener that
/// runs out of descriptors cannot accept, and so cannot evict a waiting connection either.
pub fn fit_to_open_files(limits: ConnectionLimits, other_files: u64) -> ConnectionLimits {
    let wanted = limits.max_connections as u64 + other_files;
    let available = raise_open_file_limit(wanted);
    if available >= wanted {
        return limits;
    }
    let fitted = available.saturating_sub(other_files).max(16) as usize;
    tracing::warn!(
        configured = limits.max_connections,
        fitted,
        open_file_limit = available,
        "the open-file limit is too low for max_connections; serving fewer connections (raise LimitNOFILE=)"
    );
    let reserved = limits.reserved_for_authenticated * fitted / limits.max_connections.max(1);
    ConnectionLimits {
        max_connections: fitted,
        max_per_address: limits.max_per_address.min(fitted),
        reserved_for_authenticated: reserved.min(fitted.saturating_sub(1)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, last])
    }

    fn limits(max: usize, per_address: usize, reserved: usize) -> ConnectionLimits {
        ConnectionLimits {
            max_connections: max,
            max_per_address: per_address,
            reserved_for_authenticated: reserved,
        }
    }

    #[test]
    fn one_address_is_held_to_its_limit_by_evicting_its_own_oldest_waiting() {
        let table = ConnectionTable::new(limits(100, 3, 0));
        let a: Vec<_> = (0..3).map(|_| table.admit(ip(2)).unwrap()).collect();
        let other = table.admit(ip(3)).unwrap();
        let fourth = table.admit(ip(2)).unwrap();
        assert!(a[0].evicted().is_cancelled(), "the oldest of that address");
        assert!(!a[1].evicted().is_cancelled() && !a[2].evicted().is_cancelled());
        assert!(!other.evicted().is_cancelled());
        // With every connection of the address working, the next one is refused.
        for slot in [&a[1], &a[2], &fourth] {
            slot.set_phase(Phase::Busy);
        }
        assert_eq!(table.admit(ip(2)).unwrap_err(), Refusal::AddressFull);
        assert_eq!(table.counts().live, 4);
    }

    #[test]
    fn the_heaviest_address_is_evicted_first_and_working_connections_never() {
        let table = ConnectionTable::new(limits(6, 10, 0));
        let flood: Vec<_> = (0..4).map(|_| table.admit(ip(2)).unwrap()).collect();
        let legit_idle = table.admit(ip(1)).unwrap();
        let legit_busy = table.admit(ip(4)).unwrap();
        legit_busy.set_phase(Phase::Authenticated);
        // Full: the next ones evict the flood's oldest, one at a time.
        let newcomer = table.admit(ip(5)).unwrap();
        assert!(flood[0].evicted().is_cancelled());
        let second = table.admit(ip(6)).unwrap();
        assert!(flood[1].evicted().is_cancelled());
        assert!(!legit_idle.evicted().is_cancelled());
        assert!(!legit_busy.evicted().is_cancelled());
        drop((newcomer, second));
        assert_eq!(table.counts().evicted_total, 2);
    }

    #[test]
    fn the_reserved_share_is_only_for_authenticated_requests() {
        // 4 slots, 1 reserved: anonymous connections hold at most 3.
        let table = ConnectionTable::new(limits(4, 10, 1));
        let anonymous: Vec<_> = (0..3).map(|_| table.admit(ip(2)).unwrap()).collect();
        for slot in &anonymous {
            slot.set_phase(Phase::Busy);
        }
        assert_eq!(table.admit(ip(3)).unwrap_err(), Refusal::Full);
        assert!(!table.has_room());
        // One of them authenticates: it moves to the reserved share, and an anonymous slot
        // is free again.
        anonymous[0].set_phase(Phase::Authenticated);
        assert!(table.has_room());
        let fourth = table.admit(ip(3)).unwrap();
        fourth.set_phase(Phase::Authenticated);
        assert_eq!(table.counts().live, 4);
        assert_eq!(table.admit(ip(5)).unwrap_err(), Refusal::Full);
        // Back to waiting (keep-alive): evictable again, so a newcomer gets its slot.
        fourth.set_phase(Phase::Waiting);
        let fifth = table.admit(ip(5)).unwrap();
        assert!(fourth.evicted().is_cancelled());
        drop(fifth);
    }

    #[test]
    fn dropping_a_slot_frees_it_and_counts_stay_consistent() {
        let table = ConnectionTable::new(limits(2, 2, 0));
        let a = table.admit(ip(2)).unwrap();
        let b = table.admit(ip(2)).unwrap();
        a.set_phase(Phase::ReadingAnonymousBody);
        b.set_phase(Phase::Authenticated);
        drop(a);
        drop(b);
        assert_eq!(
            table.counts(),
            TableCounts {
                live: 0,
                anonymous: 0,
                waiting: 0,
                evicted_total: 0
            }
        );
        // An evicted slot's later phase changes and drop are no-ops.
        let c = table.admit(ip(2)).unwrap();
        let d = table.admit(ip(2)).unwrap();
        let e = table.admit(ip(2)).unwrap();
        assert!(c.evicted().is_cancelled());
        c.set_phase(Phase::Authenticated);
        drop(c);
        assert_eq!(table.counts().live, 2);
        drop((d, e));
        assert_eq!(table.counts().live, 0);
    }

    #[tokio::test]
    async fn room_wakes_when_a_connection_starts_waiting() {
        let table = ConnectionTable::new(limits(1, 1, 0));
        let only = table.admit(ip(2)).unwrap();
        only.set_phase(Phase::Busy);
        let waiter = tokio::spawn({
            let table = table.clone();
            async move { table.room().await }
        });
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        assert!(!waiter.is_finished());
        only.set_phase(Phase::Waiting);
        tokio::time::timeout(std::time::Duration::from_secs(2), waiter)
            .await
            .unwrap()
            .unwrap();
    }

    #[test]
    fn a_quarter_is_reserved() {
        let l = ConnectionLimits::with_reserved_quarter(1024, 64);
        assert_eq!(l.reserved_for_authenticated, 256);
        assert_eq!(l.anonymous_share(), 768);
        let one = ConnectionLimits::with_reserved_quarter(1, 1);
        assert_eq!(one.reserved_for_authenticated, 0);
        assert_eq!(one.anonymous_share(), 1);
    }
}
