//! Kubelet TLS bootstrap and client certificate rotation (`serve --bootstrap-kubeconfig`,
//! `--rotate-certificates`).
//!
//! Follows the kubelet: `pkg/kubelet/certificate/bootstrap/bootstrap.go` (`LoadClientCert`:
//! keep a kubeconfig whose certificate is still valid, else reuse the certificate store's
//! current certificate, else request one with the bootstrap credential and a private key kept
//! across restarts), `client-go/util/certificate/certificate_store.go` (the store:
//! `kubelet-client-<time>.pem` holding certificate and key, `kubelet-client-current.pem` a
//! symlink to it) and `certificate_manager.go` (rotation at a jittered 70-90 % of the
//! certificate's lifetime, with the node's own identity).
//!
//! The request is a CertificateSigningRequest for `CN=system:node:NAME, O=system:nodes` with
//! signer `kubernetes.io/kube-apiserver-client-kubelet` and usages `digital signature, client
//! auth` (an ECDSA P-256 key: no key encipherment), which kube-controller-manager's approver
//! accepts for a requester allowed `create` on `certificatesigningrequests/nodeclient`
//! (bootstrap) or `selfnodeclient` (renewal), and its signer issues.
//!
//! After a rotation the client keeps working without a restart: every request goes through
//! [`SwappableClient`], which holds the client built from the newest certificate; requests in
//! flight (watches) finish on the old one, whose certificate is still valid then.

use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use futures::future::BoxFuture;
use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestSpec,
};
use kube::Client;
use kube::api::{Api, PostParams};
use kube::config::{Kubeconfig, NamedAuthInfo};
use tracing::{info, warn};

use crate::client::{install_crypto_provider, with_deadline};
use crate::error::ClusterError;

/// The signer of kubelet client certificates.
pub const KUBELET_CLIENT_SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";
/// The group every node identity is in.
pub const NODES_GROUP: &str = "system:nodes";
/// The store's link to the certificate in use (certificate and key in one PEM file).
pub const CURRENT_PEM: &str = "kubelet-client-current.pem";
/// The private key of a request not yet issued, kept so that a restart continues it.
const PENDING_KEY: &str = "kubelet-client.key.tmp";
/// ECDSA keys sign; they do not encipher (the kubelet drops `key encipherment` for them).
const USAGES: [&str; 2] = ["digital signature", "client auth"];
/// How often a pending request is looked at.
const POLL: Duration = Duration::from_millis(500);

/// What went wrong while getting or rotating the node's client certificate.
#[derive(Debug, thiserror::Error)]
pub enum BootstrapError {
    /// A file could not be read or written.
    #[error("cannot {action} {}: {source}", path.display())]
    Io {
        /// What was being done.
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A kubeconfig could not be used.
    #[error("kubeconfig {}: {message}", path.display())]
    Kubeconfig {
        /// The file.
        path: PathBuf,
        /// Why.
        message: String,
    },
    /// The key or the request could not be made.
    #[error("cannot make the private key or the certificate request: {0}")]
    Key(#[from] rcgen::Error),
    /// The API server refused or failed a call.
    #[error(transparent)]
    Api(#[from] ClusterError),
    /// An approver denied the request.
    #[error(
        "CertificateSigningRequest {name} was denied ({reason}: {message}); the node cannot join. \
         Check who may approve node client certificates (kube-controller-manager's csrapproving \
         controller approves requests from identities allowed `create` on \
         certificatesigningrequests/nodeclient)"
    )]
    Denied {
        /// The request's name.
        name: String,
        /// The condition's reason.
        reason: String,
        /// The condition's message.
        message: String,
    },
    /// The signer failed the request.
    #[error("CertificateSigningRequest {name} failed ({reason}: {message})")]
    Failed {
        /// The request's name.
        name: String,
        /// The condition's reason.
        reason: String,
        /// The condition's message.
        message: String,
    },
    /// Nobody approved or issued the request in time.
    #[error(
        "CertificateSigningRequest {name} was not {what} within {} s; {hint}",
        waited.as_secs()
    )]
    Timeout {
        /// The request's name.
        name: String,
        /// What did not happen: "approved" or "issued".
        what: &'static str,
        /// How long devicelet waited.
        waited: Duration,
        /// What to do.
        hint: &'static str,
    },
    /// The issued certificate is not one devicelet can use.
    #[error("the certificate issued for {name} is unusable: {message}")]
    BadCertificate {
        /// The request's name.
        name: String,
        /// Why.
        message: String,
    },
}

