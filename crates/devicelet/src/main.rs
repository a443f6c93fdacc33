//! devicelet: the device and resource-allocation half of the kubelet.
fn main() {}
