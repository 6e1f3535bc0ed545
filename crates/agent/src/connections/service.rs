//! The connections' service handle: the stores, the guarded outbound client and the sealing key
//! the connections API shares, and from which agentd makes the chats' [`ConnectionTools`] and
//! the operator's sign-in apps. Knows nothing of HTTP routing ([`super::api`] serves the
//! endpoints on it) and nothing of the chats.

use crate::catalog::files::FileTools;
use crate::connections::ConnectionTools;
use crate::connections::apps::McpApps;
use crate::connections::sealed::SealingKey;
use crate::connections::secrets::SecretStore;
use crate::connections::sign_in::PendingSignIns;
use crate::connections::store::ConnectionStore;
use crate::console::session::Sessions;
use crate::identity::IdentityStore;
use agentworks_support::outbound::GuardedClient;
use std::sync::Arc;

/// Everything the connections need. Cheap to clone.
#[derive(Clone)]
pub struct Connections {
    pub identity: IdentityStore,
    /// A person's live access to a project, checked at every request.
    pub files: FileTools,
    /// The projects' MCP connections, their sign-ins and the operator's sign-in apps.
    pub store: ConnectionStore,
    /// The guarded client the servers are called through (`None`: connections are not used,
    /// e.g. when a configured root certificate file is unusable).
    pub client: Option<GuardedClient>,
    /// The projects' sealed secrets (`None`: the sealing key is unusable, logged at start; the
    /// secrets API answers 503 and a connection that names a secret is not used).
    pub secrets: Option<SecretStore>,
    /// The key connection sign-ins are sealed with (`None`: unusable, logged at start; no
    /// sign-in is stored or used).
    pub sealing: Option<Arc<SealingKey>>,
    /// Connection sign-ins waiting for their callback.
    pub sign_ins: PendingSignIns,
    /// agentd's public URL: where a connection sign-in's callback comes back to.
    pub public_url: String,
    /// The console's sessions, accepted beside bearer tokens (none unless agentd sets them).
    pub sessions: Sessions,
}

impl Connections {
    /// The handle over `store`, with no client, secrets or sealing key until agentd sets them.
    pub fn new(identity: IdentityStore, files: FileTools, store: ConnectionStore) -> Connections {
        Connections {
            identity,
            files,
            sign_ins: PendingSignIns::new(store.clone()),
            store,
            client: None,
            secrets: None,
            sealing: None,
            public_url: String::new(),
            sessions: Sessions::default(),
        }
    }

    /// What a chat turn may use of the connections: their tools, and nothing else.
    pub fn tools(&self) -> ConnectionTools {
        ConnectionTools {
            identity: self.identity.clone(),
            files: self.files.clone(),
            store: self.store.clone(),
            client: self.client.clone(),
            secrets: self.secrets.clone(),
            sealing: self.sealing.clone(),
        }
    }

    /// The operator's sign-in apps (on `agentd.sock`), on the same store and sealing key.
    pub fn apps(&self) -> McpApps {
        McpApps {
            store: self.store.clone(),
            sealing: self.sealing.clone(),
            public_url: self.public_url.clone(),
        }
    }
}
