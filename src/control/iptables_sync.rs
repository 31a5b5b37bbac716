//! Applies [`iptables`](super::iptables) plans with the system's
//! `iptables-save` / `iptables-restore --noflush` (and the ip6tables pair),
//! and clears moved flows with `conntrack`. Runs on the control thread only:
//! every call here spawns a process and waits for it.

use std::io::Write;
use std::net::IpAddr;
use std::process::{Command, Stdio};

use super::iptables::{self, Current, Family, Plan};

#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error("running {cmd}: {source}")]
    Spawn { cmd: String, source: std::io::Error },
    #[error("{cmd} failed: {stderr}")]
    Failed { cmd: String, stderr: String },
}

fn run(cmd: &str, args: &[&str], stdin: Option<&str>) -> Result<String, SyncError> {
    let spawn_err = |source| SyncError::Spawn {
        cmd: cmd.to_string(),
        source,
    };
    let mut child = Command::new(cmd)
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(spawn_err)?;
    if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(input.as_bytes()).map_err(spawn_err)?;
    }
    let out = child.wait_with_output().map_err(spawn_err)?;
    if !out.status.success() {
        return Err(SyncError::Failed {
            cmd: format!("{cmd} {}", args.join(" ")),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The current nat state of `family`.
pub fn current(family: Family) -> Result<Current, SyncError> {
    Ok(iptables::parse_save(&run(
        family.save_cmd(),
        &["-t", "nat"],
        None,
    )?))
}

/// Makes the kernel's rules match `plan` in one transaction.
pub fn sync(plan: &Plan) -> Result<(), SyncError> {
    let cur = current(plan.family)?;
    let input = iptables::render_sync(plan, &cur);
    run(plan.family.restore_cmd(), &["--noflush"], Some(&input))?;
    Ok(())
}

/// Removes all our rules and chains of `family`.
pub fn cleanup(family: Family) -> Result<(), SyncError> {
    let cur = current(family)?;
    if cur.chains.is_empty() && cur.jumps.is_empty() {
        return Ok(());
    }
    run(
        family.restore_cmd(),
        &["--noflush"],
        Some(&iptables::render_cleanup(&cur)),
    )?;
    Ok(())
}

/// Deletes tracked flows to `ip:port` so they take the new NAT decision.
/// A missing `conntrack` tool or "0 flow entries" is not an error.
pub fn conntrack_delete(ip: IpAddr, port: u16) {
    let family = if ip.is_ipv4() { "ipv4" } else { "ipv6" };
    let ip = ip.to_string();
    let port = port.to_string();
    match run(
        "conntrack",
        &[
            "-D",
            "-f",
            family,
            "--orig-dst",
            &ip,
            "-p",
            "tcp",
            "--orig-port-dst",
            &port,
        ],
        None,
    ) {
        Ok(_) => tracing::debug!(%ip, %port, "conntrack entries deleted"),
        Err(SyncError::Failed { stderr, .. }) if stderr.contains("0 flow entries") => {}
        Err(e) => tracing::debug!(%ip, %port, "conntrack: {e}"),
    }
}
