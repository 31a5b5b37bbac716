//! client-go's exec credential exchange (`client.authentication.k8s.io`
//! `v1` and `v1beta1`), sans-I/O: the `KUBERNETES_EXEC_INFO` document a
//! plugin receives and the checks client-go applies to what it prints
//! (k8s.io/client-go/plugin/pkg/client/auth/exec/exec.go,
//! `refreshCredsLocked`): same group and version as asked, a `status`, a
//! token or a certificate/key pair (both or neither), an optional
//! `expirationTimestamp` (RFC 3339). The pair becomes a TLS client key in
//! the kubectl proxy crate (`edgetunnel_kubectl_proxy::exec_cert`, which
//! needs rustls).

use serde::Deserialize;

/// The API versions client-go accepts for `user.exec.apiVersion`.
pub const V1: &str = "client.authentication.k8s.io/v1";
pub const V1BETA1: &str = "client.authentication.k8s.io/v1beta1";

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ExecCredentialError {
    #[error("exec plugin: invalid apiVersion {0:?}")]
    UnknownVersion(String),
    #[error("decoding stdout: {0}")]
    Decode(String),
    #[error("exec plugin is configured to use API version {want}, plugin returned version {got}")]
    VersionMismatch { want: String, got: String },
    #[error("exec plugin didn't return a status field")]
    NoStatus,
    #[error("exec plugin didn't return a token or cert/key pair")]
    Empty,
    #[error("exec plugin returned only certificate or key, not both")]
    HalfPair,
    #[error("exec plugin: invalid expirationTimestamp {0:?}")]
    Expiry(String),
    /// client-go's words around Go's `tls.X509KeyPair` error.
    #[error("failed parsing client key/certificate: {0}")]
    KeyPair(String),
}

/// What a plugin handed back.
#[derive(Clone, PartialEq, Eq)]
pub struct Credential {
    pub token: Option<String>,
    /// PEM client certificate and key, both or neither.
    pub client_cert: Option<(String, String)>,
    /// Unix seconds after which the credential must be fetched again.
    pub expires_unix: Option<i64>,
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credential")
            .field("token", &self.token.as_ref().map(|_| ".."))
            .field("client_cert", &self.client_cert.is_some())
            .field("expires_unix", &self.expires_unix)
            .finish()
    }
}

fn check_version(v: &str) -> Result<(), ExecCredentialError> {
    if v == V1 || v == V1BETA1 {
        Ok(())
    } else {
        Err(ExecCredentialError::UnknownVersion(v.to_string()))
    }
}

/// The `KUBERNETES_EXEC_INFO` value: an ExecCredential with only a spec
/// (`interactive`, and `cluster` when `provideClusterInfo` is set).
pub fn exec_info(
    api_version: &str,
    interactive: bool,
    cluster: Option<serde_json::Value>,
) -> Result<String, ExecCredentialError> {
    check_version(api_version)?;
    let mut spec = serde_json::Map::new();
    if let Some(c) = cluster {
        spec.insert("cluster".into(), c);
    }
    spec.insert("interactive".into(), serde_json::Value::Bool(interactive));
    let doc = serde_json::json!({
        "kind": "ExecCredential",
        "apiVersion": api_version,
        "spec": spec,
    });
    Ok(doc.to_string())
}

#[derive(Deserialize)]
struct Raw {
    #[serde(rename = "apiVersion", default)]
    api_version: String,
    #[serde(default)]
    kind: String,
    status: Option<RawStatus>,
}

#[derive(Deserialize)]
struct RawStatus {
    #[serde(rename = "expirationTimestamp")]
    expiration: Option<String>,
    #[serde(default)]
    token: String,
    #[serde(rename = "clientCertificateData", default)]
    cert: String,
    #[serde(rename = "clientKeyData", default)]
    key: String,
}

