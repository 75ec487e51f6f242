//! Certificates made at test time with rcgen: a certificate authority
//! ([`Ca`]) signing server certificates (for `localhost` and 127.0.0.1) and
//! client certificates (for mutual TLS), written as PEM files to a temporary
//! directory ([`Pem`]) for the server's and the clients' flags.

use std::path::PathBuf;

use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

/// A certificate authority: its certificate (to trust) and key (to sign).
pub struct Ca {
    pub cert: Certificate,
    pub key: KeyPair,
}

impl Ca {
    pub fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages =
            vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        let key = KeyPair::generate().expect("CA key");
        let cert = params.self_signed(&key).expect("self-signed CA");
        Self { cert, key }
    }

    /// A certificate for `names` (DNS names or IP addresses) signed by this
    /// CA, for a server or a client; with its key.
    pub fn sign(&self, common_name: &str, names: &[&str], usage: ExtendedKeyUsagePurpose) -> (Certificate, KeyPair) {
        let mut params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).expect("leaf params");
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, common_name);
        params.extended_key_usages = vec![usage];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.use_authority_key_identifier_extension = true;
        let key = KeyPair::generate().expect("leaf key");
        let cert = params.signed_by(&key, &self.cert, &self.key).expect("signed leaf");
        (cert, key)
    }

    /// A server certificate for "localhost" and 127.0.0.1.
    pub fn server_cert(&self) -> (Certificate, KeyPair) {
        self.sign("rankd test server", &["localhost", "127.0.0.1"], ExtendedKeyUsagePurpose::ServerAuth)
    }

    /// A client certificate for mutual TLS.
    pub fn client_cert(&self) -> (Certificate, KeyPair) {
        self.sign("rankd test client", &["client.rankd.test"], ExtendedKeyUsagePurpose::ClientAuth)
    }
}

/// A temporary directory of PEM files.
pub struct Pem {
    dir: tempfile::TempDir,
}

impl Pem {
    pub fn new() -> Self {
        Self { dir: tempfile::tempdir().expect("temp dir") }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn write(&self, name: &str, contents: &str) -> PathBuf {
        let path = self.path(name);
        std::fs::write(&path, contents).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        path
    }

    /// Writes `ca`'s certificate as `name`.
    pub fn ca(&self, name: &str, ca: &Ca) -> PathBuf {
        self.write(name, &ca.cert.pem())
    }

    /// Writes a certificate and its key as `<name>.pem` and `<name>.key`.
    pub fn pair(&self, name: &str, (cert, key): &(Certificate, KeyPair)) -> (PathBuf, PathBuf) {
        (self.write(&format!("{name}.pem"), &cert.pem()), self.write(&format!("{name}.key"), &key.serialize_pem()))
    }
}

impl Default for Pem {
    fn default() -> Self {
        Self::new()
    }
}

/// A CA ("rankd test CA") and a server certificate it signed for
/// "localhost" and 127.0.0.1, written as `ca.pem`, `server.pem` and
/// `server.key` in a [`Pem`] directory (where a test may write more files).
pub struct TlsFiles {
    pub ca: Ca,
    pub pem: Pem,
    /// The CA's certificate, for the clients to trust.
    pub ca_file: PathBuf,
    /// The server's certificate.
    pub cert: PathBuf,
    /// The server's private key.
    pub key: PathBuf,
}

impl TlsFiles {
    pub fn new() -> Self {
        let ca = Ca::new("rankd test CA");
        let pem = Pem::new();
        let ca_file = pem.ca("ca.pem", &ca);
        let (cert, key) = pem.pair("server", &ca.server_cert());
        Self { ca, pem, ca_file, cert, key }
    }

    /// The server's flags for them: `--tls-cert <cert> --tls-key <key>`.
    pub fn server_args(&self) -> Vec<&str> {
        vec!["--tls-cert", super::arg(&self.cert), "--tls-key", super::arg(&self.key)]
    }
}

impl Default for TlsFiles {
    fn default() -> Self {
        Self::new()
    }
}
