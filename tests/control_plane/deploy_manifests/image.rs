//! The image the manifests run: the Dockerfile builds per `TARGETARCH`
//! (amd64, arm64, arm as `docker buildx --platform
//! linux/amd64,linux/arm64,linux/arm/v7` passes it), its build stage on
//! the build machine's platform, a non-root final stage. No container
//! runtime here: the test runs the build stage's own command
//! (`scripts/image-build`) for each architecture, as buildx would, and
//! reads what it made: an ELF binary of that machine and word size,
//! stripped. An ARM binary also runs `--version` under qemu-user when
//! it is installed.
//!
//! Building three release binaries is slow: outside CI an architecture
//! whose binary was never built (`scripts/cross-build`, `cargo build
//! --release`) says `skipped: ...`; with `EDGETUNNEL_REQUIRE_CROSS=1`
//! (scripts/test) every one is built and checked.

use std::path::Path;
use std::process::Command;

use super::root;

fn dockerfile() -> String {
    std::fs::read_to_string(root().join("Dockerfile")).unwrap()
}

/// The build stage's `RUN` command that makes the binary.
fn build_command(df: &str) -> String {
    let runs: Vec<&str> = df
        .lines()
        .filter_map(|l| l.trim().strip_prefix("RUN "))
        .filter(|l| l.contains("scripts/image-build"))
        .collect();
    assert_eq!(runs.len(), 1, "one RUN scripts/image-build: {runs:?}");
    runs[0].to_string()
}

#[test]
fn the_image_builds_per_target_arch_and_runs_as_non_root() {
    let df = dockerfile();
    let froms: Vec<&str> = df.lines().filter(|l| l.starts_with("FROM ")).collect();
    assert_eq!(froms.len(), 2, "a build stage and a final stage: {froms:?}");
    assert!(
        froms[0].contains("--platform=$BUILDPLATFORM"),
        "the build stage runs natively and cross-compiles: {}",
        froms[0]
    );
    assert!(
        !froms[1].contains("--platform"),
        "the final stage is the target's platform: {}",
        froms[1]
    );
    assert!(df.contains("ARG TARGETARCH"), "no ARG TARGETARCH");
    assert!(build_command(&df).contains("TARGETARCH"));
    let user = df
        .lines()
        .filter_map(|l| l.strip_prefix("USER "))
        .next_back()
        .expect("a USER in the final stage");
    let uid = user.split(':').next().unwrap().trim();
    assert_ne!(uid, "0", "the image runs as root");
    assert_ne!(uid, "root", "the image runs as root");
    // The manifests' pods run as that user where they can (checked in
    // containers_have_resources_pinned_images_and_least_privilege).
    assert_eq!(uid, "65532");
}

/// qemu-user's binary and the C library root it runs with.
type Qemu = Option<(&'static str, &'static str)>;

/// (TARGETARCH, its Rust triple, ELF e_machine, 64-bit, qemu-user).
const ARCHES: [(&str, &str, u16, bool, Qemu); 3] = [
    ("amd64", "", 62, true, None),
    (
        "arm64",
        "aarch64-unknown-linux-gnu",
        183,
        true,
        Some(("qemu-aarch64-static", "/usr/aarch64-linux-gnu")),
    ),
    (
        "arm",
        "armv7-unknown-linux-gnueabihf",
        40,
        false,
        Some(("qemu-arm-static", "/usr/arm-linux-gnueabihf")),
    ),
];

/// ELF facts of a file: (e_machine, 64-bit, has a symbol table).
fn elf(path: &Path) -> (u16, bool, bool) {
    let b = std::fs::read(path).unwrap();
    assert_eq!(&b[..4], b"\x7fELF", "{}: not ELF", path.display());
    assert_eq!(b[5], 1, "{}: not little-endian", path.display());
    let is64 = b[4] == 2;
    let u16_at = |o: usize| u16::from_le_bytes([b[o], b[o + 1]]);
    let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
    let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
    let machine = u16_at(18);
    let (shoff, shentsize, shnum) = if is64 {
        (u64_at(0x28) as usize, u16_at(0x3A), u16_at(0x3C))
    } else {
        (u32_at(0x20) as usize, u16_at(0x2E), u16_at(0x30))
    };
    // SHT_SYMTAB (2): a symbol table strip removes.
    let symtab = (0..usize::from(shnum))
        .map(|i| shoff + i * usize::from(shentsize))
        .any(|h| u32_at(h + 4) == 2);
    (machine, is64, symtab)
}

#[test]
fn the_images_build_step_makes_each_architectures_binary() {
    let required = crate::support::cross_required();
    let cmd = build_command(&dockerfile());
    let out = tempfile::tempdir().unwrap();
    // The image ships release binaries; scripts/test builds the cross ones
    // with a cheaper profile to keep CI's time down, and the build step is
    // run with the same profile.
    for (arch, triple, machine, is64, qemu) in ARCHES {
        let triple = (!triple.is_empty()).then_some(triple);
        let profile = crate::support::cross_profile();
        let built = crate::support::cross_binary(triple);
        if !required && !built.exists() {
            println!(
                "skipped: {arch}: {} not built (scripts/cross-build, cargo build --release)",
                built.display()
            );
            continue;
        }
        let dir = out.path().join(arch);
        let run = cmd.replace("/out/", &format!("{}/", dir.display()));
        let status = crate::support::without_test_env(&mut Command::new("bash"))
            .arg("-c")
            .arg(&run)
            .current_dir(root())
            .env("TARGETARCH", arch)
            .env("EDGETUNNEL_IMAGE_PROFILE", &profile)
            .status()
            .unwrap();
        assert!(status.success(), "{arch}: {run}: {status}");
        let bin = dir.join("edgetunnel");
        let (m, wide, symtab) = elf(&bin);
        assert_eq!(m, machine, "{arch}: ELF machine {m}");
        assert_eq!(wide, is64, "{arch}: ELF class");
        assert!(!symtab, "{arch}: not stripped");
        let size = std::fs::metadata(&bin).unwrap().len();
        match qemu {
            Some((q, sysroot)) if Path::new(sysroot).exists() => {
                let o = Command::new(q)
                    .args(["-L", sysroot])
                    .arg(&bin)
                    .arg("--version")
                    .output();
                let o = o.unwrap_or_else(|e| panic!("{arch}: {q}: {e}"));
                assert!(o.status.success(), "{arch}: --version under {q}: {o:?}");
                println!(
                    "{arch}: {size} bytes, stripped; under {q}: {}",
                    String::from_utf8_lossy(&o.stdout)
                        .lines()
                        .next()
                        .unwrap_or("")
                );
            }
            _ => println!("{arch}: {size} bytes, stripped"),
        }
    }
}