/// Parses and checks a plugin's stdout against the configured version.
pub fn parse(api_version: &str, stdout: &[u8]) -> Result<Credential, ExecCredentialError> {
    check_version(api_version)?;
    let raw: Raw =
        serde_json::from_slice(stdout).map_err(|e| ExecCredentialError::Decode(e.to_string()))?;
    if raw.kind != "ExecCredential" && !raw.kind.is_empty() {
        return Err(ExecCredentialError::Decode(format!(
            "unexpected kind {:?}",
            raw.kind
        )));
    }
    if raw.api_version != api_version {
        return Err(ExecCredentialError::VersionMismatch {
            want: api_version.to_string(),
            got: raw.api_version,
        });
    }
    let status = raw.status.ok_or(ExecCredentialError::NoStatus)?;
    if status.token.is_empty() && status.cert.is_empty() && status.key.is_empty() {
        return Err(ExecCredentialError::Empty);
    }
    if status.cert.is_empty() != status.key.is_empty() {
        return Err(ExecCredentialError::HalfPair);
    }
    let expires_unix = match status.expiration {
        None => None,
        Some(t) => Some(
            t.parse::<jiff::Timestamp>()
                .map_err(|_| ExecCredentialError::Expiry(t.clone()))?
                .as_second(),
        ),
    };
    Ok(Credential {
        token: (!status.token.is_empty()).then_some(status.token),
        client_cert: (!status.cert.is_empty()).then_some((status.cert, status.key)),
        expires_unix,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_with_expiry() {
        let out = br#"{"kind":"ExecCredential","apiVersion":"client.authentication.k8s.io/v1","status":{"token":"t1","expirationTimestamp":"2030-01-02T03:04:05Z"}}"#;
        let c = parse(V1, out).unwrap();
        assert_eq!(c.token.as_deref(), Some("t1"));
        assert_eq!(c.expires_unix, Some(1893553445));
        assert!(c.client_cert.is_none());
    }

    #[test]
    fn client_go_checks() {
        let v1b = br#"{"kind":"ExecCredential","apiVersion":"client.authentication.k8s.io/v1beta1","status":{"token":"t"}}"#;
        assert!(parse(V1BETA1, v1b).is_ok());
        assert!(matches!(
            parse(V1, v1b),
            Err(ExecCredentialError::VersionMismatch { .. })
        ));
        let no_status =
            br#"{"kind":"ExecCredential","apiVersion":"client.authentication.k8s.io/v1"}"#;
        assert_eq!(parse(V1, no_status), Err(ExecCredentialError::NoStatus));
        let empty = br#"{"kind":"ExecCredential","apiVersion":"client.authentication.k8s.io/v1","status":{}}"#;
        assert_eq!(parse(V1, empty), Err(ExecCredentialError::Empty));
        let half = br#"{"kind":"ExecCredential","apiVersion":"client.authentication.k8s.io/v1","status":{"clientCertificateData":"x"}}"#;
        assert_eq!(parse(V1, half), Err(ExecCredentialError::HalfPair));
        let bad_time = br#"{"kind":"ExecCredential","apiVersion":"client.authentication.k8s.io/v1","status":{"token":"t","expirationTimestamp":"soon"}}"#;
        assert!(matches!(
            parse(V1, bad_time),
            Err(ExecCredentialError::Expiry(_))
        ));
        assert!(matches!(
            parse("v9", v1b),
            Err(ExecCredentialError::UnknownVersion(_))
        ));
        assert!(matches!(
            parse(V1, b"not json"),
            Err(ExecCredentialError::Decode(_))
        ));
    }

    #[test]
    fn exec_info_document() {
        let s = exec_info(V1, false, None).unwrap();
        let v: serde_json::Value = serde_json::from_str(&s).unwrap();
        assert_eq!(v["apiVersion"], V1);
        assert_eq!(v["kind"], "ExecCredential");
        assert_eq!(v["spec"]["interactive"], false);
        assert!(v["spec"].get("cluster").is_none());
        let s = exec_info(
            V1BETA1,
            true,
            Some(serde_json::json!({"server": "https://x"})),
        )
        .unwrap();
        let v: serde_json::Value = serde_json::from_str(&s).unwrap();
        assert_eq!(v["spec"]["cluster"]["server"], "https://x");
    }
}
