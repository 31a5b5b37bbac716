//! Impersonation headers as client-go's `impersonatingRoundTripper` writes
//! them (k8s.io/client-go/transport/round_trippers.go): `Impersonate-User`,
//! `Impersonate-Uid` when set, one `Impersonate-Group` per group and one
//! `Impersonate-Extra-<key>` per value, the key percent-encoded
//! (`headerKeyEscape`: every byte outside Go's header token set, and `%`,
//! as `%XX`) and the whole name in Go's canonical MIME form. A request
//! that already names a user (non-empty `Impersonate-User`) is left as is.

use std::collections::BTreeMap;

/// Who to act as (`as`, `as-uid`, `as-groups`, `as-user-extra`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Impersonation {
    pub user: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ImpersonationError {
    /// kubectl's message (clientcmd `validateAuthInfo`).
    #[error("requesting uid, groups or user-extra for {0} without impersonating a user")]
    NoUser(String),
}

/// Go's `isTokenTable` (net/http/lex.go), which client-go copied.
fn token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// client-go's `headerKeyEscape`.
pub fn escape_extra_key(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for &b in key.as_bytes() {
        if !token_byte(b) || b == b'%' {
            out.push_str(&format!("%{b:02X}"));
        } else {
            out.push(b as char);
        }
    }
    out
}

/// Go's `textproto.CanonicalMIMEHeaderKey` for a name made of token bytes:
/// upper case at the start and after each `-`, lower case elsewhere.
pub fn canonical_name(name: &str) -> String {
    let mut upper = true;
    name.chars()
        .map(|c| {
            let o = if upper {
                c.to_ascii_uppercase()
            } else {
                c.to_ascii_lowercase()
            };
            upper = c == '-';
            o
        })
        .collect()
}

impl Impersonation {
    /// Whether client-go would install the impersonating round tripper.
    pub fn is_set(&self) -> bool {
        !self.user.is_empty()
            || !self.uid.is_empty()
            || !self.groups.is_empty()
            || !self.extra.is_empty()
    }

    /// kubectl refuses uid, groups or extras without a user.
    pub fn validate(&self, auth_info_name: &str) -> Result<(), ImpersonationError> {
        if self.user.is_empty()
            && (!self.uid.is_empty() || !self.groups.is_empty() || !self.extra.is_empty())
        {
            return Err(ImpersonationError::NoUser(auth_info_name.to_string()));
        }
        Ok(())
    }

    /// The fields to write, in order, and the names whose client values
    /// they replace (`Header.Set`); groups and extras are added after the
    /// client's own (`Header.Add`). Empty when the request already carries
    /// a non-empty `Impersonate-User` (`client_user`).
    pub fn fields(&self, client_user: Option<&str>) -> (Vec<&'static str>, Vec<(String, String)>) {
        if !self.is_set() || client_user.is_some_and(|u| !u.is_empty()) {
            return (Vec::new(), Vec::new());
        }
        let mut replace = vec!["Impersonate-User"];
        let mut out = vec![("Impersonate-User".to_string(), self.user.clone())];
        if !self.uid.is_empty() {
            replace.push("Impersonate-Uid");
            out.push(("Impersonate-Uid".to_string(), self.uid.clone()));
        }
        for g in &self.groups {
            out.push(("Impersonate-Group".to_string(), g.clone()));
        }
        for (k, vs) in &self.extra {
            let name = canonical_name(&format!("Impersonate-Extra-{}", escape_extra_key(k)));
            for v in vs {
                out.push((name.clone(), v.clone()));
            }
        }
        (replace, out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extra_keys_escaped_and_canonical() {
        assert_eq!(escape_extra_key("scopes/x y"), "scopes%2Fx%20y");
        assert_eq!(escape_extra_key("a%b"), "a%25b");
        assert_eq!(escape_extra_key("é"), "%C3%A9");
        assert_eq!(escape_extra_key("ok-_.~"), "ok-_.~");
        assert_eq!(
            canonical_name("Impersonate-Extra-scopes%2Fx%20y"),
            "Impersonate-Extra-Scopes%2fx%20y"
        );
        assert_eq!(
            canonical_name("impersonate-extra-REASON"),
            "Impersonate-Extra-Reason"
        );
    }

    #[test]
    fn fields_and_marker() {
        let mut imp = Impersonation {
            user: "alice".into(),
            uid: "u1".into(),
            groups: vec!["g1".into(), "g 2".into()],
            ..Default::default()
        };
        imp.extra
            .insert("reason".into(), vec!["a".into(), "b".into()]);
        let (replace, f) = imp.fields(None);
        assert_eq!(replace, vec!["Impersonate-User", "Impersonate-Uid"]);
        let names: Vec<&str> = f.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            vec![
                "Impersonate-User",
                "Impersonate-Uid",
                "Impersonate-Group",
                "Impersonate-Group",
                "Impersonate-Extra-Reason",
                "Impersonate-Extra-Reason"
            ]
        );
        assert_eq!(imp.fields(Some("")).1.len(), 6);
        assert!(imp.fields(Some("bob")).1.is_empty());
        assert!(Impersonation::default().fields(None).1.is_empty());
    }

    #[test]
    fn groups_need_a_user() {
        let imp = Impersonation {
            groups: vec!["g".into()],
            ..Default::default()
        };
        assert_eq!(
            imp.validate("t").unwrap_err().to_string(),
            "requesting uid, groups or user-extra for t without impersonating a user"
        );
        assert!(Impersonation::default().validate("t").is_ok());
    }
}
