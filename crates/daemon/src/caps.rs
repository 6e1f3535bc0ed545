//! Dropping Linux capabilities at daemon start.
//!
//! Owns reducing the process to the capabilities it names and nothing else, in an order the
//! kernel accepts (ambient, then bounding while CAP_SETPCAP is still effective, then
//! inheritable, effective, permitted).
//!
//! Must never raise a capability the process does not already hold in its permitted set.
//! Capability sets are per thread: call [`retain_only`] before starting the tokio runtime or
//! any other thread, so every thread inherits the reduced sets.

use ::caps::{CapSet, Capability, CapsHashSet};

/// Why capabilities could not be dropped.
#[derive(Debug, thiserror::Error)]
pub enum CapsError {
    /// Reading a capability set failed.
    #[error("cannot read the {set:?} capability set: {source}")]
    Read {
        set: CapSet,
        source: ::caps::errors::CapsError,
    },
    /// Clearing the ambient set failed.
    #[error("cannot clear the ambient capability set: {source}")]
    ClearAmbient { source: ::caps::errors::CapsError },
    /// Dropping a capability from the bounding set failed.
    #[error("cannot drop {cap} from the bounding set: {source}")]
    DropBounding {
        cap: Capability,
        source: ::caps::errors::CapsError,
    },
    /// Writing a capability set failed.
    #[error("cannot set the {set:?} capability set to {wanted:?}: {source}")]
    Set {
        set: CapSet,
        wanted: Vec<Capability>,
        source: ::caps::errors::CapsError,
    },
}

fn read(set: CapSet) -> Result<CapsHashSet, CapsError> {
    ::caps::read(None, set).map_err(|source| CapsError::Read { set, source })
}

fn write(set: CapSet, value: &CapsHashSet) -> Result<(), CapsError> {
    ::caps::set(None, set, value).map_err(|source| CapsError::Set {
        set,
        wanted: sorted(value),
        source,
    })
}

fn sorted(set: &CapsHashSet) -> Vec<Capability> {
    let mut v: Vec<Capability> = set.iter().copied().collect();
    v.sort_by_key(|c| c.index());
    v
}

/// Drops every capability from the effective, permitted, inheritable and ambient sets and the
/// bounding set (bounding only if we hold CAP_SETPCAP) except those in `keep` that we currently
/// have in the permitted set. Returns the kept ones, sorted by number.
///
/// A process without any capabilities (the normal rootless case) succeeds doing nothing. The
/// kept capabilities end up effective, so the daemon can use them without raising.
pub fn retain_only(keep: &[Capability]) -> Result<Vec<Capability>, CapsError> {
    let permitted = read(CapSet::Permitted)?;
    let effective = read(CapSet::Effective)?;
    let inheritable = read(CapSet::Inheritable)?;
    let ambient = read(CapSet::Ambient)?;
    let kept: CapsHashSet = keep
        .iter()
        .copied()
        .filter(|c| permitted.contains(c))
        .collect();

    // 1. Ambient first: ambient capabilities are granted across execve without file caps, and
    //    clearing them needs no privilege.
    if !ambient.is_empty() {
        ::caps::clear(None, CapSet::Ambient)
            .map_err(|source| CapsError::ClearAmbient { source })?;
    }

    // 2. Bounding while CAP_SETPCAP can still be made effective: dropping from the bounding set
    //    needs it, and it is gone after step 4 unless kept.
    if permitted.contains(&Capability::CAP_SETPCAP) {
        if !effective.contains(&Capability::CAP_SETPCAP) {
            let mut with_setpcap = effective.clone();
            with_setpcap.insert(Capability::CAP_SETPCAP);
            write(CapSet::Effective, &with_setpcap)?;
        }
        for cap in sorted(&read(CapSet::Bounding)?) {
            if !kept.contains(&cap) {
                ::caps::drop(None, CapSet::Bounding, cap)
                    .map_err(|source| CapsError::DropBounding { cap, source })?;
            }
        }
    }

    // 3. Inheritable: only ever lowered, never raised.
    let new_inheritable: CapsHashSet = inheritable.intersection(&kept).copied().collect();
    if new_inheritable != inheritable {
        write(CapSet::Inheritable, &new_inheritable)?;
    }

    // 4. Effective before permitted: the kernel refuses an effective set larger than the
    //    permitted one.
    if read(CapSet::Effective)? != kept {
        write(CapSet::Effective, &kept)?;
    }
    if permitted != kept {
        write(CapSet::Permitted, &kept)?;
    }
    Ok(sorted(&kept))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `f` on a fresh thread: capability sets are per thread, so the test runner's other
    /// threads keep theirs.
    fn on_own_thread<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        std::thread::spawn(f).join().unwrap()
    }

    #[test]
    fn keeps_only_what_is_asked_and_held() {
        on_own_thread(|| {
            let before = ::caps::read(None, CapSet::Permitted).unwrap();
            let kept = retain_only(&[Capability::CAP_CHOWN, Capability::CAP_FOWNER]).unwrap();
            let expected: Vec<Capability> = [Capability::CAP_CHOWN, Capability::CAP_FOWNER]
                .into_iter()
                .filter(|c| before.contains(c))
                .collect();
            assert_eq!(kept, expected);
            let expected_set: CapsHashSet = expected.iter().copied().collect();
            assert_eq!(::caps::read(None, CapSet::Permitted).unwrap(), expected_set);
            assert_eq!(::caps::read(None, CapSet::Effective).unwrap(), expected_set);
            assert!(::caps::read(None, CapSet::Ambient).unwrap().is_empty());
            assert!(
                ::caps::read(None, CapSet::Inheritable)
                    .unwrap()
                    .is_subset(&expected_set)
            );
            if before.contains(&Capability::CAP_SETPCAP) {
                let bounding = ::caps::read(None, CapSet::Bounding).unwrap();
                assert!(bounding.is_subset(&expected_set), "{bounding:?}");
            }
            // A second call with the same list is a no-op that keeps the same set.
            assert_eq!(
                retain_only(&[Capability::CAP_CHOWN, Capability::CAP_FOWNER]).unwrap(),
                expected
            );
        });
    }

    #[test]
    fn without_capabilities_it_succeeds_doing_nothing() {
        on_own_thread(|| {
            retain_only(&[]).unwrap();
            assert!(::caps::read(None, CapSet::Permitted).unwrap().is_empty());
            // Now we are the rootless case: asking for a capability we lack keeps nothing.
            assert_eq!(retain_only(&[Capability::CAP_NET_ADMIN]).unwrap(), vec![]);
        });
    }
}
