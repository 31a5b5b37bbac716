//! The Rust code for the Packet protocol is generated from `proto/` and
//! committed as `crates/protocol/src/anp/pb.rs`, so building needs no `protoc`. This test
//! regenerates it with pure-Rust tools (protox + prost-build) and fails on any
//! difference. Run with `UPDATE_CODEGEN=1` to rewrite the committed file.

use std::path::Path;

#[test]
fn committed_protobuf_code_matches_proto_files() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let fds = protox::compile(["agent.proto", "client.proto"], [root.join("proto")])
        .expect("proto files parse");
    let out = tempfile::tempdir().expect("tempdir");
    let mut config = prost_build::Config::new();
    config.bytes(["."]);
    config.out_dir(out.path());
    config.compile_fds(fds).expect("prost-build generates code");
    // Files without a `package` statement are written to `_.rs`.
    let generated = std::fs::read_to_string(out.path().join("_.rs")).expect("generated file");
    let committed_path = root.join("crates/protocol/src/anp/pb.rs");
    if std::env::var_os("UPDATE_CODEGEN").is_some() {
        std::fs::write(&committed_path, &generated).expect("write pb.rs");
    }
    let committed = std::fs::read_to_string(&committed_path).unwrap_or_default();
    assert!(
        committed == generated,
        "crates/protocol/src/anp/pb.rs is stale: run `UPDATE_CODEGEN=1 cargo test --test codegen`"
    );
}
