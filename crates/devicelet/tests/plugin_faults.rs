//! Plugin-side faults (issue 18 item 2): sockets devicelet may not use, plugin sockets replaced
//! by a regular file or a directory, a plugin registering a thousand times a second, plugin
//! registry churn, and thousands of concurrent control-API and PodResources clients. Each fault
//! gets a clear message, costs bounded work, and leaves every other plugin served.
//!
//! devicelet normally runs as root, which ignores file permissions; the permission tests run it
//! without `CAP_DAC_OVERRIDE` and `CAP_DAC_READ_SEARCH` (`setpriv`), as a confined or rootless
//! daemon runs, so a socket's mode bits apply to it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::test_plugin::{TestPlugin, TestPluginConfig, device, register};
use common::{EXE, Proc, Root, WAIT, cli};
use devicelet_proto::deviceplugin::v1beta1 as pb;
use devicelet_proto::pluginregistration::v1 as reg;
use devicelet_proto::podresources::v1 as pr;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;

/// `devicelet serve` on `root`, without the capabilities that bypass file permissions when run
/// as root; waits until the control API answers (or returns early if it exited).
async fn serve_confined(root: &Root) -> Proc {
    let log = root.path().join("serve-confined.log");
    let file = std::fs::File::create(&log).unwrap();
    let mut command = if rustix::process::geteuid().is_root() {
        let mut c = Command::new("setpriv");
        c.args(["--bounding-set=-dac_override,-dac_read_search", "--", EXE]);
        c
    } else {
        Command::new(EXE)
    };
    let child = command
        .arg("serve")
        .arg("--root-dir")
        .arg(root.path())
        .env("RUST_LOG", "debug")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(file)
        .kill_on_drop(true)
        .spawn()
        .expect("setpriv (util-linux) runs devicelet without CAP_DAC_OVERRIDE");
    let mut proc = Proc { child, log };
    let control = root.control();
    let deadline = Instant::now() + WAIT;
    while control.resources().await.is_err() {
        if proc.child.try_wait().unwrap().is_some() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "serve did not come up:\n{}",
            proc.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    proc
}

/// `devicelet serve` logging at info, not debug: at a thousand registrations a second the
/// debug log of every HTTP/2 frame would be most of the work measured.
async fn serve_quiet(root: &Root) -> Proc {
    let proc = root.spawn_env("serve", &["serve"], &[("RUST_LOG", "info")]);
    let control = root.control();
    let deadline = Instant::now() + WAIT;
    while control.resources().await.is_err() {
        assert!(
            Instant::now() < deadline,
            "serve did not come up:\n{}",
            proc.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    proc
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn plugin_info(name: &str) -> Option<reg::PluginInfo> {
    Some(reg::PluginInfo {
        r#type: "DevicePlugin".into(),
        name: name.into(),
        endpoint: String::new(),
        supported_versions: vec!["v1beta1".into()],
    })
}

fn devices(prefix: &str, n: usize) -> Vec<pb::Device> {
    (0..n)
        .map(|i| device(&format!("{prefix}{i}"), "Healthy", None))
        .collect()
}

/// Waits until `log()` has a line containing every one of `parts`; returns it.
async fn wait_log(proc: &Proc, parts: &[&str]) -> String {
    let deadline = Instant::now() + WAIT;
    loop {
        let log = proc.log();
        if let Some(line) = log.lines().find(|l| parts.iter().all(|p| l.contains(p))) {
            return line.to_owned();
        }
        assert!(
            Instant::now() < deadline,
            "no log line with {parts:?}:\n{log}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// CPU time (user + system) the process has used, from `/proc/PID/stat`.
fn cpu_time(proc: &Proc) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", proc.child.id().unwrap())).unwrap();
    let after_name = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = after_name.split(' ').collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    // USER_HZ is 100 on Linux.
    Duration::from_millis(ticks * 10)
}

/// CPU the process uses over `window`, as a fraction of one core.
async fn cpu_share(proc: &Proc, window: Duration) -> f64 {
    let before = cpu_time(proc);
    tokio::time::sleep(window).await;
    (cpu_time(proc) - before).as_secs_f64() / window.as_secs_f64()
}

fn open_fds(proc: &Proc) -> usize {
    std::fs::read_dir(format!("/proc/{}/fd", proc.child.id().unwrap()))
        .unwrap()
        .count()
}

fn threads(proc: &Proc) -> usize {
    std::fs::read_dir(format!("/proc/{}/task", proc.child.id().unwrap()))
        .unwrap()
        .count()
}

fn rss_kib(proc: &Proc) -> u64 {
    let status =
        std::fs::read_to_string(format!("/proc/{}/status", proc.child.id().unwrap())).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").parse().ok())
        .unwrap()
}

/// Polls the control API every 20 ms until `stop`; returns the slowest answer and the count.
fn probe_control(
    root: &Root,
) -> (
    tokio::sync::watch::Sender<bool>,
    tokio::task::JoinHandle<(Duration, usize)>,
) {
    let control = root.control();
    let (stop, mut stopped) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(async move {
        let mut slowest = Duration::ZERO;
        let mut answers = 0;
        while !*stopped.borrow() {
            let start = Instant::now();
            control.resources().await.expect("control API answers");
            slowest = slowest.max(start.elapsed());
            answers += 1;
            let _ = tokio::time::timeout(Duration::from_millis(20), stopped.changed()).await;
        }
        (slowest, answers)
    });
    (stop, task)
}

/// The bound on a control-API answer while a storm runs: generous for a loaded 2-core VM,
/// far below "wedged".
const RESPONSIVE: Duration = Duration::from_secs(2);

#[tokio::test]
async fn socket_permission_errors_are_named_and_other_plugins_keep_working() {
    let root = Root::new();
    let serve = serve_confined(&root).await;
    let good = root.example_plugin(&["--resource", "example.com/gpu", "--devices", "2"]);
    root.wait_counts("example.com/gpu", 2, 2).await;

    // A plugin socket devicelet may not connect to: Register fails naming the socket and why.
    let locked = TestPlugin::start(
        &root.paths.device_plugins.join("locked.sock"),
        TestPluginConfig {
            devices: devices("l", 2),
            ..Default::default()
        },
    );
    chmod(&locked.socket, 0o000);
    let err = register(
        &root.paths.kubelet_socket,
        "v1beta1",
        "locked.sock",
        "example.com/locked",
    )
    .await
    .unwrap_err();
    assert!(
        err.message().contains("locked.sock") && err.message().contains("permission denied"),
        "{}",
        err.message()
    );

    // The same in plugins_registry: logged with the cause, retried, the others unaffected.
    let locked_pw = TestPlugin::start(
        &root.paths.plugins_registry.join("locked-pw.sock"),
        TestPluginConfig {
            devices: devices("lp", 1),
            info: plugin_info("example.com/locked-pw"),
            ..Default::default()
        },
    );
    chmod(&locked_pw.socket, 0o000);
    // A directory devicelet may not read: its plugins cannot be found, said once.
    let hidden = root.paths.plugins_registry.join("hidden");
    std::fs::create_dir(&hidden).unwrap();
    chmod(&hidden, 0o000);
    let open_pw = TestPlugin::start(
        &root.paths.plugins_registry.join("open-pw.sock"),
        TestPluginConfig {
            devices: devices("op", 3),
            info: plugin_info("example.com/open-pw"),
            ..Default::default()
        },
    );
    root.wait_counts("example.com/open-pw", 3, 3).await;
    wait_log(
        &serve,
        &[
            "plugin registration failed",
            "locked-pw.sock",
            "permission denied",
        ],
    )
    .await;
    wait_log(
        &serve,
        &[
            "cannot read in the plugin registry",
            "hidden",
            "Permission denied",
        ],
    )
    .await;
    root.wait_counts("example.com/gpu", 2, 2).await;

    // Permissions fixed: both plugins register.
    chmod(&locked.socket, 0o600);
    register(
        &root.paths.kubelet_socket,
        "v1beta1",
        "locked.sock",
        "example.com/locked",
    )
    .await
    .unwrap();
    root.wait_counts("example.com/locked", 2, 2).await;
    chmod(&locked_pw.socket, 0o600);
    root.wait_counts("example.com/locked-pw", 1, 1).await;
    let unreadable = serve
        .log()
        .lines()
        .filter(|l| l.contains("cannot read in the plugin registry"))
        .count();
    assert_eq!(unreadable, 1, "reported once, not once per listing");

    chmod(&hidden, 0o755);
    for plugin in [locked, locked_pw, open_pw] {
        plugin.stop().await;
    }
    assert_eq!(good.terminate().await, 0);
    assert_eq!(serve.terminate().await, 0);
}

#[tokio::test]
async fn an_unwritable_kubelet_sock_directory_stops_serve_with_the_cause() {
    let root = Root::new();
    std::fs::create_dir_all(&root.paths.device_plugins).unwrap();
    chmod(&root.paths.device_plugins, 0o555);
    let serve = serve_confined(&root).await;
    let (code, log) = serve.wait_exit().await;
    chmod(&root.paths.device_plugins, 0o755);
    assert_ne!(code, 0, "{log}");
    let last = log.lines().last().unwrap_or_default();
    assert!(
        last.contains("cannot bind Unix socket")
            && last.contains("device-plugins/kubelet.sock")
            && last.contains("Permission denied"),
        "the error names neither the socket nor the cause:\n{log}"
    );
    assert!(!root.paths.control_socket.exists(), "{last}");
}

#[tokio::test]
async fn a3_plugin_socket_replaced_by_a_file_or_directory_is_refused_by_name_and_comes_back() {
    let root = Root::new();
    let serve = root.serve(&[]).await;
    let good = root.example_plugin(&["--resource", "example.com/gpu", "--devices", "2"]);
    let resource = "example.com/swap";
    let socket = root.paths.device_plugins.join("swap.sock");
    let plugin = TestPlugin::start(
        &socket,
        TestPluginConfig {
            devices: devices("s", 2),
            ..Default::default()
        },
    );
    register(&root.paths.kubelet_socket, "v1beta1", "swap.sock", resource)
        .await
        .unwrap();
    root.wait_counts(resource, 2, 2).await;
    plugin.stop().await;
    root.wait_counts(resource, 2, 0).await;

    std::fs::write(&socket, b"not a socket").unwrap();
    let err = register(&root.paths.kubelet_socket, "v1beta1", "swap.sock", resource)
        .await
        .unwrap_err();
    assert!(
        err.message().contains("swap.sock")
            && err
                .message()
                .contains("it is a regular file, not a Unix socket"),
        "{}",
        err.message()
    );
    std::fs::remove_file(&socket).unwrap();
    std::fs::create_dir(&socket).unwrap();
    let err = register(&root.paths.kubelet_socket, "v1beta1", "swap.sock", resource)
        .await
        .unwrap_err();
    assert!(
        err.message()
            .contains("it is a directory, not a Unix socket"),
        "{}",
        err.message()
    );
    std::fs::remove_dir(&socket).unwrap();

    // Back as a socket: served again.
    let plugin = TestPlugin::start(
        &socket,
        TestPluginConfig {
            devices: devices("s", 3),
            ..Default::default()
        },
    );
    register(&root.paths.kubelet_socket, "v1beta1", "swap.sock", resource)
        .await
        .unwrap();
    root.wait_counts(resource, 3, 3).await;
    root.wait_counts("example.com/gpu", 2, 2).await;
    plugin.stop().await;
    assert_eq!(good.terminate().await, 0);
    assert_eq!(serve.terminate().await, 0);
}

#[tokio::test]
async fn a3_registry_socket_replaced_by_a_file_or_directory_is_ignored_once_without_a_busy_loop() {
    let root = Root::new();
    let serve = root.serve(&[]).await;
    let resource = "example.com/pw-swap";
    let socket = root.paths.plugins_registry.join("pw-swap.sock");
    let config = |n| TestPluginConfig {
        devices: devices("w", n),
        info: plugin_info(resource),
        ..Default::default()
    };
    let other = TestPlugin::start(
        &root.paths.plugins_registry.join("pw-other.sock"),
        TestPluginConfig {
            devices: devices("o", 1),
            info: plugin_info("example.com/pw-other"),
            ..Default::default()
        },
    );
    let plugin = TestPlugin::start(&socket, config(2));
    root.wait_counts(resource, 2, 2).await;

    // Replaced in one step (rename) by a regular file: deregistered, and the file is ignored
    // with one message, not one per listing.
    let staged = root.paths.plugins_registry.join(".staged");
    std::fs::write(&staged, b"not a socket").unwrap();
    std::fs::rename(&staged, &socket).unwrap();
    wait_log(
        &serve,
        &[
            "registration socket replaced by a regular file",
            "pw-swap.sock",
        ],
    )
    .await;
    root.wait_counts(resource, 2, 0).await;
    let share = cpu_share(&serve, Duration::from_secs(3)).await;
    assert!(
        share < 0.1,
        "devicelet used {share:.2} of a core beside a regular file"
    );
    let ignored = serve
        .log()
        .lines()
        .filter(|l| l.contains("ignoring a regular file in the plugin registry"))
        .count();
    assert_eq!(ignored, 1, "{}", serve.log());

    // Then a directory (with a file in it): searched, nothing registers, no busy loop.
    std::fs::remove_file(&socket).unwrap();
    std::fs::create_dir(&socket).unwrap();
    std::fs::write(socket.join("junk"), b"junk").unwrap();
    wait_log(&serve, &["ignoring a regular file", "junk"]).await;
    let share = cpu_share(&serve, Duration::from_secs(3)).await;
    assert!(
        share < 0.1,
        "devicelet used {share:.2} of a core beside a directory"
    );
    std::fs::remove_dir_all(&socket).unwrap();

    // Back as a socket: registered again; the other plugin was served all along.
    drop(plugin);
    let plugin = TestPlugin::start(&socket, config(3));
    root.wait_counts(resource, 3, 3).await;
    root.wait_counts("example.com/pw-other", 1, 1).await;
    plugin.stop().await;
    other.stop().await;
    assert_eq!(serve.terminate().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a3_29_a_thousand_registrations_a_second_keep_devicelet_responsive_and_the_last_wins() {
    let root = Root::new();
    let serve = serve_quiet(&root).await;
    let good = root.example_plugin(&["--resource", "example.com/gpu", "--devices", "2"]);
    root.wait_counts("example.com/gpu", 2, 2).await;
    let resource = "example.com/storm";
    let first = TestPlugin::start(
        &root.paths.device_plugins.join("storm-a.sock"),
        TestPluginConfig {
            devices: devices("a", 2),
            ..Default::default()
        },
    );
    let last = TestPlugin::start(
        &root.paths.device_plugins.join("storm-b.sock"),
        TestPluginConfig {
            devices: devices("b", 5),
            ..Default::default()
        },
    );
    register(
        &root.paths.kubelet_socket,
        "v1beta1",
        "storm-a.sock",
        resource,
    )
    .await
    .unwrap();
    root.wait_counts(resource, 2, 2).await;
    let (fds, tasks, rss) = (open_fds(&serve), threads(&serve), rss_kib(&serve));

    let (stop_probe, probe) = probe_control(&root);
    let cpu_before = cpu_time(&serve);
    // Offered load: a Register every millisecond for 3 s over 8 connections, none waiting for
    // the one before (a plugin in a crash loop, or several replicas racing).
    let storm = Duration::from_secs(3);
    let mut connections = Vec::new();
    for _ in 0..8 {
        let channel = devicelet_rpc::transport::dial(&root.paths.kubelet_socket, WAIT)
            .await
            .unwrap();
        connections.push(pb::registration_client::RegistrationClient::new(channel));
    }
    let started = Instant::now();
    let mut ticker = tokio::time::interval(Duration::from_millis(1));
    let mut calls = Vec::new();
    let mut peak_fds = 0;
    while started.elapsed() < storm {
        ticker.tick().await;
        let mut client = connections[calls.len() % connections.len()].clone();
        calls.push(tokio::spawn(async move {
            client
                .register(pb::RegisterRequest {
                    version: "v1beta1".into(),
                    endpoint: "storm-a.sock".into(),
                    resource_name: "example.com/storm".into(),
                    options: None,
                })
                .await
        }));
        if calls.len() % 100 == 0 {
            peak_fds = peak_fds.max(open_fds(&serve));
        }
    }
    let offered = calls.len() as f64 / started.elapsed().as_secs_f64();
    let mut outcomes = std::collections::BTreeMap::new();
    for call in calls {
        let code = match tokio::time::timeout(WAIT, call).await {
            Err(_) => "hung".to_owned(),
            Ok(result) => match result.unwrap() {
                Ok(_) => "OK".to_owned(),
                Err(status) => format!("{:?}", status.code()),
            },
        };
        *outcomes.entry(code).or_insert(0u32) += 1;
        peak_fds = peak_fds.max(open_fds(&serve));
    }
    let sent = outcomes.values().sum::<u32>();
    let rate = f64::from(sent) / started.elapsed().as_secs_f64();
    let daemon_cpu =
        (cpu_time(&serve) - cpu_before).as_secs_f64() / started.elapsed().as_secs_f64();
    // The final registration, sent after every other one was answered, wins.
    register(
        &root.paths.kubelet_socket,
        "v1beta1",
        "storm-b.sock",
        resource,
    )
    .await
    .unwrap();
    let view = root.wait_counts(resource, 5, 5).await;
    assert!(view.endpoint.unwrap().socket.ends_with("storm-b.sock"));
    let _ = stop_probe.send(true);
    let (slowest, answers) = probe.await.unwrap();
    eprintln!(
        "{sent} registrations offered at {offered:.0}/s, answered at {rate:.0}/s: {outcomes:?}; devicelet {daemon_cpu:.2} of a core, {peak_fds} fds at most (from {fds}); control API: {answers} answers, slowest {slowest:?}"
    );
    assert!(
        offered >= 900.0,
        "only {offered:.0} registrations/s offered"
    );
    assert!(!outcomes.contains_key("hung"), "{outcomes:?}");
    assert!(outcomes.get("OK").is_some_and(|n| *n > 0), "{outcomes:?}");
    assert!(
        peak_fds <= fds + 64,
        "{peak_fds} fds during the storm (from {fds})"
    );
    assert!(slowest < RESPONSIVE, "control API took {slowest:?}");

    // Every replaced endpoint's connection and stream are gone.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (fds_after, tasks_after, rss_after) = (open_fds(&serve), threads(&serve), rss_kib(&serve));
    eprintln!(
        "fds {fds} -> {fds_after}, threads {tasks} -> {tasks_after}, RSS {rss} -> {rss_after} KiB"
    );
    assert!(fds_after <= fds + 8, "fds {fds} -> {fds_after}");
    assert!(tasks_after <= tasks + 4, "threads {tasks} -> {tasks_after}");
    assert!(rss_after < rss + 64 * 1024, "RSS {rss} -> {rss_after} KiB");
    root.wait_counts("example.com/gpu", 2, 2).await;
    first.stop().await;
    last.stop().await;
    assert_eq!(good.terminate().await, 0);
    assert_eq!(serve.terminate().await, 0);
}

#[tokio::test]
async fn a3_22_plugin_registry_socket_churn_keeps_devicelet_responsive_and_bounded() {
    let root = Root::new();
    let serve = root.serve(&[]).await;
    let steady = TestPlugin::start(
        &root.paths.plugins_registry.join("steady.sock"),
        TestPluginConfig {
            devices: devices("st", 2),
            info: plugin_info("example.com/steady"),
            ..Default::default()
        },
    );
    root.wait_counts("example.com/steady", 2, 2).await;
    let (fds, tasks) = (open_fds(&serve), threads(&serve));

    // Sockets created and removed a thousand times a second, none of them a plugin; a fifth
    // stay bound and never answer (each attempt on one waits for its dial deadline).
    let (stop_probe, probe) = probe_control(&root);
    let registry = root.paths.plugins_registry.clone();
    let churn = tokio::task::spawn_blocking(move || {
        let started = Instant::now();
        let mut ops = 0u64;
        let mut silent = std::collections::VecDeque::new();
        while started.elapsed() < Duration::from_secs(3) {
            let path = registry.join(format!("churn-{}.sock", ops % 500));
            let _ = std::fs::remove_file(&path);
            let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
            if ops.is_multiple_of(5) {
                silent.push_back(listener);
                if silent.len() > 200 {
                    silent.pop_front();
                }
            }
            ops += 1;
            // Paced to 1 200 a second: ahead of schedule, pause; behind, catch up at once.
            if ops as f64 > started.elapsed().as_secs_f64() * 1200.0 {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        let rate = ops as f64 / started.elapsed().as_secs_f64();
        (rate, silent, registry)
    });
    let mut peak_fds = 0;
    while !churn.is_finished() {
        peak_fds = peak_fds.max(open_fds(&serve));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (rate, silent, registry) = churn.await.unwrap();
    // A moment with 200 silent sockets in place, then they go.
    for _ in 0..40 {
        peak_fds = peak_fds.max(open_fds(&serve));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(silent);
    for i in 0..500 {
        let _ = std::fs::remove_file(registry.join(format!("churn-{i}.sock")));
    }
    // The last socket of the storm is a real plugin: it registers.
    let last = TestPlugin::start(
        &root.paths.plugins_registry.join("churn-final.sock"),
        TestPluginConfig {
            devices: devices("f", 4),
            info: plugin_info("example.com/churn-final"),
            ..Default::default()
        },
    );
    root.wait_counts("example.com/churn-final", 4, 4).await;
    let _ = stop_probe.send(true);
    let (slowest, answers) = probe.await.unwrap();
    eprintln!(
        "{rate:.0} socket creations/s; {peak_fds} fds at most (from {fds}); control API: {answers} answers, slowest {slowest:?}"
    );
    assert!(rate >= 1000.0, "only {rate:.0} creations/s");
    // At most 64 registration attempts (one connection each) at a time.
    assert!(
        peak_fds <= fds + 64 + 16,
        "{peak_fds} fds during the churn (from {fds})"
    );
    assert!(slowest < RESPONSIVE, "control API took {slowest:?}");
    let view = root.wait_counts("example.com/steady", 2, 2).await;
    assert_eq!(view.endpoint.unwrap().state, "Serving");

    // Afterwards: idle again, and no connection or thread left behind.
    let share = cpu_share(&serve, Duration::from_secs(2)).await;
    assert!(share < 0.1, "devicelet still uses {share:.2} of a core");
    let (fds_after, tasks_after) = (open_fds(&serve), threads(&serve));
    eprintln!("fds {fds} -> {fds_after}, threads {tasks} -> {tasks_after}");
    assert!(fds_after <= fds + 8, "fds {fds} -> {fds_after}");
    assert!(tasks_after <= tasks + 4, "threads {tasks} -> {tasks_after}");
    steady.stop().await;
    last.stop().await;
    assert_eq!(serve.terminate().await, 0);
}

/// How one client of the crowd fared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Outcome {
    Answered,
    Refused,
    Hung,
}

/// `GET /v1/resources` on a connection of its own.
async fn control_client(socket: std::path::PathBuf) -> Outcome {
    let attempt = async {
        let mut stream = tokio::net::UnixStream::connect(&socket).await?;
        stream
            .write_all(
                b"GET /v1/resources HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
            )
            .await?;
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await?;
        Ok::<_, std::io::Error>(answer)
    };
    match tokio::time::timeout(WAIT, attempt).await {
        Err(_) => Outcome::Hung,
        Ok(Err(_)) => Outcome::Refused,
        Ok(Ok(answer)) => {
            let text = String::from_utf8_lossy(&answer);
            if text.starts_with("HTTP/1.1 200") && text.contains("\"resources\"") {
                Outcome::Answered
            } else if answer.is_empty() {
                Outcome::Refused
            } else {
                panic!("unexpected answer: {text}")
            }
        }
    }
}

/// v1 `List` on a connection of its own.
async fn pod_resources_client(socket: std::path::PathBuf) -> Outcome {
    let attempt = async {
        let channel = devicelet_rpc::transport::dial(&socket, WAIT)
            .await
            .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
        pr::pod_resources_lister_client::PodResourcesListerClient::new(channel)
            .list(pr::ListPodResourcesRequest {})
            .await
    };
    match tokio::time::timeout(WAIT, attempt).await {
        Err(_) => Outcome::Hung,
        Ok(Ok(_)) => Outcome::Answered,
        Ok(Err(status)) => match status.code() {
            tonic::Code::ResourceExhausted | tonic::Code::Unavailable | tonic::Code::Unknown => {
                Outcome::Refused
            }
            _ => panic!("unexpected status: {status:?}"),
        },
    }
}

#[tokio::test]
async fn two_thousand_concurrent_clients_are_answered_or_refused_and_the_daemon_serves_on() {
    const CLIENTS: usize = 2000;
    // The test holds a descriptor per client, twice over.
    let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    let wanted = (4 * CLIENTS + 256) as u64;
    if limit.current.is_some_and(|c| c < wanted) {
        rustix::process::setrlimit(
            rustix::process::Resource::Nofile,
            rustix::process::Rlimit {
                current: limit.maximum.map(|m| m.min(wanted)).or(Some(wanted)),
                maximum: limit.maximum,
            },
        )
        .unwrap();
    }
    let root = Root::new();
    let serve = root.serve(&[]).await;
    let good = root.example_plugin(&["--resource", "example.com/gpu", "--devices", "2"]);
    root.wait_counts("example.com/gpu", 2, 2).await;
    // The daemon gets far fewer descriptors than there are clients, so it runs out.
    let pid = rustix::process::Pid::from_raw(serve.child.id().unwrap() as i32).unwrap();
    let daemon_limit = rustix::process::prlimit(
        Some(pid),
        rustix::process::Resource::Nofile,
        rustix::process::Rlimit {
            current: Some(512),
            maximum: limit.maximum,
        },
    );
    daemon_limit.unwrap();

    for (name, outcomes) in [
        (
            "control API",
            futures::future::join_all(
                (0..CLIENTS)
                    .map(|_| tokio::spawn(control_client(root.paths.control_socket.clone()))),
            )
            .await,
        ),
        (
            "PodResources",
            futures::future::join_all((0..CLIENTS).map(|_| {
                tokio::spawn(pod_resources_client(
                    root.paths.pod_resources_socket.clone(),
                ))
            }))
            .await,
        ),
    ] {
        let mut counts = std::collections::HashMap::new();
        for outcome in outcomes {
            *counts.entry(outcome.unwrap()).or_insert(0usize) += 1;
        }
        eprintln!("{name}: {counts:?}");
        assert_eq!(counts.get(&Outcome::Hung), None, "{name}: {counts:?}");
        assert!(
            counts.get(&Outcome::Answered).is_some_and(|n| *n > 0),
            "{name}: {counts:?}"
        );
    }

    // The daemon did run out of descriptors, said so, and is still alive serving both APIs.
    let exhausted = serve
        .log()
        .lines()
        .filter(|l| l.contains("accepting a Unix socket connection failed"))
        .count();
    eprintln!("{exhausted} accept failures logged");
    assert!(exhausted > 0, "the daemon never ran out of descriptors");
    let mut serve = serve;
    assert!(serve.child.try_wait().unwrap().is_none(), "{}", serve.log());
    root.wait_counts("example.com/gpu", 2, 2).await;
    assert_eq!(
        pod_resources_client(root.paths.pod_resources_socket.clone()).await,
        Outcome::Answered
    );
    let (code, out, err) = cli(root.path(), &["get", "resources"]).await;
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(good.terminate().await, 0);
    assert_eq!(serve.terminate().await, 0);
}
