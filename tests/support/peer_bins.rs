//! Where the real peers' binaries are (ANP's Go server and agent,
//! anptool, h2spec, kube-apiserver): `EDGETUNNEL_PEERS` names either a
//! directory of plain binaries or `../shared/peers` with `unpack` and
//! `*.xz`, unpacked into `target/peers` (cheap when up to date). Shared by
//! tests/peers and the manifests' dry run; has no other dependency, so a
//! test binary can include this file alone.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// The directory of peer binaries, or `None` when `EDGETUNNEL_PEERS` is
/// unset. `repo` is the repository root (for `target/peers`). A set
/// variable whose unpacking fails panics: a broken setup, not an absent
/// peer.
pub(crate) fn peer_dir(repo: &Path) -> Option<PathBuf> {
    let dir = PathBuf::from(std::env::var_os("EDGETUNNEL_PEERS")?);
    if !dir.join("unpack").is_file() {
        return Some(dir);
    }
    let into = repo.join("target/peers");
    let out = Command::new(dir.join("unpack"))
        .arg(&into)
        .output()
        .expect("run the peers' unpack script");
    assert!(
        out.status.success(),
        "{}/unpack {} failed: {}",
        dir.display(),
        into.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    Some(into)
}
