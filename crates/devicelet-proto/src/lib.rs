//! devicelet-proto: every gRPC API the kubelet speaks on its Unix sockets, generated from the
//! `.proto` files in `proto/` (wire copies of Kubernetes 1.36
//! `staging/src/k8s.io/kubelet/pkg/apis/*/api.proto`, spec `devicemanager.md` §1.1–§1.2, §5.2–§5.3
//! and `dra-kubelet.md` §1.1–§1.5).
//!
//! Module tree (proto package in brackets; the package is part of every gRPC method path):
//! - [`deviceplugin::v1beta1`] (`v1beta1`): `Registration` (served by devicelet) and
//!   `DevicePlugin` (served by plugins).
//! - [`pluginregistration::v1`] (`pluginregistration`): the plugin-watcher `Registration`
//!   service served by plugins and DRA drivers.
//! - [`podresources::v1`] (`v1`) and [`podresources::v1alpha1`] (`v1alpha1`):
//!   `PodResourcesLister`.
//! - [`dra::v1`] (`k8s.io.kubelet.pkg.apis.dra.v1`) and [`dra::v1beta1`]
//!   (`k8s.io.kubelet.pkg.apis.dra.v1beta1`): `DRAPlugin` served by DRA drivers.
//! - [`dra_health::v1alpha1`] (`v1alpha1`, the same bare package as PodResources v1alpha1):
//!   `DRAResourceHealth` served by DRA drivers.
//! - [`constants`]: the well-known strings and paths of those APIs.
//!
//! Each generated module has a `*_client` and a `*_server` sub-module (tonic), e.g.
//! [`deviceplugin::v1beta1::registration_server::RegistrationServer`].

pub mod constants;

/// Encoded `google.protobuf.FileDescriptorSet` of every API in this crate (for gRPC server
/// reflection, e.g. `tonic-reflection`, so `grpcurl` can talk to devicelet's sockets).
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/kubelet_apis.fds.bin"));

/// Includes one generated file; the build script writes each API into its own sub-directory of
/// `OUT_DIR` (see `build.rs`).
macro_rules! include_generated {
    ($sub_dir:literal, $file:literal) => {
        include!(concat!(env!("OUT_DIR"), "/", $sub_dir, "/", $file));
    };
}

/// Device plugin API (`k8s.io/kubelet/pkg/apis/deviceplugin`).
pub mod deviceplugin {
    /// Device plugin API v1beta1, proto package `v1beta1`.
    #[allow(clippy::all, clippy::pedantic, clippy::nursery, missing_docs)]
    pub mod v1beta1 {
        include_generated!("deviceplugin_v1beta1", "v1beta1.rs");
    }
}

/// Plugin-watcher registration API (`k8s.io/kubelet/pkg/apis/pluginregistration`).
pub mod pluginregistration {
    /// Plugin registration v1, proto package `pluginregistration`.
    #[allow(clippy::all, clippy::pedantic, clippy::nursery, missing_docs)]
    pub mod v1 {
        include_generated!("pluginregistration_v1", "pluginregistration.rs");
    }
}

/// PodResources API (`k8s.io/kubelet/pkg/apis/podresources`).
pub mod podresources {
    /// PodResources v1, proto package `v1`.
    #[allow(clippy::all, clippy::pedantic, clippy::nursery, missing_docs)]
    pub mod v1 {
        include_generated!("podresources_v1", "v1.rs");
    }

    /// PodResources v1alpha1, proto package `v1alpha1`.
    #[allow(clippy::all, clippy::pedantic, clippy::nursery, missing_docs)]
    pub mod v1alpha1 {
        include_generated!("podresources_v1alpha1", "v1alpha1.rs");
    }
}

/// DRA kubelet-plugin API (`k8s.io/kubelet/pkg/apis/dra`).
pub mod dra {
    /// DRA v1, proto package `k8s.io.kubelet.pkg.apis.dra.v1`.
    #[allow(clippy::all, clippy::pedantic, clippy::nursery, missing_docs)]
    pub mod v1 {
        include_generated!("dra_v1", "k8s.io.kubelet.pkg.apis.dra.v1.rs");
    }

    /// DRA v1beta1, proto package `k8s.io.kubelet.pkg.apis.dra.v1beta1` (no `share_id`).
    #[allow(clippy::all, clippy::pedantic, clippy::nursery, missing_docs)]
    pub mod v1beta1 {
        include_generated!("dra_v1beta1", "k8s.io.kubelet.pkg.apis.dra.v1beta1.rs");
    }
}

/// DRA device health API (`k8s.io/kubelet/pkg/apis/dra-health`).
pub mod dra_health {
    /// DRA health v1alpha1, proto package `v1alpha1`.
    #[allow(clippy::all, clippy::pedantic, clippy::nursery, missing_docs)]
    pub mod v1alpha1 {
        include_generated!("dra_health_v1alpha1", "v1alpha1.rs");
    }
}

/// Container Runtime Interface (`k8s.io/cri-api/pkg/apis/runtime`): what devicelet's CRI
/// runtime drives (containerd, CRI-O).
pub mod cri {
    /// CRI v1, proto package `runtime.v1`.
    #[allow(clippy::all, clippy::pedantic, clippy::nursery, missing_docs)]
    pub mod v1 {
        include_generated!("cri_v1", "runtime.v1.rs");
    }
}
