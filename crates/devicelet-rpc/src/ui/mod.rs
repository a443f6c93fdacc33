//! The read-only web page of `devicelet serve --ui-address HOST:PORT` (off by default): the
//! node as a picture ([`NodePicture`]), live. Everything is embedded in the binary (no
//! external assets: nodes often have no internet).
//!
//! Routes, GET (and HEAD) only; any other method is 405:
//! - `/` → the page: the picture rendered by [`html::fragment`], and a small inline script
//!   that polls `/api/numa/view` every second and swaps the markup when it changed
//! - `/api/numa` → [`NodePicture`] JSON (what `devicelet top --numa -o json` prints)
//! - `/api/numa/view` → `{"generation": N, "html": "<the fragment>"}`
//!
//! Where the listener is on loopback, a request must name a loopback host (`Host:
//! localhost:PORT`, `127.0.0.1:PORT`, `[::1]:PORT`): a web page elsewhere that rebinds its own
//! DNS name to 127.0.0.1 gets 403, not the node's picture. Answers carry a
//! Content-Security-Policy that allows only the page's own inline style and script and
//! requests to itself.

pub mod html;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use devicelet_node::picture::NodePicture;
use devicelet_node::pods::PodAdmitter;
use serde::Serialize;
use tokio::net::TcpListener;

use crate::error::RpcError;

/// The page shell; `__PICTURE__` is replaced by the rendered picture.
const PAGE: &str = include_str!("page.html");

const CSP: &str = "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; \
                   connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; \
                   frame-ancestors 'none'";

/// `/api/numa/view`.
#[derive(Debug, Clone, Serialize)]
struct View {
    generation: u64,
    html: String,
}

#[derive(Clone)]
struct UiState {
    pods: Arc<PodAdmitter>,
    /// Bound to loopback: only loopback host names are served (see the module header).
    loopback_only: bool,
}

/// The page with `picture` drawn in.
pub fn page(picture: &NodePicture) -> String {
    PAGE.replacen("__PICTURE__", &html::fragment(picture), 1)
}