impl BootstrapError {
    fn io(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> BootstrapError {
        let path = path.to_path_buf();
        move |source| BootstrapError::Io {
            action,
            path,
            source,
        }
    }
}

/// Settings of the bootstrap.
#[derive(Debug, Clone)]
pub struct BootstrapConfig {
    /// The bootstrap credential (a kubeconfig with a bootstrap token, usually).
    pub bootstrap_kubeconfig: PathBuf,
    /// The node's kubeconfig: read when usable, written otherwise.
    pub kubeconfig: PathBuf,
    /// The certificate store (`R/pki`).
    pub cert_dir: PathBuf,
    /// The Node's name: the certificate is for `system:node:<node_name>`.
    pub node_name: String,
    /// How long to wait for the request to be approved and issued.
    pub wait: Duration,
    /// Rotate the certificate before it expires.
    pub rotate: bool,
    /// Rotate after this long at the latest (tests; `None`: 70-90 % of the lifetime only).
    pub rotate_after: Option<Duration>,
}

/// A client with the node's own certificate: the one in `kubeconfig` when still valid, else
/// one obtained with the bootstrap credential. With `rotate`, a task renews it before it
/// expires and the returned client switches to the new one.
pub async fn connect_bootstrapped(config: &BootstrapConfig) -> Result<Client, BootstrapError> {
    install_crypto_provider();
    std::fs::create_dir_all(&config.cert_dir)
        .map_err(BootstrapError::io("create", &config.cert_dir))?;
    let store = CertStore::new(&config.cert_dir, &config.node_name);
    if let Some(validity) = kubeconfig_certificate(&config.kubeconfig, &config.node_name)? {
        info!(kubeconfig = %config.kubeconfig.display(), expires = %validity.not_after_text(), "using the node's kubeconfig");
    } else if let Some(validity) = store.current_validity() {
        info!(certificate = %store.current().display(), expires = %validity.not_after_text(), "using the stored client certificate");
        store.forget_pending_key();
        write_node_kubeconfig(config, &store)?;
    } else {
        info!(
            bootstrap = %config.bootstrap_kubeconfig.display(),
            node = %config.node_name,
            "no valid client certificate: requesting one with the bootstrap credential"
        );
        let bootstrap = client_from_kubeconfig(&config.bootstrap_kubeconfig).await?;
        let key = store.pending_key()?;
        let pem = request_certificate(&bootstrap, config, &key, true).await?;
        store.save(&pem, &key)?;
        store.forget_pending_key();
        write_node_kubeconfig(config, &store)?;
    }
    let client = client_from_kubeconfig(&config.kubeconfig).await?;
    if !config.rotate {
        return Ok(client);
    }
    if !kubeconfig_uses_store(&config.kubeconfig, &store) {
        warn!(
            kubeconfig = %config.kubeconfig.display(),
            "--rotate-certificates: the kubeconfig's certificate is not in the store ({}); not rotating it",
            store.current().display()
        );
        return Ok(client);
    }
    let swappable = SwappableClient::new(client);
    let outer = swappable.client();
    tokio::spawn(rotate_forever(config.clone(), store, swappable));
    Ok(outer)
}

/// Renews the certificate at each rotation deadline, for the life of the process.
async fn rotate_forever(config: BootstrapConfig, store: CertStore, client: SwappableClient) {
    let mut backoff = Duration::from_secs(1);
    loop {
        // Never faster than once a second, as client-go's manager: a certificate that is due
        // at once (a short signing duration, an end date capped by the CA's) must not turn
        // into a stream of requests.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let current = store.current_validity();
        if let Some(validity) = current {
            let deadline = validity.rotation_deadline(config.rotate_after);
            if let Ok(wait) = deadline.duration_since(SystemTime::now()) {
                info!(
                    in_seconds = wait.as_secs(),
                    "next client certificate rotation"
                );
                tokio::time::sleep(wait).await;
            }
        }
        // An expired certificate cannot ask for its successor: the bootstrap credential
        // does, as the kubelet falls back to it.
        let via = match current {
            Some(_) => Ok(client.client()),
            None => {
                warn!(certificate = %store.current().display(), "the client certificate expired: renewing it with the bootstrap credential");
                client_from_kubeconfig(&config.bootstrap_kubeconfig).await
            }
        };
        let result = match via {
            Ok(via) => rotate_once(&config, &store, &client, &via).await,
            Err(err) => Err(err),
        };
        match result {
            Ok(()) => backoff = Duration::from_secs(1),
            Err(err) => {
                warn!(error = %err, retry_in_seconds = backoff.as_secs(), "client certificate rotation failed");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(300));
            }
        }
    }
}

