//! Memory per NUMA node, as cadvisor v0.56 reads it for the kubelet's memory manager
//! (`utils/sysinfo/sysinfo.go` `GetNodesInfo` → `getNodeMemInfo`, `GetHugePagesInfo`):
//! `MemTotal` from `node<N>/meminfo` and the page counts of
//! `node<N>/hugepages/hugepages-<kB>kB/nr_hugepages`.
//!
//! As in cadvisor, a node without `meminfo` has 0 bytes and a node without a `hugepages`
//! directory has no hugepages; a `meminfo` without `MemTotal: <n> kB`, a hugepage directory
//! whose name has no size, or an `nr_hugepages` that does not start with a number is an error.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use devicelet_memorymanager::{MemoryTopology, NumaMemory};

use crate::error::MachineError;
use crate::sysfs::{node_dirs, read};

/// `MemTotal: <n> kB` anywhere in a node's meminfo (`Node 0 MemTotal: ...`), in bytes.
fn mem_total(content: &str) -> Option<u64> {
    let at = content.find("MemTotal:")?;
    let rest = content[at + "MemTotal:".len()..].trim_start();
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    let after = &rest[digits.len()..];
    if digits.is_empty() || !after.starts_with(" kB") {
        return None;
    }
    digits.parse::<u64>().ok()?.checked_mul(1024)
}

/// The leading integer of a file, as Go's `Sscanf("%d")` takes it.
fn leading_u64(content: &str) -> Option<u64> {
    let s = content.trim();
    let s = s.strip_prefix('+').unwrap_or(s);
    let digits: String = s.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

fn read_node(dir: &Path) -> Result<NumaMemory, MachineError> {
    let meminfo = dir.join("meminfo");
    let memory_bytes = match fs::read_to_string(&meminfo) {
        Err(_) => 0,
        Ok(content) => mem_total(&content).ok_or_else(|| MachineError::BadValue {
            path: meminfo.clone(),
            content: content.clone(),
        })?,
    };
    let mut hugepages = BTreeMap::new();
    let hp_dir = dir.join("hugepages");
    if let Ok(entries) = fs::read_dir(&hp_dir) {
        for entry in entries {
            let entry = entry.map_err(|source| MachineError::Io {
                path: hp_dir.clone(),
                source,
            })?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let size_kb = name
                .split('-')
                .nth(1)
                .and_then(|s| s.split("kB").next())
                .and_then(|s| s.parse::<u64>().ok())
                .ok_or_else(|| MachineError::BadValue {
                    path: entry.path(),
                    content: name.clone(),
                })?;
            let nr_path = entry.path().join("nr_hugepages");
            let content = read(nr_path.clone())?;
            let pages = leading_u64(&content).ok_or(MachineError::BadValue {
                path: nr_path,
                content,
            })?;
            hugepages.insert(size_kb.saturating_mul(1024), pages);
        }
    }
    Ok(NumaMemory {
        memory_bytes,
        hugepages,
    })
}

/// Reads `<sysfs_root>/devices/system/node/node*/{meminfo,hugepages}`.
pub fn read_memory_topology(sysfs_root: &Path) -> Result<MemoryTopology, MachineError> {
    let (dir, found) = node_dirs(sysfs_root)?;
    let mut nodes = vec![];
    for (id, path) in found {
        nodes.push((id, read_node(&path)?));
    }
    MemoryTopology::new(nodes).map_err(|e| MachineError::BadValue {
        path: dir,
        content: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(root: &Path, rel: &str, content: &str) {
        let p = root.join(rel);
        fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        fs::write(p, content).expect("write");
    }

    #[test]
    fn reads_memtotal_and_hugepages_per_node() {
        let tmp = tempfile::tempdir().expect("tmp");
        let root = tmp.path();
        let base = "devices/system/node";
        write(
            root,
            &format!("{base}/node0/meminfo"),
            "Node 0 MemTotal:       32768000 kB\nNode 0 MemFree:        1000 kB\n",
        );
        write(
            root,
            &format!("{base}/node0/hugepages/hugepages-2048kB/nr_hugepages"),
            "512\n",
        );
        write(
            root,
            &format!("{base}/node0/hugepages/hugepages-1048576kB/nr_hugepages"),
            "2\n",
        );
        // node1: no meminfo (0 bytes, as cadvisor) and no hugepages directory.
        fs::create_dir_all(root.join(format!("{base}/node1"))).expect("mkdir");
        write(root, &format!("{base}/online"), "0-1\n");
        let t = read_memory_topology(root).expect("reads");
        let n0 = &t.nodes()[&0];
        assert_eq!(n0.memory_bytes, 32_768_000 * 1024);
        assert_eq!(n0.hugepages[&(2 << 20)], 512);
        assert_eq!(n0.hugepages[&(1 << 30)], 2);
        assert_eq!(t.nodes()[&1], NumaMemory::default());
    }

    #[test]
    fn bad_files_are_errors() {
        let tmp = tempfile::tempdir().expect("tmp");
        let root = tmp.path();
        write(root, "devices/system/node/node0/meminfo", "MemFree: 1 kB\n");
        assert!(matches!(
            read_memory_topology(root),
            Err(MachineError::BadValue { .. })
        ));
        let tmp = tempfile::tempdir().expect("tmp");
        let root = tmp.path();
        write(
            root,
            "devices/system/node/node0/hugepages/hugepages-2048kB/nr_hugepages",
            "x\n",
        );
        assert!(read_memory_topology(root).is_err());
        let tmp = tempfile::tempdir().expect("tmp");
        assert!(matches!(
            read_memory_topology(tmp.path()),
            Err(MachineError::Io { .. })
        ));
    }
}
