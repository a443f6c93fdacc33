//! `devicelet top --numa`: the node as a picture in the terminal, from the control API's
//! `GET /v1/picture` ([`NodePicture`]). Each NUMA node is an ASCII box with a CPU strip (one
//! cell per CPU: `R` reserved, `.` shared pool, a letter for the pod holding it exclusively),
//! its memory and huge pages, and its devices with their holders; a last box holds what has
//! no NUMA node. [`render`] is pure (model → text) so it is tested without a terminal.
//!
//! ASCII only and no colour: the output is read by people and by `tmux capture-pane` alike.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::path::Path;

use anyhow::Context;
use devicelet_node::picture::{
    DeviceSource, DeviceUse, Holder, NodePicture, NumaView, cpu_list, human_bytes as bytes,
};
use devicelet_rpc::{ControlClient, RootPaths};

use crate::cli::{OutputFormat, TopArgs};
use crate::output;

/// Narrowest and widest picture; the terminal's width is clamped into this range.
pub const MIN_WIDTH: usize = 60;
/// See [`MIN_WIDTH`].
pub const MAX_WIDTH: usize = 120;
/// Width when stdout is not a terminal.
pub const DEFAULT_WIDTH: usize = 100;

/// Names come from pod manifests and plugins: control characters (a terminal escape in a pod
/// name) are shown as `?`, never sent to the terminal.
fn clean(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

/// A box of `width` columns: `+- title ---+`, `| line |` rows, `+----+`.
struct Frame {
    width: usize,
    out: String,
}

impl Frame {
    fn inner(&self) -> usize {
        self.width.saturating_sub(4)
    }

    fn top(&mut self, title: &str) {
        let title = fit(&format!("- {title} "), self.width.saturating_sub(2));
        let fill = self.width.saturating_sub(2 + title.chars().count());
        self.out.push('+');
        self.out.push_str(&title);
        self.out.push_str(&"-".repeat(fill));
        self.out.push_str("+\n");
    }

    fn line(&mut self, text: &str) {
        let inner = self.inner();
        let text = fit(text, inner);
        let pad = inner.saturating_sub(text.chars().count());
        self.out.push_str("| ");
        self.out.push_str(&text);
        self.out.push_str(&" ".repeat(pad));
        self.out.push_str(" |\n");
    }

    fn bottom(&mut self) {
        self.out.push('+');
        self.out.push_str(&"-".repeat(self.width.saturating_sub(2)));
        self.out.push_str("+\n");
    }
}

/// Cuts `text` to `width` characters, marking the cut with `~`.
fn fit(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        return text.to_owned();
    }
    let mut cut: String = text.chars().take(width.saturating_sub(1)).collect();
    cut.push('~');
    cut
}

/// `default/a (app)`; several holders joined.
fn holders(list: &[Holder]) -> String {
    if list.is_empty() {
        return "free".to_owned();
    }
    list.iter()
        .map(|h| format!("{} ({})", clean(&h.pod), clean(&h.container)))
        .collect::<Vec<_>>()
        .join(", ")
}

fn device_line(d: &DeviceUse, show_nodes: bool) -> String {
    let source = match d.source {
        DeviceSource::Plugin => "plugin",
        DeviceSource::Dra => "dra",
    };
    let mut line = format!(
        "{source:<6} {} {}  {}  {}",
        clean(&d.resource),
        clean(&d.id),
        clean(&d.health),
        holders(&d.holders)
    );
    if show_nodes && d.numa_nodes.len() > 1 {
        let nodes: Vec<String> = d.numa_nodes.iter().map(ToString::to_string).collect();
        line.push_str(&format!("  [NUMA {}]", nodes.join(",")));
    }
    line
}

/// Letters for the pods holding exclusive CPUs, in the order they first appear.
fn cpu_letters(picture: &NodePicture) -> BTreeMap<String, char> {
    const LETTERS: &str = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQSTUVWXYZ";
    let mut out = BTreeMap::new();
    let mut next = LETTERS.chars();
    for node in &picture.numa_nodes {
        for c in &node.cpus.exclusive {
            if !out.contains_key(&c.holder.pod) {
                // Past the alphabet every further pod is `*` (the list below names them).
                out.insert(c.holder.pod.clone(), next.next().unwrap_or('*'));
            }
        }
    }
    out
}