/// One rotation: a request through `via`, the new certificate stored, the client switched to
/// it.
async fn rotate_once(
    config: &BootstrapConfig,
    store: &CertStore,
    client: &SwappableClient,
    via: &Client,
) -> Result<(), BootstrapError> {
    let key = rcgen::KeyPair::generate()?;
    let pem = request_certificate(via, config, &key, false).await?;
    store.save(&pem, &key)?;
    // The store now names the new certificate: the client must follow it, or the old one
    // would stay in use until it expires. The kubeconfig is devicelet's own, so a failure
    // here is transient (a full disk): retry until it works.
    let mut backoff = Duration::from_secs(1);
    loop {
        match client_from_kubeconfig(&config.kubeconfig).await {
            Ok(new) => {
                client.swap(new);
                break;
            }
            Err(err) => {
                warn!(error = %err, "cannot build a client on the rotated certificate; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(60));
            }
        }
    }
    let validity = store.current_validity();
    info!(
        expires = %validity.map(|v| v.not_after_text()).unwrap_or_default(),
        "client certificate rotated"
    );
    Ok(())
}

/// Creates the request and waits until it is issued; returns the certificate (PEM).
/// `bootstrap`: named from the key (a restart finds its own pending request again), as the
/// kubelet names bootstrap requests; renewals use a generated name.
async fn request_certificate(
    client: &Client,
    config: &BootstrapConfig,
    key: &rcgen::KeyPair,
    bootstrap: bool,
) -> Result<Vec<u8>, BootstrapError> {
    let request = certificate_request(&config.node_name, key)?;
    let api: Api<CertificateSigningRequest> = Api::all(client.clone());
    let mut csr = CertificateSigningRequest {
        spec: CertificateSigningRequestSpec {
            request: ByteString(request.into_bytes()),
            signer_name: KUBELET_CLIENT_SIGNER.to_owned(),
            usages: Some(USAGES.iter().map(|u| (*u).to_owned()).collect()),
            ..Default::default()
        },
        ..Default::default()
    };
    if bootstrap {
        csr.metadata.name = Some(digested_name(&config.node_name, key));
    } else {
        csr.metadata.generate_name = Some("csr-".to_owned());
    }
    let name = match with_deadline(
        "create CertificateSigningRequest",
        api.create(&PostParams::default(), &csr),
    )
    .await
    {
        Ok(created) => created.metadata.name.unwrap_or_default(),
        Err(ClusterError::Api {
            source: kube::Error::Api(status),
            ..
        }) if status.code == 409 => {
            // Created before a restart with the same key: wait for that one.
            let name = csr.metadata.name.unwrap_or_default();
            info!(csr = %name, "continuing the CertificateSigningRequest made before a restart");
            name
        }
        Err(err) => return Err(err.into()),
    };
    info!(csr = %name, signer = KUBELET_CLIENT_SIGNER, "CertificateSigningRequest created; waiting for approval and issuance");
    let certificate = wait_for_certificate(&api, &name, config.wait).await?;
    check_certificate(&name, &config.node_name, &certificate, key)?;
    Ok(certificate)
}

/// Polls the request until it has a certificate, is denied or failed, or `wait` passes.
async fn wait_for_certificate(
    api: &Api<CertificateSigningRequest>,
    name: &str,
    wait: Duration,
) -> Result<Vec<u8>, BootstrapError> {
    let started = tokio::time::Instant::now();
    let mut approved = false;
    loop {
        let csr = match with_deadline(
            format!("get CertificateSigningRequest {name}"),
            api.get(name),
        )
        .await
        {
            Ok(csr) => Some(csr),
            Err(ClusterError::Api {
                source: kube::Error::Api(status),
                ..
            }) if status.code == 404 => {
                return Err(BootstrapError::Failed {
                    name: name.to_owned(),
                    reason: "Deleted".to_owned(),
                    message: "the request was deleted before it was issued".to_owned(),
                });
            }
            // The API server restarting, a reset connection: look again until the wait ends.
            Err(err) => {
                warn!(csr = %name, error = %err, "cannot read the CertificateSigningRequest; retrying");
                None
            }
        };
        let status = csr.and_then(|c| c.status).unwrap_or_default();
        for condition in status.conditions.unwrap_or_default() {
            if condition.status != "True" {
                continue;
            }
            let reason = condition.reason.unwrap_or_default();
            let message = condition.message.unwrap_or_default();
            match condition.type_.as_str() {
                "Denied" => {
                    return Err(BootstrapError::Denied {
                        name: name.to_owned(),
                        reason,
                        message,
                    });
                }
                "Failed" => {
                    return Err(BootstrapError::Failed {
                        name: name.to_owned(),
                        reason,
                        message,
                    });
                }
                "Approved" if !approved => {
                    approved = true;
                    info!(csr = %name, "CertificateSigningRequest approved; waiting for the signer");
                }
                _ => {}
            }
        }
        if let Some(certificate) = status.certificate.filter(|c| !c.0.is_empty()) {
            return Ok(certificate.0);
        }
        if started.elapsed() >= wait {
            return Err(if approved {
                BootstrapError::Timeout {
                    name: name.to_owned(),
                    what: "issued",
                    waited: wait,
                    hint: "it is approved: is kube-controller-manager running with \
                           --cluster-signing-cert-file and --cluster-signing-key-file?",
                }
            } else {
                BootstrapError::Timeout {
                    name: name.to_owned(),
                    what: "approved",
                    waited: wait,
                    hint: "approve it (`kubectl certificate approve NAME`), or bind the \
                           bootstrap identity to ClusterRole \
                           system:certificates.k8s.io:certificatesigningrequests:nodeclient so \
                           that kube-controller-manager approves it",
                }
            });
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The PEM request for `system:node:<node>` in `system:nodes`, signed with `key`.
fn certificate_request(node: &str, key: &rcgen::KeyPair) -> Result<String, BootstrapError> {
    let mut params = rcgen::CertificateParams::default();
    let mut subject = rcgen::DistinguishedName::new();
    subject.push(rcgen::DnType::OrganizationName, NODES_GROUP);
    subject.push(rcgen::DnType::CommonName, format!("system:node:{node}"));
    params.distinguished_name = subject;
    Ok(params.serialize_request(key)?.pem()?)
}

/// `node-csr-<hash of the public key, subject and usages>`: the same key gives the same name.
fn digested_name(node: &str, key: &rcgen::KeyPair) -> String {
    use rcgen::PublicKeyData;
    let mut context = ring::digest::Context::new(&ring::digest::SHA256);
    context.update(&key.subject_public_key_info());
    let subject = format!("system:node:{node}");
    for part in [subject.as_str(), NODES_GROUP].into_iter().chain(USAGES) {
        context.update(&[0]);
        context.update(part.as_bytes());
    }
    let digest = context.finish();
    let hex: String = digest
        .as_ref()
        .iter()
        .take(16)
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("node-csr-{hex}")
}

/// The issued certificate must be for the key devicelet holds and valid now.
fn check_certificate(
    name: &str,
    node: &str,
    pem: &[u8],
    key: &rcgen::KeyPair,
) -> Result<(), BootstrapError> {
    use rcgen::PublicKeyData;
    let bad = |message: String| BootstrapError::BadCertificate {
        name: name.to_owned(),
        message,
    };
    let info = first_certificate(pem).map_err(bad)?;
    if info.spki != key.subject_public_key_info() {
        return Err(bad("it is not for devicelet's key".to_owned()));
    }
    if !info.is_for(node) {
        return Err(bad(format!(
            "it is for {}, not system:node:{node}",
            info.subject()
        )));
    }
    let validity = info.validity;
    if !validity.valid_now() {
        return Err(bad(format!(
            "it is not valid now (until {})",
            validity.not_after_text()
        )));
    }
    Ok(())
}

/// A certificate's validity period.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Validity {
    /// Not before (seconds since the epoch).
    pub not_before: i64,
    /// Not after (seconds since the epoch).
    pub not_after: i64,
}

impl Validity {
    /// Not expired. The start is not checked, as the kubelet does not: a node whose clock is
    /// behind the signer's (which backdates by 5 minutes) still uses a fresh certificate.
    fn valid_now(&self) -> bool {
        unix_now() < self.not_after
    }

    fn not_after_text(&self) -> String {
        k8s_openapi::jiff::Timestamp::from_second(self.not_after)
            .map(|t| t.to_string())
            .unwrap_or_else(|_| self.not_after.to_string())
    }

    /// client-go's deadline: not-before plus 70-90 % of the lifetime (jittered so that nodes
    /// issued together do not all renew together), or `rotate_after` from now when that is
    /// sooner.
    pub fn rotation_deadline(&self, rotate_after: Option<Duration>) -> SystemTime {
        let lifetime = (self.not_after - self.not_before).max(0) as f64;
        let fraction = 0.7 + 0.2 * jitter();
        let seconds = self.not_before as f64 + lifetime * fraction;
        let deadline = UNIX_EPOCH + Duration::from_secs_f64(seconds.max(0.0));
        match rotate_after {
            Some(after) => deadline.min(SystemTime::now() + after),
            None => deadline,
        }
    }
}

/// A number in [0, 1) that differs between processes and calls (not for cryptography).
fn jitter() -> f64 {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let mixed = (u64::from(nanos) ^ u64::from(std::process::id()).rotate_left(32))
        .wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (mixed >> 11) as f64 / (1u64 << 53) as f64
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// What devicelet reads from a certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
struct CertInfo {
    /// SubjectPublicKeyInfo (DER).
    spki: Vec<u8>,
    validity: Validity,
    common_names: Vec<String>,
    organizations: Vec<String>,
}

impl CertInfo {
    /// For `system:node:<node>` in `system:nodes`: what the Node authorizer needs.
    fn is_for(&self, node: &str) -> bool {
        self.common_names == [format!("system:node:{node}")]
            && self.organizations.iter().any(|o| o == NODES_GROUP)
    }

    fn subject(&self) -> String {
        format!(
            "CN={} O={}",
            self.common_names.join("+"),
            self.organizations.join("+")
        )
    }
}

/// The first certificate of a PEM text.
fn first_certificate(pem: &[u8]) -> Result<CertInfo, String> {
    for block in x509_parser::pem::Pem::iter_from_buffer(pem) {
        let block = block.map_err(|e| format!("not PEM: {e}"))?;
        if block.label != "CERTIFICATE" {
            continue;
        }
        let certificate = block
            .parse_x509()
            .map_err(|e| format!("not an X.509 certificate: {e}"))?;
        let validity = certificate.validity();
        let subject = certificate.subject();
        let common_names = subject
            .iter_common_name()
            .filter_map(|a| a.as_str().ok().map(str::to_owned))
            .collect();
        let organizations = subject
            .iter_organization()
            .filter_map(|a| a.as_str().ok().map(str::to_owned))
            .collect();
        return Ok(CertInfo {
            spki: certificate.public_key().raw.to_vec(),
            validity: Validity {
                not_before: validity.not_before.timestamp(),
                not_after: validity.not_after.timestamp(),
            },
            common_names,
            organizations,
        });
    }
    Err("no CERTIFICATE block".to_owned())
}

/// The certificate store under `R/pki`, laid out as the kubelet's.
#[derive(Debug, Clone)]
struct CertStore {
    dir: PathBuf,
    /// The node whose certificates are wanted.
    node: String,
}

impl CertStore {
    fn new(dir: &Path, node: &str) -> Self {
        CertStore {
            dir: dir.to_path_buf(),
            node: node.to_owned(),
        }
    }

    fn current(&self) -> PathBuf {
        self.dir.join(CURRENT_PEM)
    }

    /// The current certificate's validity, if it exists, parses, is this node's and is valid
    /// now (another node's, from a renamed node, means a new bootstrap).
    fn current_validity(&self) -> Option<Validity> {
        let pem = std::fs::read(self.current()).ok()?;
        let info = first_certificate(&pem).ok()?;
        if !info.is_for(&self.node) {
            warn!(
                certificate = %self.current().display(),
                subject = %info.subject(),
                node = %self.node,
                "the stored certificate is another node's; not using it"
            );
            return None;
        }
        info.validity.valid_now().then_some(info.validity)
    }

    /// The key of a pending bootstrap request, created (0600) when there is none.
    fn pending_key(&self) -> Result<rcgen::KeyPair, BootstrapError> {
        let path = self.dir.join(PENDING_KEY);
        if let Ok(text) = std::fs::read_to_string(&path) {
            match rcgen::KeyPair::from_pem(&text) {
                Ok(key) => return Ok(key),
                Err(err) => {
                    warn!(key = %path.display(), error = %err, "unusable pending key replaced")
                }
            }
        }
        let key = rcgen::KeyPair::generate()?;
        write_private(&path, key.serialize_pem().as_bytes())?;
        Ok(key)
    }

    fn forget_pending_key(&self) {
        let _ = std::fs::remove_file(self.dir.join(PENDING_KEY));
    }

    /// Writes `kubelet-client-<time>.pem` (certificate then key, 0600) and points
    /// `kubelet-client-current.pem` at it.
    fn save(&self, certificate: &[u8], key: &rcgen::KeyPair) -> Result<PathBuf, BootstrapError> {
        let stamp = k8s_openapi::jiff::Timestamp::now().strftime("%Y-%m-%d-%H-%M-%S");
        let path = self.dir.join(format!("kubelet-client-{stamp}.pem"));
        let mut content = certificate.to_vec();
        if !content.ends_with(b"\n") {
            content.push(b'\n');
        }
        content.extend_from_slice(key.serialize_pem().as_bytes());
        write_private(&path, &content)?;
        let link = self.current();
        let tmp_link = self.dir.join(format!("{CURRENT_PEM}.tmp"));
        let _ = std::fs::remove_file(&tmp_link);
        std::os::unix::fs::symlink(&path, &tmp_link)
            .map_err(BootstrapError::io("link", &tmp_link))?;
        std::fs::rename(&tmp_link, &link).map_err(BootstrapError::io("replace", &link))?;
        sync_dir(&self.dir);
        info!(certificate = %path.display(), "client certificate stored");
        Ok(path)
    }
}

/// Writes `content` to `path` with mode 0600 (temporary file, fsync, rename).
fn write_private(path: &Path, content: &[u8]) -> Result<(), BootstrapError> {
    use std::io::Write;
    let tmp = path.with_extension("writing");
    let _ = std::fs::remove_file(&tmp);
    let written = (|| {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(BootstrapError::io("create", &tmp))?;
        file.write_all(content)
            .and_then(|()| file.sync_all())
            .map_err(BootstrapError::io("write", &tmp))?;
        // The mode given to open is subject to the umask, which may only remove bits.
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))
            .map_err(BootstrapError::io("chmod", &tmp))?;
        std::fs::rename(&tmp, path).map_err(BootstrapError::io("replace", path))
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written?;
    if let Some(dir) = path.parent() {
        sync_dir(dir);
    }
    Ok(())
}

fn sync_dir(dir: &Path) {
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
}

/// The client certificate of `path`'s current user, if the file exists, names a certificate
/// and a key that can be read, and the certificate is valid now; `None` means "bootstrap"
/// (a kubeconfig without a certificate, e.g. a token, too: the kubelet bootstraps then). A
/// certificate for another node is an error: joining with it would be refused.
fn kubeconfig_certificate(path: &Path, node: &str) -> Result<Option<Validity>, BootstrapError> {
    if !path.exists() {
        return Ok(None);
    }
    let Ok(kubeconfig) = Kubeconfig::read_from(path) else {
        warn!(kubeconfig = %path.display(), "unreadable kubeconfig: bootstrapping a new one");
        return Ok(None);
    };
    let Some(user) = current_user(&kubeconfig) else {
        return Ok(None);
    };
    let pem = if let Some(data) = &user.client_certificate_data {
        base64::engine::general_purpose::STANDARD
            .decode(data.trim())
            .ok()
    } else if let Some(file) = &user.client_certificate {
        std::fs::read(file).ok()
    } else {
        None
    };
    let key_readable = user.client_key_data.is_some()
        || user
            .client_key
            .as_ref()
            .is_some_and(|file| std::fs::File::open(file).is_ok());
    match pem.and_then(|pem| first_certificate(&pem).ok()) {
        Some(info) if !info.is_for(node) => Err(BootstrapError::Kubeconfig {
            path: path.to_path_buf(),
            message: format!(
                "its client certificate is for {}, not system:node:{node}: give this node its \
                 own --kubeconfig path",
                info.subject()
            ),
        }),
        Some(info) if key_readable && info.validity.valid_now() => Ok(Some(info.validity)),
        _ => {
            info!(kubeconfig = %path.display(), "the kubeconfig has no usable client certificate and key: bootstrapping");
            Ok(None)
        }
    }
}

/// The current context's user.
fn current_user(kubeconfig: &Kubeconfig) -> Option<&kube::config::AuthInfo> {
    let context_name = kubeconfig.current_context.as_deref()?;
    let context = kubeconfig
        .contexts
        .iter()
        .find(|c| c.name == context_name)?
        .context
        .as_ref()?;
    let user = context.user.as_deref()?;
    kubeconfig
        .auth_infos
        .iter()
        .find(|a: &&NamedAuthInfo| a.name == user)?
        .auth_info
        .as_ref()
}

fn kubeconfig_uses_store(path: &Path, store: &CertStore) -> bool {
    Kubeconfig::read_from(path)
        .ok()
        .and_then(|k| current_user(&k).and_then(|u| u.client_certificate.clone()))
        .is_some_and(|file| Path::new(&file) == store.current())
}

/// Writes the node's kubeconfig (0600), as the kubelet does: the bootstrap kubeconfig's
/// cluster, and the store's current certificate and key as the user.
fn write_node_kubeconfig(
    config: &BootstrapConfig,
    store: &CertStore,
) -> Result<(), BootstrapError> {
    let bad = |message: String| BootstrapError::Kubeconfig {
        path: config.bootstrap_kubeconfig.clone(),
        message,
    };
    let bootstrap =
        Kubeconfig::read_from(&config.bootstrap_kubeconfig).map_err(|e| bad(e.to_string()))?;
    let context_name = bootstrap
        .current_context
        .clone()
        .ok_or_else(|| bad("no current-context".to_owned()))?;
    let cluster_name = bootstrap
        .contexts
        .iter()
        .find(|c| c.name == context_name)
        .and_then(|c| c.context.as_ref())
        .map(|c| c.cluster.clone())
        .ok_or_else(|| bad(format!("context {context_name:?} not found")))?;
    let cluster = bootstrap
        .clusters
        .iter()
        .find(|c| c.name == cluster_name)
        .and_then(|c| c.cluster.clone())
        .ok_or_else(|| bad(format!("cluster {cluster_name:?} not found")))?;
    let pem = store.current().display().to_string();
    let document = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "default-cluster", "cluster": cluster}],
        "contexts": [{"name": "default-context", "context": {
            "cluster": "default-cluster", "namespace": "default", "user": "default-auth"}}],
        "current-context": "default-context",
        "users": [{"name": "default-auth", "user": {"client-certificate": pem, "client-key": pem}}],
    });
    let text = serde_yaml::to_string(&document).map_err(|e| BootstrapError::Kubeconfig {
        path: config.kubeconfig.clone(),
        message: e.to_string(),
    })?;
    if let Some(dir) = config
        .kubeconfig
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
    {
        std::fs::create_dir_all(dir).map_err(BootstrapError::io("create", dir))?;
    }
    write_private(&config.kubeconfig, text.as_bytes())?;
    info!(kubeconfig = %config.kubeconfig.display(), "node kubeconfig written");
    Ok(())
}

