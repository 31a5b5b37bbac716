//! Container images for the real nodes, without a Docker engine or a
//! registry: each is a docker-archive tarball (what `docker save` writes:
//! `manifest.json`, an image config, one layer) that `ctr images import`
//! reads.
//!
//! - [`edgetunnel`]: the image as the Dockerfile's final stage declares it.
//!   The stage is parsed instruction by instruction and each one is carried
//!   out here: the Debian packages it installs are copied from this
//!   machine (the same Debian release as the stage's base) with the shared
//!   libraries their programs load, the binary goes where `COPY` puts it,
//!   the Go names become the same symlinks, and `USER` and `ENTRYPOINT` go
//!   into the image config. An instruction this file does not know fails
//!   the test, so the image and the Dockerfile cannot drift apart.
//! - [`pause`]: the pod sandbox's image, a static program that waits for
//!   a signal (built here with the C compiler).
//! - [`busybox`]: a workload to reach on the edge node (Debian's static
//!   busybox).

use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::json;

use crate::support::repo;

/// An image's config: what the kubelet's runtime runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ImageConfig {
    pub user: Option<String>,
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
}

/// A docker-archive tarball and the name it imports as.
#[derive(Debug, Clone)]
pub(crate) struct Archive {
    pub path: PathBuf,
    pub name: String,
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn sha256_hex(path: &Path) -> String {
    run(Command::new("sha256sum").arg(path))
        .split_whitespace()
        .next()
        .expect("sha256sum output")
        .to_string()
}

/// Packs `rootfs` as a one-layer docker-archive named `name` at `out`.
pub(crate) fn pack(out: &Path, name: &str, rootfs: &Path, cfg: &ImageConfig) -> Archive {
    let work = out.with_extension("d");
    std::fs::create_dir_all(work.join("layer")).unwrap();
    let layer = work.join("layer/layer.tar");
    run(Command::new("tar")
        .args(["--numeric-owner", "--owner=0", "--group=0", "-C"])
        .arg(rootfs)
        .arg("-cf")
        .arg(&layer)
        .arg("."));
    let diff_id = sha256_hex(&layer);
    let mut container = json!({
        "Entrypoint": cfg.entrypoint,
        "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
        "WorkingDir": "/",
    });
    if let Some(u) = &cfg.user {
        container["User"] = json!(u);
    }
    if !cfg.cmd.is_empty() {
        container["Cmd"] = json!(cfg.cmd);
    }
    let config = json!({
        "architecture": "amd64",
        "os": "linux",
        "config": container,
        "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{diff_id}")]},
    });
    let cfg_tmp = work.join("config.json");
    std::fs::write(&cfg_tmp, config.to_string()).unwrap();
    let cfg_name = format!("{}.json", sha256_hex(&cfg_tmp));
    std::fs::rename(&cfg_tmp, work.join(&cfg_name)).unwrap();
    let manifest = json!([{
        "Config": cfg_name,
        "RepoTags": [name],
        "Layers": ["layer/layer.tar"],
    }]);
    std::fs::write(work.join("manifest.json"), manifest.to_string()).unwrap();
    run(Command::new("tar")
        .arg("-C")
        .arg(&work)
        .arg("-cf")
        .arg(out)
        .args(["manifest.json", &cfg_name, "layer"]));
    let _ = std::fs::remove_dir_all(&work);
    Archive {
        path: out.to_path_buf(),
        name: name.to_string(),
    }
}