fn numa_box(frame: &mut Frame, node: &NumaView, letters: &BTreeMap<String, char>) {
    frame.top(&format!("NUMA node {}", node.id));
    if node.cpus.all.is_empty() {
        frame.line("CPUs      (no CPU manager)");
    } else {
        let mut strip = String::new();
        for cpu in &node.cpus.all {
            let cell = if node.cpus.reserved.contains(cpu) {
                'R'
            } else if let Some(h) = node.cpus.exclusive.iter().find(|h| h.cpus.contains(cpu)) {
                letters.get(&h.holder.pod).copied().unwrap_or('*')
            } else {
                '.'
            };
            strip.push(cell);
        }
        frame.line(&format!(
            "CPUs {}  [{strip}]  reserved {}  shared {}",
            cpu_list(&node.cpus.all),
            cpu_list(&node.cpus.reserved),
            cpu_list(&node.cpus.shared)
        ));
        for h in &node.cpus.exclusive {
            let letter = letters.get(&h.holder.pod).copied().unwrap_or('*');
            frame.line(&format!(
                "  {letter} {:<10} {} ({})",
                cpu_list(&h.cpus),
                clean(&h.holder.pod),
                clean(&h.holder.container)
            ));
        }
    }
    if node.memory.is_empty() {
        frame.line("memory    (no memory manager)");
    }
    for m in &node.memory {
        frame.line(&format!(
            "{:<14} total {}  allocatable {}  allocated {}",
            clean(&m.resource),
            bytes(m.total),
            bytes(m.allocatable),
            bytes(m.allocated)
        ));
        for h in &m.holders {
            let across = if h.numa_nodes.len() > 1 {
                let nodes: Vec<String> = h.numa_nodes.iter().map(ToString::to_string).collect();
                format!("  [across NUMA {}]", nodes.join(","))
            } else {
                String::new()
            };
            frame.line(&format!(
                "  {:<12} {} ({}){across}",
                bytes(h.size),
                clean(&h.holder.pod),
                clean(&h.holder.container)
            ));
        }
    }
    if node.devices.is_empty() {
        frame.line("devices   none");
    } else {
        frame.line("devices");
        for d in &node.devices {
            frame.line(&format!("  {}", device_line(d, true)));
        }
    }
    let pods: Vec<String> = node.pods.iter().map(|p| clean(p)).collect();
    frame.line(&format!(
        "pods: {}",
        if pods.is_empty() {
            "none".to_owned()
        } else {
            pods.join(", ")
        }
    ));
    frame.bottom();
}

/// The picture as text, `width` columns wide (clamped to [`MIN_WIDTH`]..=[`MAX_WIDTH`]).
pub fn render(picture: &NodePicture, width: usize) -> String {
    let width = width.clamp(MIN_WIDTH, MAX_WIDTH);
    let mut frame = Frame {
        width,
        out: String::new(),
    };
    let policy = |p: &str| {
        if p.is_empty() {
            "-".to_owned()
        } else {
            p.to_owned()
        }
    };
    frame.out.push_str(&fit(
        &format!(
            "node picture  CPU manager {}  memory manager {}  generation {}\n",
            policy(&picture.cpu_manager_policy),
            policy(&picture.memory_manager_policy),
            picture.generation
        ),
        width,
    ));
    frame.out.push_str(&fit(
        "CPU cells: R reserved, . shared pool, a letter: the pod holding it exclusively\n",
        width,
    ));
    let letters = cpu_letters(picture);
    if picture.numa_nodes.is_empty() {
        frame.out.push_str(
            "No NUMA node known: no CPU or memory manager, no device with a NUMA node.\n",
        );
    }
    for node in &picture.numa_nodes {
        numa_box(&mut frame, node, &letters);
    }
    frame.top("no NUMA");
    if picture.no_numa.devices.is_empty() {
        frame.line("devices   none");
    } else {
        frame.line("devices");
        for d in &picture.no_numa.devices {
            frame.line(&format!("  {}", device_line(d, false)));
        }
    }
    let pods: Vec<String> = picture.no_numa.pods.iter().map(|p| clean(p)).collect();
    frame.line(&format!(
        "pods on no NUMA node: {}",
        if pods.is_empty() {
            "none".to_owned()
        } else {
            pods.join(", ")
        }
    ));
    frame.bottom();
    frame.out
}

/// The terminal's columns, when stdout is one.
fn terminal_width() -> Option<usize> {
    let stdout = std::io::stdout();
    if !stdout.is_terminal() {
        return None;
    }
    rustix::termios::tcgetwinsize(&stdout)
        .ok()
        .map(|w| usize::from(w.ws_col))
        .filter(|c| *c > 0)
}