/// A client for a kubeconfig file, with devicelet's timeouts.
async fn client_from_kubeconfig(path: &Path) -> Result<Client, BootstrapError> {
    let source = crate::client::ClusterSource::Kubeconfig(path.to_path_buf());
    Ok(crate::client::connect(&source).await?)
}

/// A client whose requests go to the newest inner client: [`Self::swap`] after a rotation
/// moves every later request to the new certificate without rebuilding its users.
#[derive(Clone)]
pub struct SwappableClient {
    inner: Arc<RwLock<Client>>,
}

impl SwappableClient {
    /// Starts with `client`.
    pub fn new(client: Client) -> Self {
        SwappableClient {
            inner: Arc::new(RwLock::new(client)),
        }
    }

    /// A [`Client`] whose every request goes through this one.
    pub fn client(&self) -> Client {
        let namespace = self.current().default_namespace().to_owned();
        Client::new(self.clone(), namespace)
    }

    /// Later requests use `client`.
    pub fn swap(&self, client: Client) {
        match self.inner.write() {
            Ok(mut guard) => *guard = client,
            Err(poisoned) => *poisoned.into_inner() = client,
        }
    }

    fn current(&self) -> Client {
        match self.inner.read() {
            Ok(guard) => guard.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }
}

impl tower::Service<http::Request<kube::client::Body>> for SwappableClient {
    type Response = http::Response<kube::client::Body>;
    type Error = kube::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(
        &mut self,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<kube::client::Body>) -> Self::Future {
        let client = self.current();
        Box::pin(async move { client.send(request).await })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use x509_parser::prelude::FromDer;

    /// A certificate valid from 2020 until 2999, or one that expired in 2020.
    fn self_signed(node: &str, valid: bool) -> (String, rcgen::KeyPair) {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, format!("system:node:{node}"));
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, NODES_GROUP);
        params.not_before = rcgen::date_time_ymd(2020, 1, 1);
        params.not_after = if valid {
            rcgen::date_time_ymd(2999, 1, 1)
        } else {
            rcgen::date_time_ymd(2020, 1, 2)
        };
        (params.self_signed(&key).unwrap().pem(), key)
    }

