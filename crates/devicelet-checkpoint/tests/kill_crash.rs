//! Process-level crash test: a child process commits admissions and removals in a loop and
//! prints `ACK <n>` after each `commit` returns; the parent kills it with SIGKILL at random
//! moments, reopens the store and checks that every acknowledged change is there (the one
//! in-flight change may or may not be) and that the kubelet file, when present, always verifies.
//! Compaction runs aggressively in the child so kills also land mid-compaction.
//!
//! Default 25 kills; `DEVICELET_CRASH_ROUNDS=200 cargo test -p devicelet-checkpoint --release
//! --test kill_crash` for the long run.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use devicelet_checkpoint::device;
use devicelet_checkpoint::state::{Change, DeviceState};
use devicelet_checkpoint::store::{DeviceStore, StoreOptions, StorePaths};

const CHILD_ENV: &str = "DEVICELET_CRASH_CHILD_DIR";
const START_ENV: &str = "DEVICELET_CRASH_CHILD_START";
const TEST_NAME: &str = "sigkill_at_random_moments_never_loses_an_acknowledged_change";

/// The n-th operation: mostly admissions, every fifth a removal of an earlier pod.
fn op(n: u64) -> Change {
    if n % 5 == 4 {
        Change::RemovePod {
            pod_uid: format!("pod-{}", n - 2),
        }
    } else {
        Change::AddContainer {
            pod_uid: format!("pod-{n}"),
            container: "ctr".into(),
            resource: "example.com/gpu".into(),
            device_ids_by_numa: BTreeMap::from([(0, vec![format!("gpu-{n}")])]),
            alloc_resp: vec![(n % 251) as u8; 64],
        }
    }
}

fn paths(dir: &Path) -> StorePaths {
    StorePaths::new(&dir.join("device-plugins"), &dir.join("devicelet"))
}

fn child(dir: &str, start: u64) {
    let options = StoreOptions {
        compact_after_records: 40,
        max_lag: Duration::from_millis(20),
        ..StoreOptions::default()
    };
    let (store, _) = DeviceStore::open_with(paths(Path::new(dir)), options).expect("child open");
    println!("READY");
    let mut n = start;
    loop {
        store.commit(&[op(n)]).expect("child commit");
        println!("ACK {n}");
        n += 1;
    }
}

struct XorShift(u64);
impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

#[test]
fn sigkill_at_random_moments_never_loses_an_acknowledged_change() {
    if let Ok(dir) = std::env::var(CHILD_ENV) {
        let start = std::env::var(START_ENV)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        child(&dir, start);
        return;
    }
    let rounds: u64 = std::env::var("DEVICELET_CRASH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(25);
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = std::env::current_exe().expect("test binary");
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64)
        | 1;
    println!("seed {seed}");
    let mut rng = XorShift(seed);
    let mut expected = DeviceState::default();
    let mut next_op = 0u64;
    let mut total_acked = 0u64;
    for round in 0..rounds {
        let mut child = Command::new(&exe)
            .args(["--exact", TEST_NAME, "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, dir.path())
            .env(START_ENV, next_op.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn child");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = mpsc::channel::<String>();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        // Wait until the child has recovered and started, then kill after a random delay.
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut lines = Vec::new();
        loop {
            let line = rx
                .recv_timeout(Duration::from_secs(30))
                .expect("child output");
            // libtest prints "test <name> ... " without a newline before our first line.
            let ready = line.ends_with("READY");
            lines.push(line);
            if ready {
                break;
            }
            assert!(Instant::now() < deadline, "child never became ready");
        }
        std::thread::sleep(Duration::from_millis(rng.next() % 60));
        child.kill().expect("SIGKILL");
        let _ = child.wait();
        reader.join().expect("reader");
        lines.extend(rx.try_iter());

        let acked: Vec<u64> = lines
            .iter()
            .filter_map(|l| l.strip_prefix("ACK ").and_then(|n| n.trim().parse().ok()))
            .collect();
        for (i, n) in acked.iter().enumerate() {
            assert_eq!(*n, next_op + i as u64, "acks are sequential");
        }
        for n in &acked {
            expected.apply(&op(*n));
        }
        total_acked += acked.len() as u64;
        let in_flight = next_op + acked.len() as u64;

        let (store, recovered) = DeviceStore::open_with(
            paths(dir.path()),
            StoreOptions {
                background_compaction: false,
                ..StoreOptions::default()
            },
        )
        .unwrap_or_else(|e| panic!("round {round}: recovery failed: {e}"));
        let mut with_in_flight = expected.clone();
        with_in_flight.apply(&op(in_flight));
        assert!(
            *recovered.state == expected || *recovered.state == with_in_flight,
            "round {round}: recovered state differs from the acknowledged state (acked up to {:?})",
            acked.last()
        );
        // Every device is held by at most one container.
        let mut holders = BTreeMap::new();
        for (pod, containers) in &recovered.state.pods {
            for (c, resources) in containers {
                for devs in resources.values() {
                    for id in devs.device_ids_by_numa.values().flatten() {
                        assert!(
                            holders
                                .insert(id.clone(), (pod.clone(), c.clone()))
                                .is_none(),
                            "{id} held twice"
                        );
                    }
                }
            }
        }
        if let Ok(bytes) = std::fs::read(paths(dir.path()).kubelet_file) {
            device::decode(&bytes)
                .unwrap_or_else(|e| panic!("round {round}: kubelet file unreadable: {e}"));
        }
        expected = DeviceState::clone(&recovered.state);
        next_op = in_flight + 1;
        drop(store);
    }
    println!("{rounds} SIGKILLs, {total_acked} acknowledged changes, none lost");
}
