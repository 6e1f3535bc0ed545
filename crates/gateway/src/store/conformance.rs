//! The store's behaviour, written once and run on both back ends: SQLite by this crate's unit
//! tests, SQLite and a real PostgreSQL server by `tests/suite/gateway_store.rs` (with the
//! `store-conformance` feature). Each function takes `open`, which opens (or reopens) one
//! and the same database at a time `now_ms` and returns the store and how many pending
//! requests it reconciled, as [`Store::open_sqlite`] and [`Store::open_postgres`] do; two
//! calls give two independent stores (two connections, as two processes or hosts would have).
//!
//! Test code: it panics on the first broken expectation.
#![allow(clippy::unwrap_used, clippy::panic)]

use std::sync::{Arc, Barrier};

use agentworks_contract::executor::{FolderAccess, FolderInfo, Outcome};
use agentworks_contract::gatewayd::DispatchState;

use super::{Begin, Lease, NEVER_SENT_REASON, NewRequest, RESTART_REASON, Store, lease_expiry};

/// Opens the database under test at a time; see the module doc.
pub type Open<'a> = &'a dyn Fn(i64) -> (Store, usize);

fn folders() -> Vec<FolderInfo> {
    vec![FolderInfo {
        alias: "proj".into(),
        access: FolderAccess::ReadWrite,
        downloads: false,
    }]
}

/// A request of user `u1` to device `d1`, folder `proj`, with payload fingerprint `payload`.
pub fn new_request<'a>(request_id: &'a str, payload: &'a str) -> NewRequest<'a> {
    NewRequest {
        request_id,
        user_id: "u1",
        device_id: "d1",
        folder: "proj",
        kind: "shell",
        payload_sha256: payload,
    }
}

/// A device id is stable per `(user, credential, name)`; another credential never gets it.
pub fn device_ids_are_stable_per_user_credential_and_name(open: Open<'_>) {
    let (store, _) = open(1);
    let a = store
        .register_device("u1", "t1", "laptop", &folders(), "1", 10)
        .unwrap();
    assert!(!a.name_clash);
    let again = store
        .register_device("u1", "t1", "laptop", &[], "2", 20)
        .unwrap();
    let other_user = store
        .register_device("u2", "t9", "laptop", &[], "1", 30)
        .unwrap();
    assert_eq!(a, again);
    assert_ne!(a.device_id, other_user.device_id);
    assert!(!other_user.name_clash, "another person's names never clash");
    // Another credential of the same person, same name: its own device, never the first.
    let other_token = store
        .register_device("u1", "t2", "laptop", &[], "1", 40)
        .unwrap();
    assert_ne!(other_token.device_id, a.device_id);
    assert!(other_token.name_clash);
    let first = store.device(&a.device_id).unwrap().unwrap();
    assert_eq!(first.token_id.as_deref(), Some("t1"));
    assert_eq!(first.last_seen_ms, 20);
    assert!(first.folders.is_empty());
    let listed = store.devices_of("u1", 0).unwrap();
    assert_eq!(listed.len(), 2);
    assert!(store.devices_of("u1", 41).unwrap().is_empty());
    assert_eq!(
        store
            .device(&other_user.device_id)
            .unwrap()
            .unwrap()
            .user_id,
        "u2"
    );
}

