//! `devicelet demo`: a temporary root, `devicelet serve` and the example device plugin as
//! child processes, the inventory printed, one device flipped unhealthy through the plugin's
//! health file and the inventory printed again, the sample pods of `examples/pods` admitted
//! (devices, runtime settings, a rejection with its reason), the example DRA driver with the
//! objects and pod of `examples/dra` (claims allocated, prepared into CDI specs, released), a
//! second node running `examples/kubelet/gpu-node.yaml` (Topology, CPU and Memory Manager) on a
//! described two-NUMA machine with a pod whose GPU, CPUs, memory and huge pages share one NUMA
//! node, then a clean stop (SIGTERM to every child, each must exit 0). Child logs go to files
//! in the temporary root.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};
use devicelet_devicemanager::ResourcesSnapshot;
use devicelet_rpc::{ControlClient, RootPaths};
use rustix::process::{Pid, Signal, kill_process};
use tokio::process::{Child, Command};

use crate::cli::DemoArgs;
use crate::commands::get::resources_table;

const RESOURCE: &str = "example.com/gpu";
const WAIT: Duration = Duration::from_secs(15);

/// Runs the demo.
pub async fn run(args: DemoArgs) -> anyhow::Result<()> {
    // Short path under /tmp: Unix socket paths must stay below 108 bytes.
    let root = tempfile::Builder::new()
        .prefix("dl-demo-")
        .tempdir_in("/tmp")
        .context("create temporary root")?;
    let root_path = root.path().to_path_buf();
    println!("devicelet demo: root directory {}", root_path.display());
    let result = demo(&root_path).await;
    if args.keep {
        let kept = root.keep();
        println!("kept {}", kept.display());
    }
    result
}

async fn demo(root: &Path) -> anyhow::Result<()> {
    let exe = std::env::current_exe().context("find the devicelet executable")?;
    let paths = RootPaths::new(root);
    let control = ControlClient::new(&paths.control_socket);

    let mut serve = spawn(&exe, root, "serve.log", &["serve"])?;
    wait_for(&control, "devicelet to answer", |_| true)
        .await
        .inspect_err(|_| show_log(root, "serve.log"))?;
    println!(
        "\n$ devicelet serve --root-dir {}   (running, pid {})",
        root.display(),
        pid(&serve)?
    );

    let plugin_args = [
        "example-plugin",
        "--resource",
        RESOURCE,
        "--devices",
        "8",
        "--numa-nodes",
        "2",
        "--preferred-allocation",
    ];
    let mut plugin = spawn(&exe, root, "plugin.log", &plugin_args)?;
    println!(
        "$ devicelet {}   (running, pid {})",
        plugin_args.join(" "),
        pid(&plugin)?
    );
    let snapshot = wait_for(&control, "the example plugin's 8 devices", |s| {
        s.resource(RESOURCE)
            .is_some_and(|r| r.capacity == 8 && r.allocatable == 8)
    })
    .await
    .inspect_err(|_| show_log(root, "plugin.log"))?;
    println!(
        "\n$ devicelet get resources\n{}",
        resources_table(&snapshot)
    );

    let health_file = paths.device_plugins.join("example.com_gpu.health");
    std::fs::write(&health_file, "gpu-3 Unhealthy\n")
        .with_context(|| format!("write {}", health_file.display()))?;
    println!("$ echo 'gpu-3 Unhealthy' > {}", health_file.display());
    let snapshot = wait_for(&control, "gpu-3 to turn unhealthy", |s| {
        s.resource(RESOURCE).is_some_and(|r| r.allocatable == 7)
    })
    .await?;
    println!(
        "\n$ devicelet get resources\n{}",
        resources_table(&snapshot)
    );

    admit_samples(&control, root).await?;
    let mut driver = dra_demo(&exe, &control, root).await?;

    stop(&mut driver, "example DRA driver").await?;
    aligned_demo(&exe, root).await?;
    stop(&mut plugin, "example plugin").await?;
    stop(&mut serve, "devicelet serve").await?;
    if paths.kubelet_socket.exists() || paths.control_socket.exists() {
        bail!("devicelet left its sockets behind after SIGTERM");
    }
    println!("stopped cleanly: plugin and daemon exited 0, sockets removed");
    Ok(())
}

/// Admits the sample pods (embedded from `examples/pods`), shows their devices and runtime
/// settings, and shows a rejection with its reason.
async fn admit_samples(control: &ControlClient, root: &Path) -> anyhow::Result<()> {
    const TRAINING: &str = include_str!("../../../examples/pods/gpu-training.yaml");
    const TOO_MANY: &str = include_str!("../../../examples/pods/too-many-gpus.yaml");
    let options = admit_and_start(
        control,
        TRAINING,
        "gpu-training",
        "demo-training",
        "trainer",
        "$ ",
    )
    .await?;
    println!("\n$ devicelet start demo-training trainer -o json");
    println!("{}", serde_json::to_string_pretty(&options)?);

    let mut greedy =
        crate::commands::admit::parse_pod(TOO_MANY).context("sample pod too-many-gpus")?;
    greedy.metadata.uid = Some("demo-greedy".to_owned());
    println!("\n$ devicelet admit -f examples/pods/too-many-gpus.yaml");
    match control.admit(serde_json::to_vec(&greedy)?.into()).await {
        Ok(_) => bail!(
            "the oversized sample pod was admitted (root {})",
            root.display()
        ),
        Err(err) => println!("rejected: {err}"),
    }
    control
        .remove("demo-training")
        .await
        .context("remove sample pod")?;
    println!("\n$ devicelet remove demo-training\npod demo-training removed\n");
    Ok(())
}

