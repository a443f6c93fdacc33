//! Allocator throughput on the scheduler_perf-shaped workloads of spec
//! `structured-allocator.md` §4.4-§4.5, devicelet next to the upstream Go allocator measured in
//! the same run (`interop/allocator/cmd/gobench`, same workloads, same units).
//!
//!     cargo bench -p devicelet-allocator --bench workloads [-- FILTER]
//!
//! Environment: `BENCH_SECS` (measuring time per round, workload and engine, default 0.5),
//! `BENCH_ROUNDS` (default 3; the engines alternate and each one's best round counts),
//! `BENCH_GO=0` (devicelet only). When `go` is on the PATH, the Go benchmark is built once, its
//! workload files (`gobench -write-dir`) are read back through devicelet's scenario reader and
//! checked to be the same inputs as devicelet's generators (`devicelet_allocator::workloads`),
//! and then each workload runs alternately in Rust and in Go, so both see the same machine load.
//!
//! Units (allocations/s = pods/s): per-pod workloads count a new allocator plus one allocation
//! call on every node (PreFilter + Filter); fill-up counts pods placed on the first node that
//! fits, skipping nodes found full (identical loops in `Workload::fill_up` and Go's
//! `Prepared.FillUp`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use devicelet_allocator::scenario::{AllocationScenario, parse_scenario};
use devicelet_allocator::workloads::Workload;
use k8s_openapi::api::resource::v1::ResourceClaim;

enum Kind {
    /// One pod = new allocator + allocate on every node; `want` nodes must fit (None = ≥ 1).
    PerPod { want: Option<usize> },
    /// `pods` pods placed one after the other.
    FillUp { pods: usize },
}

struct Case {
    name: String,
    w: Workload,
    kind: Kind,
}

fn cases() -> Vec<Case> {
    let per_pod = |w: Workload, want: Option<usize>| Case {
        name: w.name.clone(),
        w,
        kind: Kind::PerPod { want },
    };
    let mut v = vec![
        per_pod(Workload::steady_state(500, 10, 0), Some(500)),
        per_pod(Workload::steady_state(500, 10, 500), None),
        per_pod(Workload::steady_state(500, 10, 998), None),
        Case {
            name: "fill_up_5000pods_500nodes".into(),
            w: Workload::steady_state(500, 10, 0),
            kind: Kind::FillUp { pods: 5000 },
        },
        per_pod(Workload::partitionable(10, 200), Some(10)),
        per_pod(Workload::partitionable(100, 2000), Some(100)),
        per_pod(Workload::cel_heavy(500, 10), Some(500)),
    ];
    for count in 5..=8 {
        let want = if count > 7 { 0 } else { 1 };
        v.push(per_pod(Workload::backtracking(count), Some(want)));
    }
    v.push(per_pod(Workload::consumable(100, 2000), Some(100)));
    v
}

/// Runs `unit` for about `budget` (at least once); returns units per second.
fn rate(budget: Duration, mut unit: impl FnMut() -> usize) -> (f64, usize) {
    let start = Instant::now();
    let mut units = 0u64;
    let mut check = 0usize;
    while units == 0 || start.elapsed() < budget {
        check = check.wrapping_add(unit());
        units += 1;
    }
    (units as f64 / start.elapsed().as_secs_f64(), check)
}

fn measure_devicelet(c: &Case, budget: Duration) -> f64 {
    let prepared = c.w.prepare();
    match c.kind {
        Kind::PerPod { want } => {
            let fit = c.w.schedule_pod_all_nodes(&prepared);
            match want {
                Some(n) => assert_eq!(fit, n, "{}: nodes that fit", c.name),
                None => assert!(fit > 0, "{}: some node must fit", c.name),
            }
            rate(budget, || c.w.schedule_pod_all_nodes(&prepared)).0
        }
        Kind::FillUp { pods } => {
            let claims = c.w.fill_up_claims(pods);
            assert_eq!(c.w.fill_up(&claims, &prepared), pods, "{}: placed", c.name);
            rate(budget, || c.w.fill_up(&claims, &prepared)).0 * pods as f64
        }
    }
}

/// The Go benchmark binary, built once into the bench's scratch directory.
struct GoBench {
    bin: PathBuf,
    dir: PathBuf,
}

