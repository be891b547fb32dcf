//! Server-side mutual TLS with rustls. Python validates the files (asking `server_config`
//! too, through `check_tls`, so it refuses what rustls refuses) and hands over PEM bytes;
//! a new configuration replaces the old one atomically: connections accepted from then on
//! use it, established ones keep what they negotiated.

use std::io::BufReader;
use std::sync::Arc;

use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};

/// Why the files cannot be served: the file at fault ("tls.cert", "tls.key" or
/// "tls.clientCA") and what is wrong with it.
pub struct Refusal {
    pub file: &'static str,
    pub reason: String,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.file, self.reason)
    }
}

fn refuse(file: &'static str, reason: impl ToString) -> Refusal {
    Refusal {
        file,
        reason: reason.to_string(),
    }
}

fn certificates(pem: &[u8], file: &'static str) -> Result<Vec<CertificateDer<'static>>, Refusal> {
    let certs = rustls_pemfile::certs(&mut BufReader::new(pem))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| refuse(file, e))?;
    if certs.is_empty() {
        return Err(refuse(file, "no PEM certificate"));
    }
    Ok(certs)
}

fn private_key(pem: &[u8]) -> Result<PrivateKeyDer<'static>, Refusal> {
    rustls_pemfile::private_key(&mut BufReader::new(pem))
        .map_err(|e| refuse("tls.key", e))?
        .ok_or_else(|| refuse("tls.key", "no PEM private key"))
}

/// Why rustls (with ring) refuses a key other libraries read: a curve or size it cannot sign
/// with. Its own words ("failed to parse private key ...") do not say so.
fn unusable_key(error: rustls::Error) -> Refusal {
    match error {
        rustls::Error::InconsistentKeys(_) => {
            refuse("tls.key", "does not match the certificate in tls.cert")
        }
        other => {
            let detail = match other {
                rustls::Error::General(text) => text,
                other => other.to_string(),
            };
            let reason = format!(
                "unsupported key: the server signs with ECDSA P-256 or P-384, RSA of 2048 to \
                 4096 bits, or Ed25519 only (rustls: {detail})"
            );
            refuse("tls.key", reason)
        }
    }
}

/// A configuration that requires a client certificate signed by `client_ca` and speaks h2.
pub fn server_config(cert: &[u8], key: &[u8], client_ca: &[u8]) -> Result<ServerConfig, Refusal> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = RootCertStore::empty();
    for ca in certificates(client_ca, "tls.clientCA")? {
        roots.add(ca).map_err(|e| refuse("tls.clientCA", e))?;
    }
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .map_err(|e| refuse("tls.clientCA", e))?;
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("ring offers TLS 1.2 and 1.3")
        .with_client_cert_verifier(verifier)
        .with_single_cert(certificates(cert, "tls.cert")?, private_key(key)?)
        .map_err(unusable_key)?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

/// The names a client certificate goes by: its CN values and its DNS SANs.
pub fn identity(leaf: &CertificateDer<'_>) -> (Vec<String>, Vec<String>) {
    let Ok((_, cert)) = X509Certificate::from_der(leaf.as_ref()) else {
        return (Vec::new(), Vec::new());
    };
    let common_names = cert
        .subject()
        .iter_common_name()
        .map(|cn| match cn.as_str() {
            Ok(name) => name.to_string(),
            Err(_) => String::from_utf8_lossy(cn.as_slice()).into_owned(),
        })
        .collect();
    let dns = cert
        .subject_alternative_name()
        .ok()
        .flatten()
        .map(|san| {
            san.value
                .general_names
                .iter()
                .filter_map(|name| match name {
                    GeneralName::DNSName(dns) => Some(dns.to_string()),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    (common_names, dns)
}
