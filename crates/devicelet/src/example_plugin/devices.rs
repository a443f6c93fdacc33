//! The example plugin's device list: `N` devices named `<kind>-<i>` (kind = last segment of
//! the resource name), spread over NUMA nodes in contiguous blocks, with health overrides read
//! from the control file `R/device-plugins/<name>.health` (lines `ID Healthy|Unhealthy`).

use std::collections::HashMap;

use devicelet_devicemanager::{Device, Health};

/// The device ID prefix for a resource (`example.com/gpu` → `gpu`).
pub fn id_prefix(resource: &str) -> &str {
    resource.rsplit('/').next().unwrap_or(resource)
}

/// The initial devices.
pub fn build_devices(
    resource: &str,
    count: usize,
    numa_nodes: usize,
    unhealthy: &[String],
) -> Vec<Device> {
    let prefix = id_prefix(resource);
    (0..count)
        .map(|i| {
            let id = format!("{prefix}-{i}");
            let health = if unhealthy.contains(&id) {
                Health::Unhealthy
            } else {
                Health::Healthy
            };
            let device = Device::healthy(id).with_health(health);
            if numa_nodes == 0 {
                device
            } else {
                // Contiguous blocks: with 8 devices on 2 nodes, 0-3 on node 0 and 4-7 on node 1.
                let node = (i * numa_nodes / count.max(1)) as i64;
                device.on_numa([node])
            }
        })
        .collect()
}

/// Parses the health control file: one `ID Healthy|Unhealthy` per line; blank lines and
/// `#` comments are skipped.
pub fn parse_health_file(text: &str) -> Result<HashMap<String, Health>, String> {
    let mut overrides = HashMap::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut parts = line.split_whitespace();
        let (Some(id), Some(health), None) = (parts.next(), parts.next(), parts.next()) else {
            return Err(format!(
                "line {}: expected `ID Healthy|Unhealthy`, got {line:?}",
                number + 1
            ));
        };
        let health = match health {
            "Healthy" => Health::Healthy,
            "Unhealthy" => Health::Unhealthy,
            other => {
                return Err(format!(
                    "line {}: health must be Healthy or Unhealthy, got {other:?}",
                    number + 1
                ));
            }
        };
        overrides.insert(id.to_owned(), health);
    }
    Ok(overrides)
}

/// `base` with the overrides applied (IDs not in `base` are ignored).
pub fn apply_overrides(base: &[Device], overrides: &HashMap<String, Health>) -> Vec<Device> {
    base.iter()
        .map(|d| match overrides.get(&d.id) {
            Some(&health) => d.clone().with_health(health),
            None => d.clone(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_are_spread_over_numa_nodes_in_blocks() {
        let devices = build_devices("example.com/gpu", 8, 2, &["gpu-5".to_owned()]);
        let nodes: Vec<i64> = devices
            .iter()
            .map(|d| d.numa_nodes.as_ref().unwrap()[0])
            .collect();
        assert_eq!(nodes, [0, 0, 0, 0, 1, 1, 1, 1]);
        assert_eq!(devices[5].health, Health::Unhealthy);
        assert_eq!(devices[0].id, "gpu-0");
        assert!(
            build_devices("example.com/nic", 2, 0, &[])[0]
                .numa_nodes
                .is_none()
        );
    }

    #[test]
    fn health_file_lines_override_health() {
        let overrides = parse_health_file("# flip\ngpu-1 Unhealthy\n\ngpu-2 Healthy\n").unwrap();
        let base = build_devices("example.com/gpu", 3, 1, &["gpu-2".to_owned()]);
        let applied = apply_overrides(&base, &overrides);
        let health: Vec<Health> = applied.iter().map(|d| d.health).collect();
        assert_eq!(
            health,
            [Health::Healthy, Health::Unhealthy, Health::Healthy]
        );
        assert!(parse_health_file("gpu-1 sick").is_err());
        assert!(parse_health_file("gpu-1").is_err());
    }
}
