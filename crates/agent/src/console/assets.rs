//! The console's pages and assets: plain HTML, CSS and JavaScript modules embedded in agentd
//! at build time (`include_str!` from `console/assets/`), so the packages carry nothing beside
//! the binary and nothing is read from disk at run time.
//!
//! | request | answer |
//! | --- | --- |
//! | `GET /`, `GET /console` | 303 to `/console/` |
//! | `GET /console/<path>` (not under `assets/`) | `index.html`; the app routes on `location.pathname` |
//! | `GET /console/assets/<name>` | the embedded file with its Content-Type, else 404 |
//! | any other method on these paths | 405 (`HEAD` is answered like `GET`) |
//!
//! Every answer, errors and redirects included, carries [`SECURITY_HEADERS`]; HTML is
//! `Cache-Control: no-store`. Must never serve a file by a name it was not given in [`ASSETS`]:
//! an asset is looked up by exact name in a fixed table, so no request path reaches the file
//! system, and page paths with dot segments, encoded bytes or backslashes are refused (404).

use agentworks_daemon::ipc::envelope::{Body, error_response, full};
use hyper::header::{
    ALLOW, CACHE_CONTROL, CONTENT_TYPE, HeaderName, HeaderValue, LOCATION, REFERRER_POLICY,
    X_CONTENT_TYPE_OPTIONS, X_FRAME_OPTIONS,
};
use hyper::http::request::Parts;
use hyper::{Method, Response, StatusCode};

/// The Content-Security-Policy of every console response: only this origin's scripts, styles
/// and connections, no inline script or style, never framed.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// The headers every console page, asset, redirect and error carries.
pub const SECURITY_HEADERS: [(HeaderName, &str); 4] = [
    (
        HeaderName::from_static("content-security-policy"),
        CONTENT_SECURITY_POLICY,
    ),
    (X_CONTENT_TYPE_OPTIONS, "nosniff"),
    (REFERRER_POLICY, "no-referrer"),
    (X_FRAME_OPTIONS, "DENY"),
];

const HTML: &str = "text/html; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";
const JS: &str = "text/javascript; charset=utf-8";

/// One embedded file of `console/assets/`.
pub struct Asset {
    /// Its name under `/console/assets/`.
    pub name: &'static str,
    pub content_type: &'static str,
    pub bytes: &'static [u8],
}

macro_rules! asset {
    ($name:literal, $content_type:expr) => {
        Asset {
            name: $name,
            content_type: $content_type,
            bytes: include_bytes!(concat!("assets/", $name)),
        }
    };
}

/// The app's page, answered for every `/console/…` path that is not an asset.
pub const INDEX_HTML: &str = include_str!("assets/index.html");

/// The device-login approval page, answered at `GET /v1/device/approve` (see
/// [`crate::oauth::device`]); its script is `device-approve.js`.
pub const DEVICE_APPROVE_HTML: &str = include_str!("assets/device-approve.html");

/// The OAuth consent page, answered at `GET /oauth/consent?request=…`; its script is
/// `oauth-consent.js`.
pub const OAUTH_CONSENT_HTML: &str = include_str!("assets/oauth-consent.html");

/// Every file served under `/console/assets/` (a unit test checks the folder has no other).
pub const ASSETS: &[Asset] = &[
    asset!("style.css", CSS),
    asset!("api.js", JS),
    asset!("app.js", JS),
    asset!("apps.js", JS),
    asset!("chat.js", JS),
    asset!("device-approve.js", JS),
    asset!("dom.js", JS),
    asset!("messages.js", JS),
    asset!("oauth.js", JS),
    asset!("oauth-consent.js", JS),
    asset!("panel.js", JS),
    asset!("paths.js", JS),
    asset!("quote.js", JS),
    asset!("settings.js", JS),
    asset!("sse.js", JS),
];