/// Copies `path` from this machine into `rootfs` at the same place:
/// a symlink as a symlink (then what it points at, so chains such as
/// `/etc/alternatives` stay whole), a directory as an empty directory, a
/// file with its mode. Returns the ELF files copied.
fn copy_host_path(rootfs: &Path, path: &Path, elves: &mut BTreeSet<PathBuf>) {
    let dest = rootfs.join(path.strip_prefix("/").unwrap_or(path));
    if dest.symlink_metadata().is_ok() {
        return;
    }
    let Ok(md) = path.symlink_metadata() else {
        return;
    };
    if let Some(parent) = path.parent() {
        if parent != Path::new("/") {
            copy_host_path(rootfs, parent, elves);
        }
    }
    // The parent may have been a symlink (`/sbin -> usr/sbin`) through
    // which the path now names something already copied.
    if dest.symlink_metadata().is_ok() {
        return;
    }
    if md.file_type().is_symlink() {
        let target = std::fs::read_link(path).unwrap();
        std::os::unix::fs::symlink(&target, &dest).unwrap();
        let resolved = if target.is_absolute() {
            target
        } else {
            path.parent().unwrap_or(Path::new("/")).join(target)
        };
        copy_host_path(rootfs, &resolved, elves);
    } else if md.is_dir() {
        std::fs::create_dir_all(&dest).unwrap();
        std::fs::set_permissions(&dest, md.permissions()).unwrap();
    } else if md.is_file() {
        std::fs::copy(path, &dest).unwrap();
        std::fs::set_permissions(&dest, md.permissions()).unwrap();
        let mut magic = [0u8; 4];
        let is_elf = std::fs::File::open(path)
            .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic))
            .is_ok()
            && magic == *b"\x7fELF";
        if is_elf {
            elves.insert(path.to_path_buf());
        }
    }
}

/// The shared libraries `elf` loads (ldd), the dynamic loader included.
fn libraries(elf: &Path) -> Vec<PathBuf> {
    let out = Command::new("ldd").arg(elf).output().expect("ldd");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            let p = match l.split_once("=>") {
                Some((_, right)) => right.split_whitespace().next()?,
                None => l.split_whitespace().next()?,
            };
            p.starts_with('/').then(|| PathBuf::from(p))
        })
        .collect()
}

/// Copies the files of Debian `packages` installed on this machine, then
/// every shared library their programs (and `extra` programs) load.
fn copy_packages(rootfs: &Path, packages: &[&str], extra: &[PathBuf]) {
    let mut elves = BTreeSet::new();
    for pkg in packages {
        for line in run(Command::new("dpkg").args(["-L", pkg])).lines() {
            let p = Path::new(line.trim());
            if p.is_absolute() && !line.contains("/share/doc") && !line.contains("/share/man") {
                copy_host_path(rootfs, p, &mut elves);
            }
        }
    }
    for e in extra {
        copy_host_path(rootfs, e, &mut elves);
    }
    // What the packages' install scripts add: update-alternatives links
    // (`/usr/sbin/iptables-save -> /etc/alternatives/iptables-save ->
    // xtables-nft-multi`) to programs now in the image.
    for dir in ["/usr/sbin", "/usr/bin", "/sbin", "/bin"] {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let link = e.path();
            let via_alternatives =
                std::fs::read_link(&link).is_ok_and(|t| t.starts_with("/etc/alternatives/"));
            let present = std::fs::canonicalize(&link).is_ok_and(|t| {
                rootfs
                    .join(t.strip_prefix("/").unwrap_or(&t))
                    .symlink_metadata()
                    .is_ok()
            });
            if via_alternatives && present {
                copy_host_path(rootfs, &link, &mut elves);
            }
        }
    }
    let mut done = BTreeSet::new();
    while let Some(elf) = elves.iter().find(|e| !done.contains(*e)).cloned() {
        done.insert(elf.clone());
        for lib in libraries(&elf) {
            copy_host_path(rootfs, &lib, &mut elves);
        }
    }
}

/// The base every image here starts from: the directories a runtime
/// expects, root in `/etc/passwd`.
fn base(rootfs: &Path) {
    for d in ["etc", "tmp", "proc", "sys", "dev", "run", "var/run", "root"] {
        std::fs::create_dir_all(rootfs.join(d)).unwrap();
    }
    std::fs::set_permissions(rootfs.join("tmp"), std::fs::Permissions::from_mode(0o1777)).unwrap();
    std::fs::write(
        rootfs.join("etc/passwd"),
        "root:x:0:0:root:/root:/bin/sh\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n",
    )
    .unwrap();
    std::fs::write(rootfs.join("etc/group"), "root:x:0:\nnonroot:x:65532:\n").unwrap();
}

/// What the Dockerfile's final stage declares.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct FinalStage {
    pub base: String,
    /// Debian packages `apt-get install` adds.
    pub packages: Vec<String>,
    /// Where `COPY --from=build` puts the binary.
    pub binary: String,
    /// Symlinks: (link, target).
    pub links: Vec<(String, String)>,
    pub user: Option<String>,
    pub entrypoint: Vec<String>,
}

