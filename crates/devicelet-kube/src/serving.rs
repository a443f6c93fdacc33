//! Serving like a control-plane component: the secure port of kube-scheduler and the kubelet
//! (k8s.io/apiserver `pkg/server/options`: `SecureServingOptions`,
//! `DelegatingAuthenticationOptions`, `DelegatingAuthorizationOptions`; `pkg/authentication/
//! request/bearertoken`, `pkg/authorization/authorizerfactory/delegating.go`).
//!
//! - TLS with a given certificate and key (PEM files, read at start) or a self-signed one made
//!   in memory for `localhost`, `127.0.0.1`, the bound address and the host name, as
//!   kube-scheduler does without `--tls-cert-file`.
//! - A bearer token is authenticated by a `TokenReview`, the request then authorized by a
//!   `SubjectAccessReview` for its non-resource path and verb (`get` for GET, as the apiserver's
//!   request-info resolver names them), both against the API server; answers are cached for
//!   10 s (the delegating options' default TTLs) so a scrape every few seconds costs no review.
//! - Paths in the always-allow list (`/healthz`, `/readyz`, `/livez` by default: probes carry
//!   no token) skip both.
//!
//! Differences from upstream, deliberate: a request without credentials is refused with 401
//! (upstream maps it to `system:anonymous`, then usually 403); client certificates are not
//! accepted as credentials (no `--client-ca-file`): Prometheus and `kubectl get --raw` send
//! service-account tokens.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, UserInfo};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::Client;
use kube::api::{Api, PostParams};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tracing::{debug, warn};

/// How long a review's answer is reused (`--authentication-token-webhook-cache-ttl`,
/// `--authorization-webhook-cache-authorized-ttl` / `-unauthorized-ttl`: 10 s).
pub const REVIEW_TTL: Duration = Duration::from_secs(10);
/// Cached answers kept at most (each cache); past it, expired ones go first, then all.
const CACHE_LIMIT: usize = 4096;
/// A TLS handshake that takes longer is dropped (a client that connects and sends nothing must
/// not hold a task forever).
const HANDSHAKE_LIMIT: Duration = Duration::from_secs(10);
/// The paths probes reach without credentials (`--authorization-always-allow-paths`).
pub const ALWAYS_ALLOW: [&str; 3] = ["/healthz", "/readyz", "/livez"];

/// Why the secure port could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ServingError {
    #[error("read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: no PEM certificate in the file")]
    NoCertificate { path: PathBuf },
    #[error("{path}: {message}")]
    Pem { path: PathBuf, message: String },
    #[error("self-signed certificate: {0}")]
    SelfSigned(#[from] rcgen::Error),
    #[error("TLS configuration: {0}")]
    Tls(#[from] rustls::Error),
}

/// The serving certificate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ServingCertificate {
    /// `--tls-cert-file` (the chain, leaf first) and `--tls-private-key-file`.
    Files { cert: PathBuf, key: PathBuf },
    /// Made in memory at start for these names and addresses.
    SelfSigned { hosts: Vec<String> },
}

impl ServingCertificate {
    /// A self-signed certificate for `localhost`, `127.0.0.1`, `address`'s IP when it is not
    /// the unspecified one, and the host name.
    pub fn self_signed_for(address: SocketAddr) -> Self {
        let mut hosts = vec!["localhost".to_owned(), "127.0.0.1".to_owned()];
        let ip = address.ip();
        if !ip.is_unspecified() && !ip.is_loopback() {
            hosts.push(ip.to_string());
        }
        if let Ok(name) = std::fs::read_to_string("/proc/sys/kernel/hostname") {
            let name = name.trim();
            if !name.is_empty() && !hosts.iter().any(|h| h == name) {
                hosts.push(name.to_owned());
            }
        }
        ServingCertificate::SelfSigned { hosts }
    }