/// Admits the sample pod `examples/pods/<name>.yaml` (text `yaml`) under `uid`, prints its
/// table after `prompt`, and returns what starting `container` injects.
async fn admit_and_start(
    control: &ControlClient,
    yaml: &str,
    name: &str,
    uid: &str,
    container: &str,
    prompt: &str,
) -> anyhow::Result<devicelet_devicemanager::RunContainerOptions> {
    let mut pod =
        crate::commands::admit::parse_pod(yaml).with_context(|| format!("sample pod {name}"))?;
    pod.metadata.uid = Some(uid.to_owned());
    let admitted = control
        .admit(serde_json::to_vec(&pod)?.into())
        .await
        .with_context(|| format!("admit sample pod {name}"))?;
    println!("{prompt}devicelet admit -f examples/pods/{name}.yaml");
    print!(
        "{}",
        crate::commands::admit::pods_table(std::slice::from_ref(&admitted))
    );
    control
        .start(uid, container)
        .await
        .with_context(|| format!("start container {container}"))
}

/// DRA: the example driver registers through `R/plugins_registry` and publishes its slice; the
/// objects of `examples/dra` are applied; the sample pod's claims (one named, one from a
/// template) are allocated, prepared (real CDI spec files) and shown, then released.
async fn dra_demo(exe: &Path, control: &ControlClient, root: &Path) -> anyhow::Result<Child> {
    const OBJECTS: &str = include_str!("../../../examples/dra/gpu-class.yaml");
    const POD: &str = include_str!("../../../examples/dra/pod.yaml");
    let args = [
        "example-driver",
        "--name",
        "gpu.example.com",
        "--devices",
        "4",
    ];
    let driver = spawn(exe, root, "driver.log", &args)?;
    println!(
        "$ devicelet {}   (running, pid {})",
        args.join(" "),
        pid(&driver)?
    );
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let dra: devicelet_node::dra::DraSnapshot = control.get_json("/v1/dra").await?;
        if dra.published_slices.get("gpu.example.com") == Some(&1) {
            println!(
                "registered: {} ({}), ResourceSlice published",
                dra.drivers.first().map_or("", |d| d.driver.as_str()),
                dra.drivers.first().map_or("", |d| d.service.as_str())
            );
            break;
        }
        if tokio::time::Instant::now() >= deadline {
            show_log(root, "driver.log");
            bail!("the example DRA driver did not register within {WAIT:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let docs = crate::commands::apply::parse_documents(OBJECTS)?;
    println!("\n$ devicelet apply -f examples/dra/gpu-class.yaml");
    for name in control.apply(&docs).await.context("apply examples/dra")? {
        println!("{name} stored");
    }
    let pod = crate::commands::admit::parse_pod(POD).context("sample pod examples/dra/pod.yaml")?;
    let admitted = control
        .admit(serde_json::to_vec(&pod)?.into())
        .await
        .context("admit examples/dra/pod.yaml")?;
    println!("\n$ devicelet admit -f examples/dra/pod.yaml");
    print!(
        "{}",
        crate::commands::admit::pods_table(std::slice::from_ref(&admitted))
    );
    let uid = admitted.pod.uid.clone();
    let options = control
        .start(&uid, "app")
        .await
        .context("start container app")?;
    println!("\n$ devicelet start {uid} app   (cdiDevices)");
    for name in &options.cdi_devices {
        println!("  {name}");
    }
    // The driver's per-claim specs (`<driver>-<claimUID>.json`); the example plugin's own spec
    // lives in the same directory.
    let cdi_dir = root.join("cdi");
    let files = std::fs::read_dir(&cdi_dir)
        .with_context(|| format!("read {}", cdi_dir.display()))?
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("gpu.example.com-")
        })
        .count();
    println!(
        "CDI spec files of gpu.example.com in {}: {files}",
        cdi_dir.display()
    );
    if options.cdi_devices.len() != 2 || files != 2 {
        bail!(
            "expected two prepared claims with CDI devices (root {})",
            root.display()
        );
    }
    control
        .remove(&uid)
        .await
        .context("remove the DRA sample pod")?;
    println!(
        "\n$ devicelet remove {uid}\npod {uid} removed; claims unprepared (CDI files removed)\n"
    );
    Ok(driver)
}