/// Answers a console path (`/`, `/console`, `/console/…`), or `None` for any other path.
pub fn handle(parts: &Parts) -> Option<Response<Body>> {
    let path = parts.uri.path();
    let target = if path == "/" || path == "/console" {
        Target::Home
    } else if let Some(name) = path.strip_prefix("/console/assets/") {
        Target::Asset(name)
    } else if let Some(rest) = path.strip_prefix("/console/") {
        Target::Page(rest)
    } else {
        return None;
    };
    let mut response = if parts.method != Method::GET && parts.method != Method::HEAD {
        get_only(&parts.method, path)
    } else {
        match target {
            Target::Home => redirect_home(),
            Target::Asset(name) => match ASSETS.iter().find(|a| a.name == name) {
                Some(asset) => asset_response(asset),
                None => not_found(path),
            },
            Target::Page(rest) if is_page_path(rest) => page(INDEX_HTML),
            Target::Page(_) => not_found(path),
        }
    };
    add_security_headers(&mut response);
    Some(response)
}

/// The answer to `method` (neither GET nor HEAD) on a path served for reading only: 405 with
/// `Allow: GET, HEAD` (also the laptop CLI's, [`super::laptop_cli`]).
pub fn get_only(method: &Method, path: &str) -> Response<Body> {
    let mut refused = error_response(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!("{method} is not served on {path}; use GET"),
        Default::default(),
    );
    refused
        .headers_mut()
        .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
    refused
}

enum Target<'a> {
    Home,
    Asset(&'a str),
    Page(&'a str),
}

/// An HTML page of the console (status 200, `no-store`, the security headers): also what
/// agentd's other pages, such as the device approval page, answer with.
pub fn page(html: &'static str) -> Response<Body> {
    let mut response = Response::new(full(html));
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(HTML));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    add_security_headers(&mut response);
    response
}

/// Sets [`SECURITY_HEADERS`] on `response`, replacing any it had.
pub fn add_security_headers(response: &mut Response<Body>) {
    let headers = response.headers_mut();
    for (name, value) in SECURITY_HEADERS {
        headers.insert(name, HeaderValue::from_static(value));
    }
}

fn asset_response(asset: &Asset) -> Response<Body> {
    let mut response = Response::new(full(asset.bytes));
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(asset.content_type));
    // Asset names carry no version: a new agentd must not be paired with a stale module.
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

fn redirect_home() -> Response<Body> {
    let mut response = Response::new(full(""));
    *response.status_mut() = StatusCode::SEE_OTHER;
    response
        .headers_mut()
        .insert(LOCATION, HeaderValue::from_static("/console/"));
    response
}

/// A path the app routes (`chats/c0123…`, `invite`, `sign-in`, empty for home): plain segments
/// only. A `.` or `..` segment, an empty segment, a percent-encoded byte or a backslash is
/// never one of the app's paths, so it is refused rather than answered with the page.
fn is_page_path(rest: &str) -> bool {
    rest.is_empty()
        || rest.trim_end_matches('/').split('/').all(|segment| {
            !segment.is_empty()
                && segment != "."
                && segment != ".."
                && segment
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.~".contains(&b))
        })
}

