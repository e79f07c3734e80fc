//! TLS to Redis with rustls (ring): which CA to trust, the optional client certificate,
//! and the name the servers' certificates must carry.
//!
//! fred builds one TLS connector for the life of the client, so the CA and the client
//! certificate sit behind swappable handles: a reload (SIGHUP) reads the files again,
//! and the next handshake (the reload forces reconnects) uses them. A wrong CA, an
//! expired certificate or a missing file can thus be fixed without a restart.
//!
//! Names: without `tls_server_name` each node's certificate must match the address the
//! daemon dials: the seed's host, or for nodes learnt from `CLUSTER SLOTS` their IP (so
//! certificates carry IP SANs). With it, every node's certificate is checked against
//! that one name.

use arc_swap::{ArcSwap, ArcSwapOption};
use fred::types::config::{HostMapping, TlsConfig, TlsConnector, TlsHostMapping};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{ResolvesClientCert, WebPkiServerVerifier};
use rustls::crypto::CryptoProvider;
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;

/// The TLS files and name from `[redis]`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM CA bundle to trust (`tls_ca_file`); `None`: the system's trust store.
    pub ca: Option<PathBuf>,
    /// PEM client certificate chain (`tls_cert_file`), with `key`.
    pub cert: Option<PathBuf>,
    /// PEM private key of the client certificate (`tls_key_file`).
    pub key: Option<PathBuf>,
    /// The name every server certificate must carry (`tls_server_name`).
    pub server_name: Option<String>,
}

/// The live TLS material: build once, [`Tls::reload`] on SIGHUP.
#[derive(Debug)]
pub struct Tls {
    verifier: Arc<Verifier>,
    client_cert: Arc<ClientCert>,
    provider: Arc<CryptoProvider>,
    server_name: Option<String>,
}

impl Tls {
    /// Reads `files`.
    ///
    /// # Errors
    /// A message naming the field and file that could not be used.
    pub fn new(files: &TlsFiles) -> Result<Self, String> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = Arc::new(Verifier {
            inner: ArcSwap::new(web_pki(files, &provider)?),
        });
        let client_cert = Arc::new(ClientCert {
            key: ArcSwapOption::new(client_key(files, &provider)?),
        });
        Ok(Tls {
            verifier,
            client_cert,
            provider,
            server_name: files.server_name.clone(),
        })
    }

    /// Reads the CA and client certificate files again (after the operator fixed or
    /// renewed them); on error nothing changes.
    ///
    /// # Errors
    /// As [`Tls::new`].
    pub fn reload(&self, files: &TlsFiles) -> Result<(), String> {
        let verifier = web_pki(files, &self.provider)?;
        let key = client_key(files, &self.provider)?;
        self.verifier.inner.store(verifier);
        self.client_cert.key.store(key);
        Ok(())
    }

    /// The name seeds are checked against (`tls_server_name`), if set.
    pub fn server_name(&self) -> Option<&str> {
        self.server_name.as_deref()
    }

    /// fred's TLS configuration, sharing this material.
    ///
    /// # Errors
    /// rustls refusing the protocol versions (not expected with its defaults).
    pub fn fred_config(&self) -> Result<TlsConfig, String> {
        let config = ClientConfig::builder_with_provider(Arc::clone(&self.provider))
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("redis.tls: {e}"))?
            .dangerous()
            .with_custom_certificate_verifier(Arc::clone(&self.verifier) as _)
            .with_client_cert_resolver(Arc::clone(&self.client_cert) as _);
        let hostnames = match &self.server_name {
            Some(name) => TlsHostMapping::Custom(Arc::new(FixedName(name.clone()))),
            None => TlsHostMapping::None,
        };
        Ok(TlsConfig {
            connector: TlsConnector::from(config),
            hostnames,
        })
    }
}

/// The web-PKI verifier for `files.ca` (or the system roots).
fn web_pki(
    files: &TlsFiles,
    provider: &Arc<CryptoProvider>,
) -> Result<Arc<WebPkiServerVerifier>, String> {
    let mut roots = RootCertStore::empty();
    match &files.ca {
        Some(path) => {
            let shown = path.display();
            let certs = CertificateDer::pem_file_iter(path)
                .map_err(|e| format!("redis.tls_ca_file: cannot read {shown}: {e}"))?;
            for cert in certs {
                let cert = cert.map_err(|e| format!("redis.tls_ca_file: {shown}: bad PEM: {e}"))?;
                roots
                    .add(cert)
                    .map_err(|e| format!("redis.tls_ca_file: {shown}: {e}"))?;
            }
            if roots.is_empty() {
                return Err(format!("redis.tls_ca_file: {shown} holds no certificate"));
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            for cert in found.certs {
                // A system bundle may hold certificates rustls cannot use: skip those.
                let _ = roots.add(cert);
            }
            if roots.is_empty() {
                return Err(
                    "redis.tls: no system CA certificates found; set redis.tls_ca_file".into(),
                );
            }
        }
    }
    WebPkiServerVerifier::builder_with_provider(Arc::new(roots), Arc::clone(provider))
        .build()
        .map_err(|e| format!("redis.tls_ca_file: {e}"))
}

/// The client certificate and its key, when both files are set.
fn client_key(
    files: &TlsFiles,
    provider: &Arc<CryptoProvider>,
) -> Result<Option<Arc<CertifiedKey>>, String> {
    let (cert, key) = match (&files.cert, &files.key) {
        (None, None) => return Ok(None),
        (Some(c), Some(k)) => (c, k),
        _ => {
            return Err(
                "redis.tls_cert_file and redis.tls_key_file go together: set both or neither"
                    .into(),
            )
        }
    };
    let chain = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("redis.tls_cert_file: {}: {e}", cert.display()))?;
    if chain.is_empty() {
        return Err(format!(
            "redis.tls_cert_file: {} holds no certificate",
            cert.display()
        ));
    }
    let der = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| format!("redis.tls_key_file: {}: {e}", key.display()))?;
    let signing = provider
        .key_provider
        .load_private_key(der)
        .map_err(|e| format!("redis.tls_key_file: {}: {e}", key.display()))?;
    Ok(Some(Arc::new(CertifiedKey::new(chain, signing))))
}

/// Delegates to the current web-PKI verifier (swapped on reload).
#[derive(Debug)]
struct Verifier {
    inner: ArcSwap<WebPkiServerVerifier>,
}

impl ServerCertVerifier for Verifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.inner.load().verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        )
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.load().verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.load().verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.load().supported_verify_schemes()
    }
}

/// Offers the current client certificate (swapped on reload), if any.
#[derive(Debug)]
struct ClientCert {
    key: ArcSwapOption<CertifiedKey>,
}

impl ResolvesClientCert for ClientCert {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        self.key.load_full()
    }

    fn has_certs(&self) -> bool {
        self.key.load().is_some()
    }
}

/// Every node learnt from the cluster is checked against one configured name.
#[derive(Debug)]
struct FixedName(String);

impl HostMapping for FixedName {
    fn map(&self, _ip: &IpAddr, _default_host: &str) -> Option<String> {
        Some(self.0.clone())
    }
}