/// Whether `Host` names a loopback host (`localhost`, `127.x.y.z`, `[::1]`, with any port).
fn loopback_host(headers: &HeaderMap) -> bool {
    let Some(host) = headers.get(header::HOST).and_then(|h| h.to_str().ok()) else {
        // HTTP/1.0 without Host: no browser sends that, so no rebinding page either.
        return true;
    };
    let name = if let Some(rest) = host.strip_prefix('[') {
        rest.split(']').next().unwrap_or_default()
    } else {
        host.rsplit_once(':').map_or(host, |(name, _)| name)
    };
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

fn answer(state: &UiState, headers: &HeaderMap, body: Response) -> Response {
    let mut response = if state.loopback_only && !loopback_host(headers) {
        (
            StatusCode::FORBIDDEN,
            "devicelet's page answers loopback host names only (localhost, 127.0.0.1, [::1])\n",
        )
            .into_response()
    } else {
        body
    };
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

async fn index(State(state): State<UiState>, headers: HeaderMap) -> Response {
    let body = (
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        page(&state.pods.picture().await),
    )
        .into_response();
    answer(&state, &headers, body)
}

async fn numa(State(state): State<UiState>, headers: HeaderMap) -> Response {
    let body = axum::Json(state.pods.picture().await).into_response();
    answer(&state, &headers, body)
}

async fn view(State(state): State<UiState>, headers: HeaderMap) -> Response {
    let picture = state.pods.picture().await;
    let body = axum::Json(View {
        generation: picture.generation,
        html: html::fragment(&picture),
    })
    .into_response();
    answer(&state, &headers, body)
}

/// The page's routes. `get` answers GET and HEAD; axum answers 405 with `Allow` for any
/// other method on these paths.
fn router(state: UiState) -> Router {
    Router::new()
        .route("/", get(index))
        .route("/api/numa", get(numa))
        .route("/api/numa/view", get(view))
        .fallback(|| async { (StatusCode::NOT_FOUND, "no such page\n") })
        .with_state(state)
}

/// A bound page listener; [`UiServer::serve`] runs it.
#[derive(Debug)]
pub struct UiServer {
    listener: TcpListener,
    pods: Arc<PodAdmitter>,
}

impl UiServer {
    /// Binds `address` (port 0 picks a free port). Whether a non-loopback address is allowed
    /// is the caller's decision (`serve --ui-allow-remote`).
    pub async fn bind(address: SocketAddr, pods: Arc<PodAdmitter>) -> Result<Self, RpcError> {
        let listener = TcpListener::bind(address)
            .await
            .map_err(|source| RpcError::UiBind { address, source })?;
        Ok(UiServer { listener, pods })
    }

    /// The address actually bound.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.listener.local_addr().ok()
    }

    /// Serves the page until the task is dropped or aborted.
    pub async fn serve(self) -> Result<(), RpcError> {
        let address = self.local_addr();
        let state = UiState {
            pods: self.pods,
            loopback_only: address.is_none_or(|a| a.ip().is_loopback()),
        };
        axum::serve(self.listener, router(state))
            .await
            .map_err(|e| RpcError::UiServe {
                address: address.map(|a| a.to_string()).unwrap_or_default(),
                message: e.to_string(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use devicelet_devicemanager::test_utils::FakeDialer;
    use devicelet_devicemanager::{DeviceManager, DeviceManagerConfig, SystemClock};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A real listener on a free loopback port, and one raw HTTP/1.1 request to it.
    async fn call(address: SocketAddr, method: &str, path: &str, host: &str) -> (u16, String) {
        let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
        let request = format!(
            "{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
        );
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await.unwrap();
        let status = answer
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap();
        (status, answer)
    }

    #[tokio::test]
    async fn get_only_and_loopback_hosts_only() {
        let dir = tempfile::tempdir().unwrap();
        let manager = DeviceManager::new(
            DeviceManagerConfig::new(dir.path().join("dp")),
            Arc::new(FakeDialer::new()),
            Arc::new(SystemClock),
        );
        let pods = Arc::new(PodAdmitter::new(manager));
        let server = UiServer::bind("127.0.0.1:0".parse().unwrap(), pods)
            .await
            .unwrap();
        let address = server.local_addr().unwrap();
        let task = tokio::spawn(server.serve());
        let (status, answer) = call(address, "GET", "/", &address.to_string()).await;
        assert_eq!(status, 200, "{answer}");
        assert!(
            answer
                .to_ascii_lowercase()
                .contains("content-security-policy: default-src 'none'"),
            "{answer}"
        );
        assert!(answer.contains("data-numa=\"none\""), "{answer}");
        let (status, answer) = call(address, "GET", "/api/numa", "localhost:1").await;
        assert_eq!(status, 200, "{answer}");
        assert!(answer.contains("\"numaNodes\""), "{answer}");
        assert_eq!(
            call(address, "GET", "/api/numa/view", "[::1]:1").await.0,
            200
        );
        assert_eq!(call(address, "HEAD", "/", "localhost").await.0, 200);
        for method in ["POST", "PUT", "DELETE", "PATCH"] {
            for path in ["/", "/api/numa", "/api/numa/view"] {
                let got = call(address, method, path, "localhost").await.0;
                assert_eq!(got, 405, "{method} {path}");
            }
        }
        assert_eq!(call(address, "GET", "/", "evil.example:8080").await.0, 403);
        assert_eq!(call(address, "GET", "/nope", "localhost").await.0, 404);
        task.abort();
    }

    #[test]
    fn host_names_that_count_as_loopback() {
        let host = |h: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(header::HOST, HeaderValue::from_str(h).unwrap());
            loopback_host(&headers)
        };
        assert!(host("localhost:8080") && host("LOCALHOST") && host("127.0.0.2:1"));
        assert!(host("[::1]:9") && host("[::1]"));
        assert!(!host("localhost.evil.example:80") && !host("10.0.0.1:80") && !host("[::2]:1"));
    }

    #[test]
    fn the_page_embeds_the_picture_and_its_script() {
        let text = page(&NodePicture::default());
        assert!(!text.contains("__PICTURE__"));
        assert!(text.contains("data-numa=\"none\""));
        assert!(text.contains("api/numa/view"));
        assert!(
            !text.contains("http://") && !text.contains("https://"),
            "no external assets"
        );
    }
}