    /// The rustls server configuration (HTTP/1.1).
    pub fn server_config(&self) -> Result<Arc<rustls::ServerConfig>, ServingError> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
        let (chain, key): (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>) = match self {
            ServingCertificate::Files { cert, key } => {
                let read = |path: &PathBuf| {
                    std::fs::read(path).map_err(|source| ServingError::Read {
                        path: path.clone(),
                        source,
                    })
                };
                let pem_error =
                    |path: &PathBuf, e: rustls::pki_types::pem::Error| ServingError::Pem {
                        path: path.clone(),
                        message: e.to_string(),
                    };
                let cert_pem = read(cert)?;
                let chain = CertificateDer::pem_slice_iter(&cert_pem)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| pem_error(cert, e))?;
                if chain.is_empty() {
                    return Err(ServingError::NoCertificate { path: cert.clone() });
                }
                let key_pem = read(key)?;
                let key_der =
                    PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| pem_error(key, e))?;
                (chain, key_der)
            }
            ServingCertificate::SelfSigned { hosts } => {
                let made = rcgen::generate_simple_self_signed(hosts.clone())?;
                (
                    vec![made.cert.der().clone()],
                    PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(
                        made.signing_key.serialize_der(),
                    )),
                )
            }
        };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(chain, key)?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

/// Accepted TLS connections, handshaken off the accept loop (one slow client holds up no
/// other), as an axum listener.
pub struct TlsListener {
    local: SocketAddr,
    accepted: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    _accept_loop: AbortOnDrop,
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl TlsListener {
    /// Serves TLS with `config` on `listener`.
    pub fn new(listener: TcpListener, config: Arc<rustls::ServerConfig>) -> std::io::Result<Self> {
        let local = listener.local_addr()?;
        let (tx, accepted) = mpsc::channel(64);
        let acceptor = TlsAcceptor::from(config);
        let accept_loop = tokio::spawn(async move {
            loop {
                let (tcp, peer) = match listener.accept().await {
                    Ok(c) => c,
                    Err(e) => {
                        // EMFILE and the like: wait instead of spinning.
                        warn!(error = %e, "secure port: accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let (acceptor, tx) = (acceptor.clone(), tx.clone());
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_LIMIT, acceptor.accept(tcp)).await {
                        Ok(Ok(tls)) => {
                            let _ = tx.send((tls, peer)).await;
                        }
                        Ok(Err(e)) => {
                            debug!(%peer, error = %e, "secure port: TLS handshake failed")
                        }
                        Err(_) => debug!(%peer, "secure port: TLS handshake timed out"),
                    }
                });
            }
        });
        Ok(TlsListener {
            local,
            accepted,
            _accept_loop: AbortOnDrop(accept_loop),
        })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.accepted.recv().await {
            Some(c) => c,
            // The accept loop never ends while the listener lives.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}

/// Why a request is refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// No credentials, or a token the API server does not accept: 401.
    Unauthorized,
    /// Authenticated, not allowed: 403 with the authorizer's words.
    Forbidden(String),
    /// A review could not be made: 500 (nothing is allowed on a guess).
    Error(String),
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        match self {
            Refusal::Unauthorized => (
                StatusCode::UNAUTHORIZED,
                [(header::WWW_AUTHENTICATE, "Bearer")],
                "Unauthorized\n",
            )
                .into_response(),
            Refusal::Forbidden(message) => {
                (StatusCode::FORBIDDEN, format!("{message}\n")).into_response()
            }
            Refusal::Error(message) => {
                (StatusCode::INTERNAL_SERVER_ERROR, format!("{message}\n")).into_response()
            }
        }
    }
}

/// A user as the TokenReview named it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct User {
    name: String,
    uid: String,
    groups: Vec<String>,
    extra: Vec<(String, Vec<String>)>,
}

impl User {
    fn from_info(info: UserInfo) -> Self {
        let mut extra: Vec<(String, Vec<String>)> =
            info.extra.unwrap_or_default().into_iter().collect();
        extra.sort();
        User {
            name: info.username.unwrap_or_default(),
            uid: info.uid.unwrap_or_default(),
            groups: info.groups.unwrap_or_default(),
            extra,
        }
    }
}

/// A cache of review answers with a TTL.
struct Answers<K, V> {
    entries: Mutex<HashMap<K, (Instant, V)>>,
}

impl<K: std::hash::Hash + Eq, V: Clone> Answers<K, V> {
    fn new() -> Self {
        Answers {
            entries: Mutex::new(HashMap::new()),
        }
    }

    fn get(&self, key: &K) -> Option<V> {
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries
            .get(key)
            .filter(|(at, _)| at.elapsed() < REVIEW_TTL)
            .map(|(_, v)| v.clone())
    }

