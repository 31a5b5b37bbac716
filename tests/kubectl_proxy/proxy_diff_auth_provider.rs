//! `auth-provider` user entries, `edgetunnel proxy` against the real
//! `kubectl proxy` (v1.32): `gcp` and `azure` are refused with client-go's
//! removal notices, unknown providers and an `oidc` entry missing its
//! required keys with client-go's words.

use crate::support;

use support::proxy_proc::{kubectl, kubectl_cmd, ours_cmd, run_briefly};
use support::Env;

#[test]
fn removed_and_unknown_auth_providers_refused_as_kubectl() {
    let kubectl = kubectl();
    let env = Env::new();
    for (name, provider) in [
        ("gcp", "name: gcp\n      config: {}"),
        ("azure", "name: azure\n      config:\n        tenant-id: t"),
        ("unknown", "name: foo"),
        (
            "oidc-issuer",
            "name: oidc\n      config:\n        client-id: c",
        ),
        (
            "oidc-client",
            "name: oidc\n      config:\n        idp-issuer-url: https://127.0.0.1:1",
        ),
    ] {
        let kc = env.path(&format!("{name}.yaml"));
        std::fs::write(
            &kc,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:1\ncontexts:\n- name: x\n  context: {{cluster: c, user: u}}\ncurrent-context: x\nusers:\n- name: u\n  user:\n    auth-provider:\n      {provider}\n"
            ),
        )
        .unwrap();
        let flags = vec!["--port=0".to_string()];
        let (gok, gerr) = run_briefly(
            env.path(&format!("{name}-k.err")),
            kubectl_cmd(&kubectl, &kc, &flags),
        );
        let (ook, oerr) = run_briefly(env.path(&format!("{name}-o.err")), ours_cmd(&kc, &flags));
        assert!(!gok && !ook, "{name}: both refuse: {gerr} / {oerr}");
        let want = gerr
            .strip_prefix("error: ")
            .unwrap_or_else(|| panic!("{name}: kubectl said {gerr}"))
            .trim_end();
        assert!(oerr.contains(want), "{name}: want {want:?}, ours: {oerr}");
    }
}
