//! Issue #4 "must show": crash safety of durable admission through real processes. A loop
//! admits and removes pods through the control API of a real `devicelet serve` process with
//! the real `example-plugin` process, SIGKILLs the daemon at random moments, restarts it and
//! checks: no device held by two containers of different pods, every admission and removal that
//! was answered is still in effect, the checkpoint and the journal are always readable.
//! `DEVICELET_CRASH_KILLS` sets the number of kills (default 200; CI runs the default).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Proc, Root};
use devicelet_checkpoint::{device, journal};
use devicelet_rpc::{ControlClient, ControlError};

const RESOURCE: &str = "example.com/gpu";
const PLUGIN_ENV: &[(&str, &str)] = &[("DEVICELET_EXAMPLE_PLUGIN_POLL_MS", "10")];
const SERVE_ENV: &[(&str, &str)] = &[("RUST_LOG", "warn")];

/// What the clients were told.
#[derive(Default)]
struct Model {
    /// Answered admissions not answered-removed: uid → devices.
    acked: BTreeMap<String, Vec<String>>,
    /// Sent, not answered (the daemon died): may or may not have happened.
    in_doubt_admit: BTreeSet<String>,
    in_doubt_remove: BTreeSet<String>,
    next: u64,
    admitted_total: u64,
    removed_total: u64,
    last_rejection: Option<String>,
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn pod_json(uid: &str, count: u64) -> bytes::Bytes {
    serde_json::to_vec(&serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("pod-{uid}"), "namespace": "crash", "uid": uid},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {RESOURCE: count.to_string()}}}]}
    }))
    .unwrap()
    .into()
}

/// Devices of one pod in `get pods`.
fn devices_of(pod: &devicelet_node::AdmittedPod) -> Vec<String> {
    pod.containers
        .iter()
        .flat_map(|c| c.devices.get(RESOURCE).cloned().unwrap_or_default())
        .collect()
}

/// After a restart: reconcile in-doubt operations with what the daemon reports, then check
/// every invariant.
async fn check_after_restart(control: &ControlClient, model: &Mutex<Model>, round: usize) {
    let list = control.pods().await.expect("get pods after restart");
    let mut m = model.lock().unwrap();
    let present: BTreeMap<String, Vec<String>> = list
        .pods
        .iter()
        .map(|p| (p.pod.uid.clone(), devices_of(p)))
        .collect();
    // In-doubt operations resolve one way or the other; from now on they are facts.
    for uid in std::mem::take(&mut m.in_doubt_admit) {
        if let Some(d) = present.get(&uid) {
            m.acked.insert(uid, d.clone());
        }
    }
    for uid in std::mem::take(&mut m.in_doubt_remove) {
        if !present.contains_key(&uid) {
            m.acked.remove(&uid);
        }
    }
    for (uid, devices) in &m.acked {
        assert_eq!(
            present.get(uid),
            Some(devices),
            "round {round}: acknowledged pod {uid} lost or changed after SIGKILL"
        );
    }
    for uid in present.keys() {
        assert!(
            m.acked.contains_key(uid),
            "round {round}: pod {uid} is admitted but its removal was acknowledged (or it was never sent)"
        );
    }
    let mut owner: BTreeMap<&str, &str> = BTreeMap::new();
    for (uid, devices) in &present {
        for d in devices {
            if let Some(other) = owner.insert(d, uid) {
                panic!("round {round}: device {d} held by {other} and {uid}");
            }
        }
    }
}

/// The files on disk must always be readable: the kubelet file verifies, the journal parses
/// (an incomplete final record is allowed: it was never acknowledged).
fn check_files(root: &Root, round: usize) {
    let kubelet = root
        .paths
        .device_plugins
        .join(device::DEVICE_CHECKPOINT_FILE);
    if let Ok(bytes) = std::fs::read(&kubelet) {
        device::decode(&bytes)
            .unwrap_or_else(|e| panic!("round {round}: kubelet checkpoint unreadable: {e}"));
    }
    let journal_path = root
        .paths
        .control_dir
        .join(devicelet_checkpoint::store::JOURNAL_FILE);
    let bytes = std::fs::read(&journal_path).expect("journal exists after the first start");
    journal::parse(&bytes).unwrap_or_else(|e| panic!("round {round}: journal unreadable: {e}"));
    let quarantine = root
        .paths
        .control_dir
        .join(devicelet_checkpoint::store::QUARANTINE_FILE);
    assert!(!quarantine.exists(), "round {round}: state was quarantined");
}

