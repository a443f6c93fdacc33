//! CPU placement from `devices/system/cpu/cpuN/topology/{physical_package_id,core_id}`
//! (cadvisor's `sysfs.go` `GetCoreID` / `GetCPUPhysicalPackageID`, feeding the kubelet's
//! `cm/cpumanager/topology/topology.go` `Discover`), and each CPU's uncore (L3) cache from
//! `cpuN/cache/indexK/{id,size,level,type,shared_cpu_map}` (cadvisor v0.56.2
//! `utils/sysinfo/sysinfo.go` `addCacheInfo` / `GetCacheInfo`, `utils/sysfs/sysfs.go`).
//!
//! cadvisor's rules, followed here: per NUMA node, threads with the same (core_id, socket) form
//! a core, in the order of the node's `cpuN` directory names (string order, so `cpu10` comes
//! before `cpu2`); a core's caches are read from its first thread, index directories in name
//! order. A cache above L2 whose `shared_cpu_map` counts exactly the node's threads is a node
//! cache; any other one is an uncore cache, and the first is the one the kubelet uses
//! (`UncoreCaches[0].Id`). A cache directory that cannot be read ends the cache scan of the
//! node (cadvisor ignores that error), and cores without an uncore cache get their socket id,
//! as the kubelet's `getUncoreCacheID` falls back.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use devicelet_cpumanager::{CpuPlacement, CpuTopology};
use devicelet_topology::NumaTopology;

use crate::error::MachineError;
use crate::sysfs::read_u32;

/// One cache of one CPU, as cadvisor's `GetCacheInfo` reads it (size and type are read only
/// because a missing file makes cadvisor drop the node's remaining cache information).
struct Cache {
    id: u32,
    level: u32,
    cpus: u32,
}

/// Leading decimal integer of a file (Go's `fmt.Sscanf("%d")`), with the rest of the text.
fn scan_int(text: &str) -> Option<(u32, &str)> {
    let t = text.trim_start();
    let end = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    Some((t[..end].parse().ok()?, &t[end..]))
}

fn read_cache(dir: &Path) -> Option<Cache> {
    let read = |name: &str| fs::read_to_string(dir.join(name)).ok();
    let (id, _) = scan_int(&read("id")?)?;
    let size = read("size")?;
    let (_, rest) = scan_int(&size)?;
    if !rest.starts_with('K') {
        return None;
    }
    let (level, _) = scan_int(&read("level")?)?;
    read("type")?;
    let mut cpus = 0;
    for word in read("shared_cpu_map")?.split(',') {
        cpus += u64::from_str_radix(word.trim(), 16).ok()?.count_ones();
    }
    Some(Cache { id, level, cpus })
}

/// The caches of one CPU, index directories in name order; `None` when any cannot be read.
fn read_caches(sysfs_root: &Path, cpu: u32) -> Option<Vec<Cache>> {
    let dir = sysfs_root.join(format!("devices/system/cpu/cpu{cpu}/cache"));
    let mut names: Vec<String> = fs::read_dir(&dir)
        .ok()?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("index"))
        .collect();
    names.sort();
    names.iter().map(|n| read_cache(&dir.join(n))).collect()
}

/// Reads socket, core and uncore cache of every CPU that `numa` lists (the online CPUs of each
/// node).
pub fn read_cpu_topology(
    sysfs_root: &Path,
    numa: &NumaTopology,
) -> Result<CpuTopology, MachineError> {
    let mut placements = vec![];
    for node in &numa.nodes {
        // cadvisor walks `node<N>/cpu*` in name order.
        let mut cpus = node.cpus.clone();
        cpus.sort_by_key(|c| c.to_string());
        // (core_id, socket) → threads in walk order; `order` keeps the cores' first sighting.
        let mut cores: BTreeMap<(u32, u32), Vec<u32>> = BTreeMap::new();
        let mut order: Vec<(u32, u32)> = vec![];
        for &cpu in &cpus {
            let dir = sysfs_root.join(format!("devices/system/cpu/cpu{cpu}/topology"));
            let socket = read_u32(dir.join("physical_package_id"))?;
            let core_id = read_u32(dir.join("core_id"))?;
            let threads = cores.entry((core_id, socket)).or_default();
            if threads.is_empty() {
                order.push((core_id, socket));
            }
            threads.push(cpu);
        }
        let mut cache_scan_ok = true;
        for key in &order {
            let Some(threads) = cores.get(key) else {
                continue;
            };
            let (core_id, socket) = *key;
            let threads_per_node = (order.len() * threads.len()) as u32;
            let mut uncore = None;
            if cache_scan_ok {
                match threads.first().and_then(|&t| read_caches(sysfs_root, t)) {
                    Some(caches) => {
                        uncore = caches
                            .iter()
                            .find(|c| c.level > 2 && c.cpus != threads_per_node)
                            .map(|c| c.id);
                    }
                    None => cache_scan_ok = false,
                }
            }
            for &cpu in threads {
                placements.push(CpuPlacement {
                    id: cpu,
                    socket,
                    core_id,
                    numa: node.id,
                    uncore_cache: uncore.unwrap_or(socket),
                });
            }
        }
    }
    Ok(CpuTopology::from_placements(placements)?)
}
