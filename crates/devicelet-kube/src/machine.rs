//! What the machine has, read once at start (the kubelet gets it from cAdvisor's
//! `MachineInfo`; devicelet reads the same kernel files). Every value has a fallback so a
//! restricted container or an unusual system still registers a node.

use std::path::Path;

use crate::node_status::{DEFAULT_MAX_PODS, MachineInfo};

/// Reads the machine's CPUs, memory, boot ID and identity.
pub fn read_machine(max_pods: Option<u64>) -> MachineInfo {
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get() as u64)
        .unwrap_or(1);
    let memory_bytes = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| mem_total_bytes(&text))
        .unwrap_or(0);
    MachineInfo {
        cpus,
        memory_bytes,
        hugepages: read_hugepages(Path::new(HUGEPAGES_DIR)),
        max_pods: max_pods.unwrap_or(DEFAULT_MAX_PODS),
        boot_id: read_trimmed("/proc/sys/kernel/random/boot_id"),
        machine_id: read_trimmed("/etc/machine-id"),
        kernel_version: read_trimmed("/proc/sys/kernel/osrelease"),
        os_image: std::fs::read_to_string("/etc/os-release")
            .ok()
            .and_then(|text| pretty_name(&text))
            .unwrap_or_else(|| "Linux".to_owned()),
        architecture: go_arch(std::env::consts::ARCH).to_owned(),
        internal_ip: "127.0.0.1".to_owned(),
        container_runtime_version: None,
    }
}

/// Where the kernel lists the machine's huge page pools.
pub const HUGEPAGES_DIR: &str = "/sys/kernel/mm/hugepages";

/// Pre-allocated huge pages per page size (bytes → pages), as cadvisor reads them: one
/// `hugepages-<kB>kB` directory per size with `nr_hugepages`. A pool that cannot be read is
/// left out rather than reported as 0, as cadvisor does.
pub fn read_hugepages(dir: &Path) -> std::collections::BTreeMap<u64, u64> {
    let mut out = std::collections::BTreeMap::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(kib) = name
            .to_str()
            .and_then(|n| n.strip_prefix("hugepages-"))
            .and_then(|n| n.strip_suffix("kB"))
            .and_then(|n| n.parse::<u64>().ok())
        else {
            continue;
        };
        let pages = std::fs::read_to_string(entry.path().join("nr_hugepages"))
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok());
        if let (Some(size), Some(pages)) = (kib.checked_mul(1024), pages) {
            out.insert(size, pages);
        }
    }
    out
}

fn read_trimmed(path: impl AsRef<Path>) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

/// `MemTotal` of `/proc/meminfo`, in bytes.
pub fn mem_total_bytes(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// `PRETTY_NAME` of an os-release file.
pub fn pretty_name(os_release: &str) -> Option<String> {
    let value = os_release
        .lines()
        .find_map(|l| l.strip_prefix("PRETTY_NAME="))?;
    Some(value.trim_matches('"').to_owned())
}

/// Rust's architecture names in Go's spelling (what `kubernetes.io/arch` uses).
pub fn go_arch(rust_arch: &str) -> &str {
    match rust_arch {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_hugepage_pools_per_size() {
        let dir = std::env::temp_dir().join(format!("devicelet-hp-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for (name, pages) in [
            ("hugepages-2048kB", "512\n"),
            ("hugepages-1048576kB", "2\n"),
        ] {
            std::fs::create_dir_all(dir.join(name)).unwrap();
            std::fs::write(dir.join(name).join("nr_hugepages"), pages).unwrap();
        }
        std::fs::create_dir_all(dir.join("not-a-pool")).unwrap();
        let pools = read_hugepages(&dir);
        assert_eq!(
            pools,
            std::collections::BTreeMap::from([(2 << 20, 512), (1 << 30, 2)])
        );
        assert!(read_hugepages(&dir.join("missing")).is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn parses_meminfo_and_os_release() {
        assert_eq!(
            mem_total_bytes("MemTotal:       24590000 kB\nMemFree: 1 kB\n"),
            Some(24_590_000 * 1024)
        );
        assert_eq!(mem_total_bytes("garbage"), None);
        assert_eq!(
            pretty_name("NAME=x\nPRETTY_NAME=\"Debian GNU/Linux 13\"\n").as_deref(),
            Some("Debian GNU/Linux 13")
        );
        assert_eq!(go_arch("x86_64"), "amd64");
    }
}
