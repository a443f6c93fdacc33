//! The picture as HTML: [`fragment`] turns a [`NodePicture`] into the markup the page shows
//! (one box per NUMA node, a box for what has no NUMA node). Pure (model → String), and every
//! name from a manifest, plugin or driver goes through [`escape`]: a pod may be called
//! `<script>`. Colours come from a hash of the pod name, a number, never from the name itself.

use std::fmt::Write;

use devicelet_node::picture::{
    DeviceSource, DeviceUse, Holder, NodePicture, NumaView, cpu_list, human_bytes as bytes,
};

/// Text and attribute values made inert: `& < > " '` as character references.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A stable hue (0-359) for a pod, so it has one colour everywhere on the page.
fn hue(pod: &str) -> u32 {
    // FNV-1a: stable across runs and platforms, unlike the std hasher.
    let mut h: u32 = 0x811c_9dc5;
    for b in pod.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h % 360
}

/// `<span class="holder">pod (container)</span>`, coloured by pod.
fn holder(out: &mut String, h: &Holder) {
    let _ = write!(
        out,
        "<span class=\"holder\" style=\"--h:{}\" data-pod=\"{}\">{} <small>({})</small></span>",
        hue(&h.pod),
        escape(&h.pod),
        escape(&h.pod),
        escape(&h.container)
    );
}

fn device(out: &mut String, d: &DeviceUse) {
    let source = match d.source {
        DeviceSource::Plugin => "plugin",
        DeviceSource::Dra => "dra",
    };
    // A free DRA device has no health report (no claim holds it): unknown, not bad.
    let health = match d.health.as_str() {
        "Healthy" => "ok",
        "Unhealthy" => "bad",
        _ => "unknown",
    };
    let _ = write!(
        out,
        "<li class=\"device {source}\"><span class=\"tag\">{source}</span> \
         <span class=\"res\">{}</span> <b class=\"dev\">{}</b> <span class=\"health {health}\">{}</span>",
        escape(&d.resource),
        escape(&d.id),
        escape(&d.health)
    );
    if d.numa_nodes.len() > 1 {
        let nodes: Vec<String> = d.numa_nodes.iter().map(ToString::to_string).collect();
        let _ = write!(out, " <small>NUMA {}</small>", nodes.join(","));
    }
    out.push_str(" &rarr; ");
    if d.holders.is_empty() {
        out.push_str("<span class=\"free\">free</span>");
    }
    for h in &d.holders {
        holder(out, h);
    }
    out.push_str("</li>");
}

fn pods_list(out: &mut String, pods: &[String]) {
    out.push_str("<ul class=\"pods\">");
    if pods.is_empty() {
        out.push_str("<li class=\"none\">no pods</li>");
    }
    for p in pods {
        let _ = write!(
            out,
            "<li class=\"pod\" style=\"--h:{}\" data-pod=\"{}\">{}</li>",
            hue(p),
            escape(p),
            escape(p)
        );
    }
    out.push_str("</ul>");
}

fn numa(out: &mut String, node: &NumaView) {
    let _ = write!(
        out,
        "<section class=\"numa\" data-numa=\"{}\"><h2>NUMA node {}</h2>",
        node.id, node.id
    );
    out.push_str("<h3>CPUs</h3>");
    if node.cpus.all.is_empty() {
        out.push_str("<p class=\"muted\">no CPU manager</p>");
    } else {
        out.push_str("<div class=\"cpus\">");
        for cpu in &node.cpus.all {
            if node.cpus.reserved.contains(cpu) {
                let _ = write!(
                    out,
                    "<span class=\"cpu reserved\" title=\"CPU {cpu}: reserved\">{cpu}</span>"
                );
            } else if let Some(h) = node.cpus.exclusive.iter().find(|h| h.cpus.contains(cpu)) {
                let _ = write!(
                    out,
                    "<span class=\"cpu held\" style=\"--h:{}\" title=\"CPU {cpu}: {} ({})\">{cpu}</span>",
                    hue(&h.holder.pod),
                    escape(&h.holder.pod),
                    escape(&h.holder.container)
                );
            } else {
                let _ = write!(
                    out,
                    "<span class=\"cpu shared\" title=\"CPU {cpu}: shared pool\">{cpu}</span>"
                );
            }
        }
        out.push_str("</div><ul class=\"list\">");
        let _ = write!(
            out,
            "<li><span class=\"cpu reserved mini\"></span> reserved {} \
             <span class=\"cpu shared mini\"></span> shared {}</li>",
            cpu_list(&node.cpus.reserved),
            cpu_list(&node.cpus.shared)
        );
        for h in &node.cpus.exclusive {
            let _ = write!(out, "<li>{} &rarr; ", cpu_list(&h.cpus));
            holder(out, &h.holder);
            out.push_str("</li>");
        }
        out.push_str("</ul>");
    }
    out.push_str("<h3>Memory</h3>");
    if node.memory.is_empty() {
        out.push_str("<p class=\"muted\">no memory manager</p>");
    }
    for m in &node.memory {
        let percent = m
            .allocated
            .saturating_mul(100)
            .checked_div(m.allocatable)
            .unwrap_or(0)
            .min(100);
        let _ = write!(
            out,
            "<div class=\"mem\"><div class=\"memhead\"><b>{}</b> {} of {} allocated \
             <small>(total {})</small></div><div class=\"bar\"><div style=\"width:{percent}%\"></div></div>",
            escape(&m.resource),
            bytes(m.allocated),
            bytes(m.allocatable),
            bytes(m.total)
        );
        if !m.holders.is_empty() {
            out.push_str("<ul class=\"list\">");
            for h in &m.holders {
                let _ = write!(out, "<li>{} &rarr; ", bytes(h.size));
                holder(out, &h.holder);
                if h.numa_nodes.len() > 1 {
                    let nodes: Vec<String> = h.numa_nodes.iter().map(ToString::to_string).collect();
                    let _ = write!(out, " <small>across NUMA {}</small>", nodes.join(","));
                }
                out.push_str("</li>");
            }
            out.push_str("</ul>");
        }
        out.push_str("</div>");
    }
    out.push_str("<h3>Devices</h3>");
    if node.devices.is_empty() {
        out.push_str("<p class=\"muted\">none</p>");
    } else {
        out.push_str("<ul class=\"list\">");
        for d in &node.devices {
            device(out, d);
        }
        out.push_str("</ul>");
    }
    out.push_str("<h3>Pods</h3>");
    pods_list(out, &node.pods);
    out.push_str("</section>");
}