async fn worker(control: ControlClient, model: Arc<Mutex<Model>>, seed: u64) {
    let mut rng = Rng(seed | 1);
    loop {
        let remove = {
            let m = model.lock().unwrap();
            (m.acked.len() > 10 && rng.below(2) == 0)
                .then(|| {
                    let i = rng.below(m.acked.len() as u64) as usize;
                    m.acked.keys().nth(i).cloned()
                })
                .flatten()
                .filter(|uid| !m.in_doubt_remove.contains(uid))
        };
        if let Some(uid) = remove {
            model.lock().unwrap().in_doubt_remove.insert(uid.clone());
            match control.remove(&uid).await {
                Ok(()) => {
                    let mut m = model.lock().unwrap();
                    m.in_doubt_remove.remove(&uid);
                    m.acked.remove(&uid);
                    m.removed_total += 1;
                }
                Err(ControlError::Status { .. }) => {
                    model.lock().unwrap().in_doubt_remove.remove(&uid);
                }
                Err(_) => return, // the daemon died: stays in doubt
            }
            continue;
        }
        let uid = {
            let mut m = model.lock().unwrap();
            m.next += 1;
            let uid = format!("u{}", m.next);
            m.in_doubt_admit.insert(uid.clone());
            uid
        };
        match control.admit(pod_json(&uid, 1 + rng.below(2))).await {
            Ok(admitted) => {
                let mut m = model.lock().unwrap();
                m.in_doubt_admit.remove(&uid);
                m.acked.insert(uid, devices_of(&admitted));
                m.admitted_total += 1;
            }
            Err(
                ControlError::Status { body, .. } | ControlError::Rejected { detail: body, .. },
            ) => {
                // Rejected (plugin not back yet, no free device): nothing was admitted.
                {
                    let mut m = model.lock().unwrap();
                    m.in_doubt_admit.remove(&uid);
                    m.last_rejection = Some(body);
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            Err(_) => return,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a2_sigkill_at_random_moments_loses_no_acknowledged_change_and_never_double_allocates() {
    let kills: usize = std::env::var("DEVICELET_CRASH_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    eprintln!("crash test: {kills} kills, seed {seed}");
    let mut rng = Rng(seed | 1);
    let root = Root::new();
    // The plugin starts after the first daemon: a daemon starting cleans the socket directory,
    // which would make a plugin registering at that moment give up.
    let mut first = Some(serve_up(&root).await);
    let plugin = root.spawn_env(
        "plugin",
        &[
            "example-plugin",
            "--resource",
            RESOURCE,
            "--devices",
            "48",
            "--numa-nodes",
            "0",
        ],
        PLUGIN_ENV,
    );
    let model = Arc::new(Mutex::new(Model::default()));
    let started = Instant::now();
    let mut serve: Option<Proc> = None;
    for round in 0..=kills {
        let proc = match first.take() {
            Some(p) => p,
            None => serve_up(&root).await,
        };
        let control = root.control();
        check_after_restart(&control, &model, round).await;
        if round == kills {
            serve = Some(proc);
            break;
        }
        let workers: Vec<_> = (0..3)
            .map(|i| tokio::spawn(worker(control.clone(), model.clone(), rng.next() ^ i)))
            .collect();
        // Kill at a random moment: some rounds before the plugin is back, most during
        // admissions and removals.
        tokio::time::sleep(Duration::from_millis(rng.below(250))).await;
        proc.kill().await;
        for w in workers {
            let _ = tokio::time::timeout(Duration::from_secs(10), w).await;
        }
        check_files(&root, round);
    }
    let serve = serve.expect("final daemon");
    let (admitted, removed) = {
        let m = model.lock().unwrap();
        eprintln!("last rejection: {:?}", m.last_rejection);
        (m.admitted_total, m.removed_total)
    };
    eprintln!(
        "crash test: {kills} SIGKILLs in {:.1}s; {admitted} admissions and {removed} removals acknowledged",
        started.elapsed().as_secs_f64()
    );
    assert!(
        admitted > kills as u64,
        "too few admissions to mean anything; plugin log:\n{}",
        plugin.log()
    );
    // A clean stop makes the kubelet-format file exact: it names every acknowledged pod's devices.
    assert_eq!(serve.terminate().await, 0);
    let decoded = device::decode(
        &std::fs::read(
            root.paths
                .device_plugins
                .join(device::DEVICE_CHECKPOINT_FILE),
        )
        .unwrap(),
    )
    .expect("kubelet file verifies after a clean stop");
    let mut in_file: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for e in decoded.data.pod_device_entries.iter().flatten() {
        in_file.entry(e.pod_uid.clone()).or_default().extend(
            e.device_ids
                .iter()
                .flatten()
                .flat_map(|(_, ids)| ids.iter().flatten().cloned()),
        );
    }
    let m = model.lock().unwrap();
    let expected: BTreeMap<String, BTreeSet<String>> = m
        .acked
        .iter()
        .map(|(k, v)| (k.clone(), v.iter().cloned().collect()))
        .collect();
    assert_eq!(in_file, expected);
    drop(plugin);
}

/// Starts `serve` (quiet logs) and waits for its control API.
async fn serve_up(root: &Root) -> Proc {
    let proc = root.spawn_env("serve", &["serve"], SERVE_ENV);
    let control = root.control();
    let deadline = Instant::now() + common::WAIT;
    while control.resources().await.is_err() {
        assert!(
            Instant::now() < deadline,
            "serve did not come up:\n{}",
            proc.log()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    proc
}