fn not_found(path: &str) -> Response<Body> {
    error_response(
        StatusCode::NOT_FOUND,
        "not_found",
        format!("{path} is not a page or an asset of the console"),
        Default::default(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use hyper::Request;

    fn get(method: Method, path: &str) -> Option<Response<Body>> {
        let (parts, ()) = Request::builder()
            .method(method)
            .uri(path)
            .body(())
            .expect("a valid request")
            .into_parts();
        handle(&parts)
    }

    fn answer(method: Method, path: &str) -> Response<Body> {
        get(method, path).unwrap_or_else(|| panic!("{path} is a console path"))
    }

    async fn body(response: Response<Body>) -> Vec<u8> {
        response
            .into_body()
            .collect()
            .await
            .expect("an infallible body")
            .to_bytes()
            .to_vec()
    }

    /// Exactly the contract's four security headers, with exactly its values.
    fn assert_security_headers(response: &Response<Body>, path: &str) {
        let headers = response.headers();
        assert_eq!(
            headers
                .get("content-security-policy")
                .and_then(|v| v.to_str().ok()),
            Some(
                "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
            ),
            "{path}"
        );
        assert_eq!(headers["x-content-type-options"], "nosniff", "{path}");
        assert_eq!(headers["referrer-policy"], "no-referrer", "{path}");
        assert_eq!(headers["x-frame-options"], "DENY", "{path}");
        for name in [
            "content-security-policy",
            "x-content-type-options",
            "referrer-policy",
            "x-frame-options",
        ] {
            assert_eq!(
                headers.get_all(name).iter().count(),
                1,
                "{path}: one {name}"
            );
        }
    }

    #[tokio::test]
    async fn the_root_and_console_redirect_to_the_app() {
        for path in ["/", "/console"] {
            for method in [Method::GET, Method::HEAD] {
                let response = answer(method, path);
                assert_eq!(response.status(), StatusCode::SEE_OTHER, "{path}");
                assert_eq!(response.headers()[LOCATION], "/console/", "{path}");
                assert_security_headers(&response, path);
            }
        }
    }

    #[tokio::test]
    async fn every_app_path_answers_the_page_uncached() {
        for path in [
            "/console/",
            "/console/chats/c0123abcd",
            "/console/invite",
            "/console/sign-in",
            "/console/apps",
            "/console/projects/p0123/settings",
            "/console/?next=/console/chats/c1",
            "/console/chats/c1/",
        ] {
            let response = answer(Method::GET, path);
            assert_eq!(response.status(), StatusCode::OK, "{path}");
            assert_eq!(response.headers()[CONTENT_TYPE], HTML, "{path}");
            assert_eq!(response.headers()[CACHE_CONTROL], "no-store", "{path}");
            assert_security_headers(&response, path);
            assert_eq!(body(response).await, INDEX_HTML.as_bytes(), "{path}");
        }
        let head = answer(Method::HEAD, "/console/");
        assert_eq!(head.status(), StatusCode::OK);
        assert_security_headers(&head, "HEAD /console/");
    }

    #[tokio::test]
    async fn assets_are_served_with_their_type() {
        for (name, content_type) in [
            ("app.js", JS),
            ("api.js", JS),
            ("device-approve.js", JS),
            ("oauth-consent.js", JS),
            ("apps.js", JS),
            ("settings.js", JS),
            ("style.css", CSS),
        ] {
            let path = format!("/console/assets/{name}");
            let response = answer(Method::GET, &path);
            assert_eq!(response.status(), StatusCode::OK, "{path}");
            assert_eq!(response.headers()[CONTENT_TYPE], content_type, "{path}");
            assert_security_headers(&response, &path);
            let expected = std::fs::read(
                std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("src/console/assets")
                    .join(name),
            )
            .expect("the asset's source");
            assert_eq!(body(response).await, expected, "{path}");
        }
    }

    #[tokio::test]
    async fn unknown_assets_and_traversals_are_not_found() {
        for path in [
            "/console/assets/nope.js",
            "/console/assets/",
            "/console/assets/APP.JS",
            "/console/assets/app.js/",
            "/console/assets/../assets.rs",
            "/console/assets/./app.js",
            "/console/assets/%2e%2e/assets.rs",
            "/console/assets/..%2fassets.rs",
            "/console/assets/%2E%2E%2Fmod.rs",
            "/console/assets/..%5cmod.rs",
            "/console/assets/device-approve.html",
            "/console/assets/oauth-consent.html",
            "/console/assets/../device-approve.js",
            "/console/assets/device-approve.js/../../assets.rs",
            "/console/assets/sub/app.js",
            "/console/assets//app.js",
            "/console/../console/assets/app.js",
            "/console/..",
            "/console/chats/../../etc/passwd",
            "/console/%2e%2e/x",
            "/console/assets%2f..%2fmod.rs",
            "/console/a%5cb",
            "/console//x",
        ] {
            let response = answer(Method::GET, path);
            assert_eq!(response.status(), StatusCode::NOT_FOUND, "{path}");
            assert_security_headers(&response, path);
        }
    }

    #[tokio::test]
    async fn other_methods_are_refused() {
        for method in [Method::POST, Method::PUT, Method::DELETE, Method::PATCH] {
            for path in [
                "/",
                "/console/",
                "/console/chats/c1",
                "/console/assets/app.js",
            ] {
                let response = answer(method.clone(), path);
                assert_eq!(
                    response.status(),
                    StatusCode::METHOD_NOT_ALLOWED,
                    "{method} {path}"
                );
                assert_eq!(response.headers()[ALLOW], "GET, HEAD");
                assert_security_headers(&response, path);
            }
        }
    }

    #[test]
    fn other_paths_are_not_the_consoles() {
        for path in [
            "/v1/health",
            "/mcp",
            "/consolex",
            "/console.js",
            "/v1/console/session",
        ] {
            assert!(get(Method::GET, path).is_none(), "{path}");
        }
    }

    /// Every file of `console/assets/` is in [`ASSETS`] (or is one of the three pages), so a module the
    /// app imports cannot be left out of the binary, and every entry has a known type.
    #[test]
    fn the_table_is_the_assets_folder() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/console/assets");
        let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
            .expect("the assets folder")
            .map(|e| {
                e.expect("an entry")
                    .file_name()
                    .to_string_lossy()
                    .into_owned()
            })
            .filter(|name| {
                !["index.html", "device-approve.html", "oauth-consent.html"]
                    .contains(&name.as_str())
            })
            .collect();
        on_disk.sort();
        let mut served: Vec<String> = ASSETS.iter().map(|a| a.name.to_owned()).collect();
        served.sort();
        assert_eq!(on_disk, served);
    }

    /// The panel sends, as `confirm`, exactly the sentence the chat API requires.
    #[test]
    fn the_panel_confirms_with_the_contracts_sentence() {
        let panel = ASSETS
            .iter()
            .find(|a| a.name == "panel.js")
            .expect("panel.js");
        let source = std::str::from_utf8(panel.bytes).expect("UTF-8");
        let line = format!(
            "export const CONFIRMATION = '{}';",
            agentworks_contract::public_api::CONFIRMATION
        );
        assert!(source.contains(&line), "panel.js lacks {line}");
    }

    /// The page and the modules keep to the CSP and to text-only rendering: no inline script
    /// or style, only this origin's assets, no HTML sinks, and every import is an asset.
    #[test]
    fn the_app_keeps_to_its_policy() {
        for html in [INDEX_HTML, DEVICE_APPROVE_HTML, OAUTH_CONSENT_HTML] {
            page_keeps_to_the_policy(html);
        }
        for asset in ASSETS.iter().filter(|a| a.content_type == JS) {
            let source = std::str::from_utf8(asset.bytes).expect("UTF-8");
            for sink in [
                "innerHTML",
                "outerHTML",
                "insertAdjacentHTML",
                "document.write",
                "eval(",
                "new Function",
                "setAttribute('on",
                ".style.",
            ] {
                assert!(!source.contains(sink), "{} uses {sink}", asset.name);
            }
            for line in source.lines().filter(|l| l.starts_with("import ")) {
                let spec = line
                    .rsplit(['\'', '"'])
                    .nth(1)
                    .expect("an import specifier");
                let name = spec.strip_prefix("./").expect("a relative import");
                assert!(
                    ASSETS.iter().any(|a| a.name == name),
                    "{} imports {spec}",
                    asset.name
                );
            }
        }
    }

    /// A page: no inline script or style, only this origin's assets, each one in [`ASSETS`].
    fn page_keeps_to_the_policy(html: &str) {
        assert!(!html.contains(" style="), "an inline style attribute");
        assert!(!html.contains("<style"), "an inline style element");
        for (at, _) in html.match_indices("<script") {
            let tag = &html[at..at + html[at..].find('>').expect("a closed tag")];
            assert!(
                tag.contains("src=\"/console/assets/"),
                "inline script: {tag}"
            );
        }
        assert!(!html.contains("http://") && !html.contains("https://"));
        for (at, _) in html.match_indices("/console/assets/") {
            let rest = &html[at + "/console/assets/".len()..];
            let name = &rest[..rest.find('"').expect("a quoted path")];
            assert!(ASSETS.iter().any(|a| a.name == name), "{name}");
        }
    }
}