/// Parses the Dockerfile's last stage; an instruction not understood
/// here is an error naming it.
pub(crate) fn final_stage(dockerfile: &str) -> Result<FinalStage, String> {
    // Instructions with their continuation lines joined, comments dropped.
    let mut instrs: Vec<String> = Vec::new();
    let mut cur = String::new();
    for line in dockerfile.lines() {
        let t = line.trim();
        if t.starts_with('#') || (t.is_empty() && cur.is_empty()) {
            continue;
        }
        let (body, more) = match t.strip_suffix('\\') {
            Some(b) => (b.trim(), true),
            None => (t, false),
        };
        if !cur.is_empty() {
            cur.push(' ');
        }
        cur.push_str(body);
        if !more {
            instrs.push(std::mem::take(&mut cur));
        }
    }
    let last_from = instrs
        .iter()
        .rposition(|i| i.starts_with("FROM "))
        .ok_or("no FROM")?;
    let mut st = FinalStage::default();
    for instr in &instrs[last_from..] {
        let (op, rest) = instr.split_once(' ').unwrap_or((instr, ""));
        match op {
            "FROM" => st.base = rest.trim().to_string(),
            "USER" => st.user = Some(rest.trim().to_string()),
            "ENTRYPOINT" => {
                st.entrypoint = serde_json::from_str(rest.trim())
                    .map_err(|e| format!("ENTRYPOINT {rest}: {e}"))?
            }
            "COPY" => {
                let words: Vec<&str> = rest.split_whitespace().collect();
                match words.as_slice() {
                    ["--from=build", "/out/edgetunnel", dest] => st.binary = dest.to_string(),
                    _ => return Err(format!("COPY not understood: {rest}")),
                }
            }
            "RUN" if rest.contains("apt-get install") => {
                let install = rest.split("apt-get install").nth(1).unwrap_or("");
                let install = install.split("&&").next().unwrap_or("");
                st.packages = install
                    .split_whitespace()
                    .filter(|w| !w.starts_with('-'))
                    .map(str::to_string)
                    .collect();
            }
            "RUN" if rest.starts_with("for n in ") => {
                // for n in A B; do ln -s TARGET "/$n"; ln -s TARGET "/dir/$n"; done
                let (names, body) = rest["for n in ".len()..]
                    .split_once("; do")
                    .ok_or_else(|| format!("RUN not understood: {rest}"))?;
                for cmd in body.trim_end_matches("done").split(';') {
                    let words: Vec<&str> = cmd.split_whitespace().collect();
                    match words.as_slice() {
                        ["ln", "-s", target, link] => {
                            let link = link.trim_matches('"');
                            for n in names.split_whitespace() {
                                st.links.push((link.replace("$n", n), target.to_string()));
                            }
                        }
                        [] => {}
                        _ => return Err(format!("RUN loop step not understood: {cmd}")),
                    }
                }
            }
            _ => return Err(format!("final stage instruction not understood: {instr}")),
        }
    }
    Ok(st)
}