/// A request id is recorded once, its first final state stays, and what was pending is
/// `unknown` once the store is opened again (gatewayd restarted).
pub fn a_request_id_is_recorded_once_and_pending_becomes_unknown_at_reopen(open: Open<'_>) {
    let (store, _) = open(1);
    assert_eq!(
        store.begin_request(&new_request("r1", "h1"), 5).unwrap(),
        Begin::New
    );
    assert_eq!(
        store.begin_request(&new_request("r2", "h2"), 5).unwrap(),
        Begin::New
    );
    let done = DispatchState::Done {
        outcome: Outcome::Refused {
            code: "x".into(),
            message: "y".into(),
        },
    };
    store.finish_request("r1", &done, 6).unwrap();
    // A second final state never overwrites the first.
    store
        .finish_request(
            "r1",
            &DispatchState::Unknown {
                reason: "late".into(),
            },
            7,
        )
        .unwrap();
    match store.begin_request(&new_request("r1", "h1"), 8).unwrap() {
        Begin::Existing(record) => {
            assert_eq!(record.state, done);
            assert_eq!(record.payload_sha256.as_deref(), Some("h1"));
        }
        other => panic!("{other:?}"),
    }
    drop(store);
    let (store, reconciled) = open(9);
    assert_eq!(reconciled, 1);
    assert_eq!(store.request("r1").unwrap().unwrap().state, done);
    assert_eq!(
        store.request("r2").unwrap().unwrap().state,
        DispatchState::Unknown {
            reason: RESTART_REASON.into()
        }
    );
    assert!(store.request("r3").unwrap().is_none());
}