impl GoBench {
    fn build() -> Result<GoBench, String> {
        if std::env::var("BENCH_GO").as_deref() == Ok("0") {
            return Err("BENCH_GO=0".into());
        }
        let module = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../interop/allocator");
        let scratch = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("allocator-bench");
        let dir = scratch.join("workloads");
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let bin = scratch.join("gobench");
        let out = Command::new("go")
            .args(["build", "-o"])
            .arg(&bin)
            .arg("./cmd/gobench")
            .current_dir(&module)
            .output()
            .map_err(|e| format!("go: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "go build ./cmd/gobench: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let out = Command::new(&bin)
            .arg("-write-only")
            .arg("-write-dir")
            .arg(&dir)
            .output()
            .map_err(|e| format!("gobench: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "gobench -write-only: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(GoBench { bin, dir })
    }

    /// Go's allocations/s for one workload, or an error text.
    fn measure(&self, name: &str, budget: Duration) -> Result<f64, String> {
        let out = Command::new(&self.bin)
            .arg("-run")
            .arg(format!("^{name}$"))
            .arg("-duration")
            .arg(format!("{}ms", budget.as_millis()))
            .output()
            .map_err(|e| e.to_string())?;
        let text = String::from_utf8_lossy(&out.stdout);
        text.split_whitespace()
            .find_map(|f| f.strip_prefix("go_allocs_per_sec="))
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("no figure from gobench: {text}"))
    }

    /// Checks that Go's workload file holds the same cluster and claims as devicelet's generator.
    fn same_input(&self, c: &Case) -> Result<(), String> {
        let path = self.dir.join(format!("{}.json", c.name));
        let bytes = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let go = parse_scenario(&bytes).map_err(|e| e.to_string())?;
        let ours = c.w.to_scenario();
        let claims: Vec<ResourceClaim> = match c.kind {
            Kind::PerPod { .. } => ours.claims.clone(),
            Kind::FillUp { pods } => c.w.fill_up_claims(pods),
        };
        let diffs: Vec<&str> = [
            // Go writes zero-valued node status and claim status; the allocator reads neither.
            ("nodes", nodes(&go) != nodes(&ours)),
            (
                "deviceClasses",
                v(&go.device_classes) != v(&ours.device_classes),
            ),
            (
                "resourceSlices",
                v(&go.resource_slices) != v(&ours.resource_slices),
            ),
            ("claims", claim_specs(&go.claims) != claim_specs(&claims)),
            ("allocated", state(&go) != state(&ours)),
            ("features", go.features != ours.features),
        ]
        .into_iter()
        .filter(|(_, differs)| *differs)
        .map(|(what, _)| what)
        .collect();
        if diffs.is_empty() {
            Ok(())
        } else {
            Err(format!("{}: inputs differ in {diffs:?}", c.name))
        }
    }
}

fn state(s: &AllocationScenario) -> Vec<(String, String, String)> {
    let mut v: Vec<_> = s
        .allocated
        .state
        .devices
        .iter()
        .map(|d| (d.driver.clone(), d.pool.clone(), d.device.clone()))
        .collect();
    v.sort();
    v
}

fn nodes(s: &AllocationScenario) -> Vec<serde_json::Value> {
    s.nodes.iter().map(|n| v(&n.metadata)).collect()
}

fn claim_specs(claims: &[ResourceClaim]) -> Vec<(serde_json::Value, serde_json::Value)> {
    claims
        .iter()
        .map(|c| (v(&c.metadata), v(&c.spec)))
        .collect()
}

fn v<T: serde::Serialize>(x: &T) -> serde_json::Value {
    serde_json::to_value(x).unwrap_or(serde_json::Value::Null)
}

fn main() {
    let filter = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let secs: f64 = std::env::var("BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0.5);
    let budget = Duration::from_secs_f64(secs);
    let rounds: usize = std::env::var("BENCH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3)
        .max(1);
    let go = GoBench::build();
    if let Err(e) = &go {
        println!("Go allocator not measured: {e}");
    }
    println!("allocations/s, best of {rounds} alternating rounds of {secs} s per engine");
    println!(
        "{:<34} {:>14} {:>12} {:>8}",
        "workload", "devicelet/s", "Go/s", "ratio"
    );
    let mut mismatched = false;
    for c in cases() {
        if filter.as_deref().is_some_and(|f| !c.name.contains(f)) {
            continue;
        }
        if let Ok(g) = &go
            && let Err(e) = g.same_input(&c)
        {
            println!("{e}");
            mismatched = true;
            continue;
        }
        // Alternate the engines and keep each one's best round: the machine is shared, and a
        // load spike during one engine's turn must not decide the ratio.
        let mut ours = 0f64;
        let mut theirs: Result<f64, String> = Err("not measured".into());
        for _ in 0..rounds {
            ours = ours.max(measure_devicelet(&c, budget));
            let round = go
                .as_ref()
                .map_err(String::clone)
                .and_then(|g| g.measure(&c.name, budget));
            theirs = match (theirs, round) {
                (Ok(a), Ok(b)) => Ok(a.max(b)),
                (_, r) => r,
            };
        }
        let (g, r) = match &theirs {
            Ok(g) => (format!("{g:.1}"), format!("{:.1}x", ours / g)),
            Err(_) => ("n/a".into(), "n/a".into()),
        };
        println!("{:<34} {ours:>14.1} {g:>12} {r:>8}", c.name);
        if let (Ok(_), Err(e)) = (&go, &theirs) {
            println!("  Go: {e}");
        }
    }
    assert!(
        !mismatched,
        "devicelet and Go workloads must be the same inputs"
    );
}
