//! Server-side mutual TLS with rustls. Python validates the files and hands over PEM bytes;
//! a new configuration replaces the old one atomically: connections accepted from then on
//! use it, established ones keep what they negotiated.

use std::io::BufReader;
use std::sync::Arc;

use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};

fn certificates(pem: &[u8], what: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = rustls_pemfile::certs(&mut BufReader::new(pem))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{what}: {e}"))?;
    if certs.is_empty() {
        return Err(format!("{what}: no PEM certificate"));
    }
    Ok(certs)
}

fn private_key(pem: &[u8]) -> Result<PrivateKeyDer<'static>, String> {
    rustls_pemfile::private_key(&mut BufReader::new(pem))
        .map_err(|e| format!("tls.key: {e}"))?
        .ok_or_else(|| "tls.key: no PEM private key".to_string())
}

/// A configuration that requires a client certificate signed by `client_ca` and speaks h2.
pub fn server_config(cert: &[u8], key: &[u8], client_ca: &[u8]) -> Result<ServerConfig, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = RootCertStore::empty();
    for ca in certificates(client_ca, "tls.clientCA")? {
        roots.add(ca).map_err(|e| format!("tls.clientCA: {e}"))?;
    }
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .map_err(|e| format!("tls.clientCA: {e}"))?;
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certificates(cert, "tls.cert")?, private_key(key)?)
        .map_err(|e| format!("tls.cert/tls.key: {e}"))?;
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
