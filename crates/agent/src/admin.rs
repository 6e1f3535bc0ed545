//! agentd's socket API: the operator endpoints `agentworksctl` uses, and health.
//!
//! Every endpoint authorizes its peer by `SO_PEERCRED`, not only by who may open the socket:
//! operator endpoints serve root, agentd's own user (the quickstart case) and members of the
//! admin group; a gatewayd peer can never create users or tokens. Bodies and answers are JSON;
//! failures are the one error envelope.

use crate::identity::authority::FileGuard;
use crate::identity::store::TokenRequest;
use crate::identity::{IdentityError, IdentityStore, Role, Scope, TokenCheckError};
use agentworks_contract::envelope::Health;
use agentworks_contract::workspaced::{
    Context, EnsureProjectRequest, EnsureProjectResponse, Principal, Receipt, ReceiptRequest,
};
use agentworks_core::guard::Guard;
use agentworks_daemon::ipc::envelope::{Body, Refusal, decode_json, json_response, run_blocking};
use agentworks_daemon::ipc::server::{Peer, refuse_peer};
use agentworks_support::unix_http::ClientError;
use bytes::Bytes;
use hyper::http::request::Parts;
use hyper::{Method, Response, StatusCode};
use serde::Serialize;
use serde_json::json;
use std::collections::BTreeSet;

pub use agentworks_contract::agentd::{
    ApproveLoginRequest, ConsoleLink, CreateTokenRequest, ListRequest, MemberRequest,
    PasswordRequest, ProjectRequest, ReceiptShowRequest, RevokeRequest, TokenCheckRequest,
    TokenCheckResponse, TokenStatusRequest, TokenStatusResponse, UserRequest,
};

/// Who may use which endpoints, resolved once at start from the config.
#[derive(Debug, Clone)]
pub struct SocketPolicy {
    /// Root, our own uid and the admin group's members.
    operators: BTreeSet<u32>,
    admin_gid: Option<u32>,
    /// Root, our own uid and the configured gateway users.
    gateways: BTreeSet<u32>,
}

impl SocketPolicy {
    pub fn new(admin_group: &str, gateway_users: &[String]) -> SocketPolicy {
        let own = nix::unistd::geteuid().as_raw();
        let mut gateways = BTreeSet::from([0, own]);
        for name in gateway_users {
            match nix::unistd::User::from_name(name) {
                Ok(Some(user)) => {
                    gateways.insert(user.uid.as_raw());
                }
                _ => tracing::info!(user = %name, "gateway user does not exist; skipping it"),
            }
        }
        let mut operators = BTreeSet::from([0, own]);
        let group = nix::unistd::Group::from_name(admin_group).ok().flatten();
        if let Some(group) = &group {
            for member in &group.mem {
                if let Ok(Some(user)) = nix::unistd::User::from_name(member) {
                    operators.insert(user.uid.as_raw());
                }
            }
        } else {
            tracing::info!(
                group = admin_group,
                "the admin group does not exist; only root and agentd's user are operators"
            );
        }
        SocketPolicy {
            operators,
            admin_gid: group.map(|g| g.gid.as_raw()),
            gateways,
        }
    }

    pub fn is_operator(&self, peer: &Peer) -> bool {
        self.operators.contains(&peer.uid) || self.admin_gid.is_some_and(|gid| gid == peer.gid)
    }

    pub fn is_gateway(&self, peer: &Peer) -> bool {
        self.gateways.contains(&peer.uid)
    }
}

/// The socket API's state.
#[derive(Clone)]
pub struct Admin {
    /// The console's links (`<public_url>/console/…`) are made from it.
    pub public_url: String,
    pub identity: IdentityStore,
    pub workspaced: crate::clients::workspaced::WorkspacedClient,
    pub policy: std::sync::Arc<SocketPolicy>,
    /// The operator's MCP sign-in apps (`None` when the chat side could not open its stores).
    pub mcp_apps: Option<crate::connections::apps::McpApps>,
}

/// The socket API's refusal for an identity store error: its code, with the status that code
/// means.
impl From<IdentityError> for Refusal {
    fn from(e: IdentityError) -> Refusal {
        let status = match e.code() {
            "not_found" => StatusCode::NOT_FOUND,
            "already_exists" => StatusCode::CONFLICT,
            "invalid_request" => StatusCode::BAD_REQUEST,
            _ => StatusCode::SERVICE_UNAVAILABLE,
        };
        Refusal::new(status, e.code(), e.to_string())
    }
}

