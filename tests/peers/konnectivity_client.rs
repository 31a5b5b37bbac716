//! The Go konnectivity-client (through anptool) against our server and
//! agent: gRPC over TCP and over a unix socket dialed exactly as
//! kube-apiserver dials it, echo / upload / download of 1 KiB to 100 MiB
//! with sha256 checks, the target closing first, the client closing or
//! dying mid-download, DIAL_CLS on a dial deadline, no agent, TLS on the
//! frontend.

use crate::common::{peers, serial, Stack};

/// gRPC over TCP and over the unix socket: the three transfers at three
/// sizes, each checked by sha256, each leaving nothing open.
#[test]
fn grpc_echo_upload_download_over_tcp_and_unix_socket() {
    let Some(p) = peers() else { return };
    let _g = serial();
    let s = Stack::start(p, &[]);
    let grpc = s.server.grpc.to_string();
    let uds = s.server.grpc_uds.display().to_string();
    let target = s.target.target();
    for (via, addr) in [("grpc", &grpc), ("grpc-uds", &uds)] {
        for test in ["echo", "up", "down"] {
            for size in ["1024", "1048576", "104857600"] {
                s.expect_ok(
                    p,
                    &[
                        "-via", via, "-addr", addr, "-target", &target, "-test", test, "-size",
                        size,
                    ],
                );
                s.assert_clean();
            }
        }
    }
}