    fn put(&self, key: K, value: V) {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if entries.len() >= CACHE_LIMIT {
            entries.retain(|_, (at, _)| at.elapsed() < REVIEW_TTL);
            if entries.len() >= CACHE_LIMIT {
                entries.clear();
            }
        }
        entries.insert(key, (Instant::now(), value));
    }
}

/// Authentication and authorization delegated to the API server.
pub struct DelegatedAuth {
    authentication: Client,
    authorization: Client,
    always_allow: Vec<String>,
    /// By the token's SHA-256 (the token itself is not kept): the user, or `None` when the
    /// API server refused the token.
    tokens: Answers<[u8; 32], Option<User>>,
    decisions: Answers<(User, String, String), Result<(), String>>,
}

impl std::fmt::Debug for DelegatedAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DelegatedAuth")
            .field("always_allow", &self.always_allow)
            .finish_non_exhaustive()
    }
}

impl DelegatedAuth {
    /// Reviews through `authentication` (TokenReviews) and `authorization`
    /// (SubjectAccessReviews); `always_allow` paths skip both (a trailing `*` matches a prefix).
    pub fn new(authentication: Client, authorization: Client, always_allow: Vec<String>) -> Self {
        DelegatedAuth {
            authentication,
            authorization,
            always_allow,
            tokens: Answers::new(),
            decisions: Answers::new(),
        }
    }

    fn always_allowed(&self, path: &str) -> bool {
        self.always_allow.iter().any(|p| match p.strip_suffix('*') {
            Some(prefix) => path.starts_with(prefix),
            None => p == path,
        })
    }

    /// Whether a request for `path` with `method` and the `Authorization` header value
    /// `authorization` may be served.
    pub async fn check(
        &self,
        authorization: Option<&str>,
        method: &str,
        path: &str,
    ) -> Result<(), Refusal> {
        if self.always_allowed(path) {
            return Ok(());
        }
        let token = authorization
            .and_then(|h| {
                let (scheme, token) = h.trim().split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
            })
            .filter(|t| !t.is_empty())
            .ok_or(Refusal::Unauthorized)?;
        let user = self.authenticate(token).await?;
        // The apiserver's verb for a non-resource request is the lower-case method.
        let verb = method.to_ascii_lowercase();
        self.authorize(user, path, &verb).await
    }

    async fn authenticate(&self, token: &str) -> Result<User, Refusal> {
        let digest = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
        let mut key = [0u8; 32];
        key.copy_from_slice(digest.as_ref());
        if let Some(known) = self.tokens.get(&key) {
            return known.ok_or(Refusal::Unauthorized);
        }
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_owned(),
                audiences: None,
            },
            ..TokenReview::default()
        };
        let api: Api<TokenReview> = Api::all(self.authentication.clone());
        let answer = api
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| {
                warn!(error = %e, "TokenReview failed");
                // As the delegating authenticator: an error authenticates nobody.
                Refusal::Unauthorized
            })?;
        let status = answer.status.unwrap_or_default();
        let user = match (status.authenticated, status.user) {
            (Some(true), Some(info)) => Some(User::from_info(info)),
            _ => None,
        };
        self.tokens.put(key, user.clone());
        user.ok_or(Refusal::Unauthorized)
    }

    async fn authorize(&self, user: User, path: &str, verb: &str) -> Result<(), Refusal> {
        let key = (user, path.to_owned(), verb.to_owned());
        if let Some(known) = self.decisions.get(&key) {
            return known.map_err(Refusal::Forbidden);
        }
        let (user, path, verb) = key;
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(user.name.clone()),
                uid: (!user.uid.is_empty()).then(|| user.uid.clone()),
                groups: Some(user.groups.clone()),
                extra: (!user.extra.is_empty()).then(|| user.extra.iter().cloned().collect()),
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some(path.clone()),
                    verb: Some(verb.clone()),
                }),
                resource_attributes: None,
            },
            ..SubjectAccessReview::default()
        };
        let api: Api<SubjectAccessReview> = Api::all(self.authorization.clone());
        let answer = api
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| {
                warn!(error = %e, "SubjectAccessReview failed");
                Refusal::Error(format!("authorization review failed: {e}"))
            })?;
        let status = answer.status.unwrap_or_default();
        let decision = if status.allowed {
            Ok(())
        } else {
            let reason = status.reason.filter(|r| !r.is_empty());
            Err(format!(
                "forbidden: User \"{}\" cannot {verb} path \"{path}\"{}",
                user.name,
                reason.map(|r| format!(": {r}")).unwrap_or_default()
            ))
        };
        self.decisions.put((user, path, verb), decision.clone());
        decision.map_err(Refusal::Forbidden)
    }
}

