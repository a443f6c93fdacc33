//! Build script for devicelet-proto: compiles the kubelet gRPC `.proto` files in `proto/`
//! (copies of the Kubernetes 1.36 wire definitions under `k8s.io/kubelet/pkg/apis/`) into Rust
//! with `protox` (a pure-Rust protobuf compiler, so no system `protoc` is needed) and
//! `tonic-prost-build`.
//!
//! Each API is compiled into its own sub-directory of `OUT_DIR`. This matters because two
//! unrelated upstream APIs (PodResources v1alpha1 and DRA health v1alpha1) share the bare proto
//! package `v1alpha1`; prost names its output after the package, so one shared output directory
//! would merge them into one Rust module.
//!
//! All files are also compiled together into one encoded `FileDescriptorSet`
//! (`OUT_DIR/kubelet_apis.fds.bin`), exported as `FILE_DESCRIPTOR_SET` for gRPC reflection.

use std::path::{Path, PathBuf};

/// (output sub-directory, proto file relative to `proto/`).
const APIS: &[(&str, &str)] = &[
    (
        "deviceplugin_v1beta1",
        "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1/api.proto",
    ),
    (
        "pluginregistration_v1",
        "k8s.io/kubelet/pkg/apis/pluginregistration/v1/api.proto",
    ),
    (
        "podresources_v1",
        "k8s.io/kubelet/pkg/apis/podresources/v1/api.proto",
    ),
    (
        "podresources_v1alpha1",
        "k8s.io/kubelet/pkg/apis/podresources/v1alpha1/api.proto",
    ),
    ("dra_v1", "k8s.io/kubelet/pkg/apis/dra/v1/api.proto"),
    (
        "dra_v1beta1",
        "k8s.io/kubelet/pkg/apis/dra/v1beta1/api.proto",
    ),
    (
        "dra_health_v1alpha1",
        "k8s.io/kubelet/pkg/apis/dra-health/v1alpha1/api.proto",
    ),
];

/// The container runtime interface, v1 (`k8s.io/cri-api` v0.36.3).
const CRI_API: &str = "k8s.io/cri-api/pkg/apis/runtime/v1/api.proto";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    let proto_root = Path::new("proto");
    println!("cargo:rerun-if-changed=build.rs");
    for (sub_dir, file) in APIS {
        println!("cargo:rerun-if-changed={}", proto_root.join(file).display());
        let fds = protox::compile([*file], [proto_root])?;
        let api_out = out_dir.join(sub_dir);
        std::fs::create_dir_all(&api_out)?;
        tonic_prost_build::configure()
            .build_client(true)
            .build_server(true)
            .out_dir(&api_out)
            .compile_fds(fds)?;
    }
    // The CRI (`k8s.io/cri-api` runtime v1) is a client API of devicelet: it drives the
    // container runtime. Compiled on its own and kept out of the reflection set, which lists
    // the APIs devicelet serves. The server half exists for in-process fake runtimes in tests.
    println!(
        "cargo:rerun-if-changed={}",
        proto_root.join(CRI_API).display()
    );
    let cri = protox::compile([CRI_API], [proto_root])?;
    let cri_out = out_dir.join("cri_v1");
    std::fs::create_dir_all(&cri_out)?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // A fake runtime in a test implements the few calls it needs; the rest answer
        // Unimplemented.
        .generate_default_stubs(true)
        .out_dir(&cri_out)
        .compile_fds(cri)?;
    let all_files: Vec<&str> = APIS.iter().map(|(_, file)| *file).collect();
    let fds = protox::compile(all_files, [proto_root])?;
    std::fs::write(
        out_dir.join("kubelet_apis.fds.bin"),
        prost::Message::encode_to_vec(&fds),
    )?;
    Ok(())
}
