//! Interop with a real grpc-go client (spec/devicemanager.md §1.11, spec/ecosystem.md A11 row
//! 63): `tests/go_client` dials our Unix socket the ways deployed Go plugins do and calls the
//! standard health service.
//!
//! Needs the Go toolchain and the `google.golang.org/grpc` module (module cache or proxy), so
//! it is `#[ignore]`d by default:
//! `cargo test -p devicelet-transport --test go_interop -- --ignored`.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::TestServer;

fn build_go_client(out_dir: &Path) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/go_client");
    let bin = out_dir.join("go_client");
    let status = Command::new("go")
        .args(["build", "-mod=readonly", "-o"])
        .arg(&bin)
        .arg(".")
        .current_dir(&src)
        .status()
        .expect("the go toolchain is installed");
    assert!(status.success(), "go build of tests/go_client failed");
    bin
}

/// Runs the Go client against `socket`; returns variant → "OK SERVING" / "ERR <code> ...".
async fn run_go_client(bin: &Path, socket: &Path) -> BTreeMap<String, String> {
    let output = tokio::process::Command::new(bin)
        .arg(socket)
        .output()
        .await
        .expect("the Go client runs");
    assert!(output.status.success(), "{output:?}");
    String::from_utf8(output.stdout)
        .expect("the Go client prints UTF-8")
        .lines()
        .map(|line| {
            let (variant, result) = line
                .split_once(' ')
                .expect("lines are `<variant> <result>`");
            (variant.to_string(), result.to_string())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the Go toolchain and google.golang.org/grpc"]
async fn a11_real_grpc_go_clients_are_served_through_the_shim() {
    let dir = tempfile::tempdir().unwrap();
    let bin = build_go_client(dir.path());

    let shimmed = TestServer::start(dir.path(), "kubelet.sock", true).await;
    let results = run_go_client(&bin, &shimmed.path).await;
    assert_eq!(results.len(), 3, "{results:?}");
    for (variant, result) in &results {
        assert_eq!(result, "OK SERVING", "{variant} through the shim");
    }
    shimmed.stop().await;

    // The same clients against plain tonic: the path authorities are refused, proving they are
    // what grpc-go really sends.
    let plain = TestServer::start(dir.path(), "plain.sock", false).await;
    let results = run_go_client(&bin, &plain.path).await;
    eprintln!("grpc-go against plain tonic: {results:?}");
    assert_eq!(results["unix-scheme"], "OK SERVING");
    assert!(results["dial-bare-path"].starts_with("ERR"), "{results:?}");
    assert!(
        results["passthrough-relative"].starts_with("ERR"),
        "{results:?}"
    );
    plain.stop().await;
}