/// workspaced's own refusal as it came, or `workspaced_unavailable` if it could not be asked.
fn workspaced_error(e: ClientError) -> Refusal {
    match e {
        ClientError::Remote { status, body } => Refusal::relayed(status, body),
        other => Refusal::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "workspaced_unavailable",
            format!("workspaced is not reachable: {other}"),
        ),
    }
}

/// `token-check`'s refusal for a token agentd could not vouch for: 401 with the token's
/// refusal code, or the store's or the task's failure.
fn token_check_error(e: TokenCheckError) -> Refusal {
    match e {
        TokenCheckError::Refused(refusal) => {
            Refusal::new(StatusCode::UNAUTHORIZED, refusal.code(), refusal.message())
        }
        TokenCheckError::Store(e) => e.into(),
        e @ TokenCheckError::Task(_) => Refusal::internal(e.to_string()),
    }
}

/// An operator request body (an empty one is `{}`: list calls take no arguments).
fn decode<T: serde::de::DeserializeOwned>(body: &Bytes) -> Result<T, Refusal> {
    decode_json(if body.is_empty() { b"{}" } else { body })
}

/// Run a store call on a blocking thread and answer its result as JSON.
async fn blocking<T, F>(f: F) -> Result<Response<Body>, Refusal>
where
    T: Serialize + Send + 'static,
    F: FnOnce() -> Result<T, IdentityError> + Send + 'static,
{
    let value = run_blocking(f, Refusal::from).await?;
    Ok(json_response(StatusCode::OK, &value))
}

impl Admin {
    pub async fn handle(&self, peer: Peer, parts: Parts, body: Bytes) -> Response<Body> {
        self.route(&peer, &parts, &body)
            .await
            .unwrap_or_else(Refusal::into_response)
    }