/// Runs `top --numa`: the picture once (`--once`, or not a terminal with `-o json|yaml`), or
/// redrawn in place every `--interval`.
pub async fn run(root_dir: &Path, args: TopArgs) -> anyhow::Result<()> {
    let client = ControlClient::new(RootPaths::new(root_dir).control_socket);
    let redraw =
        !args.once && args.output.output == OutputFormat::Table && std::io::stdout().is_terminal();
    loop {
        let picture = client.picture().await.context("top --numa")?;
        let width = args.width.or_else(terminal_width).unwrap_or(DEFAULT_WIDTH);
        if redraw {
            // Clear the screen and go home, so the picture updates in place.
            print!("\x1b[2J\x1b[H");
        }
        match args.output.output {
            // A stream of JSON documents is one compact object per line.
            OutputFormat::Json if !args.once => println!("{}", serde_json::to_string(&picture)?),
            OutputFormat::Yaml if !args.once => {
                print!("---\n{}", serde_yaml::to_string(&picture)?);
            }
            format => output::print(format, &picture, |p| render(p, width))?,
        }
        std::io::stdout().flush()?;
        if args.once {
            return Ok(());
        }
        tokio::time::sleep(args.interval).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use devicelet_node::picture::{CpuHolder, CpuView, MemoryHolder, MemoryUse, NoNumaView};

    fn holder(pod: &str) -> Holder {
        Holder {
            pod: pod.into(),
            uid: format!("uid-{pod}"),
            container: "app".into(),
        }
    }

    fn picture() -> NodePicture {
        let gpu = DeviceUse {
            source: DeviceSource::Dra,
            resource: "gpu.example.com/node-1".into(),
            id: "gpu-2".into(),
            numa_nodes: vec![1],
            health: "Healthy".into(),
            holders: vec![holder("default/a")],
        };
        NodePicture {
            generation: 3,
            cpu_manager_policy: "static".into(),
            memory_manager_policy: "Static".into(),
            numa_nodes: vec![
                NumaView {
                    id: 0,
                    cpus: CpuView {
                        all: vec![0, 1, 2, 3],
                        reserved: vec![0],
                        shared: vec![1, 2, 3],
                        exclusive: vec![],
                    },
                    memory: vec![],
                    devices: vec![],
                    pods: vec![],
                },
                NumaView {
                    id: 1,
                    cpus: CpuView {
                        all: vec![4, 5, 6, 7],
                        reserved: vec![],
                        shared: vec![6, 7],
                        exclusive: vec![CpuHolder {
                            holder: holder("default/a"),
                            cpus: vec![4, 5],
                        }],
                    },
                    memory: vec![MemoryUse {
                        resource: "memory".into(),
                        total: 4 << 30,
                        allocatable: 4 << 30,
                        allocated: 1 << 30,
                        holders: vec![MemoryHolder {
                            holder: holder("default/a"),
                            size: 1 << 30,
                            numa_nodes: vec![1],
                        }],
                    }],
                    devices: vec![gpu],
                    pods: vec!["default/a".into()],
                },
            ],
            no_numa: NoNumaView {
                devices: vec![],
                pods: vec!["default/shared".into()],
            },
        }
    }

    #[test]
    fn every_line_fits_the_width_and_boxes_close() {
        for width in [80, 100, 120] {
            let text = render(&picture(), width);
            for line in text.lines() {
                assert!(line.chars().count() <= width, "{width}: {line:?}");
            }
            let boxes = text.lines().filter(|l| l.starts_with("+-")).count();
            // Three boxes: top and bottom each.
            assert_eq!(boxes, 6, "{text}");
        }
    }

    #[test]
    fn numa_1_shows_the_pod_its_cpus_memory_and_gpu() {
        let text = render(&picture(), 100);
        let node1 = text.split("NUMA node 1").nth(1).unwrap();
        assert!(node1.contains("[aa..]"), "{text}");
        assert!(node1.contains("a 4-5        default/a (app)"), "{text}");
        assert!(node1.contains("1Gi          default/a (app)"), "{text}");
        assert!(
            node1.contains("dra    gpu.example.com/node-1 gpu-2  Healthy  default/a (app)"),
            "{text}"
        );
        assert!(node1.contains("pods: default/a"), "{text}");
        let node0 = text.split("NUMA node 0").nth(1).unwrap();
        assert!(node0.contains("[R...]"), "{text}");
        assert!(
            text.contains("pods on no NUMA node: default/shared"),
            "{text}"
        );
    }

    #[test]
    fn a_hostile_name_cannot_reach_the_terminal_and_long_lines_are_cut() {
        let mut p = picture();
        p.numa_nodes[1].pods = vec![format!("default/\x1b]0;pwned\x07{}", "x".repeat(200))];
        let text = render(&p, 80);
        assert!(!text.contains('\x1b') && !text.contains('\x07'), "{text:?}");
        assert!(text.contains("pods: default/?]0;pwned?xxx"), "{text}");
        assert!(text.lines().all(|l| l.chars().count() <= 80));
    }
}