/// Axum middleware: every request passes `auth` first.
pub async fn require(
    State(auth): State<Arc<DelegatedAuth>>,
    request: Request,
    next: Next,
) -> Response {
    let header = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let path = request.uri().path().to_owned();
    let method = request.method().as_str().to_owned();
    match auth.check(header.as_deref(), &method, &path).await {
        Ok(()) => next.run(request).await,
        Err(refusal) => {
            debug!(%path, %method, refusal = ?refusal, "secure port: request refused");
            refusal.into_response()
        }
    }
}

/// Serves `app` on `listener` with TLS `config` ([`ServingCertificate::server_config`]), every
/// request checked by `auth`.
pub async fn serve_secure(
    listener: TcpListener,
    config: Arc<rustls::ServerConfig>,
    auth: Arc<DelegatedAuth>,
    app: axum::Router,
) -> std::io::Result<()> {
    let tls = TlsListener::new(listener, config)?;
    let app = app.layer(axum::middleware::from_fn_with_state(auth, require));
    axum::serve(tls, app).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn self_signed_names_localhost_and_the_bound_address() {
        let c = ServingCertificate::self_signed_for("10.1.2.3:10261".parse().unwrap());
        let ServingCertificate::SelfSigned { hosts } = &c else {
            panic!("not self-signed")
        };
        assert!(hosts.contains(&"localhost".to_owned()));
        assert!(hosts.contains(&"127.0.0.1".to_owned()));
        assert!(hosts.contains(&"10.1.2.3".to_owned()));
        let any = ServingCertificate::self_signed_for("0.0.0.0:1".parse().unwrap());
        let ServingCertificate::SelfSigned { hosts } = any else {
            panic!("not self-signed")
        };
        assert!(!hosts.contains(&"0.0.0.0".to_owned()));
        c.server_config().unwrap();
    }

    #[test]
    fn certificate_files_are_read_and_bad_ones_named() {
        let dir = tempfile::tempdir().unwrap();
        let made = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
        let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        std::fs::write(&cert, made.cert.pem()).unwrap();
        std::fs::write(&key, made.signing_key.serialize_pem()).unwrap();
        let files = ServingCertificate::Files {
            cert: cert.clone(),
            key: key.clone(),
        };
        files.server_config().unwrap();
        std::fs::write(&cert, "not a certificate").unwrap();
        let e = files.server_config().unwrap_err().to_string();
        assert!(
            e.contains("tls.crt") && e.contains("no PEM certificate"),
            "{e}"
        );
        let missing = ServingCertificate::Files {
            cert: dir.path().join("absent.crt"),
            key,
        };
        let e = missing.server_config().unwrap_err().to_string();
        assert!(e.contains("absent.crt"), "{e}");
    }

    fn unreachable() -> Client {
        let config = kube::Config::new("http://127.0.0.1:1".parse().unwrap());
        Client::try_from(config).unwrap()
    }

    #[tokio::test]
    async fn probes_pass_and_the_rest_needs_a_reviewed_token() {
        let auth = DelegatedAuth::new(
            unreachable(),
            unreachable(),
            vec!["/healthz".into(), "/debug/pprof/*".into()],
        );
        assert_eq!(auth.check(None, "GET", "/healthz").await, Ok(()));
        assert_eq!(auth.check(None, "GET", "/debug/pprof/heap").await, Ok(()));
        assert_eq!(
            auth.check(None, "GET", "/healthz/x").await,
            Err(Refusal::Unauthorized)
        );
        assert_eq!(
            auth.check(None, "GET", "/metrics").await,
            Err(Refusal::Unauthorized)
        );
        assert_eq!(
            auth.check(Some("Basic dTpw"), "GET", "/metrics").await,
            Err(Refusal::Unauthorized)
        );
        assert_eq!(
            auth.check(Some("Bearer "), "GET", "/metrics").await,
            Err(Refusal::Unauthorized)
        );
        // The review cannot be made: refused, not allowed on a guess.
        assert_eq!(
            auth.check(Some("Bearer abc"), "GET", "/metrics").await,
            Err(Refusal::Unauthorized)
        );
    }

    #[test]
    fn answers_expire_and_stay_bounded() {
        let a: Answers<u32, bool> = Answers::new();
        a.put(1, true);
        assert_eq!(a.get(&1), Some(true));
        for i in 0..(CACHE_LIMIT as u32 + 10) {
            a.put(i, false);
        }
        assert!(a.entries.lock().unwrap().len() <= CACHE_LIMIT);
    }
}