/// A GPU node's resource managers: `examples/kubelet/gpu-node.yaml` (single-numa-node, static
/// CPUs with strict-cpu-reservation, Static memory) on a described machine of two NUMA nodes,
/// the example plugin's GPUs on both, and `examples/pods/aligned-gpu.yaml` admitted: its GPU,
/// exclusive CPUs, memory and huge pages come from one node, and `start` pins both.
async fn aligned_demo(exe: &Path, root: &Path) -> anyhow::Result<()> {
    const CONFIG: &str = include_str!("../../../examples/kubelet/gpu-node.yaml");
    const POD: &str = include_str!("../../../examples/pods/aligned-gpu.yaml");
    const MACHINE: &str = "devicelet:\n  machine: {nodes: 2, cpusPerNode: 8}\n  memory: {perNode: 16Gi, hugepagesPerNode: {2Mi: 1024}}\n";
    let node_root = root.join("gpu-node");
    std::fs::create_dir_all(&node_root)
        .with_context(|| format!("create {}", node_root.display()))?;
    let config = node_root.join("kubelet.yaml");
    std::fs::write(&config, format!("{CONFIG}{MACHINE}"))
        .with_context(|| format!("write {}", config.display()))?;
    let paths = RootPaths::new(&node_root);
    let control = ControlClient::new(&paths.control_socket);
    let config_arg = config.to_string_lossy().into_owned();
    let mut serve = spawn(
        exe,
        &node_root,
        "serve.log",
        &["serve", "--config", &config_arg],
    )?;
    wait_for(&control, "the GPU node to answer", |_| true)
        .await
        .inspect_err(|_| show_log(&node_root, "serve.log"))?;
    println!(
        "$ devicelet serve --root-dir {} --config examples/kubelet/gpu-node.yaml   (running, pid {})\n  \
         machine described in the demo: 2 NUMA nodes of 8 CPUs, 16Gi and 1024 huge pages of 2Mi each",
        node_root.display(),
        pid(&serve)?
    );
    let plugin_args = [
        "example-plugin",
        "--resource",
        RESOURCE,
        "--devices",
        "4",
        "--numa-nodes",
        "2",
    ];
    let mut plugin = spawn(exe, &node_root, "plugin.log", &plugin_args)?;
    wait_for(&control, "the GPU node's 4 devices", |s| {
        s.resource(RESOURCE).is_some_and(|r| r.allocatable == 4)
    })
    .await
    .inspect_err(|_| show_log(&node_root, "plugin.log"))?;
    println!("$ devicelet {}   (running)", plugin_args.join(" "));

    let options = admit_and_start(
        &control,
        POD,
        "aligned-gpu",
        "demo-aligned",
        "trainer",
        "\n$ ",
    )
    .await?;
    println!(
        "\n$ devicelet start demo-aligned trainer   (cpuset and cpuset-mems: what the runtime pins)"
    );
    print!("{}", crate::commands::start::options_table(&options));
    if options.cpuset_mems.is_none() || options.cpuset_cpus.is_none() {
        bail!("the aligned pod's CPUs or memory were not pinned: {options:?}");
    }
    control
        .remove("demo-aligned")
        .await
        .context("remove the aligned pod")?;
    println!(
        "\n$ devicelet remove demo-aligned\npod demo-aligned removed; CPUs and memory freed\n"
    );
    stop(&mut plugin, "GPU node's example plugin").await?;
    stop(&mut serve, "GPU node's devicelet serve").await?;
    Ok(())
}

fn spawn(exe: &Path, root: &Path, log: &str, args: &[&str]) -> anyhow::Result<Child> {
    let log_path = root.join(log);
    let log_file = std::fs::File::create(&log_path)
        .with_context(|| format!("create {}", log_path.display()))?;
    Command::new(exe)
        .args(args)
        .arg("--root-dir")
        .arg(root)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log_file)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("start devicelet {}", args.join(" ")))
}

fn pid(child: &Child) -> anyhow::Result<u32> {
    child.id().context("child already exited")
}

async fn wait_for(
    control: &ControlClient,
    what: &str,
    ready: impl Fn(&ResourcesSnapshot) -> bool,
) -> anyhow::Result<ResourcesSnapshot> {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let last = control.resources().await;
        if let Ok(snapshot) = &last
            && ready(snapshot)
        {
            return Ok(snapshot.clone());
        }
        if tokio::time::Instant::now() >= deadline {
            let detail = last.map_or_else(|e| e.to_string(), |s| format!("last inventory: {s:?}"));
            bail!("timed out after {WAIT:?} waiting for {what} ({detail})");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn stop(child: &mut Child, name: &str) -> anyhow::Result<()> {
    let raw = pid(child)?;
    let pid = i32::try_from(raw)
        .ok()
        .and_then(Pid::from_raw)
        .with_context(|| format!("invalid pid {raw}"))?;
    kill_process(pid, Signal::TERM).with_context(|| format!("send SIGTERM to {name}"))?;
    let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .with_context(|| format!("{name} did not stop within 10s of SIGTERM"))?
        .with_context(|| format!("wait for {name}"))?;
    if !status.success() {
        bail!("{name} exited with {status}");
    }
    Ok(())
}

fn show_log(root: &Path, log: &str) {
    let path: PathBuf = root.join(log);
    if let Ok(text) = std::fs::read_to_string(&path) {
        eprintln!("--- {} ---\n{text}", path.display());
    }
}