    #[test]
    fn the_request_names_the_node_and_its_group_only() {
        let key = rcgen::KeyPair::generate().unwrap();
        let pem = certificate_request("gpu-1", &key).unwrap();
        let (_, block) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).unwrap();
        assert_eq!(block.label, "CERTIFICATE REQUEST");
        let (_, csr) =
            x509_parser::certification_request::X509CertificationRequest::from_der(&block.contents)
                .unwrap();
        let subject = &csr.certification_request_info.subject;
        let cn: Vec<_> = subject
            .iter_common_name()
            .map(|a| a.as_str().unwrap())
            .collect();
        let o: Vec<_> = subject
            .iter_organization()
            .map(|a| a.as_str().unwrap())
            .collect();
        assert_eq!(cn, ["system:node:gpu-1"]);
        assert_eq!(o, ["system:nodes"]);
        // No extensions: no DNS names, IPs or e-mails (the approver refuses those).
        assert!(
            csr.requested_extensions()
                .is_none_or(|mut e| e.next().is_none())
        );
    }

    #[test]
    fn a_bootstrap_request_name_follows_the_key() {
        let a = rcgen::KeyPair::generate().unwrap();
        let b = rcgen::KeyPair::generate().unwrap();
        let name = digested_name("n", &a);
        assert_eq!(name, digested_name("n", &a));
        assert_ne!(name, digested_name("n", &b));
        assert_ne!(name, digested_name("m", &a));
        assert!(name.starts_with("node-csr-") && name.len() == 9 + 32);
    }

    #[test]
    fn rotation_is_due_at_70_to_90_percent_or_sooner_when_asked() {
        let v = Validity {
            not_before: 1_000,
            not_after: 11_000,
        };
        for _ in 0..50 {
            let at = v
                .rotation_deadline(None)
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_secs_f64();
            assert!((8_000.0..=10_000.0).contains(&at), "{at}");
        }
        let later = Validity {
            not_before: unix_now(),
            not_after: unix_now() + 86_400,
        };
        let soon = later.rotation_deadline(Some(Duration::from_secs(30)));
        let from_now = soon.duration_since(SystemTime::now()).unwrap();
        assert!(from_now <= Duration::from_secs(30) && from_now > Duration::from_secs(25));
    }

    #[test]
    fn the_store_writes_0600_and_links_the_current_certificate() {
        let dir = tempfile::tempdir().unwrap();
        let store = CertStore::new(dir.path(), "n");
        assert!(store.current_validity().is_none());
        let (pem, key) = self_signed("n", true);
        let written = store.save(pem.as_bytes(), &key).unwrap();
        let mode = std::fs::metadata(&written).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(std::fs::read_link(store.current()).unwrap(), written);
        assert!(store.current_validity().is_some());
        // Certificate and key in one file, as the kubelet's store keeps them.
        let text = std::fs::read_to_string(store.current()).unwrap();
        assert!(text.contains("BEGIN CERTIFICATE") && text.contains("PRIVATE KEY"));
        check_certificate("x", "n", pem.as_bytes(), &key).unwrap();
        let err = check_certificate("x", "m", pem.as_bytes(), &key).unwrap_err();
        assert!(err.to_string().contains("not system:node:m"), "{err}");
        // Another node's certificate in the store is not used.
        assert!(CertStore::new(dir.path(), "m").current_validity().is_none());
        let other = rcgen::KeyPair::generate().unwrap();
        let err = check_certificate("x", "n", pem.as_bytes(), &other).unwrap_err();
        assert!(err.to_string().contains("not for devicelet's key"), "{err}");
        // The pending key survives a restart: the same request name.
        let k1 = store.pending_key().unwrap();
        let k2 = store.pending_key().unwrap();
        assert_eq!(digested_name("n", &k1), digested_name("n", &k2));
    }

    /// Writes a kubeconfig whose current context's user is `user` (a YAML flow mapping).
    fn write_kubeconfig(path: &Path, user: &str) {
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters: [{{name: c, cluster: {{server: https://127.0.0.1:1}}}}]\n\
             contexts: [{{name: x, context: {{cluster: c, user: u}}}}]\ncurrent-context: x\n\
             users: [{{name: u, user: {user}}}]\n"
        );
        std::fs::write(path, text).unwrap();
    }

    /// `{client-certificate: CERT, client-key: KEY}`.
    fn certificate_user(cert: &Path, key: &Path) -> String {
        format!(
            "{{client-certificate: {}, client-key: {}}}",
            cert.display(),
            key.display()
        )
    }

    #[test]
    fn an_expired_kubeconfig_certificate_means_bootstrap() {
        let dir = tempfile::tempdir().unwrap();
        let (pem, key) = self_signed("n", false);
        let cert = dir.path().join("c.pem");
        std::fs::write(&cert, format!("{pem}{}", key.serialize_pem())).unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        write_kubeconfig(&kubeconfig, &certificate_user(&cert, &cert));
        assert_eq!(kubeconfig_certificate(&kubeconfig, "n").unwrap(), None);
        let (pem, key) = self_signed("n", true);
        std::fs::write(&cert, format!("{pem}{}", key.serialize_pem())).unwrap();
        assert!(kubeconfig_certificate(&kubeconfig, "n").unwrap().is_some());
        assert_eq!(
            kubeconfig_certificate(&dir.path().join("missing"), "n").unwrap(),
            None
        );
    }

    #[test]
    fn another_nodes_kubeconfig_is_an_error_and_a_token_means_bootstrap() {
        let dir = tempfile::tempdir().unwrap();
        let (pem, key) = self_signed("other", true);
        let cert = dir.path().join("c.pem");
        std::fs::write(&cert, format!("{pem}{}", key.serialize_pem())).unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        write_kubeconfig(&kubeconfig, &certificate_user(&cert, &cert));
        let err = kubeconfig_certificate(&kubeconfig, "n").unwrap_err();
        assert!(
            err.to_string()
                .contains("is for CN=system:node:other O=system:nodes, not system:node:n"),
            "{err}"
        );
        // A token (the bootstrap kubeconfig given as --kubeconfig too) is not a node identity.
        write_kubeconfig(&kubeconfig, "{token: abc.def}");
        assert_eq!(kubeconfig_certificate(&kubeconfig, "n").unwrap(), None);
        // A certificate whose key file is gone: bootstrap again.
        let (pem, _) = self_signed("n", true);
        std::fs::write(&cert, pem).unwrap();
        write_kubeconfig(
            &kubeconfig,
            &certificate_user(&cert, &dir.path().join("gone.key")),
        );
        assert_eq!(kubeconfig_certificate(&kubeconfig, "n").unwrap(), None);
    }

    /// A client whose every answer is `name` (a stand-in for one certificate's connection).
    fn answering(name: &'static str) -> Client {
        let service = tower::service_fn(
            move |_request: http::Request<kube::client::Body>| async move {
                Ok::<_, std::convert::Infallible>(http::Response::new(kube::client::Body::from(
                    name.as_bytes().to_vec(),
                )))
            },
        );
        Client::new(service, "default")
    }

    async fn answer_of(client: &Client) -> String {
        let request = http::Request::get("/version")
            .body(kube::client::Body::empty())
            .unwrap();
        let response = client.send(request).await.unwrap();
        let bytes = response.into_body().collect_bytes().await.unwrap();
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    #[tokio::test]
    async fn a_swap_moves_every_later_request_of_existing_clones() {
        let swappable = SwappableClient::new(answering("first certificate"));
        let client = swappable.client();
        let clone = client.clone();
        assert_eq!(answer_of(&client).await, "first certificate");
        swappable.swap(answering("rotated certificate"));
        assert_eq!(answer_of(&client).await, "rotated certificate");
        assert_eq!(answer_of(&clone).await, "rotated certificate");
    }
}
