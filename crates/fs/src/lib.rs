//! File-system mechanism shared by the daemons and the laptop executor: confinement of every
//! path under a root directory (`openat2` with `RESOLVE_BENEATH`, or a component walk where
//! the kernel lacks it) ([`confine`]), the staged durable write ([`staged`]), making a private
//! directory through a descriptor ([`private_dir`]), and the crash-test failpoints
//! ([`failpoint`]).
//!
//! Must never decide policy: which paths may be written is the guard's (`agentworks_core`);
//! this only makes sure an opened path is the one under the root that was asked for.

pub mod confine;
pub mod failpoint;
pub mod private_dir;
pub mod staged;
