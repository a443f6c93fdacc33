//! Device plugin lifecycle against real processes: `devicelet serve` and `devicelet
//! example-plugin` on temporary roots (spec devicemanager.md §1.4-§1.7, §2 A/B).
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{Root, cli, scrape};
use rustix::process::Signal;

const GPU: &str = "example.com/gpu";

#[tokio::test]
async fn s1_4_registration_is_visible_in_get_resources_json_yaml_and_table() {
    let root = Root::new();
    let serve = root.serve(&[]).await;
    let plugin = root.example_plugin(&[
        "--resource",
        GPU,
        "--devices",
        "8",
        "--numa-nodes",
        "2",
        "--unhealthy",
        "gpu-7",
    ]);
    root.wait_counts(GPU, 8, 7).await;

    let (code, stdout, stderr) = cli(root.path(), &["get", "resources", "-o", "json"]).await;
    assert_eq!(code, 0, "{stderr}");
    let json: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let gpu = &json["resources"][0];
    assert_eq!(gpu["name"], GPU);
    assert_eq!(gpu["capacity"], 8);
    assert_eq!(gpu["allocatable"], 7);
    assert_eq!(gpu["inactive"], false);
    let devices = gpu["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 8);
    assert_eq!(devices[0]["id"], "gpu-0");
    assert_eq!(devices[0]["health"], "Healthy");
    assert_eq!(devices[0]["numaNodes"], serde_json::json!([0]));
    assert_eq!(devices[7]["numaNodes"], serde_json::json!([1]));
    assert_eq!(devices[7]["health"], "Unhealthy");

    let (code, yaml, _) = cli(root.path(), &["get", "resources", "-o", "yaml"]).await;
    assert_eq!(code, 0);
    assert!(
        yaml.contains("name: example.com/gpu") && yaml.contains("numaNodes:"),
        "{yaml}"
    );
    let (code, table, _) = cli(root.path(), &["get", "resources"]).await;
    assert_eq!(code, 0);
    assert!(
        table.contains("RESOURCE") && table.contains("gpu-7") && table.contains("Unhealthy"),
        "{table}"
    );

    assert_eq!(plugin.terminate().await, 0);
    assert_eq!(serve.terminate().await, 0);
    assert!(
        !root.paths.kubelet_socket.exists(),
        "kubelet.sock removed on SIGTERM"
    );
    assert!(
        !root.paths.control_socket.exists(),
        "control socket removed on SIGTERM"
    );
}

#[tokio::test]
async fn get_resources_without_daemon_names_the_cause() {
    let root = Root::new();
    let (code, _, stderr) = cli(root.path(), &["get", "resources", "-o", "json"]).await;
    assert_eq!(code, 1);
    assert!(stderr.contains("devicelet is not running"), "{stderr}");
    assert!(stderr.contains("devicelet.sock"), "{stderr}");
}

#[tokio::test]
async fn a4_health_flips_both_ways_through_the_health_file_and_sigusr1() {
    let root = Root::new();
    let _serve = root.serve(&[]).await;
    let plugin = root.example_plugin(&["--resource", GPU, "--devices", "4"]);
    root.wait_counts(GPU, 4, 4).await;
    let health = root.paths.device_plugins.join("example.com_gpu.health");

    std::fs::write(&health, "gpu-1 Unhealthy\ngpu-2 Unhealthy\n").unwrap();
    let view = root.wait_counts(GPU, 4, 2).await;
    let unhealthy: Vec<&str> = view
        .devices
        .iter()
        .filter(|d| d.health == "Unhealthy")
        .map(|d| d.id.as_str())
        .collect();
    assert_eq!(unhealthy, ["gpu-1", "gpu-2"]);

    // Unhealthy → Healthy must raise allocatable again (ecosystem.md A4 row 30).
    std::fs::write(&health, "gpu-1 Healthy\n").unwrap();
    plugin.signal(Signal::USR1);
    root.wait_counts(GPU, 4, 4).await;
    assert_eq!(plugin.terminate().await, 0);
}

#[tokio::test]
async fn s1_5_reregistration_with_new_socket_and_devices_survives_death_of_old_plugin() {
    let root = Root::new();
    let _serve = root.serve(&[]).await;
    let old = root.example_plugin(&[
        "--resource",
        GPU,
        "--devices",
        "2",
        "--socket-name",
        "old.sock",
    ]);
    root.wait_counts(GPU, 2, 2).await;

    let new = root.example_plugin(&[
        "--resource",
        GPU,
        "--devices",
        "5",
        "--socket-name",
        "new.sock",
    ]);
    let view = root.wait_counts(GPU, 5, 5).await;
    assert!(view.endpoint.as_ref().unwrap().socket.ends_with("new.sock"));

    // The old plugin dies after being replaced; upstream (k8s #121994) would now stop the new
    // endpoint. Ours must stay serving.
    old.kill().await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    let view = root.wait_counts(GPU, 5, 5).await;
    assert_eq!(view.endpoint.as_ref().unwrap().state, "Serving");
    assert!(view.endpoint.as_ref().unwrap().socket.ends_with("new.sock"));
    assert_eq!(new.terminate().await, 0);
}

#[tokio::test]
async fn a3_plugin_sigkill_keeps_capacity_zero_allocatable_then_inactive_after_grace() {
    let root = Root::new();
    let _serve = root.serve(&["--endpoint-grace-period", "2s"]).await;
    let plugin = root.example_plugin(&["--resource", GPU, "--devices", "3"]);
    root.wait_counts(GPU, 3, 3).await;
    plugin.kill().await;

    let stopped = root
        .wait_for("stopped endpoint", |s| {
            s.resource(GPU)
                .and_then(|r| r.endpoint.as_ref())
                .is_some_and(|e| e.state == "Stopped")
        })
        .await;
    let view = stopped.resource(GPU).unwrap();
    assert_eq!(
        (view.capacity, view.allocatable, view.inactive),
        (3, 0, false)
    );
    assert!(view.devices.iter().all(|d| d.health == "Unhealthy"));

    let expired = root
        .wait_for("grace period expiry", |s| {
            s.resource(GPU).is_some_and(|r| r.inactive)
        })
        .await;
    let view = expired.resource(GPU).unwrap();
    assert_eq!((view.capacity, view.allocatable), (0, 0));
    assert!(view.devices.is_empty());

    // A plugin coming back revives the resource.
    let again = root.example_plugin(&["--resource", GPU, "--devices", "3"]);
    root.wait_counts(GPU, 3, 3).await;
    assert_eq!(again.terminate().await, 0);
}

#[tokio::test]
async fn s1_7_devicelet_restart_removes_stale_sockets_and_plugins_reregister() {
    let root = Root::new();
    let serve = root.serve(&[]).await;
    let plugin = root.example_plugin(&["--resource", GPU, "--devices", "2"]);
    let nic = root.example_plugin(&[
        "--resource",
        "example.com/nic",
        "--devices",
        "1",
        "--numa-nodes",
        "0",
    ]);
    root.wait_counts(GPU, 2, 2).await;
    root.wait_counts("example.com/nic", 1, 1).await;

    // Clean stop, then a crash (SIGKILL leaves kubelet.sock and the control socket behind).
    assert_eq!(serve.terminate().await, 0);
    let serve = root.serve(&[]).await;
    root.wait_counts(GPU, 2, 2).await;
    root.wait_counts("example.com/nic", 1, 1).await;
    serve.kill().await;
    assert!(
        root.paths.kubelet_socket.exists(),
        "SIGKILL leaves kubelet.sock behind"
    );

    // A stale socket of a plugin that is gone, plus a regular file that must survive.
    let stale = root.paths.device_plugins.join("gone.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    let keep = root.paths.device_plugins.join("notes.txt");
    std::fs::write(&keep, "keep me").unwrap();

    let _serve = root.serve(&[]).await;
    assert!(!stale.exists(), "stale plugin socket removed at startup");
    assert!(keep.exists(), "regular files are left alone");
    assert!(!root.paths.device_plugins.join("DEPRECATION").exists());
    root.wait_counts(GPU, 2, 2).await;
    root.wait_counts("example.com/nic", 1, 1).await;
    assert_eq!(plugin.terminate().await, 0);
    assert_eq!(nic.terminate().await, 0);
}

#[tokio::test]
async fn second_serve_on_same_root_is_refused() {
    let root = Root::new();
    let _serve = root.serve(&[]).await;
    let (code, log) = root.spawn("serve2", &["serve"]).wait_exit().await;
    assert_eq!(code, 1);
    assert!(
        log.contains("another devicelet is already serving") && log.contains("--force"),
        "{log}"
    );
    // The first daemon still answers.
    assert!(root.control().resources().await.is_ok());
}

/// Issue 29: on a host that runs a kubelet, `serve` on its root must not remove its plugin
/// sockets nor bind its `kubelet.sock`; it names the process, and `--force` takes over.
#[tokio::test]
async fn serve_refuses_a_root_whose_kubelet_sock_a_live_process_serves() {
    let root = Root::new();
    std::fs::create_dir_all(&root.paths.device_plugins).unwrap();
    let kubelet_sock = root.paths.kubelet_socket.clone();
    // A "kubelet": another process listening on kubelet.sock, with a plugin socket beside it.
    let script = format!(
        "import socket,time\ns=socket.socket(socket.AF_UNIX)\ns.bind({:?})\ns.listen(1)\ntime.sleep(60)\n",
        kubelet_sock.to_string_lossy()
    );
    let mut kubelet = std::process::Command::new("python3")
        .args(["-c", &script])
        .spawn()
        .unwrap();
    let plugin_sock = root.paths.device_plugins.join("nvidia-gpu.sock");
    drop(std::os::unix::net::UnixListener::bind(&plugin_sock).unwrap());
    for _ in 0..100 {
        if kubelet_sock.exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (code, log) = root.spawn("serve", &["serve"]).wait_exit().await;
    assert_eq!(code, 1, "{log}");
    assert!(
        log.contains(&format!("served by process {}", kubelet.id()))
            && log.contains("python3")
            && log.contains("--force"),
        "{log}"
    );
    assert!(
        plugin_sock.exists(),
        "the kubelet's plugin sockets are left alone"
    );
    assert!(kubelet_sock.exists(), "its kubelet.sock is left alone");
    assert!(
        std::os::unix::net::UnixStream::connect(&kubelet_sock).is_ok(),
        "the kubelet still answers"
    );

    // --force takes the root over: plugins register with devicelet from then on.
    let _serve = root.serve(&["--force"]).await;
    assert!(!plugin_sock.exists(), "stale sockets cleaned as usual");
    let _ = kubelet.kill();
    let _ = kubelet.wait();
}

/// Issue 29: a second node on one host must not run without metrics unnoticed. An address
/// asked for that is taken is an error; the default one taken moves to a free port, logged.
/// Logs to a file carry no colour escapes.
#[tokio::test]
async fn a_taken_metrics_port_is_an_error_or_moves_to_a_free_port() {
    let root = Root::new();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = taken.local_addr().unwrap().to_string();
    let (code, log) = root
        .spawn("serve", &["serve", "--metrics-address", &address])
        .wait_exit()
        .await;
    assert_eq!(code, 1, "{log}");
    assert!(log.contains(&format!("{address} is taken")), "{log}");
    assert!(
        !log.contains('\x1b'),
        "colour escapes in a log file:\n{log}"
    );

    // Hold the default port (other tests' daemons may hold it for a moment).
    let mut hold = None;
    for _ in 0..600 {
        match std::net::TcpListener::bind(devicelet_rpc::DEFAULT_METRICS_ADDRESS) {
            Ok(listener) => {
                hold = Some(listener);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    let _hold = hold.expect("the default metrics port stayed taken for 30 s");
    let serve = root.serve(&[]).await;
    // The metrics endpoint may come up (and log its move) just after the control socket.
    let mut log = serve.log();
    for _ in 0..100 {
        if log.contains("default metrics port taken") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        log = serve.log();
    }
    let line = log
        .lines()
        .find(|l| l.contains("default metrics port taken"))
        .unwrap_or_else(|| panic!("no fallback logged:\n{log}"));
    let moved = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("address="))
        .unwrap_or_else(|| panic!("no address in {line}"));
    assert_ne!(moved, devicelet_rpc::DEFAULT_METRICS_ADDRESS);
    let body = scrape(moved).await;
    assert!(
        body.contains("200 OK") && body.contains("kubelet_"),
        "{body}"
    );
    assert!(
        !log.contains('\x1b'),
        "colour escapes in a log file:\n{log}"
    );
    assert_eq!(serve.terminate().await, 0);
}

#[tokio::test]
async fn serve_metrics_report_capacity_and_allocatable_per_resource() {
    let root = Root::new();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let address = format!("127.0.0.1:{port}");
    let serve = root.serve(&["--metrics-address", &address]).await;
    let plugin =
        root.example_plugin(&["--resource", GPU, "--devices", "3", "--unhealthy", "gpu-0"]);
    root.wait_counts(GPU, 3, 2).await;

    let body = scrape(&address).await;
    assert!(
        body.contains("devicelet_device_plugin_capacity{resource_name=\"example.com/gpu\"} 3"),
        "{body}"
    );
    assert!(
        body.contains("devicelet_device_plugin_allocatable{resource_name=\"example.com/gpu\"} 2"),
        "{body}"
    );
    assert!(
        body.contains("devicelet_device_plugin_unhealthy{resource_name=\"example.com/gpu\"} 1"),
        "{body}"
    );
    // The kubelet's registration counter, and the plugin calls made while registering.
    assert!(
        body.contains(
            "kubelet_device_plugin_registration_total{resource_name=\"example.com/gpu\"} 1"
        ),
        "{body}"
    );
    assert!(
        body.contains("devicelet_device_plugin_rpc_duration_seconds_count{resource_name=\"example.com/gpu\",method=\"GetDevicePluginOptions\",code=\"OK\"} 1"),
        "{body}"
    );
    assert!(
        body.contains("content-type: text/plain; version=0.0.4"),
        "{body}"
    );
    assert_eq!(plugin.terminate().await, 0);
    assert_eq!(serve.terminate().await, 0);
}

#[tokio::test]
async fn serve_rejects_an_unreadable_or_non_mapping_config_with_the_cause() {
    let root = Root::new();
    let missing = root.path().join("missing.yaml");
    let (code, log) = root
        .spawn("serve", &["serve", "--config", missing.to_str().unwrap()])
        .wait_exit()
        .await;
    assert_eq!(code, 1);
    assert!(
        log.contains("read config") && log.contains("missing.yaml"),
        "{log}"
    );

    let list = root.path().join("list.yaml");
    std::fs::write(&list, "- a\n- b\n").unwrap();
    let (code, log) = root
        .spawn("serve", &["serve", "--config", list.to_str().unwrap()])
        .wait_exit()
        .await;
    assert_eq!(code, 1);
    assert!(log.contains("is not a mapping"), "{log}");
    assert!(!root.paths.kubelet_socket.exists());
}
