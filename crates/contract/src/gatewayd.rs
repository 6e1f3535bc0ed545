//! `gatewayd.sock`: the dispatch API gatewayd serves to agentd (list a person's devices,
//! dispatch a request to one, look up, cancel or recover its outcome).
//!
//! The operations and outcomes themselves are the executor protocol's ([`crate::executor`]):
//! agentd's request is forwarded to the laptop as it is.

use serde::{Deserialize, Serialize};

use crate::executor::{FolderInfo, Operation, Outcome};

/// A connected (or recently seen) device, as listed to its owner.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceInfo {
    pub device_id: String,
    pub name: String,
    pub user_id: String,
    pub online: bool,
    pub folders: Vec<FolderInfo>,
    pub connected_at_ms: Option<i64>,
    pub last_seen_ms: i64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DevicesRequest {
    /// Only this person's devices are ever listed.
    pub user_id: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DispatchRequest {
    /// The person on whose behalf agentd dispatches; must own the device.
    pub user_id: String,
    pub device_id: String,
    pub folder: String,
    /// Made by the server (agentd), unique per intended operation.
    pub request_id: String,
    pub operation: Operation,
}

/// The answer to a dispatch or an outcome lookup.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum DispatchState {
    Done {
        outcome: Outcome,
    },
    /// Still running on the laptop.
    Pending,
    /// The device disconnected (or its token was revoked) while the request was pending: the
    /// outcome is unknown; it is never re-sent.
    Unknown {
        reason: String,
    },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestRef {
    pub user_id: String,
    pub request_id: String,
}

/// The answer to `POST /v1/recover` (body: the [`DispatchRequest`] whose answer agentd lost).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "recovery", rename_all = "snake_case")]
pub enum Recovery {
    /// The request's final state: as recorded, or recovered now from the device's receipt
    /// (`from_receipt`). `Unknown` here is for good: the device has no receipt of it, or it
    /// was recorded unknown and the device's receipt cannot change that.
    Settled {
        state: DispatchState,
        from_receipt: bool,
    },
    /// gatewayd had no record of the request id, so it was never sent (a request is recorded
    /// before it is sent); the id is now claimed, so it never will be.
    NeverSent,
    /// Not final yet (still running, the device is offline, or it did not answer the receipt
    /// query): ask again later.
    Unsettled { reason: String },
}

/// `POST /v1/locate` (a cluster): where a device's connection is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LocateRequest {
    /// The person asking; must own the device (else `not_found`).
    pub user_id: String,
    pub device_id: String,
}

/// The answer to `POST /v1/locate`: the gatewayd host whose live lease the device is under
/// (an offline device is refused `device_offline`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Located {
    pub host_id: String,
}

/// The answer to `POST /v1/watch` (body: a [`DispatchRequest`] sent to another host): what the
/// shared database says of it now. A record of another request under its id is refused
/// `request_id_reused`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Watched {
    /// The request's recorded state (pending included); `None` if no host recorded it yet.
    pub state: Option<DispatchState>,
    /// The host whose live lease the request's device is under, if any and if the device is
    /// the request's person's.
    pub holder: Option<String>,
}

/// The answer to `POST /v1/cancel`: whether a cancel frame was sent (only while the request
/// is pending on a connected device), and the request's state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CancelResponse {
    pub cancel_sent: bool,
    #[serde(flatten)]
    pub state: DispatchState,
}

/// gatewayd's `GET /v1/health`: the common answer and how many laptops are connected now.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct GatewayHealth {
    #[serde(flatten)]
    pub health: crate::envelope::Health,
    /// Live executor sessions.
    pub connected: usize,
}