/// The picture's markup (what the page's `#picture` holds).
pub fn fragment(picture: &NodePicture) -> String {
    let mut out = String::new();
    let policy = |p: &str| {
        if p.is_empty() {
            "-".to_owned()
        } else {
            escape(p)
        }
    };
    let _ = write!(
        out,
        "<p class=\"meta\">CPU manager <b>{}</b> &middot; memory manager <b>{}</b> &middot; \
         generation <b id=\"generation\">{}</b></p><div class=\"nodes\">",
        policy(&picture.cpu_manager_policy),
        policy(&picture.memory_manager_policy),
        picture.generation
    );
    for node in &picture.numa_nodes {
        numa(&mut out, node);
    }
    out.push_str("<section class=\"numa nonuma\" data-numa=\"none\"><h2>No NUMA node</h2>");
    out.push_str("<h3>Devices</h3>");
    if picture.no_numa.devices.is_empty() {
        out.push_str("<p class=\"muted\">none</p>");
    } else {
        out.push_str("<ul class=\"list\">");
        for d in &picture.no_numa.devices {
            device(&mut out, d);
        }
        out.push_str("</ul>");
    }
    out.push_str("<h3>Pods on no NUMA node</h3>");
    pods_list(&mut out, &picture.no_numa.pods);
    out.push_str("</section></div>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use devicelet_node::picture::{CpuHolder, CpuView, NoNumaView};

    const HOSTILE: &str = "<script>alert('x')</script>\"><img src=x onerror=alert(1)>&amp;";

    fn picture(pod: &str) -> NodePicture {
        let h = Holder {
            pod: pod.into(),
            uid: "u".into(),
            container: "<b>c</b>".into(),
        };
        NodePicture {
            generation: 1,
            cpu_manager_policy: "static".into(),
            memory_manager_policy: String::new(),
            numa_nodes: vec![NumaView {
                id: 0,
                cpus: CpuView {
                    all: vec![0, 1],
                    reserved: vec![0],
                    shared: vec![],
                    exclusive: vec![CpuHolder {
                        holder: h.clone(),
                        cpus: vec![1],
                    }],
                },
                memory: vec![],
                devices: vec![DeviceUse {
                    source: DeviceSource::Plugin,
                    resource: "example.com/<x>".into(),
                    id: "dev\"'<>".into(),
                    numa_nodes: vec![0],
                    health: "Healthy".into(),
                    holders: vec![h],
                }],
                pods: vec![pod.into()],
            }],
            no_numa: NoNumaView {
                devices: vec![],
                pods: vec![pod.into()],
            },
        }
    }

    #[test]
    fn a_hostile_pod_name_is_text_never_markup() {
        let html = fragment(&picture(HOSTILE));
        assert!(!html.contains("<script"), "{html}");
        assert!(!html.contains("<img"), "{html}");
        assert!(!html.contains("<b>c</b>"), "{html}");
        assert!(!html.contains("dev\"'"), "{html}");
        assert!(
            html.contains("&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&quot;&gt;&lt;img src=x onerror=alert(1)&gt;&amp;amp;"),
            "{html}"
        );
        // Every quote in the markup is ours: attributes cannot be broken out of.
        for tag in html.split('<').skip(1) {
            let tag = tag.split('>').next().unwrap_or_default();
            assert_eq!(tag.matches('"').count() % 2, 0, "{tag}");
        }
    }

    #[test]
    fn the_boxes_carry_their_numa_id_and_pods() {
        let html = fragment(&picture("default/a"));
        assert!(
            html.contains("<section class=\"numa\" data-numa=\"0\">"),
            "{html}"
        );
        assert!(html.contains("data-numa=\"none\""), "{html}");
        assert_eq!(html.matches("<li class=\"pod\"").count(), 2, "{html}");
        assert!(html.contains("cpu reserved"), "{html}");
        assert!(html.contains("cpu held"), "{html}");
    }

    #[test]
    fn escape_covers_the_five_characters() {
        assert_eq!(escape("&<>\"'a"), "&amp;&lt;&gt;&quot;&#39;a");
        assert_eq!(hue("default/a"), hue("default/a"));
        assert!(hue("x") < 360);
    }
}
