//! kubectl's refusal of a `--user`, `--context` or `--cluster` that the
//! kubeconfig does not define (the `kube` crate would fall back silently):
//! checked at start, before the upstream is resolved, in kubectl's order
//! (user, context, cluster; the first missing name is the error) and with
//! its wording (`auth info "x" does not exist`, observed from kubectl
//! v1.32).

use kube::config::Kubeconfig;

/// The names a kubeconfig defines.
#[derive(Debug, Default)]
pub(super) struct Names {
    pub users: Vec<String>,
    pub contexts: Vec<String>,
    pub clusters: Vec<String>,
}

impl Names {
    pub(super) fn of(kc: &Kubeconfig) -> Names {
        Names {
            users: kc.auth_infos.iter().map(|a| a.name.clone()).collect(),
            contexts: kc.contexts.iter().map(|c| c.name.clone()).collect(),
            clusters: kc.clusters.iter().map(|c| c.name.clone()).collect(),
        }
    }
}

/// The error kubectl gives for the flags' names against `names` (an empty
/// flag is not checked).
pub(super) fn check(names: &Names, user: &str, context: &str, cluster: &str) -> Result<(), String> {
    let missing = |name: &str, have: &[String]| !name.is_empty() && !have.iter().any(|h| h == name);
    if missing(user, &names.users) {
        return Err(format!("auth info {user:?} does not exist"));
    }
    if missing(context, &names.contexts) {
        return Err(format!("context {context:?} does not exist"));
    }
    if missing(cluster, &names.clusters) {
        return Err(format!("cluster {cluster:?} does not exist"));
    }
    Ok(())
}

/// Reads the kubeconfig as the proxy will (`--kubeconfig`, else
/// `KUBECONFIG`, else `~/.kube/config`) and checks the flags' names. An
/// unreadable `--kubeconfig` is left for the upstream resolution to report;
/// no kubeconfig at all defines no names.
pub(super) fn check_args(
    kubeconfig: &str,
    user: &str,
    context: &str,
    cluster: &str,
) -> Result<(), String> {
    if user.is_empty() && context.is_empty() && cluster.is_empty() {
        return Ok(());
    }
    let names = if kubeconfig.is_empty() {
        Kubeconfig::read()
            .map(|kc| Names::of(&kc))
            .unwrap_or_default()
    } else {
        match Kubeconfig::read_from(std::path::Path::new(kubeconfig)) {
            Ok(kc) => Names::of(&kc),
            Err(_) => return Ok(()),
        }
    };
    check(&names, user, context, cluster)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubectl_order_and_wording() {
        let n = Names {
            users: vec!["u1".into()],
            contexts: vec!["x1".into()],
            clusters: vec!["c1".into()],
        };
        assert!(check(&n, "", "", "").is_ok());
        assert!(check(&n, "u1", "x1", "c1").is_ok());
        assert_eq!(
            check(&n, "nope", "nope", "nope").unwrap_err(),
            "auth info \"nope\" does not exist"
        );
        assert_eq!(
            check(&n, "", "nope", "nope").unwrap_err(),
            "context \"nope\" does not exist"
        );
        assert_eq!(
            check(&n, "", "", "nope").unwrap_err(),
            "cluster \"nope\" does not exist"
        );
        assert!(check(&Names::default(), "u1", "", "").is_err());
    }
}