/// The edgetunnel image: `binary` packed as the Dockerfile's final stage
/// declares it, named `name` (the manifests' `image:`).
pub(crate) fn edgetunnel(dir: &Path, binary: &Path, name: &str) -> (Archive, FinalStage) {
    let dockerfile = std::fs::read_to_string(repo().join("Dockerfile")).unwrap();
    let stage = final_stage(&dockerfile).unwrap_or_else(|e| panic!("Dockerfile: {e}"));
    assert_eq!(
        stage.base, "debian:bookworm-slim",
        "the image is packed from this machine's Debian files"
    );
    let file = name.replace([':', '/'], "-");
    let rootfs = dir.join(format!("{file}-rootfs"));
    base(&rootfs);
    // What the base image has that the manifests use (sh, chown), then the
    // stage's packages.
    let mut pkgs: Vec<&str> = vec!["libc6", "libgcc-s1", "dash", "coreutils"];
    pkgs.extend(stage.packages.iter().map(String::as_str));
    let bin = rootfs.join(stage.binary.trim_start_matches('/'));
    std::fs::create_dir_all(bin.parent().unwrap()).unwrap();
    std::fs::copy(binary, &bin).unwrap();
    copy_packages(&rootfs, &pkgs, &[PathBuf::from("/bin/sh")]);
    let mut elves = BTreeSet::new();
    for lib in libraries(binary) {
        copy_host_path(&rootfs, &lib, &mut elves);
    }
    // ca-certificates' bundle is made at install time, not shipped.
    if Path::new("/etc/ssl/certs/ca-certificates.crt").exists() {
        let d = rootfs.join("etc/ssl/certs");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::copy(
            "/etc/ssl/certs/ca-certificates.crt",
            d.join("ca-certificates.crt"),
        )
        .unwrap();
    }
    for (link, target) in &stage.links {
        let l = rootfs.join(link.trim_start_matches('/'));
        std::fs::create_dir_all(l.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(target, l).unwrap();
    }
    let cfg = ImageConfig {
        user: stage.user.clone(),
        entrypoint: stage.entrypoint.clone(),
        cmd: Vec::new(),
    };
    let archive = pack(&dir.join(format!("{file}.tar")), name, &rootfs, &cfg);
    (archive, stage)
}

/// The sandbox image: a static program that sleeps until SIGTERM/SIGINT
/// and reaps what it inherits (the pause container's job).
pub(crate) fn pause(dir: &Path, name: &str) -> Archive {
    let rootfs = dir.join("pause-rootfs");
    base(&rootfs);
    let src = dir.join("pause.c");
    std::fs::write(
        &src,
        "#include <signal.h>\n#include <stdlib.h>\n#include <unistd.h>\n#include <sys/wait.h>\n\
         static void quit(int s) { (void)s; _exit(0); }\n\
         static void reap(int s) { (void)s; while (waitpid(-1, NULL, WNOHANG) > 0) {} }\n\
         int main(void) { signal(SIGTERM, quit); signal(SIGINT, quit); signal(SIGCHLD, reap);\n\
         for (;;) pause(); }\n",
    )
    .unwrap();
    run(Command::new("cc")
        .args(["-static", "-O2", "-o"])
        .arg(rootfs.join("pause"))
        .arg(&src));
    let cfg = ImageConfig {
        user: None,
        entrypoint: vec!["/pause".into()],
        cmd: Vec::new(),
    };
    pack(&dir.join("pause.tar"), name, &rootfs, &cfg)
}

/// A workload image: Debian's static busybox with its applets linked.
pub(crate) fn busybox(dir: &Path, name: &str) -> Archive {
    let rootfs = dir.join("busybox-rootfs");
    base(&rootfs);
    std::fs::create_dir_all(rootfs.join("bin")).unwrap();
    std::fs::copy("/bin/busybox", rootfs.join("bin/busybox")).unwrap();
    for applet in ["sh", "sleep", "cat", "echo", "ls", "nc", "wget", "true"] {
        std::os::unix::fs::symlink("busybox", rootfs.join("bin").join(applet)).unwrap();
    }
    let cfg = ImageConfig {
        user: None,
        entrypoint: Vec::new(),
        cmd: vec!["/bin/sh".into()],
    };
    pack(&dir.join("busybox.tar"), name, &rootfs, &cfg)
}

#[test]
fn the_dockerfiles_final_stage_is_read_instruction_by_instruction() {
    let dockerfile = std::fs::read_to_string(repo().join("Dockerfile")).unwrap();
    let st = final_stage(&dockerfile).unwrap();
    assert_eq!(st.base, "debian:bookworm-slim");
    assert_eq!(st.binary, "/usr/local/bin/edgetunnel");
    assert!(st.packages.iter().any(|p| p == "iptables"), "{st:?}");
    assert_eq!(st.user.as_deref(), Some("65532:65532"));
    assert_eq!(st.entrypoint, ["/usr/local/bin/edgetunnel"]);
    for name in [
        "proxy-server",
        "proxy-agent",
        "yurt-tunnel-server",
        "yurt-tunnel-agent",
    ] {
        assert!(
            st.links
                .contains(&(format!("/{name}"), "/usr/local/bin/edgetunnel".into())),
            "{name}: {st:?}"
        );
    }
    // Something the packer does not do is refused, not skipped.
    let odd = format!("{dockerfile}\nVOLUME /data\n");
    assert!(final_stage(&odd).unwrap_err().contains("VOLUME /data"));
}
