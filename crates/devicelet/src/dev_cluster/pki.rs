//! The dev cluster's certificates and kubeconfigs, made fresh by each `up` (what kubeadm's
//! `certs` phase makes, ECDSA P-256 instead of RSA): a CA of its own, the API server's serving
//! certificate for loopback, a client certificate per identity (the admin in `system:masters`,
//! `system:kube-controller-manager`, `system:kube-scheduler`, each node as
//! `system:node:NAME` in `system:nodes`), and the service-account signing key. Keys are
//! written 0600.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use anyhow::Context;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose,
};

/// A client identity's files.
#[derive(Debug, Clone)]
pub struct ClientCert {
    /// The certificate (PEM).
    pub cert: PathBuf,
    /// Its key (PEM, 0600).
    pub key: PathBuf,
}

/// The cluster's CA and the files it signed, under one directory.
pub struct Pki {
    dir: PathBuf,
    ca: CertifiedIssuer<'static, KeyPair>,
}

impl Pki {
    /// Makes a new CA and the service-account key pair in `dir` (`ca.crt`, `ca.key`,
    /// `sa.key`, `sa.pub`).
    pub fn create(dir: &Path) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
        let key = KeyPair::generate().context("generate the CA key")?;
        let mut params = CertificateParams::default();
        params.distinguished_name = name("devicelet-dev-cluster-ca", None);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca = CertifiedIssuer::self_signed(params, key).context("sign the CA certificate")?;
        write(&dir.join("ca.crt"), &ca.pem(), false)?;
        write(&dir.join("ca.key"), &ca.key().serialize_pem(), true)?;
        let sa = KeyPair::generate().context("generate the service-account key")?;
        write(&dir.join("sa.key"), &sa.serialize_pem(), true)?;
        write(&dir.join("sa.pub"), &sa.public_key_pem(), false)?;
        Ok(Self {
            dir: dir.to_path_buf(),
            ca,
        })
    }

    /// The CA certificate.
    pub fn ca_cert(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    /// The CA key (the controller manager's CSR signer).
    pub fn ca_key(&self) -> PathBuf {
        self.dir.join("ca.key")
    }

    /// The service-account signing key and its public half.
    pub fn service_account(&self) -> (PathBuf, PathBuf) {
        (self.dir.join("sa.key"), self.dir.join("sa.pub"))
    }

    /// A serving certificate `NAME.crt`/`NAME.key` for the loopback addresses and the
    /// in-cluster names of the API server.
    pub fn serving(&self, file: &str, common_name: &str) -> anyhow::Result<ClientCert> {
        let sans = [
            "127.0.0.1",
            "10.0.0.1",
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
        ]
        .map(String::from);
        let mut params = CertificateParams::new(sans.to_vec()).context("serving names")?;
        params.distinguished_name = name(common_name, None);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.sign(file, params)
    }

    /// A client certificate `NAME.crt`/`NAME.key` for user `common_name` in `group`.
    pub fn client(
        &self,
        file: &str,
        common_name: &str,
        group: Option<&str>,
    ) -> anyhow::Result<ClientCert> {
        let mut params = CertificateParams::default();
        params.distinguished_name = name(common_name, group);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.sign(file, params)
    }

    fn sign(&self, file: &str, params: CertificateParams) -> anyhow::Result<ClientCert> {
        let key = KeyPair::generate().with_context(|| format!("generate the key of {file}"))?;
        let cert = params
            .signed_by(&key, &self.ca)
            .with_context(|| format!("sign {file}"))?;
        let files = ClientCert {
            cert: self.dir.join(format!("{file}.crt")),
            key: self.dir.join(format!("{file}.key")),
        };
        write(&files.cert, &cert.pem(), false)?;
        write(&files.key, &key.serialize_pem(), true)?;
        Ok(files)
    }
}

fn name(common_name: &str, group: Option<&str>) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    if let Some(group) = group {
        dn.push(DnType::OrganizationName, group);
    }
    dn.push(DnType::CommonName, common_name);
    dn
}

/// Writes a kubeconfig at `path` for `user` with `client` against `server`.
pub fn write_kubeconfig(
    path: &Path,
    server: &str,
    ca: &Path,
    user: &str,
    client: &ClientCert,
) -> anyhow::Result<()> {
    let text = format!(
        "apiVersion: v1
kind: Config
clusters:
- name: devicelet-dev
  cluster:
    server: {server}
    certificate-authority: {ca}
users:
- name: {user:?}
  user:
    client-certificate: {cert}
    client-key: {key}
contexts:
- name: devicelet-dev
  context: {{cluster: devicelet-dev, user: {user:?}}}
current-context: devicelet-dev
",
        ca = ca.display(),
        cert = client.cert.display(),
        key = client.key.display(),
    );
    write(path, &text, true)
}

/// Writes `text` to `path` (0600 when `secret`, else 0644), replacing it.
fn write(path: &Path, text: &str, secret: bool) -> anyhow::Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(if secret { 0o600 } else { 0o644 })
        .open(path)
        .with_context(|| format!("write {}", path.display()))?;
    file.write_all(text.as_bytes())
        .with_context(|| format!("write {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities_are_signed_by_the_cluster_ca_and_keys_are_private() {
        let dir = tempfile::tempdir().unwrap();
        let pki = Pki::create(dir.path()).unwrap();
        let node = pki
            .client("node-a", "system:node:a", Some("system:nodes"))
            .unwrap();
        let pem = std::fs::read(&node.cert).unwrap();
        let (_, parsed) = x509_parser::pem::parse_x509_pem(&pem).unwrap();
        let cert = parsed.parse_x509().unwrap();
        let subject = cert.subject().to_string();
        assert!(subject.contains("CN=system:node:a"), "{subject}");
        assert!(subject.contains("O=system:nodes"), "{subject}");
        assert!(
            cert.issuer()
                .to_string()
                .contains("devicelet-dev-cluster-ca")
        );
        use std::os::unix::fs::PermissionsExt;
        for key in [&node.key, &pki.ca_key(), &pki.service_account().0] {
            let mode = std::fs::metadata(key).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600, "{}", key.display());
        }
        let server = pki.serving("apiserver", "kube-apiserver").unwrap();
        let pem = std::fs::read(&server.cert).unwrap();
        let (_, parsed) = x509_parser::pem::parse_x509_pem(&pem).unwrap();
        let cert = parsed.parse_x509().unwrap();
        let sans = format!("{:?}", cert.subject_alternative_name().unwrap().unwrap());
        assert!(sans.contains("kubernetes.default.svc"), "{sans}");
    }
}
