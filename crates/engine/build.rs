//! Build facts for `--version` and `edgetunnel_build_info`: the git commit
//! (`unknown` outside a git checkout, e.g. a source tarball) and the
//! compiler's version.

use std::process::Command;

fn output(cmd: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(cmd).args(args).output().ok()?;
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (out.status.success() && !s.is_empty()).then_some(s)
}

fn main() {
    let commit =
        output("git", &["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=EDGETUNNEL_COMMIT={commit}");
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let version = output(&rustc, &["--version"]).unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=EDGETUNNEL_RUSTC={version}");
    // Rebuilt when HEAD moves (a commit, a checkout); worktrees keep HEAD
    // in their own git dir.
    if let Some(path) = output("git", &["rev-parse", "--git-path", "HEAD"]) {
        println!("cargo:rerun-if-changed={path}");
    }
    if let Some(r) = output("git", &["symbolic-ref", "-q", "HEAD"]) {
        if let Some(path) = output("git", &["rev-parse", "--git-path", &r]) {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    println!("cargo:rerun-if-changed=build.rs");
}