    /// The endpoint's answer, after the peer check its path prefix needs.
    async fn route(
        &self,
        peer: &Peer,
        parts: &Parts,
        body: &Bytes,
    ) -> Result<Response<Body>, Refusal> {
        let path = parts.uri.path();
        if parts.method == Method::GET && path == "/v1/health" {
            return Ok(json_response(
                StatusCode::OK,
                &Health::ok("agentworks-agentd", env!("CARGO_PKG_VERSION")),
            ));
        }
        if let Some(rest) = path.strip_prefix("/v1/gateway/") {
            if !self.policy.is_gateway(peer) {
                let why = "not a gateway peer";
                return Ok(refuse_peer(peer, "agentd.sock", path, why));
            }
            return self.gateway(rest, body).await;
        }
        if let Some(rest) = path.strip_prefix("/v1/admin/") {
            if !self.policy.is_operator(peer) {
                let why = "not a operator peer";
                return Ok(refuse_peer(peer, "agentd.sock", path, why));
            }
            if rest == "mcp-apps" || rest.starts_with("mcp-apps/") {
                let Some(apps) = &self.mcp_apps else {
                    return Err(Refusal::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "unavailable",
                        "the MCP connection store could not be opened; see agentd's log",
                    ));
                };
                let key = rest.strip_prefix("mcp-apps/");
                return apps.handle(&parts.method, key, body).await;
            }
            if parts.method != Method::POST {
                return Err(Refusal::new(
                    StatusCode::METHOD_NOT_ALLOWED,
                    "method_not_allowed",
                    "use POST",
                ));
            }
            return self.operator(rest, body).await;
        }
        Err(Refusal::new(
            StatusCode::NOT_FOUND,
            "unknown_endpoint",
            format!(
                "{} {path} is not an endpoint of agentd's socket",
                parts.method
            ),
        ))
    }

    async fn gateway(&self, endpoint: &str, body: &Bytes) -> Result<Response<Body>, Refusal> {
        let id = self.identity.clone();
        match endpoint {
            "token-check" => {
                let r: TokenCheckRequest = decode(body)?;
                let (token, user) = id.check_bearer(&r.token).await.map_err(token_check_error)?;
                if token.scopes != [Scope::DevicesConnect] {
                    return Err(Refusal::new(
                        StatusCode::FORBIDDEN,
                        "insufficient_scope",
                        "executors connect with a devices:connect token (agentworks login)",
                    ));
                }
                Ok(json_response(
                    StatusCode::OK,
                    &TokenCheckResponse {
                        token_id: token.id,
                        user_id: user.id,
                        user_name: user.name,
                    },
                ))
            }
            "token-status" => {
                let r: TokenStatusRequest = decode(body)?;
                blocking(move || {
                    let now = agentworks_support::clock::now_ms();
                    let mut invalid = Vec::new();
                    for token_id in r.token_ids {
                        let live = match id.token_by_id(&token_id)? {
                            Some(t) => {
                                t.revoked_at_ms.is_none()
                                    && t.expires_at_ms.is_none_or(|e| e > now)
                                    && id.user_by_id(&t.user_id)?.is_some_and(|u| !u.disabled)
                            }
                            None => false,
                        };
                        if !live {
                            invalid.push(token_id);
                        }
                    }
                    Ok(TokenStatusResponse { invalid })
                })
                .await
            }
            other => Err(Refusal::new(
                StatusCode::NOT_FOUND,
                "unknown_endpoint",
                format!("/v1/gateway/{other} is not a gateway endpoint"),
            )),
        }
    }

    async fn operator(&self, endpoint: &str, body: &Bytes) -> Result<Response<Body>, Refusal> {
        let id = self.identity.clone();
        // `users/{name}/password|invites|sign-in-links`: the console's accounts.
        if let Some((name, action)) = endpoint
            .strip_prefix("users/")
            .and_then(|rest| rest.split_once('/'))
        {
            return self.account(name, action, body).await;
        }
        match endpoint {
            "users/add" => {
                let r: UserRequest = decode(body)?;
                blocking(move || id.add_user(&r.name)).await
            }
            "users/list" => blocking(move || id.list_users()).await,
            "users/disable" => {
                let r: UserRequest = decode(body)?;
                blocking(move || id.set_user_disabled(&r.name, true)).await
            }
            "users/enable" => {
                let r: UserRequest = decode(body)?;
                blocking(move || id.set_user_disabled(&r.name, false)).await
            }
            "projects/add" => self.add_project(body).await,
            "projects/list" => blocking(move || id.list_projects()).await,
            "members/add" => {
                let r: MemberRequest = decode(body)?;
                let role = r.role.unwrap_or(Role::Viewer);
                blocking(move || id.set_member(&r.project, &r.user, role)).await
            }
            "members/remove" => {
                let r: MemberRequest = decode(body)?;
                blocking(move || {
                    id.remove_member(&r.project, &r.user)
                        .map(|()| json!({"removed": true}))
                })
                .await
            }
            "members/list" => {
                let r: ListRequest = decode(body)?;
                let project = r.project.unwrap_or_default();
                blocking(move || id.list_members(&project)).await
            }
            "tokens/create" => self.create_token(body).await,
            "tokens/list" => {
                let r: ListRequest = decode(body)?;
                blocking(move || id.list_tokens(r.user.as_deref())).await
            }
            "tokens/revoke" => {
                let r: RevokeRequest = decode(body)?;
                blocking(move || id.revoke_token(&r.id)).await
            }
            "login/approve" => self.approve_login(body).await,
            "receipts/show" => self.show_receipt(body).await,
            other => Err(Refusal::new(
                StatusCode::NOT_FOUND,
                "unknown_endpoint",
                format!("/v1/admin/{other} is not an operator endpoint"),
            )),
        }
    }

    /// A user's console account: set the password, or make a one-time invite or sign-in link.
    async fn account(
        &self,
        name: &str,
        action: &str,
        body: &Bytes,
    ) -> Result<Response<Body>, Refusal> {
        use crate::identity::accounts::CodeKind;
        let id = self.identity.clone();
        let name = name.to_owned();
        let (kind, page) = match action {
            "password" => {
                let r: PasswordRequest = decode(body)?;
                return blocking(move || {
                    id.set_password(&name, &r.password)
                        .map(|user| json!({"user": user.name, "password_set": true}))
                })
                .await;
            }
            "invites" => (CodeKind::Invite, "invite"),
            "sign-in-links" => (CodeKind::SignIn, "sign-in"),
            other => {
                return Err(Refusal::new(
                    StatusCode::NOT_FOUND,
                    "unknown_endpoint",
                    format!("/v1/admin/users/{name}/{other} is not an operator endpoint"),
                ));
            }
        };
        let base = self.public_url.trim_end_matches('/').to_owned();
        blocking(move || {
            let code = id.create_code(&name, kind, agentworks_support::clock::now_ms())?;
            Ok(ConsoleLink {
                url: format!("{base}/console/{page}#code={}", code.code),
                expires_at_ms: code.expires_at_ms,
            })
        })
        .await
    }

    /// `projects/add`: the folder first (through workspaced, idempotent), then the project row.
    async fn add_project(&self, body: &Bytes) -> Result<Response<Body>, Refusal> {
        let id = self.identity.clone();
        let r: ProjectRequest = decode(body)?;
        let folder = r.folder.clone().unwrap_or_else(|| r.name.clone());
        crate::identity::store::validate_name("folder", &folder)?;
        // The folder first (idempotent), through the only writer of the documents tree.
        self.workspaced
            .post::<_, EnsureProjectResponse>(
                &folder,
                "/v1/projects/ensure",
                &EnsureProjectRequest {
                    project: folder.clone(),
                },
            )
            .await
            .map_err(workspaced_error)?;
        let policy = r.policy.clone().unwrap_or(Guard {
            write_paths: vec![".".into()],
            ..Guard::default()
        });
        blocking(move || id.add_project(&r.name, r.kind, &folder, &policy, &r.owner)).await
    }

    /// `tokens/create`: a new token; its secret is in this answer only.
    async fn create_token(&self, body: &Bytes) -> Result<Response<Body>, Refusal> {
        let id = self.identity.clone();
        let r: CreateTokenRequest = decode(body)?;
        blocking(move || {
            let (info, token) = id.create_token(&TokenRequest {
                user: r.user,
                label: r.label.unwrap_or_default(),
                scopes: r.scopes,
                project: r.project,
                expires_at_ms: r.expires_at_ms,
                file_guard: FileGuard {
                    write_folders: r.write_folders,
                    read_only_folders: r.read_only_folders,
                },
            })?;
            Ok(json!({"token": token, "info": info}))
        })
        .await
    }

    /// `login/approve`: an operator approves a pending device login for a user.
    async fn approve_login(&self, body: &Bytes) -> Result<Response<Body>, Refusal> {
        let id = self.identity.clone();
        let r: ApproveLoginRequest = decode(body)?;
        blocking(move || {
            id.user_by_name(&r.user)?.ok_or(IdentityError::NotFound {
                kind: "user",
                name: r.user.clone(),
            })?;
            match id.decide_device_login(
                &r.user_code,
                &r.user,
                true,
                agentworks_support::clock::now_ms(),
            )? {
                Ok(_) => Ok(json!({"approved": true, "user": r.user})),
                Err(crate::identity::device_logins::DecideError::NotFound) => {
                    Err(IdentityError::NotFound {
                        kind: "pending login",
                        name: r.user_code,
                    })
                }
                Err(crate::identity::device_logins::DecideError::AlreadyDecided) => {
                    Err(IdentityError::Invalid(format!(
                        "the login {} was already approved or denied",
                        r.user_code
                    )))
                }
            }
        })
        .await
    }

    /// `receipts/show`: a person's receipt for a request id, from workspaced.
    async fn show_receipt(&self, body: &Bytes) -> Result<Response<Body>, Refusal> {
        let id = self.identity.clone();
        let r: ReceiptShowRequest = decode(body)?;
        let (project, user, request_id) = run_blocking(
            move || {
                let project = id
                    .find_project(&r.project)?
                    .ok_or(IdentityError::NotFound {
                        kind: "project",
                        name: r.project.clone(),
                    })?;
                let user = id.user_by_name(&r.user)?.ok_or(IdentityError::NotFound {
                    kind: "user",
                    name: r.user.clone(),
                })?;
                Ok::<_, IdentityError>((project, user, r.request_id))
            },
            Refusal::from,
        )
        .await?;
        let context = Context {
            project: project.folder,
            principal: Principal {
                user_id: user.id,
                user_name: user.name,
                connection_id: None,
                source: "ctl".into(),
            },
            guard: Guard::default(),
        };
        let request = ReceiptRequest {
            context,
            request_id,
        };
        let receipt: Receipt = self
            .workspaced
            .post(&request.context.project, "/v1/receipt", &request)
            .await
            .map_err(workspaced_error)?;
        Ok(json_response(StatusCode::OK, &receipt))
    }
}
