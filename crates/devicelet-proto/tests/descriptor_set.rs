//! Checks the exported `FILE_DESCRIPTOR_SET`: it decodes and holds every kubelet API file with
//! its upstream package and services (what a reflection client such as grpcurl will see).

use devicelet_proto::FILE_DESCRIPTOR_SET;
use prost::Message;
use prost_types::FileDescriptorSet;

#[test]
fn descriptor_set_lists_every_api_with_upstream_packages_and_services() {
    let set = FileDescriptorSet::decode(FILE_DESCRIPTOR_SET).expect("build.rs writes a valid set");
    let mut found: Vec<(String, Vec<String>)> = set
        .file
        .iter()
        .map(|f| {
            (
                f.package().to_owned(),
                f.service.iter().map(|s| s.name().to_owned()).collect(),
            )
        })
        .collect();
    found.sort();
    let expected: Vec<(String, Vec<String>)> = vec![
        (
            "k8s.io.kubelet.pkg.apis.dra.v1".into(),
            vec!["DRAPlugin".into()],
        ),
        (
            "k8s.io.kubelet.pkg.apis.dra.v1beta1".into(),
            vec!["DRAPlugin".into()],
        ),
        ("pluginregistration".into(), vec!["Registration".into()]),
        ("v1".into(), vec!["PodResourcesLister".into()]),
        ("v1alpha1".into(), vec!["DRAResourceHealth".into()]),
        ("v1alpha1".into(), vec!["PodResourcesLister".into()]),
        (
            "v1beta1".into(),
            vec!["Registration".into(), "DevicePlugin".into()],
        ),
    ];
    assert_eq!(found, expected);
}