/// Only a sent `unknown` request is settled from a receipt; an id claimed unsent never is, and a
/// dispatch with it finds the claim.
pub fn only_a_sent_unknown_request_is_recovered_and_a_claimed_id_is_never_sent(open: Open<'_>) {
    let (store, _) = open(1);
    let outcome = Outcome::Refused {
        code: "x".into(),
        message: "y".into(),
    };
    store.begin_request(&new_request("sent", "h"), 1).unwrap();
    // Pending: not recoverable (its result frame may still come).
    assert!(!store.recover_request("sent", &outcome, 2).unwrap());
    let unknown = DispatchState::Unknown {
        reason: "lost".into(),
    };
    store.finish_request("sent", &unknown, 3).unwrap();
    assert!(store.recover_request("sent", &outcome, 4).unwrap());
    assert_eq!(
        store.request("sent").unwrap().unwrap().state,
        DispatchState::Done {
            outcome: outcome.clone()
        }
    );
    assert!(
        !store.recover_request("sent", &outcome, 5).unwrap(),
        "done stays done"
    );

    // A claim records the id as never sent; a dispatch with it then finds the claim.
    assert_eq!(
        store.claim_unsent(&new_request("lost", "h"), 6).unwrap(),
        Begin::New
    );
    match store.begin_request(&new_request("lost", "h"), 7).unwrap() {
        Begin::Existing(record) => {
            assert!(!record.sent);
            assert_eq!(
                record.state,
                DispatchState::Unknown {
                    reason: NEVER_SENT_REASON.into()
                }
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(!store.recover_request("lost", &outcome, 8).unwrap());
    assert!(matches!(
        store.claim_unsent(&new_request("sent", "h"), 9).unwrap(),
        Begin::Existing(_)
    ));
}

/// Two stores (two connections: two processes, or two hosts on PostgreSQL) claim the same
/// request ids at the same moment, from several threads each: every id is recorded once, and
/// exactly one claim of each may send it.
pub fn two_stores_claiming_one_request_id_at_once_record_it_once(open: Open<'_>) {
    const IDS: usize = 20;
    const THREADS_PER_STORE: usize = 4;
    let stores = [open(1).0, open(1).0];
    let barrier = Arc::new(Barrier::new(2 * THREADS_PER_STORE));
    let mut threads = Vec::new();
    for (host, store) in stores.iter().enumerate() {
        for thread in 0..THREADS_PER_STORE {
            let (store, barrier) = (store.clone(), barrier.clone());
            threads.push(std::thread::spawn(move || {
                barrier.wait();
                let mut won = Vec::new();
                for i in 0..IDS {
                    let id = format!("race-{i}");
                    let request = new_request(&id, "h");
                    // Half the claimers record to send, half claim unsent (a recovery): any
                    // mix, one winner.
                    let begun = if (host + thread) % 2 == 0 {
                        store.begin_request(&request, 2)
                    } else {
                        store.claim_unsent(&request, 2)
                    };
                    if begun.unwrap() == Begin::New {
                        won.push(i);
                    }
                }
                won
            }));
        }
    }
    let mut winners = [0usize; IDS];
    for thread in threads {
        for i in thread.join().unwrap() {
            winners[i] += 1;
        }
    }
    assert_eq!(winners, [1; IDS], "each id must be claimed exactly once");
    for i in 0..IDS {
        assert!(stores[1].request(&format!("race-{i}")).unwrap().is_some());
    }
}

/// A lease is taken (over another host's), renewed only while live, released only by its
/// holder, and gone once its host missed three renewals.
pub fn leases_are_taken_renewed_released_and_expire_after_three_missed_renewals(open: Open<'_>) {
    let devices = |ids: &[&str]| ids.iter().map(|id| id.to_string()).collect::<Vec<_>>();
    let (store, _) = open(1);
    let every = 1_000;
    // Host a takes d1 at 0: it lasts three renewal periods.
    assert_eq!(
        store
            .take_lease("d1", "a", 0, lease_expiry(0, every))
            .unwrap(),
        None
    );
    let a_holds = |expires_at_ms| Lease {
        device_id: "d1".into(),
        host_id: "a".into(),
        expires_at_ms,
    };
    assert_eq!(store.lease("d1", 0).unwrap(), Some(a_holds(3_000)));
    assert_eq!(store.lease("d2", 0).unwrap(), None);
    // Taking it again is renewing it; a renewal of the host's leases extends them.
    assert_eq!(
        store
            .take_lease("d1", "a", 500, lease_expiry(500, every))
            .unwrap(),
        None
    );
    assert_eq!(
        store
            .renew_leases("a", &devices(&["d1"]), 1_000, lease_expiry(1_000, every))
            .unwrap(),
        1
    );
    assert_eq!(store.lease("d1", 3_999).unwrap(), Some(a_holds(4_000)));
    // Host b takes d2; the device d1 reconnects to b while a's lease is live: b takes it and
    // learns that a still held it (a's connection is stale).
    store
        .take_lease("d2", "b", 1_000, lease_expiry(1_000, every))
        .unwrap();
    assert_eq!(
        store
            .take_lease("d1", "b", 1_500, lease_expiry(1_500, every))
            .unwrap(),
        Some(a_holds(4_000))
    );
    assert_eq!(store.lease("d1", 1_500).unwrap().unwrap().host_id, "b");
    // a no longer holds anything: its renewal (its stale connection still listed) takes
    // nothing from b's live lease, its release releases nothing.
    assert_eq!(
        store
            .renew_leases("a", &devices(&["d1"]), 2_000, lease_expiry(2_000, every))
            .unwrap(),
        0
    );
    assert!(!store.release_lease("d1", "a").unwrap());
    assert_eq!(store.lease("d1", 2_000).unwrap().unwrap().host_id, "b");
    // b renews at 2 000, then misses three renewals: at 5 000 its leases are gone.
    assert_eq!(
        store
            .renew_leases(
                "b",
                &devices(&["d1", "d2"]),
                2_000,
                lease_expiry(2_000, every)
            )
            .unwrap(),
        2
    );
    assert!(store.expire_leases(4_999).unwrap().is_empty());
    assert!(store.lease("d1", 4_999).unwrap().is_some());
    assert_eq!(
        store.lease("d1", 5_000).unwrap(),
        None,
        "expired is not live"
    );
    let expired = store.expire_leases(5_000).unwrap();
    let expired: Vec<(&str, &str)> = expired
        .iter()
        .map(|l| (l.device_id.as_str(), l.host_id.as_str()))
        .collect();
    assert_eq!(expired, [("d1", "b"), ("d2", "b")]);
    assert!(store.expire_leases(5_000).unwrap().is_empty());
    // b was only cut off (a database outage): its next renewal takes back the leases of the
    // devices still connected to it, and drops its lease on one that is not.
    assert_eq!(
        store
            .renew_leases(
                "b",
                &devices(&["d1", "d2"]),
                5_500,
                lease_expiry(5_500, every)
            )
            .unwrap(),
        2
    );
    assert_eq!(store.lease("d2", 5_500).unwrap().unwrap().host_id, "b");
    assert_eq!(
        store
            .renew_leases("b", &devices(&["d2"]), 5_600, lease_expiry(5_600, every))
            .unwrap(),
        1
    );
    assert_eq!(store.lease("d1", 5_600).unwrap(), None);
    assert!(store.release_lease("d2", "b").unwrap());
    // A taken lease is released by its holder, and then free for anyone.
    store
        .take_lease("d1", "c", 6_000, lease_expiry(6_000, every))
        .unwrap();
    assert!(store.release_lease("d1", "c").unwrap());
    assert_eq!(store.lease("d1", 6_000).unwrap(), None);
    assert_eq!(
        store
            .take_lease("d1", "a", 6_000, lease_expiry(6_000, every))
            .unwrap(),
        None
    );
    // Leases survive a reopen: they are the shared truth, not one process's memory.
    drop(store);
    let (store, _) = open(7_000);
    assert_eq!(store.lease("d1", 7_000).unwrap().unwrap().host_id, "a");
}

/// The live leases of one person's devices come back in one list: only that person's devices
/// (not another person's, even one with the same name, nor a lease on an unknown device id),
/// only live leases (one past its expiry is not, even before it is deleted), with the holder
/// the latest take left.
pub fn a_persons_live_leases_are_listed_in_one_query(open: Open<'_>) {
    let (store, _) = open(1);
    let every = 1_000;
    let register = |user: &str, token: &str, name: &str| {
        store
            .register_device(user, token, name, &folders(), "1", 10)
            .unwrap()
            .device_id
    };
    let laptop = register("u1", "t1", "laptop");
    let desktop = register("u1", "t1", "desktop");
    let idle = register("u1", "t1", "idle");
    let theirs = register("u2", "t2", "laptop");
    let holders = |user: &str, now: i64| -> Vec<(String, String, i64)> {
        store
            .live_leases_of(user, now)
            .unwrap()
            .into_iter()
            .map(|l| (l.device_id, l.host_id, l.expires_at_ms))
            .collect()
    };
    assert!(holders("u1", 0).is_empty(), "no lease yet");
    // u1's laptop on host a, its desktop on host b (renewed later), u2's laptop on host a, and
    // a lease on a device id nobody registered; u1's idle device has none.
    for (device, host, at) in [
        (&laptop, "a", 0),
        (&desktop, "b", 0),
        (&theirs, "a", 0),
        (&"unregistered".to_owned(), "a", 0),
    ] {
        store
            .take_lease(device, host, at, lease_expiry(at, every))
            .unwrap();
    }
    store
        .renew_leases(
            "b",
            std::slice::from_ref(&desktop),
            2_000,
            lease_expiry(2_000, every),
        )
        .unwrap();
    let mut expected = vec![
        (laptop.clone(), "a".to_owned(), 3_000),
        (desktop.clone(), "b".to_owned(), 5_000),
    ];
    expected.sort();
    assert_eq!(holders("u1", 2_999), expected);
    assert_eq!(
        holders("u2", 2_999),
        [(theirs.clone(), "a".to_owned(), 3_000)]
    );
    assert!(holders("u3", 2_999).is_empty(), "a person with no devices");
    // At 3 000 host a's leases have expired, though nothing deleted them yet: not live.
    assert_eq!(
        holders("u1", 3_000),
        [(desktop.clone(), "b".to_owned(), 5_000)]
    );
    assert!(holders("u2", 3_000).is_empty());
    // The laptop reconnects to host c: c is its holder now; the desktop's host releases it.
    store
        .take_lease(&laptop, "c", 3_500, lease_expiry(3_500, every))
        .unwrap();
    assert!(store.release_lease(&desktop, "b").unwrap());
    assert_eq!(
        holders("u1", 3_500),
        [(laptop.clone(), "c".to_owned(), 6_500)]
    );
    // The list agrees with the one-device lookup it replaces.
    for device in [&laptop, &desktop, &idle] {
        let one = store.lease(device, 3_500).unwrap();
        let listed = store
            .live_leases_of("u1", 3_500)
            .unwrap()
            .into_iter()
            .find(|l| l.device_id == *device);
        assert_eq!(one, listed, "{device}");
    }
}
