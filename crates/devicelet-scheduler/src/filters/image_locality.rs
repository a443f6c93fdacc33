//! ImageLocality, a score of the default profile (weight 1): nodes that already hold the pod's
//! images score higher, scaled by how widely each image is spread so that one popular image
//! does not pull every pod to the same node
//! (`pkg/scheduler/framework/plugins/imagelocality/image_locality.go`; spec workloads.md W110).
//!
//! The node's images are indexed once per node update ([`NodeImages::of`]); the number of
//! nodes holding each image name is kept by the cache, so a cycle reads only the pod's names.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{Node, Pod};

const MB: i64 = 1024 * 1024;
/// Below this sum an image's presence is not worth anything (a pause-sized image).
const MIN_THRESHOLD: i64 = 23 * MB;
/// The sum that scores 100, per container.
const MAX_CONTAINER_THRESHOLD: i64 = 1000 * MB;

/// `name` with `:latest` added when it has no tag (a digest's `@sha256:…` counts as one, as
/// the colon after the last `/` decides upstream).
pub fn normalized(name: &str) -> String {
    let colon = name.rfind(':');
    let slash = name.rfind('/');
    if colon.map(|c| c as isize).unwrap_or(-1) <= slash.map(|s| s as isize).unwrap_or(-1) {
        format!("{name}:latest")
    } else {
        name.to_owned()
    }
}

/// A node's images by name (every name of `status.images`), with their size.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeImages(HashMap<String, i64>);

impl NodeImages {
    /// Reads `node.status.images`.
    pub fn of(node: &Node) -> Self {
        let mut names = HashMap::new();
        for image in node
            .status
            .as_ref()
            .and_then(|s| s.images.as_ref())
            .into_iter()
            .flatten()
        {
            for name in image.names.iter().flatten() {
                names
                    .entry(name.clone())
                    .or_insert(image.size_bytes.unwrap_or(0));
            }
        }
        NodeImages(names)
    }

    /// The image names, each once.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.0.keys().map(String::as_str)
    }

    fn size(&self, name: &str) -> Option<i64> {
        self.0.get(name).copied()
    }
}

/// What the score needs of the pod: its images (init containers, containers, image volumes;
/// one entry per use, as upstream sums them) and how many nodes hold each.
#[derive(Clone, Debug, Default)]
pub struct PodImages {
    images: Vec<String>,
    containers: i64,
    /// Per image name, the nodes holding it.
    nodes_with: HashMap<String, usize>,
    total_nodes: usize,
}

impl PodImages {
    /// The pod's normalized image names, in upstream's order.
    pub fn names_of(pod: &Pod) -> (Vec<String>, i64) {
        let Some(spec) = pod.spec.as_ref() else {
            return (Vec::new(), 0);
        };
        let init = spec.init_containers.iter().flatten();
        let containers = init.clone().count() + spec.containers.len();
        let mut images: Vec<String> = init
            .chain(&spec.containers)
            .filter_map(|c| c.image.as_deref())
            .map(normalized)
            .collect();
        images.extend(
            spec.volumes
                .iter()
                .flatten()
                .filter_map(|v| v.image.as_ref()?.reference.as_deref())
                .map(normalized),
        );
        (images, containers as i64)
    }

    /// The pod's images, with `nodes_with(name)` the number of nodes holding each of
    /// `total_nodes`.
    pub fn new(pod: &Pod, total_nodes: usize, nodes_with: impl Fn(&str) -> usize) -> Self {
        let (images, containers) = Self::names_of(pod);
        let nodes_with = images
            .iter()
            .map(|name| (name.clone(), nodes_with(name)))
            .collect();
        PodImages {
            images,
            containers,
            nodes_with,
            total_nodes,
        }
    }

    /// The node's score, 0-100 (not normalised across nodes).
    pub fn score(&self, node: &NodeImages) -> i64 {
        if self.total_nodes == 0 || self.containers == 0 {
            return 0;
        }
        let sum: i64 = self
            .images
            .iter()
            .filter_map(|name| {
                let size = node.size(name)?;
                let spread =
                    *self.nodes_with.get(name).unwrap_or(&0) as f64 / self.total_nodes as f64;
                // Truncated as upstream's int64(float64(size) * spread).
                Some((size as f64 * spread) as i64)
            })
            .sum();
        let max = MAX_CONTAINER_THRESHOLD * self.containers;
        let clamped = sum.clamp(MIN_THRESHOLD, max);
        100 * (clamped - MIN_THRESHOLD) / (max - MIN_THRESHOLD)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Container, ContainerImage, NodeStatus, PodSpec};

    fn node(images: &[(&[&str], i64)]) -> NodeImages {
        NodeImages::of(&Node {
            status: Some(NodeStatus {
                images: Some(
                    images
                        .iter()
                        .map(|(names, size)| ContainerImage {
                            names: Some(names.iter().map(|n| (*n).to_owned()).collect()),
                            size_bytes: Some(*size),
                        })
                        .collect(),
                ),
                ..NodeStatus::default()
            }),
            ..Node::default()
        })
    }

    fn pod(images: &[&str]) -> Pod {
        Pod {
            spec: Some(PodSpec {
                containers: images
                    .iter()
                    .map(|i| Container {
                        name: "c".into(),
                        image: Some((*i).to_owned()),
                        ..Container::default()
                    })
                    .collect(),
                ..PodSpec::default()
            }),
            ..Pod::default()
        }
    }

    #[test]
    fn names_get_latest_unless_tagged() {
        assert_eq!(normalized("nginx"), "nginx:latest");
        assert_eq!(normalized("gcr.io/x/nginx:1.2"), "gcr.io/x/nginx:1.2");
        assert_eq!(
            normalized("localhost:5000/nginx"),
            "localhost:5000/nginx:latest"
        );
        assert_eq!(normalized("nginx@sha256:ab"), "nginx@sha256:ab");
    }

    #[test]
    fn scores_as_upstream_table() {
        // Upstream's TestImageLocalityPriority "two images on one node, prefer this node": a
        // pod of a 40 MB and a 300 MB image, both on node 1 only, of two nodes.
        let p = pod(&["gcr.io/40:latest", "gcr.io/300:latest"]);
        let spread = |n: &str| match n {
            "gcr.io/40:latest" | "gcr.io/300:latest" => 1,
            _ => 0,
        };
        let images = PodImages::new(&p, 2, spread);
        let n1 = node(&[
            (&["gcr.io/40:latest"], 40 * MB),
            (&["gcr.io/300:latest"], 300 * MB),
        ]);
        let n2 = node(&[(&["gcr.io/2000:latest"], 2000 * MB)]);
        // 100 * ((40M + 300M)/2 - 23M) / (1000M * 2 - 23M) = 7.
        assert_eq!(images.score(&n1), 7);
        assert_eq!(images.score(&n2), 0);
    }

    #[test]
    fn large_images_are_capped_per_container() {
        let p = pod(&["big"]);
        let images = PodImages::new(&p, 1, |_| 1);
        assert_eq!(images.score(&node(&[(&["big:latest"], 5000 * MB)])), 100);
        assert_eq!(
            PodImages::new(&p, 0, |_| 0).score(&NodeImages::default()),
            0
        );
    }
}
